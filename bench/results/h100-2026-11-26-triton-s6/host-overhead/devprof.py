import cProfile, pstats, sys, time, io, os, torch
sys.path.insert(0, ".")
from bench import run as br
from examples.models import build
name, size, B = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, make = build(name, size, device="cuda")
x, t = make(B, 1024)
x, t = x.cuda(), t.cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
fn = torch.compile(model, backend="colauto", options={"codegen": "triton"})
def step():
    with torch.autocast("cuda", torch.bfloat16):
        loss = fn(x, t)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(3): step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(5): step()
t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
print(f"{name} {size}: host issue {(t1-t0)/5*1e3:.1f} ms/step, wall {(t2-t0)/5*1e3:.1f} ms/step")
pr = cProfile.Profile(); pr.enable()
for _ in range(5): step()
torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue()[:9000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(40); print(s.getvalue()[:9000])
