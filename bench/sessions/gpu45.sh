#!/usr/bin/env bash
# Written 2026-12-06 (session 39); run in session 39 (h200-2026-12-06-remat-sweep, three calls). Issue 16's must-show 3: colauto's budgets at 100% and 50% of the
# predicted activation memory (codegen inductor, COLAUTO_PLANNED_RULES at its default, auto) beside
# Inductor's activation_memory_budget sweep, in one process per model (bench.remat_sweep: sweep.json,
# sweep.md, sweep.png). MODELS: bench.run specs; POINTS, IBUDGETS: remat_sweep's --points and
# --inductor-budgets. LIMIT: seconds for the whole call (default 560); a model started with under 90 s
# left is skipped, and a sweep cut by the limit keeps the points it finished (sweep.json is written after
# each). One tar: $OUT/r45.tgz.
#   COMMIT=<sha> MODELS="gpt2:124m:16:1024 hf/qwen2:bench:8:1024" bash bench/sessions/gpu45.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/r45; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-560} - ($(date +%s) - T0) )); }
for m in ${MODELS:-gpt2:124m:16:1024 hf/qwen2:bench:8:1024}; do
  name=$(echo $m | tr /: __); d=$R/$name; mkdir -p $d
  [ $(left) -lt 90 ] && { echo "== $name: no time left"; continue; }
  env TORCHINDUCTOR_CACHE_DIR=/tmp/c45/$name/inductor COLAUTO_CACHE_DIR=/tmp/c45/$name/colauto \
      TRITON_CACHE_DIR=/tmp/c45/$name/triton timeout -k 5 $(left) python -m bench.remat_sweep --models $m \
      --points ${POINTS:-100,50} --inductor-budgets ${IBUDGETS:-1.0,0.5,0.3} --steps 10 --warmup 2 --out $d > $d/log.txt 2>&1
  echo "== $name: rc $?"; grep -h "tok/s\|FAILED" $d/log.txt | cut -c1-200
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r45.tgz -C $R .
