#!/usr/bin/env bash
# 2026-12-06 session 35 (one GPU): why the memory model is 12.7% low on HF Llama 1.1B under codegen triton
# (bench/results/h200-2026-12-06-compiled-peak-triton/): what is live at the measured peak, at the memory
# model's predicted peak (predicted.txt) and at the compiled code's (compiled.txt), for each
# model=budget:codegen of RUNS, each a fresh process with empty caches. DEBUG=1: also Inductor's debug
# folders (TORCH_COMPILE_DEBUG: each graph as handed to Inductor, after its passes, and its code).
# One tar: $OUT/r41.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r41; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-540} - ($(date +%s) - T0) )); }
for run in ${RUNS:-hf/llama:bench:4:1024=17.1GiB:triton hf/llama:bench:4:1024=17.1GiB:inductor hf/qwen2:bench:8:1024=17.7GiB:triton}; do
  spec=${run%=*}; rest=${run#*=}; budget=${rest%:*}; codegen=${rest#*:}
  name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$budget-$codegen; d=$R/$name; mkdir -p $d
  [ $(left) -lt 60 ] && { echo "== $name: no time left"; continue; }
  debug=""; [ "${DEBUG:-0}" = 1 ] && debug="TORCH_COMPILE_DEBUG=1 TORCH_COMPILE_DEBUG_DIR=$d/debug"
  env $debug TORCHINDUCTOR_CACHE_DIR=/tmp/c41/$name/torchinductor COLAUTO_CACHE_DIR=/tmp/c41/$name/colauto \
      TRITON_CACHE_DIR=/tmp/c41/$name/triton \
      timeout -k 5 $(left) python -m bench.peak_snapshot --model $spec --budget $budget --codegen $codegen --out $d > $d/log.txt 2>&1
  echo "== $name: rc $?"
  grep -h "peak of the compiled code\|max_memory_allocated\|predicted peak\|Error\|OVER THE BUDGET" $d/log.txt $d/*.txt 2>/dev/null | cut -c1-300 | head -8
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r41.tgz -C $R .
