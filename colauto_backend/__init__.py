"""colauto: a torch.compile backend that plans parallelism and recomputation from a symbolic cost model.

    torch.compile(model, backend="colauto")           # found through the torch_dynamo_backends entry point
    colauto_backend.profile(model, *example_inputs)   # the cost model, without running the model
    colauto_backend.explain(model, *example_inputs, mesh="2x4", device="h100")   # a parallel plan, offline
    colauto_backend.clip_grad_norm_(model.parameters(), 1.0)   # torch's, also for parameters sharded in place

A bad setting raises ConfigError, a memory budget nothing fits BudgetError: one line each, reaching the
caller of the compiled model as themselves (not wrapped by Dynamo), so `except colauto_backend.ConfigError`.
"""
from .backend import colauto
from .config import Config, ConfigError
from .output_grads import UnusedGradError
from .parallel.fsdp import clip_grad_norm_
from .parallel.plan import ParallelPlan
from .planner import BudgetError, Plan
from .profile import Profile, explain, profile

__all__ = ["colauto", "profile", "explain", "Profile", "Plan", "ParallelPlan", "Config", "ConfigError", "BudgetError",
           "UnusedGradError",
           "clip_grad_norm_"]
