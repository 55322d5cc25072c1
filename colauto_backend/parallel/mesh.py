"""The device mesh: process-group start-up under torchrun, COLAUTO_MESH checks, and the candidate meshes.

An axis has a role: `dp` (parameters replicated, gradients all-reduced), `fsdp` (parameters sharded on
dim 0, gathered before use, gradients reduce-scattered) or `tp` (Megatron tensor parallel). Every axis
splits the batch: each rank feeds its own micro-batch, as with DDP.
"""
from __future__ import annotations

import itertools
import math
import os

import torch
import torch.distributed as dist

from ..config import ROLES, ConfigError

Axes = tuple[tuple[str, int], ...]          # ((role, size), ...), outermost axis first


def world_size() -> int:
    """Ranks in the job: the process group's, else torchrun's WORLD_SIZE, else 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def ensure_process_group() -> None:
    """Start the default process group if the script did not (NCCL on CUDA, gloo on CPU)."""
    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ:
        raise RuntimeError("colauto: several ranks but no rendezvous address (MASTER_ADDR): launch with torchrun")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")


def candidates(spec: tuple[tuple[str | None, int], ...] | None, world: int) -> list[Axes]:
    """The meshes the planner may choose from: COLAUTO_MESH's, with its unnamed axes given every role;
    unset, every factorization of the world size into up to 3 axes of distinct roles."""
    if spec is not None:
        sizes = [s for _, s in spec]
        if math.prod(sizes) != world:
            raise ConfigError(f"COLAUTO_MESH={'x'.join(map(str, sizes))} has {math.prod(sizes)} devices but the job has "
                              f"{world} ranks: make the product of the axis sizes equal the world size")
        named = {r for r, _ in spec if r}
        free = [r for r in ROLES if r not in named]
        out = []
        for roles in itertools.permutations(free, sum(r is None for r, _ in spec)):
            it = iter(roles)
            out.append(tuple((r or next(it), s) for r, s in spec))
        return sorted({_canonical(a) for a in out}, key=str)
    out = []
    for n in (1, 2, 3):
        for sizes in _factorizations(world, n):
            for roles in itertools.permutations(ROLES, n):
                out.append(_canonical(tuple(zip(roles, sizes))))
    return sorted(set(out), key=str)


def _canonical(axes: Axes) -> Axes:
    """Drop size-1 axes; tp innermost (neighbouring ranks: the fastest links), dp outermost."""
    kept = [(r, s) for r, s in axes if s > 1] or [("dp", 1)]
    return tuple(sorted(kept, key=lambda a: ROLES.index(a[0])))


def _factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(n,)] if n > 1 else []
    return [(d,) + rest for d in range(2, n + 1) if n % d == 0 for rest in _factorizations(n // d, parts - 1)]


def device_mesh(axes: Axes):
    from torch.distributed.device_mesh import init_device_mesh
    from .. import _torch_compat as compat
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    built = init_device_mesh(kind, tuple(s for _, s in axes), mesh_dim_names=tuple(r for r, _ in axes))
    # a gradient replicated over several axes (dp and tp) is reduced by one collective over their
    # flattened group, not one per axis in sequence (DTensor uses a flattened mesh where one exists)
    compat.flatten_mesh_axes(built)
    return built
