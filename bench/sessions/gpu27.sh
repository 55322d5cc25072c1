#!/usr/bin/env bash
# 2026-11-29 session 15 (one GPU, one call). 1) The memory model of Inductor's realized buffers (cost/memory.py
# fused_away_of: Inductor's lowering rule; in-place pointwise writes): HF Qwen2 and Qwen3 under a budget and
# Qwen2 without one, the measured peak beside the predicted one (bench.peak_snapshot). 2) HF GPT-2 large,
# colauto default: who holds the bf16 logits it keeps between steps (gpu26.sh: allocated by the transformer
# graph's forward; holders.txt: Python referrers, and the allocated bytes before/after gc.collect()).
# One tar: $OUT/r27.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r27; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
snap() {  # model budget [extra args]
  d=$R/$(echo $1 | tr '/:' '__')-$2; mkdir -p $d
  timeout -k 5 ${3:-200} python -m bench.peak_snapshot --model $1 --budget $2 ${4:-} --out $d > $d/log.txt 2>&1
  echo "== $1 $2: rc $?"; head -2 $d/peak.txt $d/predicted.txt $d/held.txt $d/holders.txt 2>/dev/null | grep -v "^$"
  rm -f $d/*.py
}
snap hf/qwen2:bench:8:1024 17.7GiB
snap hf/qwen2:bench:8:1024 none
snap hf/qwen3:bench:8:1024 21.0GiB
snap hf/gpt2:bench:8:1024 none 240 --held
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r27.tgz -C $R .
