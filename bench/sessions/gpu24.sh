#!/usr/bin/env bash
# 2026-11-29 (one GPU, one call): 1) HF GPT-2 large's peak under the default backend and under Inductor, each
# mode in its own process (the same-process run of gpu23.sh measured colauto 0.77 GiB above Inductor;
# separate launches measured them equal on 2026-11-28); 2) HF Qwen2 under a 17.7 GiB budget: what is live
# at the measured and the predicted peak (bench.peak_snapshot) now that autograd makes no zero gradient for
# the logits. One tar: $OUT/r24.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r24; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
nvidia-smi -L > $R/cards.txt; echo "${COMMIT:-unknown}" > $R/commit.txt
for mode in colauto inductor; do
  d=$R/gpt2-$mode; mkdir -p $d
  timeout -k 5 200 python -m bench.run --models hf/gpt2:bench:8:1024 --modes $mode --steps 10 --warmup 2 --out $d > $d/log.txt 2>&1
  rm -f $d/*.png; grep -h "tok/s\|Error" $d/log.txt | head -3
done
left=$(( ${LIMIT:-570} - ($(date +%s) - T0) ))
timeout -k 5 $left python -m bench.peak_snapshot --model hf/qwen2:bench:8:1024 --budget 17.7GiB --out $R/qwen2-17.7GiB > $R/qwen2-snap.log 2>&1
tail -3 $R/qwen2-snap.log; head -3 $R/qwen2-17.7GiB/peak.txt $R/qwen2-17.7GiB/predicted.txt 2>/dev/null
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r24.tgz -C $R .
