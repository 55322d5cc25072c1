"""Mechanisms (a), (b), (c) on one process (world size 1 is enough: each fails before any collective).
Run: python 04_mechanisms_abc.py"""
import torch, torch.nn as nn, traceback
import common

def first_line(e):
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"

compiles = []
def backend(gm, ins):
    compiles.append([tuple(t.shape) for t in ins if isinstance(t, nn.Parameter)][:3])
    return gm.forward

# (a) after the first call, p.data = dim-0 chunk / flat shard: the guard fails, Dynamo re-traces user code
for how in ("dim0", "flat"):
    torch._dynamo.reset(); compiles.clear()
    m = common.make("block"); cm = torch.compile(m, backend=backend); x, y = common.batch("block", 0)
    cm(x, y)
    with torch.no_grad():
        for p in m.parameters():
            p.data = p.data.chunk(2, 0)[0].clone() if how == "dim0" else p.data.reshape(-1).chunk(2)[0].clone()
    try:
        cm(x, y); print(f"(a) {how}: no error?! compiles={compiles}")
    except Exception as e:
        inner = [l.strip() for l in str(e).splitlines() if "Error" in l or "must" in l or "invalid" in l or "shape" in l][:2]
        print(f"(a) {how} shard: recompile #{len(compiles) + 1} re-traced user code and failed: {first_line(e)} | {inner}")

# (b) full-shape p with freed storage, shard in a side buffer: what AccumulateGrad and the optimizer do
m = common.make("mlp"); opt = torch.optim.SGD(m.parameters(), lr=0.1)
w = m.fc1.weight
side = w.detach().reshape(-1)[:48].clone()             # the rank's shard, kept by the backend
w.untyped_storage().resize_(0)
print(f"(b) freed: w.shape={tuple(w.shape)} storage bytes={w.untyped_storage().nbytes()}")
# the compiled graph's backward would return the shard's gradient for input w: AccumulateGrad checks shapes
class Sub(torch.autograd.Function):           # stands in for "graph reads side shard for w"
    @staticmethod
    def forward(ctx, w_): return side.new_ones(()) * 1.0
    @staticmethod
    def backward(ctx, g): return torch.ones(48)   # a shard-shaped gradient for the full-shaped w
try:
    Sub.apply(w).backward()
except Exception as e:
    print(f"(b) shard-shaped grad for full-shape p: {first_line(e)}")
try:
    w.grad = torch.ones(48)
except Exception as e:
    print(f"(b) p.grad = shard: {first_line(e)}")
import subprocess, sys   # SGD's p.add_ writes into the 0-byte storage: run it in a child process
code = ("import torch; w = torch.nn.Parameter(torch.randn(12, 8)); opt = torch.optim.SGD([w], lr=0.1); "
        "w.untyped_storage().resize_(0); w.grad = torch.ones(12, 8); opt.step(); print('stepped')")
r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
print(f"(b) optimizer.step on a full-shape p with freed storage (full-shape grad): returncode={r.returncode} "
      f"(-11 = SIGSEGV) stdout={r.stdout.strip()!r} stderr={r.stderr.strip().splitlines()[-1:]}")

# (c) a wrapper subclass (full-shape metadata, local shard inside) as p.data, or swapped into p
class ShardWrapper(torch.Tensor):
    @staticmethod
    def __new__(cls, local, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=local.dtype, device=local.device, requires_grad=False)
    def __init__(self, local, shape):
        self._local = local
    def __tensor_flatten__(self):
        return ["_local"], tuple(self.shape)
    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return ShardWrapper(inner["_local"], meta)
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"ShardWrapper: {func}")
m = common.make("mlp"); w = m.fc1.weight; wid = id(w)
sw = ShardWrapper(w.detach().reshape(-1)[:48].clone(), w.shape)
try:
    with torch.no_grad():
        w.data = sw
    print("(c) p.data = wrapper: accepted?", type(w), w.shape)
except Exception as e:
    print(f"(c) p.data = wrapper subclass: {first_line(e)}")
try:
    torch.utils.swap_tensors(w, nn.Parameter(sw))
    print(f"(c) swap_tensors(p, Parameter(wrapper)): ok, same id={id(m.fc1.weight) == wid}, type={type(m.fc1.weight).__name__}, "
          f"isinstance Parameter={isinstance(m.fc1.weight, nn.Parameter)}")
    opt = torch.optim.SGD([m.fc1.weight], lr=0.1)
    m.fc1.weight.grad = ShardWrapper(torch.ones(48), (12, 8))
    try:
        opt.step()
    except Exception as e:
        print(f"(c) optimizer.step on the wrapper (for-loop SGD): {first_line(e)}")
except Exception as e:
    print(f"(c) swap_tensors(p, Parameter(wrapper)): {first_line(e)}")
