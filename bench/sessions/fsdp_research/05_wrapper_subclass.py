"""Mechanism (c): a wrapper tensor subclass (full-shape metadata, the local shard inside) as the Parameter.
Run: python 05_wrapper_subclass.py"""
import torch, torch.nn as nn
import common

aten = torch.ops.aten
class ShardWrapper(torch.Tensor):
    @staticmethod
    def __new__(cls, local, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=local.dtype, device=local.device)
    def __init__(self, local, shape):
        self._local = local
    def __tensor_flatten__(self):
        return ["_local"], tuple(self.shape)
    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return ShardWrapper(inner["_local"], meta)
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.detach.default:
            return ShardWrapper(args[0]._local.detach(), args[0].shape)
        if func in (aten.add_.Tensor, aten.mul_.Tensor, aten.add_.Scalar, aten.mul_.Scalar, aten.lerp_.Scalar,
                    aten.addcmul_.default, aten.addcdiv_.default, aten.zero_.default):   # the optimizer's ops, on locals
            un = lambda a: a._local if isinstance(a, ShardWrapper) else a
            func(*[un(a) for a in args], **kwargs)
            return args[0]
        raise NotImplementedError(f"ShardWrapper: {func}")

def fl(e): return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:170]}"

m = common.make("mlp"); w = m.fc1.weight; wid = id(w)
sw = ShardWrapper(w.detach().reshape(-1)[:48].clone(), w.shape)
import sys
if sys.argv[1:] == ["c1child"]:
    m = common.make("mlp"); w = m.fc1.weight
    with torch.no_grad():
        w.data = ShardWrapper(w.detach().reshape(-1)[:48].clone(), w.shape)
    print(w + 1); sys.exit(0)
# (c1) p.data = wrapper: set_data accepts it, but the Parameter's Python type does not change
with torch.no_grad():
    w.data = sw
print(f"(c1) after p.data = wrapper: type={type(w).__name__} shape={tuple(w.shape)} "
      f"python key={torch._C._dispatch_keys(w).has(torch._C.DispatchKey.Python)}")
import subprocess, sys   # using it dereferences the wrapper's missing storage: in a child process
r = subprocess.run([sys.executable, "-c", "import sys; sys.argv=['x','c1child']; exec(open('05_wrapper_subclass.py').read())"],
                   capture_output=True, text=True)
print(f"(c1) w + 1 on that Parameter (child process): returncode={r.returncode} (-11 = SIGSEGV)")

# (c2) swap_tensors: the same Python object becomes a ShardWrapper (no longer an nn.Parameter)
m = common.make("mlp"); w = m.fc1.weight; wid = id(w)
opt = torch.optim.SGD(m.parameters(), lr=0.1)             # BEFORE: holds w
new = ShardWrapper(w.detach().reshape(-1)[:48].clone(), w.shape)
new.requires_grad_(True)
try:
    torch.utils.swap_tensors(w, new)
    p = m.fc1.weight
    print(f"(c2) swap_tensors(p, wrapper): same object={id(p) == wid} type={type(p).__name__} "
          f"isinstance(p, nn.Parameter)={isinstance(p, nn.Parameter)} in named_parameters={'fc1.weight' in dict(m.named_parameters())}")
    p.grad = ShardWrapper(torch.ones(48), (12, 8))
    opt.step()
    print(f"(c2) for-loop SGD stepped the wrapper: local[:3]={p._local[:3].tolist()}")
    try:
        cm = torch.compile(m, backend="aot_eager"); x, y = common.batch("mlp", 0)
        cm(x, y)
    except Exception as e:
        print(f"(c2) compile with the wrapper as a parameter: {fl(e)}")
except Exception as e:
    print(f"(c2) swap_tensors: {fl(e)}")
