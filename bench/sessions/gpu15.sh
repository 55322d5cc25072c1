#!/usr/bin/env bash
# 2026-11-28 (4 GPUs, or 2 with four of the models; one call): COLAUTO_CODEGEN=triton with Inductor compiling what colauto's generated
# kernels leave (backend.rest_by_inductor, on CUDA). Before, the rest ran op by op and the step was
# host-bound without CUDA graphs (H200 matrix: median 0.751x Inductor). 8 HF causal LMs at their bench
# shapes (4 on 2 GPUs), two per GPU one after the other, each in its own process with modes inductor, colauto-triton and
# colauto-triton-cg; every ratio against the Inductor row of the same process. One tar: $OUT/r15.tgz.
# MODELS, M (modes) and LIMIT (seconds for the whole queue) override: MODELS=hf/qwen2:bench:8:1024 M=inductor,colauto-triton LIMIT=280
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r15; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
T0=$(date +%s)
M=${M:-inductor,colauto-triton,colauto-triton-cg}
LIMIT=${LIMIT:-560}
queue() {   # queue GPU SPEC...: one model after another on one GPU
  local g=$1; shift
  for spec in "$@"; do
    local n=$(echo $spec | cut -d/ -f2 | cut -d: -f1) left=$(( LIMIT - ($(date +%s) - T0) ))
    mkdir -p $R/$n
    CUDA_VISIBLE_DEVICES=$g COLAUTO_REPORT=1 timeout -k 5 $(( left > 1 ? left : 1 )) python -m bench.run --models $spec \
        --modes $M --steps 10 --warmup 2 --out $R/$n > $R/$n/log.txt 2>&1
    rm -f $R/$n/*.png
  done
}
if [ -n "${MODELS:-}" ]; then   # MODELS="SPEC ...": these, one after another on GPU 0
  queue 0 $MODELS
elif [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
  queue 0 hf/qwen2:bench:8:1024 hf/mistral:bench:4:1024 &
  queue 1 hf/llama:bench:4:1024 hf/gemma:bench:4:1024 &
  queue 2 hf/gpt2:bench:8:1024 hf/phi3:bench:4:1024 &
  queue 3 hf/gpt_neox:bench:8:1024 hf/qwen3:bench:8:1024 &
else   # 2 GPUs: four of the models
  queue 0 hf/qwen2:bench:8:1024 hf/gpt2:bench:8:1024 &
  queue 1 hf/llama:bench:4:1024 hf/gpt_neox:bench:8:1024 &
fi
wait
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r15.tgz -C $R .
grep -h "tok/s\|Error\|error" $R/*/log.txt | grep -v "^ *$" | head -60
