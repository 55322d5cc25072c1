"""Each mode against Inductor's default, from the bench.run folders under DIR: summary.md and summary.png.

    python -m bench.compare bench/results/h200-2026-11-26-hf-suite

A mode's row is compared only with the Inductor row of the same model in the same results.json (one
launch on one machine), never across launches.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

GiB = 2 ** 30


def rows_of(folder: Path) -> list[dict]:
    """Every row with the Inductor baseline of its own launch: (model, mode, tokens/s, ratio, peak...)."""
    out = []
    for path in sorted(folder.glob("*/results.json")) + sorted(folder.glob("results.json")):
        data = json.loads(path.read_text())
        env, rows = data["environment"], data["rows"]
        inductor = [r for r in rows if r["mode"] == "inductor" and not r["error"]]
        for i, r in enumerate(rows):
            # the Inductor row of the same model run last before this one (a repeat has its own), else any
            before = [b for b in inductor if b["model"] == r["model"] and rows.index(b) < i]
            b = before[-1] if before else next((b for b in inductor if b["model"] == r["model"]), None)
            out.append(dict(
                launch=str(path.parent.relative_to(folder)) or ".", model=r["model"].removeprefix("hf/"),
                params=r.get("params"), batch=r["batch"], seq=r["seq"], mode=r["mode"], codegen=r.get("codegen"),
                error=r["error"], tokens_per_s=r.get("tokens_per_s"), peak_gib=(r.get("peak_bytes") or 0) / GiB,
                first_step_s=r.get("warmup_s"), device=env["device"], torch=env["torch"],
                ratio=(r["tokens_per_s"] / b["tokens_per_s"]) if b and not r["error"] else None,
                peak_vs_inductor_gib=((r["peak_bytes"] - b["peak_bytes"]) / GiB)
                if b and not r["error"] and r.get("peak_bytes") else None))
    return out


def markdown(rows: list[dict]) -> str:
    head = ["model", "params", "B", "T", "mode", "tokens/s", "vs Inductor", "peak GiB", "peak - Inductor's",
            "first step s", "launch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["error"]:
            cells = [r["model"], "", str(r["batch"]), str(r["seq"]), r["mode"], "FAILED: " + r["error"][:120]] + [""] * 4
        else:
            cells = [r["model"], f"{(r['params'] or 0) / 1e9:.2f}B", str(r["batch"]), str(r["seq"]), r["mode"],
                     f"{r['tokens_per_s']:,.0f}", "" if r["ratio"] is None else f"{r['ratio']:.3f}",
                     f"{r['peak_gib']:.2f}",
                     "" if r["peak_vs_inductor_gib"] is None else f"{r['peak_vs_inductor_gib']:+.2f}",
                     f"{r['first_step_s']:.1f}"]
        lines.append("| " + " | ".join(cells + [r["launch"]]) + " |")
    ratios: dict[str, list[float]] = {}
    for r in rows:
        if r["ratio"] is not None and r["mode"] != "inductor":
            ratios.setdefault(r["mode"], []).append(r["ratio"])
    lines.append("")
    for mode, rs in ratios.items():
        lines.append(f"- {mode}: {len(rs)} rows, tokens/s vs Inductor median {statistics.median(rs):.3f}, "
                     f"min {min(rs):.3f}, max {max(rs):.3f}")
    devices = sorted({f"{r['device']} (torch {r['torch']})" for r in rows})
    lines.append(f"- measured on {', '.join(devices)}")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: skipped the PNG plot"
    pts = [r for r in rows if r["ratio"] is not None and r["mode"] != "inductor"]
    modes = list(dict.fromkeys(r["mode"] for r in pts))
    models = list(dict.fromkeys(r["model"] for r in pts))
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(models) * max(1, len(modes)) / 2 + 4), 4.5))
    width = 0.8 / max(1, len(modes))
    for j, mode in enumerate(modes):
        xs = [models.index(r["model"]) + j * width for r in pts if r["mode"] == mode]
        ax.bar(xs, [r["ratio"] for r in pts if r["mode"] == mode], width, label=mode)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))], models, rotation=30, ha="right")
    ax.set_ylabel("tokens/s / Inductor's (same launch)")
    lo = min(r["ratio"] for r in pts) if pts else 0.9
    ax.set_ylim(min(0.9, lo - 0.02), 1.06)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    p.add_argument("folder", help="a folder of bench.run outputs (results.json in it or in its subfolders)")
    args = p.parse_args(argv)
    folder = Path(args.folder)
    rows = rows_of(folder)
    if not rows:
        p.error(f"no results.json in {folder} or its subfolders")
    (folder / "summary.md").write_text(markdown(rows))
    print(markdown(rows))
    print(plot(rows, folder / "summary.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
