"""The benchmark harness runs end to end on a tiny model and writes its results."""
import json
import math

from bench import run


def test_bench_tiny_matrix(tmp_path):
    run.main(["--models", "gpt2:tiny:2:32", "--modes", "eager,colauto", "--steps", "2", "--warmup", "1",
              "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == 2
    assert all(r["error"] is None and math.isfinite(r["tokens_per_s"]) for r in rows), rows
    (colauto,) = [r for r in rows if r["mode"] == "colauto"]
    assert colauto["pred_peak_bytes"] > 0
    assert (tmp_path / "results.md").exists()


def test_bench_predicts_an_hf_model_from_its_compiled_graph(tmp_path):
    """An HF model (keyword inputs) gets its prediction from the graph the step compiled: a peak of at
    least its fp32 parameters, gradients and AdamW state (16 bytes a parameter), and a step time."""
    run.main(["--models", "hf/llama:tiny:2:32", "--modes", "colauto-aten", "--steps", "2", "--warmup", "1",
              "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["error"] is None, row
    assert row["pred_source"] == "the compiled training graph"
    assert row["pred_peak_bytes"] >= 16 * row["params"], (row["pred_peak_bytes"], row["params"])
    assert row["pred_step_time_s"] > 0


def test_dist_compare_profile_without_cuda_is_a_one_line_error(tmp_path):
    """--profile times kernels: on a machine without CUDA it stops before any process group starts."""
    import subprocess
    import sys
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a machine with CUDA profiles")
    proc = subprocess.run([sys.executable, "-m", "bench.dist_compare", "--profile", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("dist_compare.py: error: --profile needs CUDA (it times kernels); "
                                                    "run without it on a machine without a GPU")


def test_predicted_breakdown_equals_a_static_capture_at_the_same_size():
    """bench.predicted_breakdown captures at a small size with dynamic shapes and evaluates at the asked
    size; its kinds add up to the step, which equals profile() of a static capture at that size (bf16
    autocast, the same preset and codegen), to a kernel launch or two."""
    import torch

    import colauto_backend
    from bench import predicted_breakdown
    from examples.hf_zoo import build_hf
    got = predicted_breakdown.predict("hf/llama:tiny", 4, 48, "h200")
    assert got["graphs"] == 1 and got["attention"] > 0 and got["matmul"] > 0 and "caution" not in got
    parts = sum(v for k, v in got.items() if k not in ("step", "graphs", "caution"))
    assert math.isclose(parts, got["step"], rel_tol=1e-9), (parts, got)
    model, make = build_hf("llama", "tiny")
    with torch.autocast("cpu", torch.bfloat16):
        prof = colauto_backend.profile(model, kwargs=make(4, 48),
                                       options={"device": "h200", "codegen": "inductor", "memory_budget": "none"})
    # the dynamic-shape graph may hold a kernel or two more (ops on the scalars Dynamo passes as inputs)
    launch = colauto_backend.cost.device.PRESETS["h200"].launch_s
    assert abs(got["step"] - prof.est_step_time_s) <= 2 * launch + 1e-12, (got["step"], prof.est_step_time_s)


def test_attention_presets_are_the_fit_of_the_committed_profiles():
    """The h100/h200 presets' attention model is what bench.attention_fit computes from the profiles under
    bench/results (least squares over the runs without dropout; the dropout runs' geometric-mean ratio), and
    the model's time is within 10% of all but one of those runs."""
    from bench import attention_fit
    from colauto_backend.cost.device import PRESETS
    points = attention_fit.runs()
    assert sum(not p["dropout"] for p in points) >= 14 and any(p["dropout"] for p in points)
    rate, overhead = attention_fit.fit(points)
    for name in ("h100", "h200"):
        spec = PRESETS[name]
        assert (spec.attention_flops, spec.attention_key_overhead) == (rate, overhead), (
            "a profile committed under bench/results moved the fit: run `python -m bench.attention_fit` and "
            "set its R and c in colauto_backend/cost/device.py")
    assert round(attention_fit.dropout_factor(points, rate, overhead), 2) == PRESETS["h200"].attention_dropout_factor
    errors = [abs(p["rate"] / attention_fit.model_rate(p, rate, overhead) - 1) for p in points if not p["dropout"]]
    assert sum(e > 0.10 for e in errors) <= 1, errors


def test_remat_sweep_replot_merges_the_committed_sweeps(tmp_path):
    """`python -m bench.remat_sweep --replot` (the command in bench/results/h200-2026-12-06-remat-sweep/README.md)
    runs nothing: it merges the per-model sweep.json files into one table, the same rows in the same order,
    and names for each colauto point the best Inductor throughput at an equal or lower measured peak."""
    import glob
    import os
    from bench import remat_sweep
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results",
                        "h200-2026-12-06-remat-sweep")
    sources = sorted(glob.glob(os.path.join(root, "*", "sweep.json")))
    assert len(sources) == 6
    assert remat_sweep.main(["--out", str(tmp_path), "--replot", *sources]) == 0
    lines = (tmp_path / "sweep.md").read_text().splitlines()
    rows = [r for src in sources for r in json.load(open(src))["rows"]]
    assert len(lines) == 2 + len(rows)
    for line, r in zip(lines[2:], rows):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2:4] == [r["system"], str(r["setting"])], (line, r)
        assert cells[4] == f"{r['tokens_per_s']:,.0f}"
        rival = [x["tokens_per_s"] for x in rows if x["system"] == "inductor" and x["model"] == r["model"]
                 and x["size"] == r["size"] and x["peak_bytes"] <= r["peak_bytes"]]
        if r["system"] == "colauto":   # by hand: the best Inductor point at or below this peak, or none
            assert cells[10] == (f"{max(rival):,.0f}" if rival else ""), (line, rival)
            # the compiled code's peak as the sweep ran the step (sweeps before 2026-12-07: as the plan assumes)
            code = r.get("compiled_dropped_bytes") or r.get("compiled_peak_bytes")
            assert cells[8] == (f"{code / 2**30:.2f}" if code else ""), (line, code)
