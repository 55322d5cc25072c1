#!/usr/bin/env bash
# 2026-11-28, issue 16's first must-show without a budget, paired (4 GPUs, one call): each model's Inductor
# launch and colauto launch (backend="colauto", no options) start together on two GPUs of one host, so both
# compile under the same host load; two models run at a time (GPUs 0+1 and 2+3). Each launch is a fresh
# process with its own, empty cache folders (a cold first step, timed from the torch.compile call).
# gpu12.sh ran the same launches from one queue of four, where a model's two launches met different
# neighbours. Everything lands in one tar ($OUT/r13.tgz).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0
R=/tmp/r13; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
git rev-parse HEAD > $R/commit.txt 2>/dev/null; git status --short >> $R/commit.txt 2>/dev/null
T0=$(date +%s)
launch() {   # launch GPU SPEC MODE
  local g=$1 spec=$2 mode=$3 name=$(echo $2 | cut -d/ -f2 | cut -d: -f1)-$3
  local left=$(( 560 - ($(date +%s) - T0) ))
  mkdir -p $R/first/$name
  env CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$name/inductor COLAUTO_CACHE_DIR=/tmp/caches/$name/colauto \
      TRITON_CACHE_DIR=/tmp/caches/$name/triton \
      timeout -k 5 $(( left > 1 ? left : 1 )) python -m bench.run --models $spec --modes $mode --steps 5 --warmup 2 \
      --out $R/first/$name > $R/first/$name/log.txt 2>&1
  rm -f $R/first/$name/*.png
}
pairs() {    # pairs GPU_A GPU_B SPEC...: each model's two launches side by side, models one after another
  local a=$1 b=$2; shift 2
  for spec in "$@"; do
    launch $a $spec inductor & launch $b $spec colauto & wait
  done
}
pairs 0 1 hf/qwen3:bench:8:1024 hf/falcon:bench:4:1024 hf/gpt_neox:bench:8:1024 hf/gemma:bench:4:1024 hf/opt:bench:4:1024 &
pairs 2 3 hf/gpt2:bench:8:1024 hf/qwen2:bench:8:1024 hf/llama:bench:4:1024 hf/mistral:bench:4:1024 hf/phi3:bench:4:1024 &
wait
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r13.tgz -C $R .
for d in $R/first/*/; do python -c "
import json; r=json.load(open('$d/results.json'))['rows'][0]
print('$d'.split('/')[-2], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '', 'peak %.2f GiB' % (r['peak_bytes'] / 2**30) if r.get('peak_bytes') else '')" 2>&1 | tail -1; done
