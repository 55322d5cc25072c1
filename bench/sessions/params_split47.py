"""Session 47 (2026-12-08): a step split inside a repeated layer where the parameters weigh. HF Llama (tiny
config, 6 decoder layers, random weights, fp32, AdamW) broken after its first layer (`bench.cpu_peak.graph_break`
"layer": one graph runs for each layer, the embedding runs eagerly), 2 x 64 tokens, codegen aten. Budgets: 0.9,
0.7, 0.5 of the way from the parameters, gradients and AdamW's moments (4 x the parameters' bytes) to the
unbudgeted step's measured peak. Measured: the CPU allocator's events in the third step
(`bench.cpu_peak.measured_step`). One JSON line per point on stdout.

    PYTHONPATH=. COLAUTO_PLAN_CACHE=0 python bench/sessions/params_split47.py
"""
import json
import warnings

from bench import cpu_peak
from colauto_backend import split_step

COUNTS = {"short": split_step.SHORT, "replanned": split_step.REPLANNED, "unheld": split_step.UNHELD}


def main() -> None:
    model, make = cpu_peak.broken_hf("llama", "layer", layers=6)
    batch = make(2, 64)
    base, _ = cpu_peak.measured_step(model, batch, {"codegen": "aten"})
    held = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"fraction": None, "measured_bytes": base, "held_bytes": held}), flush=True)
    for fraction in (0.9, 0.7, 0.5):
        budget = int(held + fraction * (base - held))
        before = {k: sum(c.values()) for k, c in COUNTS.items()}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            measured, _ = cpu_peak.measured_step(model, batch, {"codegen": "aten", "memory_budget": budget})
        print(json.dumps({"fraction": fraction, "budget_bytes": budget, "measured_bytes": measured,
                          "over": measured > budget,
                          "split": {k: sum(c.values()) - before[k] for k, c in COUNTS.items()},
                          "warned_not_held": sorted({str(w.message)[:160] for w in seen
                                                     if "not held" in str(w.message)})}), flush=True)


if __name__ == "__main__":
    main()
