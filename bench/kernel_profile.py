"""`python -m bench.kernel_profile ARGS` = `python -m bench.run ARGS`, whose --profile also writes, beside profile-<model>-<size>-<mode>.txt:
.blocks (three more blocks of 10 timed steps), .kernels.csv (every kernel's GPU time over the two profiled
steps), .timeline.csv.gz (each kernel's start and duration) and .summary.json (per step: kernel time, GPU
busy time, the span from the first kernel's start to the last one's end, kernel count)."""
import csv, gzip, json, sys, tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import bench.run as br

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_events(prof, exported: str | None = None) -> list[dict]:
    """The profile's GPU events (kernels, copies, memsets) in start order, as the Chrome trace has them.
    A profile's trace can be exported once: pass `exported`, the path it was written to, if it was."""
    trace = Path(exported) if exported else Path(tempfile.mkdtemp()) / "trace.json"
    if not exported:
        prof.export_chrome_trace(str(trace))
    return sorted((e for e in json.loads(trace.read_text())["traceEvents"]
                   if e.get("cat") in GPU_CATS and "dur" in e), key=lambda e: float(e["ts"]))


def intervals(evs) -> list[tuple[float, float]]:
    """The union of the events' [start, end) intervals, as disjoint sorted intervals (µs)."""
    out: list[list[float]] = []
    for s, t in sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in evs):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], t)
        else:
            out.append([s, t])
    return [(s, t) for s, t in out]


def union_us(evs) -> float:
    return sum(t - s for s, t in intervals(evs))


def overlap_us(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time both disjoint interval lists cover (µs)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _us(e, what):   # torch renamed cuda_* to device_* in the averages
    return getattr(e, f"{what.replace('cuda', 'device')}", None) or getattr(e, what, 0.0)


def profile_kernels(step, path: Path) -> None:
    blocks = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            step()
        end.record()
        end.synchronize()
        blocks.append(start.elapsed_time(end) / 10)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        br.sync("cuda")
    path.write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90) + "\n")
    stem = str(path.with_suffix(""))
    summary = dict(block_step_ms=blocks, profiled_steps=2)
    try:
        avg = sorted(prof.key_averages(), key=lambda e: -_us(e, "cuda_time_total"))
        with open(f"{stem}.kernels.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["name", "calls", "device_us_total"])
            for e in avg:
                w.writerow([e.key, e.count, f"{_us(e, 'cuda_time_total'):.3f}"])
        evs = gpu_events(prof)
        with gzip.open(f"{stem}.timeline.csv.gz", "wt", newline="") as f:
            w = csv.writer(f)
            w.writerow(["cat", "name", "ts_us", "dur_us", "stream"])
            for e in evs:
                w.writerow([e["cat"], e["name"], e["ts"], e["dur"], e.get("args", {}).get("stream")])
        busy = union_us(evs)
        span = (max(float(e["ts"]) + float(e["dur"]) for e in evs) - float(evs[0]["ts"])) if evs else 0.0
        summary.update(kernels_per_step=len(evs) / 2, kernel_ms_per_step=sum(float(e["dur"]) for e in evs) / 2e3,
                       busy_ms_per_step=busy / 2e3, span_ms_per_step=span / 2e3)
    except Exception as exc:   # noqa: BLE001 - the extras must not fail the row
        summary["error"] = f"{type(exc).__name__}: {exc}"[:300]
    Path(f"{stem}.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n[profile] {path.name}: {json.dumps(summary)}", flush=True)


if __name__ == "__main__":
    br.profile_kernels = profile_kernels
    sys.exit(br.main(sys.argv[1:]))
