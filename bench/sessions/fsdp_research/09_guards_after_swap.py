"""The guards Dynamo installs on a parameter once the backend (06's) has swapped them: ID_MATCH, no TENSOR_MATCH.
One process, world size 1 (gloo). Run: python 09_guards_after_swap.py"""
import io, logging, os, importlib, torch
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29731")
dist.init_process_group("gloo", rank=0, world_size=1)
m06 = importlib.import_module("06_dim0_shards_state_dict")
import common
m06.install_callbacks()
buf = io.StringIO(); logging.getLogger("torch._dynamo.guards").addHandler(logging.StreamHandler(buf))
torch._logging.set_logs(guards=True)
model = common.make("mlp"); cm = torch.compile(model, backend=m06.fsdp_backend)
x, y = common.batch("mlp", 0)
cm(x, y).backward()
torch._logging.set_logs()
for line in buf.getvalue().splitlines():
    if "_parameters['weight']" in line and "fc1" in line:
        print(line.strip()[:200])
dist.destroy_process_group()
