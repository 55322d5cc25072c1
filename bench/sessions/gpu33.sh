#!/usr/bin/env bash
# 2026-12-02 session 22 (one GPU, one call): where colauto's cold first step spends the time Inductor's does not, on
# HF Qwen2-0.5B (B8 x T1024, bf16 autocast, no budget: 65.7 s against 57.1 s in gpu32.sh's call). Each mode is one
# fresh process with empty caches, one step under cProfile (bench/sessions/first_step_profile.py); the
# profiles and torch._dynamo.utils.compile_times() land in one tar, $OUT/r33.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r33; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
for mode in ${MODES:-inductor colauto}; do
  env TORCHINDUCTOR_CACHE_DIR=/tmp/c33/$mode/inductor COLAUTO_CACHE_DIR=/tmp/c33/$mode/colauto TRITON_CACHE_DIR=/tmp/c33/$mode/triton \
      PYTHONPATH=$PWD timeout -k 5 ${STEP_S:-250} python bench/sessions/first_step_profile.py $mode ${MODEL:-qwen2} $R > $R/$mode.log 2>&1
  echo "== $mode: rc $?"; tail -3 $R/$mode.log
done
tar czf $OUT/r33.tgz -C $R .
