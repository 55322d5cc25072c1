#!/usr/bin/env bash
# 2026-11-27 (second session), call 3 (1 GPU): what calls 1 and 2 ran out of time for, then the first-step
# launches again at HEAD (a cache-hit launch no longer imports Inductor's lowering module).
# 1. The CUDA-graph tests on a GPU.  2. HF Qwen3's colauto rows.  3. First step of separate launches of
# HF Qwen2-0.5B (B8, T1024): Inductor cold / warm, colauto default cold / warm (torch's AOTAutograd cache).
# Everything lands in one tar ($OUT/r6.tgz).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/r6; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
git status --short > $R/tree.txt 2>/dev/null
T0=$(date +%s)
left() { local s=$(( 555 - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
COLAUTO_PLAN_CACHE=0 timeout -k 5 200 python -m pytest tests/test_cuda_graphs.py -q -p no:warnings -rA > $R/test_cuda_graphs.log 2>&1
COLAUTO_PLAN_CACHE=0 timeout -k 5 200 python -m bench.run --models hf/qwen3:bench:8:1024 --modes inductor,colauto,colauto-cg \
  --steps 10 --warmup 2 --out $R/qwen3 > $R/qwen3.log 2>&1
rm -f $R/qwen3/*.png
launch() {  # name cachedir mode
  local name=$1 dir=$2 mode=$3
  mkdir -p $R/first/$name
  env TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$dir/inductor COLAUTO_CACHE_DIR=/tmp/caches/$dir/colauto \
      timeout -k 5 $(left) python -m bench.run --models hf/qwen2:bench:8:1024 --modes $mode --steps 3 --warmup 1 \
      --out $R/first/$name > $R/first/$name/log.txt 2>&1
  rm -f $R/first/$name/*.png
}
launch inductor-cold ind inductor
launch inductor-warm ind inductor
launch colauto-cold col colauto
launch colauto-warm col colauto
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r6.tgz -C $R .
tail -4 $R/test_cuda_graphs.log; grep -h "tok/s\|FAILED" $R/qwen3.log
for d in $R/first/*/; do python -c "
import json,sys; r=json.load(open('$d/results.json'))['rows'][0]; print('$d'.split('/')[-2], r['mode'], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '')" 2>&1 | tail -1; done
