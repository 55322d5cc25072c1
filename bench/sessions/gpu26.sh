#!/usr/bin/env bash
# 2026-11-29 session 15 (one GPU, one call): what HF GPT-2 large holds between steps under the default backend
# and under Inductor (gpu25.sh: end-of-step allocated 9.553 vs 8.785 GiB, one bf16 logits more under colauto;
# every allocation made during the step was the same). bench.peak_snapshot --held records the allocator from
# before the compile and lists the blocks allocated at the end of a step with the frames that made them.
# One tar: $OUT/r26.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r26; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
for b in none inductor; do
  timeout -k 5 240 python -m bench.peak_snapshot --held --model hf/gpt2:bench:8:1024 --budget $b --out $R/gpt2-$b > $R/gpt2-$b.log 2>&1
  head -12 $R/gpt2-$b/held.txt
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r26.tgz -C $R .
