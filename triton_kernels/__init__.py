"""Colauto's Triton kernels, generated from FX regions of aten ops (issue 4 of 4).

`compile_region(graph, example_inputs)` turns a region (a chain or DAG of pointwise aten ops, optionally
with last-dim reductions: softmax, LayerNorm, RMSNorm and their backwards, and the views, reshapes,
[un]squeezes and expands between them) into one Triton kernel and returns a callable. Kernels are
cached on disk (see cache). Without a GPU they run in Triton's interpreter; where Triton cannot run,
`available()` is falsy with the reason and callers use aten.
"""
from .cache import cache_stats
from .compile import FusedRegion, available, check, compile_region, example, interpreting
from .ir import NotFusible
from .region import RULES
from .tuning import Tuning

__all__ = ["FusedRegion", "NotFusible", "RULES", "Tuning", "available", "cache_stats", "check", "compile_region", "example",
           "interpreting"]
