#!/usr/bin/env bash
# 2026-11-28 (1 GPU): where COLAUTO_CODEGEN=triton with Inductor compiling the rest spends its time. In
# gpu15.sh it printed the forward's fusion line and then produced nothing for 400+ s (HF Qwen2, Llama).
# HF Qwen2 at its bench width, 24 layers, B8 T1024: stage timings (fuse, re-trace, Inductor) and the main
# thread's stack each 45 s. Output in $OUT/log16.txt.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
run() {
timeout -k 5 $1 python - > $OUT/log16-$2.txt 2>&1 <<'PY'
import sys, threading, time, traceback
MAIN = threading.main_thread().ident
def watch():
    while True:
        time.sleep(45)
        frames = [f for f in traceback.format_stack(sys._current_frames()[MAIN])
                  if "__str__" not in f and "__repr__" not in f and "str_helper" not in f and "dataclasses" not in f]
        print(f"--- main thread at {time.time()-T0:.0f}s ---\n" + "".join(frames[-30:]), flush=True)
threading.Thread(target=watch, daemon=True).start()
import torch, transformers
from colauto_backend import _torch_compat as compat, fusion
from examples.hf_zoo import SPECS, config_of
T0 = time.time()
def timed(mod, name):
    f = getattr(mod, name)
    def g(*a, **k):
        t = time.time(); r = f(*a, **k); print(f"[{time.time()-T0:.0f}s] {name} {time.time()-t:.1f} s", flush=True); return r
    setattr(mod, name, g)
for mod, name in ((compat, "decomposed_for_inductor"), (compat, "run_with_inductor"), (fusion, "fuse")):
    timed(mod, name)
import triton_kernels
real_call = triton_kernels.FusedRegion.__call__
calls = [0]
def call(self, *a):
    calls[0] += 1
    t = time.time(); r = real_call(self, *a)
    if time.time() - t > 1: print(f"[{time.time()-T0:.0f}s] kernel call {calls[0]} took {time.time()-t:.1f} s", flush=True)
    return r
triton_kernels.FusedRegion.__call__ = call
import os
config = config_of("qwen2", "bench"); config.num_hidden_layers = int(os.environ.get("LAYERS", "24"))
if os.environ.get("NO_PARTITION"):
    import torch._inductor.config as ic; ic.graph_partition = False
print("layers", config.num_hidden_layers, "no partition", bool(os.environ.get("NO_PARTITION")), flush=True)
model = getattr(transformers, SPECS["qwen2"].model)(config).cuda()
ids = torch.randint(0, config.vocab_size, (8, 1024), device="cuda")
import colauto_backend
c = torch.compile(model, backend=colauto_backend.colauto, options={"codegen": "triton"})
with torch.autocast("cuda", torch.bfloat16):
    loss = c(input_ids=ids, labels=ids).loss
print(f"[{time.time()-T0:.0f}s] forward ran ({calls[0]} kernel calls)", flush=True)
loss.backward()
torch.cuda.synchronize()
print(f"[{time.time()-T0:.0f}s] backward ran ({calls[0]} kernel calls)", flush=True)
for i in range(3):
    t = time.time()
    with torch.autocast("cuda", torch.bfloat16):
        loss = c(input_ids=ids, labels=ids).loss
    loss.backward(); torch.cuda.synchronize()
    print(f"step {time.time()-t:.3f} s", flush=True)
PY
}
LAYERS=4 run 120 l4
LAYERS=4 NO_PARTITION=1 run 120 l4-nopart
grep -h '^\[\|^step\|^layers' $OUT/log16-*.txt
