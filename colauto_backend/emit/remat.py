"""Recompute decisions -> `node.meta['recompute']` tags -> torch's partitioner.

A decided forward node gets MUST_SAVE (kept) or MUST_RECOMPUTE, all under one `ac_graph_id`.
- aten codegen: every node is decided and `default_partition` saves exactly the kept nodes that backward
  (or a recomputed node) reads and recomputes the rest. Tagging every node avoids that partitioner's rule
  that an untagged producer of a recomputed node is force-saved.
- Inductor codegen: a candidate decides either only the compute-bound nodes or every node the DP
  decided (None = untagged); Inductor's min-cut partitioner decides the untagged ones.
- Triton codegen: planned as aten (every node of a candidate decided), but partitioned by the min-cut
  partitioner, which honours every tag, so that the unplanned partition recomputes cheap ops as
  Inductor's does (generated kernels fuse them as Inductor's do).
A node the plan may not recompute (a random op, SDPA included; an op reading a module buffer) is tagged
MUST_SAVE under every codegen, kept or not: min-cut forces a MUST_RECOMPUTE node into the backward even
where backward reads only its saved getitems (planner.plan).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from .. import _torch_compat as compat


def tag(joint: fx.Graph, names: Sequence[str], keep: Sequence[bool | None]) -> None:
    """Tag the named nodes (by name: Inductor's partitioner replaces the joint graph by a CSE'd copy on
    every call, so node objects do not survive a partition)."""
    untag(joint)
    decided = dict(zip(names, keep))
    for n in joint.nodes:
        k = decided.get(n.name)
        if k is None:
            continue
        n.meta["recompute"] = CheckpointPolicy.MUST_SAVE if k else CheckpointPolicy.MUST_RECOMPUTE
        n.meta["ac_graph_id"] = 0


def untag(joint: fx.Graph) -> None:
    for n in joint.nodes:
        n.meta.pop("recompute", None)
        n.meta.pop("ac_graph_id", None)


def partitioner(fused: bool) -> Callable:   # fused: Inductor or Triton kernels run the graphs
    """(joint, joint_inputs, *, num_fwd_outputs, static_lifetime_input_indices) -> (fw, bw) for the tags
    currently on the joint graph. Untagged: aten saves everything backward needs; Inductor's min-cut
    recomputes the fusible ops it finds cheap (exactly torch.compile's default partition)."""
    return compat.min_cut_partition if fused else compat.default_partition
