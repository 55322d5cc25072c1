"""Q1: which guards does Dynamo install on parameters, and which mutations of a parameter recompile?
Run: python 01_guards.py"""
import io, logging, contextlib, torch, torch.nn as nn

compiles = []
def backend(gm, example_inputs):
    compiles.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
    return gm.forward

def fresh():
    torch._dynamo.reset(); compiles.clear()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return m, torch.compile(m, backend=backend)

x = torch.randn(2, 8)

# 1) print the guards
m, cm = fresh()
buf = io.StringIO()
h = logging.StreamHandler(buf)
torch._logging.set_logs(guards=True)
logging.getLogger("torch._dynamo.guards").addHandler(h)
cm(x)
torch._logging.set_logs()
txt = buf.getvalue()
print("---- guard lines mentioning parameters / module ----")
for line in txt.splitlines():
    if "_parameters" in line or "TENSOR_MATCH" in line or "ID_MATCH" in line or "DICT" in line or "dict_tag" in line.lower():
        print(line[:220])

def trial(name, mutate, shape_after=None):
    m, cm = fresh()
    cm(x)
    with torch.no_grad():
        mutate(m)
    try:
        cm(x) if shape_after is None else cm(x)
        err = None
    except Exception as e:
        err = f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
    print(f"{name:60s} compiles={len(compiles)} err={err}")
    if len(compiles) > 1:
        print("     recompile saw input shapes", compiles[1][:2])

trial("no mutation", lambda m: None)
trial("p.data = same-shape new tensor", lambda m: setattr(m[0], "weight", m[0].weight) or m[0].weight.__setattr__("data", m[0].weight.data.clone()))
trial("p.data = dim-0 half (shape change)", lambda m: m[0].weight.__setattr__("data", m[0].weight.data[:8].clone()))
trial("p.data = flat 1/2 shard", lambda m: m[0].weight.__setattr__("data", m[0].weight.data.flatten()[:64].clone()))
def free(m):
    m[0].weight.untyped_storage().resize_(0)
trial("p.untyped_storage().resize_(0) (sizes kept)", free)
def stride(m):
    m[0].weight.data = m[0].weight.data.t().contiguous().t()
trial("p.data = same shape, transposed strides", stride)
def rg(m):
    m[0].weight.requires_grad_(False)
trial("p.requires_grad_(False)", rg)
