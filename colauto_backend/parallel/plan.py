"""The parallel plan: the mesh, each parameter's placement on it, and what the plan predicts.

Placements are strings so a plan is JSON and hashable across ranks: "R" replicated, "S0"/"S1" sharded
on that tensor dim. `storage` is what a rank holds; `compute` is what the graph uses (an fsdp axis
gathers before use: its gradient is reduce-scattered back to the storage placement). `tp_modules`
pins the activations of tensor parallelism: a column module's input is gathered over tp, a row
module's partial-sum output reduce-scattered back to batch shards (Megatron with sequence parallelism,
along the batch dim).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from .mesh import Axes


@dataclasses.dataclass(frozen=True)
class ParallelPlan:
    axes: Axes
    storage: dict[str, tuple[str, ...]]       # parameter/buffer fqn -> placement per mesh axis
    compute: dict[str, tuple[str, ...]]
    tp_modules: dict[str, str] = dataclasses.field(default_factory=dict)   # module fqn -> "col" | "row"
    # where some layer computes on the tp group's whole batch ("R", redundantly over tp): the placement
    # of every layer emission moves ("S": batch-sharded over tp), in the model's order; empty otherwise
    layer_places: dict[str, str] = dataclasses.field(default_factory=dict)
    predicted: dict = dataclasses.field(default_factory=dict, compare=False)   # step time, memory, comm

    @property
    def tensor_parallel(self) -> bool:
        """Some layer runs tensor-parallel or has its activations placed over tp."""
        return bool(self.tp_modules or self.layer_places)

    @property
    def data_parallel_only(self) -> bool:
        """Every parameter replicated everywhere and no tensor parallelism: each rank runs the whole
        graph on its micro-batch, whatever the axes are called (an fsdp axis that shards nothing is dp)."""
        return not self.tensor_parallel and all(p == "R" for spec in self.storage.values() for p in spec)

    @property
    def mesh_str(self) -> str:
        return ",".join(f"{r}={s}" for r, s in self.axes)

    def digest(self) -> str:
        """Same on every rank iff the ranks will run the same program."""
        body = json.dumps({"axes": self.axes, "storage": sorted(self.storage.items()),
                           "compute": sorted(self.compute.items()), "tp": sorted(self.tp_modules.items()),
                           "places": sorted(self.layer_places.items())})
        return hashlib.sha1(body.encode()).hexdigest()[:16]

    def local_shape(self, fqn: str, shape: tuple[int, ...], coord: tuple[int, ...],
                    compute: bool = False) -> tuple[int, ...]:
        """The shard of a tensor of `shape` that the rank at mesh coordinate `coord` holds (or uses, with
        `compute`): torch.chunk sizes, ceil(n / parts) per piece, the last pieces smaller or empty."""
        return shard_shape(self.axes, (self.compute if compute else self.storage)[fqn], shape, coord)

    def to_json(self) -> dict:
        return {"mesh": self.mesh_str, "digest": self.digest(), "data_parallel_only": self.data_parallel_only, "storage": self.storage,
                "compute": self.compute, "tp_modules": self.tp_modules, "layer_places": self.layer_places,
                "predicted": self.predicted}


def shard_shape(axes: Axes, spec: tuple[str, ...], shape: tuple[int, ...], coord: tuple[int, ...]) -> tuple[int, ...]:
    """The piece of a tensor of `shape` with placements `spec` at mesh coordinate `coord` (torch.chunk)."""
    out = list(shape)
    for (_, size), place, idx in zip(axes, spec, coord):
        if place.startswith("S"):
            d = int(place[1:])
            piece = math.ceil(out[d] / size)
            out[d] = max(0, min(piece, out[d] - piece * idx))
    return tuple(out)
