"""Reshard after forward (ZeRO-3 proper): what the forward saves for the backward, with the gathers untagged
(the partitioner saves the gathered full weights: parameter memory is freed only between steps) and tagged
MUST_RECOMPUTE in the joint graph (SimpleFSDP's policy: the backward gathers again, the forward saves shards).
Run: python 08_reshard_after_forward.py"""
import importlib, torch, torch.nn as nn
import torch.distributed as dist
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.utils.checkpoint import CheckpointPolicy
from functorch.compile import make_boxed_func
import common
m06 = importlib.import_module("06_dim0_shards_state_dict")
aten = torch.ops.aten
GATHER_CHAIN = {"_c10d_functional.all_gather_into_tensor.default", "_c10d_functional.wait_tensor.default",
                "aten.constant_pad_nd.default", "aten.slice.Tensor", "aten.narrow.default"}


def worker(rank, tag):
    torch._dynamo.reset(); m06.SHARDS.clear(); m06.install_callbacks()
    seen = {}

    def partition(joint, joint_inputs, **kw):
        if tag:   # the gather chain from a primal (a shard) up to the full weight: recomputed in the backward
            for n in joint.graph.nodes:
                if n.op == "call_function" and str(n.target) in GATHER_CHAIN and "tangents" not in str(n.all_input_nodes):
                    if not any("tangents" in a.name for a in n.all_input_nodes):
                        n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                        n.meta["ac_graph_id"] = 0
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kw)
        outs = list(fw.graph.nodes)[-1].args[0]
        seen["saved"] = [tuple(o.meta["val"].shape) for o in outs[kw["num_fwd_outputs"]:] if hasattr(o, "meta") and "val" in o.meta]
        seen["bw_ag"] = sum("all_gather" in str(n.target) for n in bw.graph.nodes)
        return fw, bw

    def backend(gm, ins):
        return m06_backend_with_partition(gm, ins, partition)

    model = common.make("mlp"); opt = common.make_opt("sgd", model.parameters())
    cm = torch.compile(model, backend=backend)
    x, y = common.batch("mlp", 0); n = x.shape[0] // 2
    cm(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]).backward(); opt.step()
    if rank == 0:
        print(f"[tag={tag}] forward saves for backward: {seen['saved']}; all_gathers in backward: {seen['bw_ag']} "
              f"(full weights (12, 8), (3, 12); shards (6, 8), (2, 12))")


def m06_backend_with_partition(gm, example_inputs, partition):
    # 06's backend, with a partition_fn (the same steps; only the aot_autograd call differs)
    orig = m06.aot_autograd
    def patched(**kw):
        return orig(partition_fn=partition, **kw)
    m06.aot_autograd = patched
    try:
        return m06.fsdp_backend(gm, example_inputs)
    finally:
        m06.aot_autograd = orig


if __name__ == "__main__":
    for tag in (False, True):
        common.launch(worker, tag)
