#!/usr/bin/env bash
# 2026-11-29 session 15 (one GPU, one call): throughput and peak of the budgeted plans under the memory model of
# Inductor's realized buffers (db56625), beside Inductor in the same process: HF Qwen3 under 21.0 GiB and
# Qwen2 under 17.7 GiB (80% of Inductor's peak, the budgets of bench/results/h200x2-2026-11-28-budget-first-step,
# where the old model's plans measured 0.943x and 0.913x Inductor). MODELS: model=budget pairs, space-separated
# (default those two). RULES (2026-12-02): after that pair, colauto alone again under each COLAUTO_PLANNED_RULES value
# listed (space-separated, e.g. "reuse fusion none"), in the same call; PAIR_S: the pair's time limit (270 s). One tar: $OUT/r28.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r28; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
for mb in ${MODELS:-hf/qwen3:bench:8:1024=21.0GiB hf/qwen2:bench:8:1024=17.7GiB}; do
  m=${mb%=*}; b=${mb#*=}; d=$R/$(echo $m | tr '/:' '__'); mkdir -p $d
  COLAUTO_MEMORY_BUDGET=$b timeout -k 5 ${PAIR_S:-270} python -m bench.run --models $m --modes inductor,colauto --steps 10 --warmup 2 --out $d > $d/log.txt 2>&1
  echo "== $m $b: rc $?"; rm -f $d/*.png; grep -h "tok/s\|Error" $d/log.txt | head -4
  for rules in ${RULES:-}; do
    e=$d/rules-$(echo $rules | tr ',' '_'); mkdir -p $e
    COLAUTO_PLANNED_RULES=$rules COLAUTO_MEMORY_BUDGET=$b timeout -k 5 200 python -m bench.run --models $m --modes colauto --steps 10 --warmup 2 --out $e > $e/log.txt 2>&1
    echo "== $m $b rules=$rules: rc $?"; rm -f $e/*.png; grep -h "tok/s\|Error" $e/log.txt | head -4
  done
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r28.tgz -C $R .
