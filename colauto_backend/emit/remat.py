"""Recompute decisions -> `node.meta['recompute']` tags -> torch's partitioner.

Every forward node of the problem gets MUST_SAVE (kept) or MUST_RECOMPUTE, all under one
`ac_graph_id`, so `default_partition` saves exactly the kept nodes that backward (or a recomputed
node) reads and recomputes the rest in the backward graph. Tagging every node avoids the
partitioner's rule that an untagged producer of a recomputed node is force-saved.
"""
from __future__ import annotations

from typing import Sequence

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from .. import _torch_compat as compat


def tag(nodes: Sequence[fx.Node], keep: Sequence[bool]) -> None:
    for n, k in zip(nodes, keep):
        n.meta["recompute"] = CheckpointPolicy.MUST_SAVE if k else CheckpointPolicy.MUST_RECOMPUTE
        n.meta["ac_graph_id"] = 0


def untag(nodes: Sequence[fx.Node]) -> None:
    for n in nodes:
        n.meta.pop("recompute", None)
        n.meta.pop("ac_graph_id", None)


def partition(joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, static_lifetime_input_indices):
    """The forward and backward graphs for the tags currently on `joint` (none: save everything needed)."""
    return compat.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                    static_lifetime_input_indices=static_lifetime_input_indices)
