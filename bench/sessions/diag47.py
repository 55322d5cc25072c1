# session 47 diagnostic: HF OPT (transformers 5.17) split step under a budget on one GPU, with the traceback
import os, sys, traceback, types, torch
sys.path.insert(0, os.getcwd())
from bench import run as br
from examples import hf_zoo
model, make = hf_zoo.build_hf("opt", "bench", device="cuda")
batch = make(4, 1024)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
fn = torch.compile(model, backend="colauto")
args = types.SimpleNamespace(dtype="bf16", device="cuda", hold_outputs=False)
for i in range(4):
    try:
        torch.cuda.reset_peak_memory_stats()
        br.training_step(fn, opt, batch["input_ids"], batch["labels"], args, loss_of=hf_zoo.loss_of_call if hasattr(hf_zoo, "loss_of_call") else (lambda f, xs: f(input_ids=xs[0], labels=xs[1])))
        torch.cuda.synchronize()
        print("step", i, "peak %.2f GiB" % (torch.cuda.max_memory_allocated() / 2**30), flush=True)
    except Exception:
        traceback.print_exc()
        break
from colauto_backend import counters
print({k: v for k, v in counters.snapshot()["counts"].items() if v})
