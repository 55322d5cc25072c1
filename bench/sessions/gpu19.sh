#!/usr/bin/env bash
# 2026-11-28 (one GPU, one call): why codegen triton is below Inductor on three HF causal LMs (issue 14:
# every row below Inductor's default listed with its measured cause). One model after another, each in
# its own process under its own timeout, colauto-triton then Inductor in that process, with --profile:
#   GPT-NeoX at the Pythia-410M shape (B8), GPT-2 large (B8), Mistral layout at 1B (B4, only if >= 120 s are left)
# T=1024, bf16 autocast, fused AdamW, 3 warm-up steps then 20 timed, no CUDA graphs; each model at most
# MODEL_MAX=300 s, all of them LIMIT=525 s.
# bench.run runs through a small driver ($R/drive.py, written below) that keeps --profile's table and adds,
# per row: three more blocks of 10 timed steps (the row's spread), every kernel's GPU time over the two
# profiled steps (profile-*.kernels.csv), the kernel timeline (profile-*.timeline.csv.gz) and the GPU's
# busy/idle time per step (profile-*.summary.json). One tar, rewritten after each model: $OUT/${TAR:-r19}.tgz.
#   bash bench/sessions/gpu19.sh
#   MODELS="hf/qwen2:bench:8:1024" M=inductor,colauto-triton LIMIT=300 bash bench/sessions/gpu19.sh
# Run from a clean `git archive` (pass COMMIT=<sha>): another checkout's edits must not reach the GPU.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/caches/inductor TRITON_CACHE_DIR=/tmp/caches/triton
R=${R:-/tmp/r19}; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); LIMIT=${LIMIT:-525}
nvidia-smi -L > $R/cards.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
    --format=csv >> $R/cards.txt 2>&1
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
{ echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; git status --short 2>/dev/null; } > $R/commit.txt

cat > $R/drive.py <<'PY'
"""python -m bench.run, whose --profile also writes, beside profile-<model>-<size>-<mode>.txt:
.blocks (three more blocks of 10 timed steps), .kernels.csv (every kernel's GPU time over the two profiled
steps), .timeline.csv.gz (each kernel's start and duration) and .summary.json (per step: kernel time, GPU
busy time, the span from the first kernel's start to the last one's end, kernel count)."""
import csv, gzip, json, sys, tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import bench.run as br

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


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
        trace = Path(tempfile.mkdtemp()) / "trace.json"
        prof.export_chrome_trace(str(trace))
        evs = sorted((e for e in json.loads(trace.read_text())["traceEvents"]
                      if e.get("cat") in GPU_CATS and "dur" in e), key=lambda e: e["ts"])
        with gzip.open(f"{stem}.timeline.csv.gz", "wt", newline="") as f:
            w = csv.writer(f)
            w.writerow(["cat", "name", "ts_us", "dur_us", "stream"])
            for e in evs:
                w.writerow([e["cat"], e["name"], e["ts"], e["dur"], e.get("args", {}).get("stream")])
        busy, cur_s, cur_e = 0.0, None, None
        for e in evs:                       # union of the kernels' intervals
            s, t = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            if cur_e is None or s > cur_e:
                busy += 0 if cur_e is None else cur_e - cur_s
                cur_s, cur_e = s, t
            else:
                cur_e = max(cur_e, t)
        busy += 0 if cur_e is None else cur_e - cur_s
        span = (max(float(e["ts"]) + float(e["dur"]) for e in evs) - float(evs[0]["ts"])) if evs else 0.0
        summary.update(kernels_per_step=len(evs) / 2, kernel_ms_per_step=sum(float(e["dur"]) for e in evs) / 2e3,
                       busy_ms_per_step=busy / 2e3, span_ms_per_step=span / 2e3)
    except Exception as exc:   # noqa: BLE001 - the extras must not fail the row
        summary["error"] = f"{type(exc).__name__}: {exc}"[:300]
    Path(f"{stem}.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n[profile] {path.name}: {json.dumps(summary)}", flush=True)


br.profile_kernels = profile_kernels
sys.exit(br.main(sys.argv[1:]))
PY

bench() {   # MODEL SECONDS
  local d=$R/$(echo $1 | cut -d: -f1 | tr / _); mkdir -p $d
  echo "start $1 at $(( $(date +%s) - T0 )) s, timeout $2 s" | tee -a $R/wall.txt
  PYTHONPATH=$PWD COLAUTO_REPORT=1 timeout -k 5 $2 python $R/drive.py --models $1 --modes ${M:-colauto-triton,inductor} \
    --steps ${STEPS:-20} --warmup 3 --profile --out $d > $d/log.txt 2>&1
  echo "exit $? after $(( $(date +%s) - T0 )) s" >> $d/log.txt
  rm -f $d/*.png
  tar czf $OUT/${TAR:-r19}.tgz -C $R .          # after each model: a later kill keeps what was measured
}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }

set -- ${MODELS:-hf/gpt_neox:bench:8:1024 hf/gpt2:bench:8:1024 hf/mistral:bench:4:1024}
n=0
for m in "$@"; do
  n=$((n + 1)); t=$(( $(left) - 5 )); [ $t -gt ${MODEL_MAX:-300} ] && t=${MODEL_MAX:-300}
  if [ $n -gt 2 ] && [ $t -lt ${MIN_LEFT:-120} ]; then echo "skip $m: $t s left" | tee -a $R/wall.txt; continue; fi
  bench $m $t
done
for d in $R/*/; do
  echo "== $d"; cat $d/results.md 2>/dev/null
  grep -h "^\[profile\]\|FAILED\|Error\|exit " $d/log.txt | cut -c1-400
done
echo "wall $(( $(date +%s) - T0 )) s" | tee -a $R/wall.txt
tar czf $OUT/${TAR:-r19}.tgz -C $R .
