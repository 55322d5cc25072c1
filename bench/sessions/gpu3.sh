#!/usr/bin/env bash
# 2026-11-27 session, call 3 (2 GPUs): memory-budget sweep points of HF Qwen2-0.5B (GPU 0) and HF Llama
# (TinyLlama-1.1B shape, GPU 1) with colauto's predicted peaks kept; everything in one tar file.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0
R=/tmp/r3; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
T0=$(date +%s)
left() { echo $(( 415 - ($(date +%s) - T0) )); }
(CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(left) python -m bench.remat_sweep --models hf/qwen2:bench:8:1024 --points 75,50 \
   --inductor-budgets 1.0 --steps 8 --warmup 2 --out $R/sweep-hf-qwen2 > $R/sweep-hf-qwen2.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout -k 5 $(left) python -m bench.remat_sweep --models hf/llama:bench:4:1024 --points 50,smallest \
   --inductor-budgets 0.5 --steps 8 --warmup 2 --out $R/sweep-hf-llama > $R/sweep-hf-llama.log 2>&1) &
wait
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r3.tgz -C $R .
grep -h "tok/s\|FAILED" $R/*.log
