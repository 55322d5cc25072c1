"""The measured live set at the peak (peak.txt: allocations made during the step, from the allocator's
history) against the memory model's (predicted.txt: storages live at the predicted peak, less the step's
state, "start"), by size: where the two differ.

    python3 bench/results/h200-2026-11-28-budget-peak-snapshot/analyze.py
"""
import collections
import pathlib
import re

HERE = pathlib.Path(__file__).parent


def load(path: pathlib.Path, skip: int) -> list[tuple[float, str]]:
    rows = []
    for line in path.read_text().splitlines()[skip:]:
        m = re.match(r"\s*([\d.]+) MiB\s*(.*)", line)
        if m:
            rows.append((float(m.group(1)), m.group(2)))
    return rows


for run in sorted(p for p in HERE.glob("snap*/*") if (p / "predicted.txt").exists()):
    measured_head = (run / "peak.txt").read_text().splitlines()[:2]
    predicted_head = (run / "predicted.txt").read_text().splitlines()[0]
    meas = load(run / "peak.txt", 3)
    pred = [r for r in load(run / "predicted.txt", 2) if r[1] != "start"]
    print(f"## {run.parent.name}/{run.name}\n\n{measured_head[0]}; {measured_head[1]}\n\n{predicted_head}\n")
    print(f"measured: {len(meas)} allocations, {sum(r[0] for r in meas):.1f} MiB; predicted (less the state): "
          f"{len(pred)} storages, {sum(r[0] for r in pred):.1f} MiB\n")
    cm = collections.Counter(round(r[0], 1) for r in meas)
    cp = collections.Counter(round(r[0], 1) for r in pred)
    names = collections.defaultdict(collections.Counter)
    for size, name in pred:
        names[round(size, 1)][re.sub(r"_\d+$", "", name)] += 1
    print("| size MiB | measured | predicted | predicted - measured MiB | predicted by (node kind) |")
    print("|---|---|---|---|---|")
    for size in sorted(set(cm) | set(cp), reverse=True):
        if cm[size] != cp[size] and size >= 1:
            kinds = ", ".join(f"{k} x{v}" for k, v in names[size].most_common(4))
            print(f"| {size} | {cm[size]} | {cp[size]} | {(cp[size] - cm[size]) * size:.1f} | {kinds} |")
    print()
