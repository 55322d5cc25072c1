#!/usr/bin/env bash
# 2026-12-04 session 31 (one GPU): issue 16 must-show 4's two GPU gaps, the peak of the compiled code
# (`Analysis.compiled_peak`) against the measured peak (torch.cuda.max_memory_allocated)
# - for a script that keeps only the loss (`loss = model(**batch).loss`, bench.run's default), the
#   figure `compiled_peak_bytes` is the outputs-dropped one (bench.run passes outputs_dropped=True);
# - under codegen triton (MODE=colauto-triton), where Inductor compiles the rest and launches
#   colauto's kernels from its wrapper.
# For each model=budget of MODELS ("none": no budget), MODE (default colauto, i.e. inductor on CUDA),
# in a fresh process with its own empty caches. LIMIT: seconds for the whole call (default 570).
# One tar: $OUT/r40-$MODE.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
MODE=${MODE:-colauto}
R=/tmp/r40-$MODE; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
for mb in ${MODELS:-hf/qwen2:bench:8:1024=17.7GiB hf/llama:bench:4:1024=17.1GiB hf/mistral:bench:4:1024=14.5GiB}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$budget
  d=$R/$name; mkdir -p $d
  [ $(left) -lt 40 ] && { echo "== $name: no time left"; continue; }
  extra=""; [ "$budget" != none ] && extra="COLAUTO_MEMORY_BUDGET=$budget"
  env TORCHINDUCTOR_CACHE_DIR=/tmp/c40/$MODE/$name/inductor COLAUTO_CACHE_DIR=/tmp/c40/$MODE/$name/colauto \
      TRITON_CACHE_DIR=/tmp/c40/$MODE/$name/triton $extra \
      timeout -k 5 $(left) python -m bench.run --models $spec --modes $MODE --steps 3 --warmup 2 --out $d > $d/log.txt 2>&1
  echo "== $MODE $name: rc $?"; rm -f $d/*.png
  grep -h "peak of the compiled code\|Error\|OVER THE BUDGET" $d/log.txt | cut -c1-400 | head -4
  python - "$d/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    g = 2**30
    print({k: (round(v / g, 3) if k.endswith("bytes") and v else v) for k, v in r.items()
           if k in ("model", "mode", "peak_bytes", "pred_peak_bytes", "peak_error", "compiled_peak_bytes", "compiled_peak_error", "compiled_peak_at", "tokens_per_s")})
PY
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r40-$MODE.tgz -C $R .
