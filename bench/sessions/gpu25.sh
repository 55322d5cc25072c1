#!/usr/bin/env bash
# 2026-11-29 (one GPU, one call): what is live at HF GPT-2 large's measured peak under the default backend and
# under Inductor (gpu24.sh measured colauto 26.86 GiB, Inductor 26.09: one bf16 logits more). One tar.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r25; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt
for b in none inductor; do
  timeout -k 5 190 python -m bench.peak_snapshot --model hf/gpt2:bench:8:1024 --budget $b --out $R/gpt2-$b > $R/gpt2-$b.log 2>&1
  head -2 $R/gpt2-$b/peak.txt
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r25.tgz -C $R .
