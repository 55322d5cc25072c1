#!/usr/bin/env bash
# 2026-11-28, issue 16's first must-show under a budget, paired (2 GPUs, one call): each model's Inductor
# launch (plain torch.compile) and colauto launch under COLAUTO_MEMORY_BUDGET = 80% of Inductor's measured
# peak start together on the two GPUs, so both compile under the same host load; models one after another.
# Each launch is a fresh process with its own, empty cache folders (a cold first step, timed from the
# torch.compile call). Also issue 16's fourth: the budgeted rows' predicted and measured peaks.
# gpu12.sh ran the same budgets from one queue of four launches (4 GPUs) with 7df914c's planner.
# Everything lands in one tar ($OUT/r20.tgz).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r20; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
LIMIT=${LIMIT:-555}
# model spec = budget (80% of Inductor's measured peak, as in gpu12.sh)
MODELS=${MODELS:-"hf/qwen2:bench:8:1024=17.7GiB hf/gpt_neox:bench:8:1024=11.8GiB hf/gpt2:bench:8:1024=20.9GiB hf/qwen3:bench:8:1024=21.0GiB"}
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
git rev-parse HEAD > $R/commit.txt 2>/dev/null; git status --short >> $R/commit.txt 2>/dev/null
T0=$(date +%s)
launch() {   # launch GPU SPEC MODE [BUDGET]
  local g=$1 spec=$2 mode=$3 budget=${4:-} name=$(echo $2 | cut -d/ -f2 | cut -d: -f1)-$3
  local left=$(( LIMIT - ($(date +%s) - T0) ))
  [ $left -lt 30 ] && { echo "$name: no time left" >> $R/jobs.txt; return; }
  mkdir -p $R/first/$name
  local benchmode=$mode extra=""
  [ "$mode" = colauto-budget ] && benchmode=colauto extra="COLAUTO_MEMORY_BUDGET=$budget"
  env CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$name/inductor COLAUTO_CACHE_DIR=/tmp/caches/$name/colauto \
      TRITON_CACHE_DIR=/tmp/caches/$name/triton $extra \
      timeout -k 5 $left python -m bench.run --models $spec --modes $benchmode --steps 3 --warmup 1 \
      --out $R/first/$name > $R/first/$name/log.txt 2>&1
  rm -f $R/first/$name/*.png
  echo "gpu$g $name done at $(( $(date +%s) - T0 )) s" >> $R/jobs.txt
}
for m in $MODELS; do
  spec=${m%%=*} budget=${m##*=}
  launch 0 $spec inductor & launch 1 $spec colauto-budget $budget & wait
done
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r20.tgz -C $R .
for d in $R/first/*/; do python -c "
import json; r=json.load(open('$d/results.json'))['rows'][0]
print('$d'.split('/')[-2], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '', 'peak %.2f GiB' % (r['peak_bytes'] / 2**30) if r.get('peak_bytes') else '', 'pred %.2f GiB' % (r['pred_peak_bytes'] / 2**30) if r.get('pred_peak_bytes') else '')" 2>&1 | tail -1; done
grep -h "planned in\|BudgetError" $R/first/*/log.txt | head -20
