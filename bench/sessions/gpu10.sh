#!/usr/bin/env bash
# 2026-11-27 (third session), call 1 (2 GPUs): after b4e2388 (the modeled partition simulated with
# Inductor's fusion; the compute-only search pruned by a time bound).
# GPU 0: HF Qwen2-0.5B (B8, T1024) budget sweep, colauto at 75% and 50% of the predicted activation memory
#        against torch.compile with activation_memory_budget 1.0 and 0.5.
# GPU 1: first step of separate launches with fresh cache folders (Inductor; colauto under 16 GiB), then
#        HF Llama (TinyLlama-1.1B shape, B4, T1024) at 50% against Inductor 1.0.
# The two GPUs' jobs share the host's CPU cores. Everything lands in one tar ($OUT/r10.tgz).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0
R=/tmp/r10; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
git log --oneline -1 > $R/commit.txt 2>/dev/null
T0=$(date +%s)
left() { local s=$(( ${LIMIT:-560} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
(CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(left) python -m bench.remat_sweep --models hf/qwen2:bench:8:1024 --points 75,50 \
   --inductor-budgets 1.0,0.5 --steps 8 --warmup 2 --out $R/sweep-hf-qwen2 > $R/sweep-hf-qwen2.log 2>&1) &
(
  launch() {  # name cachedir mode [budget]
    local name=$1 dir=$2 mode=$3 budget=${4:-}
    mkdir -p $R/first/$name
    env CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$dir/inductor TRITON_CACHE_DIR=/tmp/caches/$dir/triton \
        COLAUTO_CACHE_DIR=/tmp/caches/$dir/colauto COLAUTO_PLAN_CACHE=1 ${budget:+COLAUTO_MEMORY_BUDGET=$budget} COLAUTO_REPORT=1 \
        timeout -k 5 $(left) python -m bench.run --models hf/qwen2:bench:8:1024 --modes $mode --steps 3 --warmup 1 \
        --out $R/first/$name > $R/first/$name/log.txt 2>&1
    rm -f $R/first/$name/*.png
  }
  launch inductor-cold ind inductor
  launch colauto-16GiB-cold colb colauto 16GiB
  CUDA_VISIBLE_DEVICES=1 timeout -k 5 $(left) python -m bench.remat_sweep --models hf/llama:bench:4:1024 --points 50 \
     --inductor-budgets 1.0 --steps 8 --warmup 2 --out $R/sweep-hf-llama > $R/sweep-hf-llama.log 2>&1
) &
wait
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r10.tgz -C $R .
grep -h "tok/s\|FAILED\|Error" $R/*.log | tail -20
for d in $R/first/*/; do python -c "
import json; r=json.load(open('$d/results.json'))['rows'][0]; print('$d'.split('/')[-2], r['mode'], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '')" 2>&1 | tail -1; done
grep -h "plan\b\|partitions\|plan_s" $R/first/*/log.txt | head -5
