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
