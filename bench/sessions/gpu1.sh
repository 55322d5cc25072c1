#!/usr/bin/env bash
# 2026-11-27 session, call 1 (2 GPUs): GPT-2 large peak snapshots (Inductor vs colauto default) and the
# memory-budget sweeps of GPT-2 124M and HF Qwen2-0.5B, one job list per GPU, run side by side.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $OUT/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $OUT/versions.txt
T0=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - T0) )); }
(
  export CUDA_VISIBLE_DEVICES=0
  timeout -k 5 170 python -m bench.peak_snapshot --model hf/gpt2:bench:8:1024 --budget inductor --out $OUT/snap-gpt2-inductor > $OUT/snap-gpt2-inductor.log 2>&1
  timeout -k 5 170 python -m bench.peak_snapshot --model hf/gpt2:bench:8:1024 --budget none --out $OUT/snap-gpt2-colauto > $OUT/snap-gpt2-colauto.log 2>&1
  timeout -k 5 $(left) python -m bench.remat_sweep --models gpt2:124m:16:1024 --inductor-budgets 1.0,0.5,0.3 --steps 8 --warmup 2 --out $OUT/sweep-gpt2-124m > $OUT/sweep-gpt2-124m.log 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout -k 5 $(left) python -m bench.remat_sweep --models hf/qwen2:bench:8:1024 --inductor-budgets 1.0,0.5,0.3 --steps 8 --warmup 2 --out $OUT/sweep-hf-qwen2 > $OUT/sweep-hf-qwen2.log 2>&1
) &
wait
echo "wall $(( $(date +%s) - T0 )) s" >> $OUT/versions.txt
tail -n 3 $OUT/*.log
