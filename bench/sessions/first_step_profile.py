"""One cold first training step of an HF model at its bench shape under cProfile (gpu33.sh): MODE NAME OUTDIR."""
import cProfile
import sys
import time

import torch

import colauto_backend  # backend=colauto_backend.colauto: the device copy is not pip-installed (no entry point)

from examples.hf_zoo import build_hf

mode, name, out = sys.argv[1:4]
model, make = build_hf(name, "bench", device="cuda")
batch = make(8, 1024)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
prof = cProfile.Profile()
t0 = time.perf_counter()
prof.enable()
fn = torch.compile(model) if mode == "inductor" else torch.compile(model, backend=colauto_backend.colauto)
with torch.autocast("cuda", torch.bfloat16):
    loss = fn(**batch).loss
loss.backward()
opt.step()
torch.cuda.synchronize()
prof.disable()
print(f"{mode} {name} first step {time.perf_counter() - t0:.1f} s (under cProfile)")
prof.dump_stats(f"{out}/{mode}.prof")
from torch._dynamo.utils import compile_times
print(compile_times(repr="str", aggregate=True))
