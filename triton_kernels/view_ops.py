"""View-like aten ops -> `view` and `expand` instructions (rule signature as in pointwise_ops).

A view (view, _unsafe_view, reshape, unsqueeze, squeeze) keeps a value's elements in row-major order
under a new shape; expand broadcasts it to a larger one. Neither computes anything: both take the
shape of the node's output, and views.flatten rewrites them away before a kernel is planned (see there
for how values of different shapes share one kernel).
"""
from __future__ import annotations

import torch

from .ir import Builder, Operand, Ref

aten = torch.ops.aten

RULES: dict = {}


def _reshaped(prim: str):
    def rule(b: Builder, out, x: Operand, *args, **kwargs):
        if not isinstance(x, Ref):
            return x                  # a folded 0-dim constant broadcasts whatever its shape
        shape = tuple(out.shape)
        return b.op(prim, x, dtype=out.dtype, shape=shape, size=shape)
    return rule


for _target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
                aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default):
    RULES[_target] = _reshaped("view")
RULES[aten.expand.default] = _reshaped("expand")
