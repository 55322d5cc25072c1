"""The graph side of FSDP on the captured graph (used by 02_*.py):

- `gather`: shard (1-D, padded chunk of the flattened parameter) -> full parameter; backward: reduce-scatter
  of the full gradient, divided by the world (the ranks' mean, as DDP). An autograd.Function, so
  AOTAutograd's joint graph gets all_gather in the forward and reduce_scatter in the backward.
- `insert_gathers(gm, param_positions, metas)`: before AOTAutograd, each parameter placeholder's uses read
  gather(placeholder) instead: the graph's inputs become the shards, everything after is the captured graph.
"""
import math, torch, torch.fx as fx
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, shape, numel, group_name, world):
        ctx.meta = (shape, numel, group_name, world)
        full = funcol.all_gather_tensor(shard, 0, group_name)       # [world*chunk]
        full = funcol.wait_tensor(full) if hasattr(funcol, "wait_tensor") else full
        return full[:numel].view(shape)

    @staticmethod
    def backward(ctx, g):
        shape, numel, group_name, world = ctx.meta
        flat = g.reshape(-1)
        chunk = -(-numel // world)
        flat = torch.nn.functional.pad(flat, (0, chunk * world - numel))
        rs = funcol.reduce_scatter_tensor(flat, "sum", 0, group_name)
        rs = funcol.wait_tensor(rs) if hasattr(funcol, "wait_tensor") else rs
        return rs / world, None, None, None, None


def gather(shard, shape, numel, group_name, world):
    return _Gather.apply(shard, shape, numel, group_name, world)


def shard_of(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    chunk = -(-flat.numel() // world)
    flat = torch.nn.functional.pad(flat, (0, chunk * world - flat.numel()))
    return flat[rank * chunk:(rank + 1) * chunk].clone()


def unshard(shard: torch.Tensor, shape, world: int) -> torch.Tensor:
    out = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(out, shard.detach().contiguous())
    return torch.cat(out)[:math.prod(shape)].view(shape)


def insert_gathers(gm: fx.GraphModule, positions, metas, group_name, world):
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in positions:
        node = placeholders[i]
        shape, numel = metas[i]
        with gm.graph.inserting_after(node):
            g = gm.graph.call_function(gather, (node, tuple(shape), numel, group_name, world))
        node.replace_all_uses_with(g, delete_user_cb=lambda u: u is not g)
        node.meta.pop("example_value", None); node.meta.pop("val", None)
    gm.graph.lint(); gm.recompile()
    return gm


# ---- dim-0 sharding (torch.chunk semantics, as FSDP2 / DTensor Shard(0)): the local shard is a plain row block,
# so state_dict() can show it as a DTensor (Shard(0), uneven last shard allowed) that views the Parameter's storage
def rows_of(n: int, rank: int, world: int) -> tuple[int, int]:
    chunk = -(-n // world)
    start = min(rank * chunk, n)
    return start, min(start + chunk, n) - start


def shard0_of(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    start, length = rows_of(t.shape[0], rank, world)
    return t.detach().narrow(0, start, length).clone()


class _Gather0(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, shape, group_name, world):
        ctx.meta = (shape, group_name, world)
        chunk = -(-shape[0] // world)
        padded = torch.nn.functional.pad(shard, [0, 0] * (shard.dim() - 1) + [0, chunk - shard.shape[0]])
        full = funcol.wait_tensor(funcol.all_gather_tensor(padded, 0, group_name))
        return full.narrow(0, 0, shape[0])

    @staticmethod
    def backward(ctx, g):
        shape, group_name, world = ctx.meta
        chunk = -(-shape[0] // world)
        padded = torch.nn.functional.pad(g, [0, 0] * (g.dim() - 1) + [0, chunk * world - shape[0]])
        rs = funcol.wait_tensor(funcol.reduce_scatter_tensor(padded.contiguous(), "sum", 0, group_name))
        start, length = rows_of(shape[0], dist.get_rank(), world)
        return rs.narrow(0, 0, length) / world, None, None, None


def gather0(shard, shape, group_name, world):
    return _Gather0.apply(shard, shape, group_name, world)


def insert_gathers0(gm: fx.GraphModule, positions, shapes, group_name, world):
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in positions:
        node = placeholders[i]
        with gm.graph.inserting_after(node):
            g = gm.graph.call_function(gather0, (node, tuple(shapes[i]), group_name, world))
        node.replace_all_uses_with(g, delete_user_cb=lambda u: u is not g)
        node.meta.pop("example_value", None); node.meta.pop("val", None)
    gm.graph.lint(); gm.recompile()
    return gm
