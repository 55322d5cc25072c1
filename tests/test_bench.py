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
