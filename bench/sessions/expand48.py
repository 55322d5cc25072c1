"""explain --devices with and without layer expansion (parallel/entry.plan_model), on the HF zoo's families built
with LAYERS layers: the same plan (mesh, placements) and the same predicted figures for every candidate mesh?

    PYTHONPATH=. COLAUTO_PLAN_CACHE=0 python bench/sessions/expand48.py [family ...] > out.json
"""
import json
import math
import sys
import time

import torch
import transformers

from colauto_backend import config as cfg
from colauto_backend.parallel import entry
from examples.hf_zoo import SPECS, build_hf, config_of

LAYERS, DEVICES, B, T = 7, 8, 2, 16
KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "encoder_layers", "decoder_layers",
        "n_layers")
FIGURES = ("step_time_s", "compute_s", "comm_s", "recompute_s", "optimizer_s", "memory_bytes", "state_bytes")


def model_of(name: str):
    config = config_of(name)
    for key in KEYS:
        if isinstance(getattr(config, key, None), int):
            setattr(config, key, LAYERS)
    if isinstance(getattr(config, "layer_types", None), list):    # one type a layer, in the tiny spec's pattern
        pattern = config.layer_types
        config.layer_types = [pattern[i % len(pattern)] for i in range(LAYERS)]
    torch.manual_seed(0)
    tiny, make = build_hf(name)
    try:
        model = getattr(transformers, SPECS[name].model)(config).train()
    except (IndexError, ValueError):   # a config whose layer count other lists follow (ConvNeXt's stages)
        model = tiny
    return model, make(B, 32 if SPECS[name].kind == "image" else T)


def close(a, b) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-15)


def compare(name: str) -> dict:
    model, batch = model_of(name)
    row = {"family": name}
    plans = {}
    refused = dict(entry.NOT_EXPANDED)
    for expand in (True, False):
        torch._dynamo.reset()
        start = time.perf_counter()
        plans[expand] = entry.plan_model(model, (), cfg.load({}), DEVICES, batch, expand=expand)
        row["expanded_s" if expand else "whole_s"] = round(time.perf_counter() - start, 2)
    a, b = plans[True], plans[False]
    row["expanded"] = "traced_layers" in a.predicted
    row["not_expanded_because"] = [why for why, n in entry.NOT_EXPANDED.items() if n > refused.get(why, 0)]
    row["mesh"] = [a.mesh_str, b.mesh_str]
    row["same_placements"] = a.storage == b.storage and a.compute == b.compute and a.layer_places == b.layer_places
    diffs = []
    for ca, cb in zip(a.predicted["candidates"], b.predicted["candidates"]):
        for k in FIGURES:
            if ca["mesh"] != cb["mesh"] or not close(ca[k], cb[k]):
                diffs.append(f"{ca['mesh']} {k}: {ca[k]} vs {cb[k]}")
    row["figure_differences"] = diffs
    row["same"] = a.mesh_str == b.mesh_str and row["same_placements"] and not diffs
    return row


if __name__ == "__main__":
    rows = []
    for name in sys.argv[1:] or list(SPECS):
        try:
            rows.append(compare(name))
        except Exception as exc:  # noqa: BLE001 - a row per family
            rows.append({"family": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1))
