"""Mechanism (d'): the backend replaces Dynamo's TENSOR_MATCH guard on each parameter by an ID_MATCH
(through TracingContext.get().guards_context.dynamo_guards, while Dynamo still waits for the backend),
shards the user's own Parameters in place (p.data = local flat shard) and compiles a graph whose
parameter inputs are the shards (all_gather in forward, reduce_scatter in backward). No recompile, no
re-trace of user code; the optimizer (created before compile) steps on the shards.
Run: python 02_backend_drops_param_shape_guards.py"""
import sys, torch, torch.nn as nn
import torch.distributed as dist
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.guards import GuardBuilder
from torch._guards import TracingContext
from functorch.compile import make_boxed_func
import common, fsdp_graph

COMPILES = []


def fsdp_backend(gm, example_inputs):
    world, rank = dist.get_world_size(), dist.get_rank()
    group_name = dist.group.WORLD.group_name
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    guards = TracingContext.get().guards_context.dynamo_guards
    positions, metas, new_inputs = [], {}, list(example_inputs)
    for i, (node, t) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(t, nn.Parameter):
            continue
        source = node.meta["grapharg"].source
        guards.remove_guards_with_source(source)        # TENSOR_MATCH (sizes, strides) + dynamic-marking guards
        guards.add(source.make_guard(GuardBuilder.ID_MATCH))   # still: the same Parameter object
        positions.append(i); metas[i] = (tuple(t.shape), t.numel())
        if not hasattr(t, "_fsdp_full_shape"):
            with torch.no_grad():
                dist.broadcast(t.data, 0)
                t.data = fsdp_graph.shard_of(t.data, rank, world)     # same Parameter object, shard storage
            t._fsdp_full_shape = metas[i][0]
        # AOTAutograd would fakify t from Dynamo's memo (the full-shape symbolic context): give it a fake of the
        # shard from Dynamo's own fake mode instead
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            stand_in = nn.Parameter(torch.empty_like(t.data), requires_grad=t.requires_grad)
        new_inputs[i] = TracingContext.get().fake_mode.from_tensor(stand_in, static_shapes=True)
    COMPILES.append([tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)])
    fsdp_graph.insert_gathers(gm, positions, metas, group_name, world)
    joint_seen = {}

    def fw(g, ins):
        joint_seen["fw"] = sorted({str(n.target) for n in g.graph.nodes if "c10d" in str(n.target)})
        return make_boxed_func(g.forward)

    def bw(g, ins):
        joint_seen["bw"] = sorted({str(n.target) for n in g.graph.nodes if "c10d" in str(n.target)})
        if rank == 0:
            print("  fw collectives:", joint_seen["fw"], "\n  bw collectives:", joint_seen["bw"])
        return make_boxed_func(g.forward)
    return aot_autograd(fw_compiler=fw, bw_compiler=bw)(gm, new_inputs)


def worker(rank, kind, opt_name, ref):
    torch._dynamo.reset(); COMPILES.clear()
    model = common.make(kind)
    params_before = {k: id(p) for k, p in model.named_parameters()}
    opt = common.make_opt(opt_name, model.parameters())          # BEFORE compile
    cm = torch.compile(model, backend=fsdp_backend)
    losses = []
    for step in range(common.STEPS):
        x, y = common.batch(kind, step)
        n = x.shape[0] // common.WORLD
        loss = cm(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n])
        loss.backward()
        if step == 0 and rank == 0:
            p = next(model.parameters())
            print(f"  after backward: p.shape={tuple(p.shape)} p.grad.shape={tuple(p.grad.shape)}")
        opt.step(); opt.zero_grad()
        l = loss.detach().clone(); dist.all_reduce(l); losses.append(l.item() / common.WORLD)
    full = {k: fsdp_graph.unshard(p, p._fsdp_full_shape, common.WORLD) for k, p in model.named_parameters()}
    same_ids = all(id(p) == params_before[k] for k, p in model.named_parameters())
    if rank == 0:
        ref_losses, ref_params = ref
        err = max((full[k] - ref_params[k]).abs().max().item() for k in ref_params)
        print(f"[{kind}/{opt_name}] compiles={len(COMPILES)} same Parameter objects={same_ids}")
        print(f"  losses      {['%.6f' % l for l in losses]}\n  eager ref   {['%.6f' % l for l in ref_losses]}")
        print(f"  max |param - eager param| after {common.STEPS} steps = {err:.2e}")
        print(f"  optimizer state shapes: {sorted({tuple(v.shape) for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()})[:4]}")


if __name__ == "__main__":
    for kind in ("mlp", "block"):
        for opt_name in ("sgd", "adamw"):
            common.launch(worker, kind, opt_name, common.eager_reference(kind, opt_name))
