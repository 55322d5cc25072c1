"""HF GPT-2 (its 50257-token vocabulary) end-of-step memory under a backend (inductor | colauto, the colauto
backend of whatever colauto_backend is first on PYTHONPATH): which commit holds an extra block. bench/sessions/gpu31.sh."""
import gc, os, sys, time
import torch
import transformers
backend = sys.argv[1]
force = os.environ.get("FORCE_PAD") == "1"
import torch._inductor.config as ic
if force:
    ic.force_shape_pad = True
torch.cuda.memory._record_memory_history(max_entries=200000)
cfg = transformers.GPT2Config(n_layer=int(os.environ.get("LAYERS", "2")), n_head=20, n_embd=1280, vocab_size=50257, n_positions=1024)
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), fused=True)
if backend == "inductor":
    fn = torch.compile(model)
else:
    from colauto_backend.backend import colauto
    fn = torch.compile(model, backend=colauto)
x = torch.randint(0, 50257, (8, 1024), device="cuda")
GiB = 2**30
def step():
    with torch.autocast("cuda", torch.bfloat16):
        loss = fn(input_ids=x, labels=x).loss
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    return loss
t0 = time.perf_counter()
loss = None
for i in range(4):
    torch.cuda.reset_peak_memory_stats()
    loss = step()
    torch.cuda.synchronize()
    print(f"{backend} step {i}: end {torch.cuda.memory_allocated()/GiB:.3f} GiB, peak {torch.cuda.max_memory_allocated()/GiB:.3f} GiB, t {time.perf_counter()-t0:.1f}s", flush=True)
snap = torch.cuda.memory._snapshot()
big = []
for seg in snap["segments"]:
    for b in seg["blocks"]:
        if b["state"] == "active_allocated" and b["size"] > 100 * 2**20:
            fr = [f"{os.path.basename(f['filename'])}:{f['line']}({f['name']})" for f in b.get("frames", [])
                  if "torch/nn" not in f["filename"] and "python" not in f["name"]][:6]
            big.append((b["size"] / 2**20, fr))
for s, fr in sorted(big, key=lambda t: -t[0])[:6]:
    print(f"  held {s:.1f} MiB  " + " <- ".join(fr))
del loss; gc.collect(); torch.cuda.synchronize()
print(f"{backend} after del loss: {torch.cuda.memory_allocated()/GiB:.3f} GiB", flush=True)
