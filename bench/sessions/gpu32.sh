#!/usr/bin/env bash
# 2026-12-01 (one GPU, one call): gpu28.sh at HEAD, after Inductor was made to run a plan's recomputation as modeled
# (compat._as_planned: no horizontal fusion of a recomputation with work needed elsewhere, buffers reused only by
# the next kernel): does it cost throughput under a budget? MODELS: model=budget pairs (default HF Qwen2 at
# 17.7 GiB, as in gpu28.sh). One tar: $OUT/r32.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r32; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
for mb in ${MODELS:-hf/qwen2:bench:8:1024=17.7GiB}; do
  m=${mb%=*}; b=${mb#*=}; d=$R/$(echo $m | tr '/:' '__'); mkdir -p $d
  COLAUTO_MEMORY_BUDGET=$b timeout -k 5 270 python -m bench.run --models $m --modes inductor,colauto --steps 10 --warmup 2 --out $d > $d/log.txt 2>&1
  echo "== $m $b: rc $?"; rm -f $d/*.png; grep -h "tok/s\|Error" $d/log.txt | head -4
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r32.tgz -C $R .
