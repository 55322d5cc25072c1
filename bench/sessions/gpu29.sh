#!/usr/bin/env bash
# 2026-11-29 session 15 (one GPU, one call, ~8 device minutes left): issue 16's 50% goal on HF Qwen2-0.5B under the
# memory model of Inductor's realized buffers: colauto at 50% of the unconstrained activation memory beside
# Inductor without a budget, in one process (bench.remat_sweep). One tar: $OUT/r29.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r29; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
timeout -k 5 ${LIMIT:-380} python -m bench.remat_sweep --models hf/qwen2:bench:8:1024 --points 50 --inductor-budgets 1.0 \
  --steps 8 --warmup 2 --out $R/sweep-hf-qwen2 > $R/sweep-hf-qwen2.log 2>&1
echo "rc $?"; cat $R/sweep-hf-qwen2/sweep.md 2>/dev/null | head -20; rm -f $R/sweep-hf-qwen2/*.png
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r29.tgz -C $R .
