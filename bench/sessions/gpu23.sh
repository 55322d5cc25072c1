#!/usr/bin/env bash
# 2026-11-29 (one GPU, one call per model list): the default backend (codegen auto = Inductor on CUDA) against
# plain torch.compile, in one process per model, after colauto compiles the backward without the zero
# gradient autograd made for the logits returned beside the loss (colauto_backend/output_grads.py).
# MODELS: comma-separated bench.run specs; MODES: bench.run modes (inductor,colauto); LIMIT: seconds for the whole call. One tar: $OUT/r23.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r23; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
echo "${COMMIT:-unknown}" > $R/commit.txt
for spec in ${MODELS//,/ }; do
  left=$(( ${LIMIT:-570} - ($(date +%s) - T0) ))
  [ $left -lt 60 ] && { echo "skipped $spec: $left s left" | tee -a $R/skipped.txt; continue; }
  d=$R/$(echo $spec | tr '/:' '__'); mkdir -p $d
  COLAUTO_REPORT=1 timeout -k 5 $left python -m bench.run --models $spec --modes ${MODES:-inductor,colauto} \
      --steps ${STEPS:-20} --warmup 3 --out $d > $d/log.txt 2>&1
  rm -f $d/*.png
  grep -h "tok/s\|Error\|outputs returned beside" $d/log.txt | head -8 | cut -c1-300
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r23.tgz -C $R .
