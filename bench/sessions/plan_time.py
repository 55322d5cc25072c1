"""By hand (session 26): how long colauto plans one HF model under a budget on this machine's CPU.

    python bench/sessions/plan_time.py llama 22

Builds the model of examples/hf_zoo.py's tiny config with LAYERS layers (default 22), compiles it with
codegen inductor, reads the unplanned predicted peak of its first training graph, then compiles it again
under a budget 3% below that peak, with the plan cache off (COLAUTO_REPORT prints "planned in ... s") and times that first step.
"""
import os
import sys
import time

import torch

# a cached compiled step would plan nothing (and publish no analysis): plan every time
os.environ["COLAUTO_PLAN_CACHE"] = "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from examples import hf_zoo  # noqa: E402
from colauto_backend import backend  # noqa: E402


def main(name: str, layers: int) -> None:
    import transformers
    cfg = hf_zoo.config_of(name, "tiny")
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(cfg, key):
            setattr(cfg, key, layers)
    torch.manual_seed(0)
    model = getattr(transformers, hf_zoo.SPECS[name].model)(cfg).train()
    batch = hf_zoo.build_hf(name, "tiny")[1](4, 128)
    backend.ANALYSES.clear()
    compiled = torch.compile(model, backend="colauto", options={"codegen": "inductor"})
    hf_zoo.loss_of(compiled(**batch)).backward()
    first = next(a for a in backend.ANALYSES if a.planner is not None)
    peak = first.evaluate(first.hints)["peak_memory_bytes"]
    torch._dynamo.reset()
    budget = int(peak * 0.97)
    compiled = torch.compile(model, backend="colauto",
                             options={"codegen": "inductor", "memory_budget": budget, "report": "1"})
    start = time.perf_counter()
    hf_zoo.loss_of(compiled(**batch)).backward()
    print(f"{name}, {layers} layers: first step under {budget} bytes took {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "llama", int(sys.argv[2]) if len(sys.argv) > 2 else 22)
