#!/usr/bin/env bash
# 2026-11-28, issue 16's first must-show on every HF causal LM of `python -m bench.run --suite hf` (4 GPUs,
# two calls: `bash bench/sessions/gpu12.sh 1`, then `... 2`, five models each). Each launch is a fresh
# process with its own, empty cache folders (a cold first step), timed from the torch.compile call:
#   inductor              plain torch.compile
#   colauto               backend="colauto", no options (no budget: the default)
#   colauto-budget        COLAUTO_MEMORY_BUDGET = 80% of Inductor's measured peak for that model
#                         (bench/results/h100x4-2026-11-27-hf-default-cg, qwen3 from h100-2026-11-27-first-step)
# Four launches run at a time, one a GPU, taken from one queue, so every launch shares the host with three
# other compiles. Everything lands in one tar ($OUT/r12-CALL.tgz).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
CALL=${1:?call 1 or 2}
R=/tmp/r12-$CALL; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
git rev-parse HEAD > $R/commit.txt 2>/dev/null; git status --short >> $R/commit.txt 2>/dev/null
export R T0=$(date +%s)
# model spec and budget (80% of Inductor's measured peak, GiB)
if [ "$CALL" = 1 ]; then
  MODELS="hf/qwen3:bench:8:1024=21.0GiB hf/gpt2:bench:8:1024=20.9GiB hf/qwen2:bench:8:1024=17.7GiB hf/falcon:bench:4:1024=20.1GiB hf/llama:bench:4:1024=17.1GiB"
else
  MODELS="hf/gpt_neox:bench:8:1024=11.8GiB hf/mistral:bench:4:1024=13.5GiB hf/gemma:bench:4:1024=17.4GiB hf/phi3:bench:4:1024=14.6GiB hf/opt:bench:4:1024=19.1GiB"
fi
one() {   # one MODEL=BUDGET MODE: a launch on a free GPU
  local spec=${1%%=*} budget=${1##*=} mode=$2
  local name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$mode dir=$R/first/$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$2
  local benchmode=$mode extra=""
  [ "$mode" = colauto-budget ] && benchmode=colauto extra="COLAUTO_MEMORY_BUDGET=$budget"
  for g in 0 1 2 3; do
    exec {fd}>/tmp/gpu$g.lock
    if flock -n $fd; then
      mkdir -p $dir
      local left=$(( 555 - ($(date +%s) - T0) ))
      env CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$name/inductor COLAUTO_CACHE_DIR=/tmp/caches/$name/colauto \
          TRITON_CACHE_DIR=/tmp/caches/$name/triton $extra \
          timeout -k 5 $(( left > 1 ? left : 1 )) python -m bench.run --models $spec --modes $benchmode --steps 3 --warmup 1 \
          --out $dir > $dir/log.txt 2>&1
      rm -f $dir/*.png
      echo "gpu$g $name done at $(( $(date +%s) - T0 ))" >> $R/jobs.txt
      flock -u $fd
      return
    fi
  done
  echo "no free GPU for $name" >> $R/jobs.txt
}
export -f one
for m in $MODELS; do for mode in colauto-budget inductor colauto; do echo "$m $mode"; done; done | xargs -P 4 -L 1 bash -c 'one $0 $1'
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r12-$CALL.tgz -C $R .
for d in $R/first/*/; do python -c "
import json; r=json.load(open('$d/results.json'))['rows'][0]
print('$d'.split('/')[-2], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '', 'peak %.2f GiB' % (r['peak_bytes'] / 2**30) if r.get('peak_bytes') else '')" 2>&1 | tail -1; done
grep -h "planned in\|compile cache" $R/first/*/log.txt | head -20
