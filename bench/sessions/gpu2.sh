#!/usr/bin/env bash
# 2026-11-27 session, call 2 (2 GPUs).
# GPU 0: first-step time of separate launches of HF Qwen2-0.5B (B8, T1024), each a fresh process:
#   Inductor cold / warm (same TORCHINDUCTOR_CACHE_DIR), colauto default cold / warm, colauto under a
#   16 GiB budget cold / warm (same COLAUTO_CACHE_DIR: the second launch reads the plan cache).
# GPU 1: HF GPT-2 large Inductor vs colauto default (the strides fix: peak), then the memory-budget
#   sweep of HF Llama (TinyLlama-1.1B shape, B4, T1024).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $OUT/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $OUT/versions.txt
T0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - T0) )); }
launch() {  # name cachedir mode [budget]
  local name=$1 dir=$2 mode=$3 budget=${4:-}
  mkdir -p $OUT/first/$name
  env TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$dir/inductor COLAUTO_CACHE_DIR=/tmp/caches/$dir/colauto \
      ${budget:+COLAUTO_MEMORY_BUDGET=$budget} \
      timeout -k 5 $(left) python -m bench.run --models hf/qwen2:bench:8:1024 --modes $mode --steps 3 --warmup 1 \
      --out $OUT/first/$name > $OUT/first/$name/log.txt 2>&1
  rm -f $OUT/first/$name/*.png
}
(
  export CUDA_VISIBLE_DEVICES=0
  launch inductor-cold ind inductor
  launch inductor-warm ind inductor
  launch colauto-cold col colauto
  launch colauto-warm col colauto
  launch colauto-16GiB-cold colb colauto 16GiB
  launch colauto-16GiB-warm colb colauto 16GiB
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout -k 5 300 python -m bench.run --models hf/gpt2:bench:8:1024 --modes inductor,colauto --steps 10 --warmup 2 --out $OUT/gpt2-peak > $OUT/gpt2-peak.log 2>&1
  rm -f $OUT/gpt2-peak/*.png
  timeout -k 5 $(left) python -m bench.remat_sweep --models hf/llama:bench:4:1024 --inductor-budgets 1.0,0.5 --steps 8 --warmup 2 --out $OUT/sweep-hf-llama > $OUT/sweep-hf-llama.log 2>&1
) &
wait
echo "wall $(( $(date +%s) - T0 )) s" >> $OUT/versions.txt
grep -h "tok/s\|FAILED" $OUT/*.log | tail -20
for d in $OUT/first/*/; do python -c "
import json,sys; r=json.load(open('$d/results.json'))['rows'][0]; print('$d'.split('/')[-2], r['mode'], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '')" 2>&1 | tail -1; done
