#!/usr/bin/env bash
# 2026-11-28 (2 GPUs, one call): where the budgeted plans' throughput goes (issue 16's 50% goal). gpu20.sh
# measured HF Qwen3 at 0.858x and Qwen2 at 0.913x Inductor under COLAUTO_MEMORY_BUDGET = 80% of Inductor's
# peak (saved activations about halved), where the plan predicted +2.7-2.9% step time. Each model runs twice
# side by side, colauto without a budget on GPU 0 and under the budget on GPU 1, through gpu19.sh's profiling
# driver (every kernel's GPU time, the timeline, three more 10-step blocks); models one after another.
# Results: $OUT/r21-nobudget.tgz and $OUT/r21-budget.tgz (one tar per side, rewritten after each model).
#   bash bench/sessions/gpu21.sh
set -u
export COLAUTO_PLAN_CACHE=0
MODELS=${MODELS:-"hf/qwen3:bench:8:1024=21.0GiB hf/qwen2:bench:8:1024=17.7GiB"}
LIMIT=${LIMIT:-420}; T0=$(date +%s)
for m in $MODELS; do
  spec=${m%%=*} budget=${m##*=}
  left=$(( LIMIT - ($(date +%s) - T0) )); [ $left -lt 150 ] && { echo "skip $spec: $left s left"; continue; }
  CUDA_VISIBLE_DEVICES=0 R=/tmp/r21/nobudget TAR=r21-nobudget MODELS=$spec M=colauto LIMIT=$left MODEL_MAX=$left \
      bash bench/sessions/gpu19.sh > /tmp/r21-nobudget.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 R=/tmp/r21/budget TAR=r21-budget MODELS=$spec M=colauto LIMIT=$left MODEL_MAX=$left \
      COLAUTO_MEMORY_BUDGET=$budget bash bench/sessions/gpu19.sh > /tmp/r21-budget.log 2>&1 &
  wait
done
tail -n 30 /tmp/r21-nobudget.log /tmp/r21-budget.log
