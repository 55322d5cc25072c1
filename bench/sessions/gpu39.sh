#!/usr/bin/env bash
# 2026-12-04 session 30 (one GPU, one call): what is live at the peak of the compiled code
# (compiled.txt, `cost.memory.compiled_live_at_peak`) beside the allocator's live set at the measured
# peak (peak.txt) and the memory model's (predicted.txt), for each model=budget of MODELS
# (bench.peak_snapshot, a fresh process with its own empty caches). LIMIT: seconds for the whole call
# (default 540). One tar: $OUT/r39.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r39; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-540} - ($(date +%s) - T0) )); }
for mb in ${MODELS:-hf/qwen2:bench:8:1024=17.7GiB hf/llama:bench:4:1024=17.1GiB}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$budget
  d=$R/$name; mkdir -p $d
  [ $(left) -lt 40 ] && { echo "== $name: no time left"; continue; }
  env TORCHINDUCTOR_CACHE_DIR=/tmp/c39/$name/inductor COLAUTO_CACHE_DIR=/tmp/c39/$name/colauto \
      TRITON_CACHE_DIR=/tmp/c39/$name/triton \
      timeout -k 5 $(left) python -m bench.peak_snapshot --model $spec --budget $budget --out $d > $d/log.txt 2>&1
  echo "== $name: rc $?"; head -3 $d/peak.txt; head -1 $d/predicted.txt; head -14 $d/compiled.txt
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r39.tgz -C $R .
