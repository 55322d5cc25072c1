"""Mechanism (d') plus recompiles: once sharded, ANY later recompile of the frame (a new batch shape, eval under
no_grad, ...) makes Dynamo re-trace the user's code with the shard-shaped Parameters, which breaks on the
first use of a weight. Fix: Dynamo's compile start/end callbacks (torch._dynamo.callback) give each sharded
Parameter a full-shape, storage-less stand-in as .data while Dynamo traces (so the trace sees the captured
shapes) and the shard back when the compile ends. Run: python 03_recompile_with_full_shape_standins.py [nofix]"""
import sys, torch, torch.nn as nn
import torch.distributed as dist
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.guards import GuardBuilder
from torch._guards import TracingContext
from torch.utils.weak import WeakIdKeyDictionary
from functorch.compile import make_boxed_func
import common, fsdp_graph

SHARDS = WeakIdKeyDictionary()      # Parameter -> (its shard, full shape, full stride)
COMPILES = []
FIX = "nofix" not in sys.argv


def _standins_on(*args):
    trigger = getattr(args[0], "callback_trigger", None) if args else None
    if trigger is not None and trigger.name != "DYNAMO":       # a lazy backward compile: leave the shards
        return
    with torch.no_grad():
        for p, (shard, shape, stride) in SHARDS.items():
            stand = torch.empty_strided(shape, stride, dtype=shard.dtype, device=shard.device)
            stand.untyped_storage().resize_(0)                   # no memory: Dynamo only fakifies it
            p.data = stand


def _standins_off(*args):
    with torch.no_grad():
        for p, (shard, _, _) in SHARDS.items():
            p.data = shard


def install_callbacks():     # torch._dynamo.reset() clears the callbacks (torch/_dynamo/__init__.py:167)
    if FIX and _standins_on not in torch._dynamo.callback_handler.start_callbacks:
        torch._dynamo.callback.on_compile_start(_standins_on)
        torch._dynamo.callback.on_compile_end(_standins_off)


def fsdp_backend(gm, example_inputs):
    world, rank = dist.get_world_size(), dist.get_rank()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tc = TracingContext.get()
    positions, metas, new_inputs = [], {}, list(example_inputs)
    for i, (node, t) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(t, nn.Parameter):
            continue
        source = node.meta["grapharg"].source
        tc.guards_context.dynamo_guards.remove_guards_with_source(source)
        tc.guards_context.dynamo_guards.add(source.make_guard(GuardBuilder.ID_MATCH))
        positions.append(i); metas[i] = (tuple(t.shape), t.numel())
        if t not in SHARDS:
            with torch.no_grad():
                dist.broadcast(t.data, 0)
                SHARDS[t] = (fsdp_graph.shard_of(t.data, rank, world), tuple(t.shape), t.stride())
                t.data = SHARDS[t][0]
        shard = SHARDS[t][0]
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            stand_in = nn.Parameter(torch.empty_like(shard), requires_grad=t.requires_grad)
        new_inputs[i] = tc.fake_mode.from_tensor(stand_in, static_shapes=True)
    COMPILES.append((torch.is_grad_enabled(), [tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor) and not isinstance(x, nn.Parameter)]))
    fsdp_graph.insert_gathers(gm, positions, metas, dist.group.WORLD.group_name, world)
    if not torch.is_grad_enabled():
        return fsdp_graph_inference(gm)
    boxed = lambda g, ins: make_boxed_func(g.forward)
    return aot_autograd(fw_compiler=boxed, bw_compiler=boxed)(gm, new_inputs)


def fsdp_graph_inference(gm):
    return gm.forward     # no_grad graph: gather in forward, nothing else


def worker(rank, kind):
    torch._dynamo.reset(); COMPILES.clear(); SHARDS.clear(); install_callbacks()
    model = common.make(kind)
    opt = common.make_opt("sgd", model.parameters())
    cm = torch.compile(model, backend=fsdp_backend)
    ref = common.make(kind); ref_opt = common.make_opt("sgd", ref.parameters())
    try:
        for step in range(common.STEPS + 1):
            x, y = common.batch(kind, step)
            if step == common.STEPS:                    # a different batch size: a recompile
                x, y = torch.cat([x, x]), torch.cat([y, y])
            n = x.shape[0] // common.WORLD
            loss = cm(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]); loss.backward()
            opt.step(); opt.zero_grad()
            rl = ref(x, y); rl.backward(); ref_opt.step(); ref_opt.zero_grad()
            l = loss.detach().clone(); dist.all_reduce(l)
            if rank == 0:
                print(f"  step {step} batch {tuple(x.shape)}: loss {l.item() / common.WORLD:.6f} eager {rl.item():.6f}")
        with torch.no_grad():                           # eval: the grad-mode guard fails, a recompile
            x, y = common.batch(kind, 99)
            n = x.shape[0] // common.WORLD
            l = cm(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]).clone(); dist.all_reduce(l)
            if rank == 0:
                print(f"  eval no_grad: loss {l.item() / common.WORLD:.6f} eager {ref(x, y).item():.6f}")
        if rank == 0:
            print(f"[{kind} fix={FIX}] OK, compiles (grad mode, input shapes): {COMPILES}")
            print("  param shapes now:", [tuple(p.shape) for p in model.parameters()][:3])
    except Exception as e:
        if rank == 0:
            print(f"[{kind} fix={FIX}] FAILED after compiles {COMPILES}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        dist.barrier()


if __name__ == "__main__":
    for kind in ("mlp", "block"):
        common.launch(worker, kind)
