#!/usr/bin/env bash
# 2026-11-27 (second session), call 1 (4 GPUs): the 10 HF causal LMs of `python -m bench.run --suite hf` at
# their bench shapes, each against Inductor in its own process, in the modes that decide the default:
# Inductor, Inductor + CUDA graphs, colauto's default, and colauto's default with COLAUTO_CUDAGRAPHS=1
# (now Inductor's code generation recorded as CUDA graphs); then the CUDA-graph tests on a GPU.
# Everything lands in one tar ($OUT/r4.tgz).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0
R=/tmp/r4; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
git rev-parse HEAD > $R/commit.txt 2>/dev/null; git status --short >> $R/commit.txt 2>/dev/null
T0=$(date +%s)
left() { echo $(( 545 - ($(date +%s) - T0) )); }
M=inductor,colauto,inductor-cg,colauto-cg
gpu() {   # gpu INDEX MODEL... : the models one after another on one GPU
  local i=$1; shift
  for m in "$@"; do
    local n=$(echo $m | cut -d/ -f2 | cut -d: -f1)
    CUDA_VISIBLE_DEVICES=$i timeout -k 5 $(left) python -m bench.run --models $m --modes $M --steps 10 --warmup 2 \
      --out $R/$n > $R/$n.log 2>&1
  done
}
gpu 0 hf/llama:bench:4:1024 hf/gpt_neox:bench:8:1024 hf/qwen3:bench:8:1024 &
gpu 1 hf/opt:bench:4:1024 hf/qwen2:bench:8:1024 hf/phi3:bench:4:1024 &
gpu 2 hf/falcon:bench:4:1024 hf/gemma:bench:4:1024 &
(gpu 3 hf/gpt2:bench:8:1024 hf/mistral:bench:4:1024
 CUDA_VISIBLE_DEVICES=3 timeout -k 5 $(left) python -m pytest tests/test_cuda_graphs.py -q -p no:warnings > $R/test_cuda_graphs.log 2>&1) &
wait
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r4.tgz -C $R .
grep -h "tok/s\|FAILED" $R/*.log | head -60; tail -3 $R/test_cuda_graphs.log
