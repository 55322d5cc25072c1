#!/usr/bin/env bash
# 2026-12-04 session 30 (one GPU, one call): the peak of the compiled code (`Analysis.compiled_peak`: each
# graph run as Inductor's generated wrapper allocates and frees) beside the memory model's prediction and
# the measured peak (torch.cuda.max_memory_allocated), on HF models under a budget and without. For each
# model=budget of MODELS ("none": no budget): colauto in a fresh process with its own empty caches.
# LIMIT: seconds for the whole call (default 570). One tar: $OUT/r38.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r38; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
for mb in ${MODELS:-hf/qwen2:bench:8:1024=17.7GiB hf/llama:bench:4:1024=17.1GiB hf/mistral:bench:4:1024=14.5GiB hf/qwen2:bench:8:1024=none}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$budget
  d=$R/$name; mkdir -p $d
  [ $(left) -lt 40 ] && { echo "== $name: no time left"; continue; }
  extra=""; [ "$budget" != none ] && extra="COLAUTO_MEMORY_BUDGET=$budget"
  env TORCHINDUCTOR_CACHE_DIR=/tmp/c38/$name/inductor COLAUTO_CACHE_DIR=/tmp/c38/$name/colauto \
      TRITON_CACHE_DIR=/tmp/c38/$name/triton $extra \
      timeout -k 5 $(left) python -m bench.run --models $spec --modes colauto --steps 3 --warmup 2 --out $d > $d/log.txt 2>&1
  echo "== $name: rc $?"; rm -f $d/*.png
  grep -h "peak of the compiled code\|Error" $d/log.txt | cut -c1-300 | head -3
  python - "$d/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    g = 2**30
    print({k: (round(v / g, 3) if k.endswith("bytes") and v else v) for k, v in r.items()
           if k in ("model", "peak_bytes", "pred_peak_bytes", "peak_error", "compiled_peak_bytes", "compiled_peak_error", "compiled_peak_at", "tokens_per_s")})
PY
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r38.tgz -C $R .
