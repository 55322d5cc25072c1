"""The recommended mechanism end to end, with dim-0 shards (Shard(0), uneven allowed, as FSDP2) so that
state_dict() can show each Parameter as a DTensor viewing the shard's storage, and load_state_dict /
torch.distributed.checkpoint load into it in place. Guards as in 02/03 (TENSOR_MATCH -> ID_MATCH, full-shape
stand-ins while Dynamo traces). Run: python 06_dim0_shards_state_dict.py"""
import torch, torch.nn as nn
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.guards import GuardBuilder
from torch._guards import TracingContext
from torch.utils.weak import WeakIdKeyDictionary
from functorch.compile import make_boxed_func
import common, fsdp_graph

SHARDS = WeakIdKeyDictionary()          # sharded Parameter -> (full shape, full stride)
STASH = WeakIdKeyDictionary()           # while Dynamo traces: sharded Parameter -> its shard (its real .data)


def local_of(p):
    return STASH.get(p, p.data)


def _standins_on(*args):
    trigger = getattr(args[0], "callback_trigger", None) if args else None
    if trigger is not None and trigger.name != "DYNAMO":
        return
    with torch.no_grad():
        for p, (shape, stride) in SHARDS.items():
            if p in STASH:
                continue
            STASH[p] = shard = p.data            # whatever the shard is now (the user may have cast it)
            stand = torch.empty_strided(shape, stride, dtype=shard.dtype, device=shard.device)
            stand.untyped_storage().resize_(0)
            p.data = stand


def _standins_off(*args):
    with torch.no_grad():
        for p in list(STASH.keys()):
            p.data = STASH.pop(p)


def install_callbacks():
    if _standins_on not in torch._dynamo.callback_handler.start_callbacks:
        torch._dynamo.callback.on_compile_start(_standins_on)
        torch._dynamo.callback.on_compile_end(_standins_off)


def fsdp_backend(gm, example_inputs):
    world, rank = dist.get_world_size(), dist.get_rank()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tc = TracingContext.get()
    positions, shapes, new_inputs = [], {}, list(example_inputs)
    for i, (node, t) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(t, nn.Parameter):
            continue
        source = node.meta["grapharg"].source
        tc.guards_context.dynamo_guards.remove_guards_with_source(source)
        tc.guards_context.dynamo_guards.add(source.make_guard(GuardBuilder.ID_MATCH))
        positions.append(i); shapes[i] = tuple(t.shape)
        if t not in SHARDS:
            with torch.no_grad():
                dist.broadcast(t.data, 0)
                SHARDS[t] = (tuple(t.shape), t.stride())
                shard = fsdp_graph.shard0_of(t.data, rank, world)
                if t in STASH:
                    STASH[t] = shard                 # restored when the compile ends
                else:
                    t.data = shard
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            stand_in = nn.Parameter(torch.empty_like(local_of(t)), requires_grad=t.requires_grad)
        new_inputs[i] = tc.fake_mode.from_tensor(stand_in, static_shapes=True)
    fsdp_graph.insert_gathers0(gm, positions, shapes, dist.group.WORLD.group_name, world)
    boxed = lambda g, ins: make_boxed_func(g.forward)
    return aot_autograd(fw_compiler=boxed, bw_compiler=boxed)(gm, new_inputs)


def dtensor_state_dict_hook(mesh):
    """state_dict post-hook: each sharded Parameter's entry as a DTensor viewing its shard (no copy)."""
    def hook(module, state_dict, prefix, local_metadata):
        for fqn, p in list(module.named_parameters()):
            key = prefix + fqn
            if key in state_dict and p in SHARDS:
                shape, stride = SHARDS[p]
                state_dict[key] = DTensor.from_local(state_dict[key], mesh, [Shard(0)], run_check=False,
                                                     shape=torch.Size(shape), stride=stride)
        return state_dict
    return hook


def worker(rank, kind):
    torch._dynamo.reset(); SHARDS.clear(); STASH.clear(); install_callbacks()
    mesh = init_device_mesh("cpu", (common.WORLD,))
    model = common.make(kind)
    opt = common.make_opt("adamw", model.parameters())
    model._register_state_dict_hook(dtensor_state_dict_hook(mesh))
    cm = torch.compile(model, backend=fsdp_backend)
    losses = []
    for step in range(common.STEPS):
        x, y = common.batch(kind, step)
        n = x.shape[0] // common.WORLD
        loss = cm(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]); loss.backward()
        opt.step(); opt.zero_grad()
        l = loss.detach().clone(); dist.all_reduce(l); losses.append(l.item() / common.WORLD)
    # recompiles after sharding (a new batch size; eval under no_grad) re-trace with full-shape stand-ins
    x, y = common.batch(kind, 7); x, y = torch.cat([x, x]), torch.cat([y, y]); n = x.shape[0] // common.WORLD
    l2 = cm(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]).detach().clone(); dist.all_reduce(l2)
    with torch.no_grad():
        l3 = cm(x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]).clone(); dist.all_reduce(l3)
    opt.zero_grad()
    sd = model.state_dict()
    full = {k: v.full_tensor() for k, v in sd.items() if isinstance(v, DTensor)}
    shares = all(sd[k].to_local().untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
                 for k, p in model.named_parameters())
    # load_state_dict in place through the DTensor view: set everything to 1 and check p's shard changed
    ones = {k: DTensor.from_local(torch.ones_like(v.to_local()), mesh, [Shard(0)], run_check=False,
                                  shape=v.shape, stride=v.stride()) for k, v in sd.items()}
    for k, v in sd.items():
        v.to_local().copy_(ones[k].to_local())          # what DCP's in-place load does to the state_dict's tensors
    loaded = all(bool((p == 1).all()) for p in model.parameters())
    if rank == 0:
        ref_losses, ref_params = common.eager_reference(kind, "adamw")
        err = max((full[k] - ref_params[k]).abs().max().item() for k in ref_params)
        print(f"[{kind} dim-0 shards] losses {['%.6f' % l for l in losses]}  eager {['%.6f' % l for l in ref_losses]}")
        print(f"  local shapes {[tuple(p.shape) for p in model.parameters()][:4]}, state_dict types {sorted({type(v).__name__ for v in sd.values()})}")
        with torch.no_grad():
            ref = common.make(kind); ref.load_state_dict(ref_params); r2 = ref(x, y).item()
        print(f"  after recompiles: batch {tuple(x.shape)} loss {l2.item() / 2:.6f}, no_grad {l3.item() / 2:.6f}, eager {r2:.6f}")
        print(f"  state_dict full_tensor vs eager params: max err {err:.2e}; DTensor local shares p's storage: {shares}; "
              f"in-place load reaches p: {loaded}")


if __name__ == "__main__":
    for kind in ("mlp", "block"):
        common.launch(worker, kind)
