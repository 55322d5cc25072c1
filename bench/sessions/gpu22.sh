#!/usr/bin/env bash
# 2026-11-28 (session 9), one call on 2 GPUs: the data-parallel path after parallel/overlap.py (colauto
# buckets the gradient all-reduces itself and waits at the end; Inductor's bucketing is off for such
# graphs), each model's colauto and DDP + torch.compile in one launch, with one profiled step each.
#   bash bench/sessions/gpu22.sh
#   MODELS="hf/llama:tiny=1" SEQ=16 bash bench/sessions/gpu22.sh     # the script's dry run on CPU (gloo; no --profile)
#   MODELS="hf/llama:bench=4" CONFIGS=colauto@fsdp=2,fsdp2 BUDGET=240 bash bench/sessions/gpu22.sh   # the fsdp path
# Everything lands in one tar ($OUT/r22.tgz) and a log ($OUT/r22.log).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0
MODELS=${MODELS:-"hf/llama:bench=4 hf/gpt2:bench=8"}; SEQ=${SEQ:-1024}; BUDGET=${BUDGET:-560}; NPROC=${NPROC:-2}
PROFILE=$(python -c "import torch; print('--profile' if torch.cuda.is_available() else '')")
R=/tmp/r22; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt 2>&1
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}" > $R/commit.txt
T0=$(date +%s)
for spec in $MODELS; do
  m=${spec%=*}; b=${spec#*=}; name=$(echo $m | tr '/:' '--')
  left=$(( BUDGET - ($(date +%s) - T0) )); [ $left -lt 30 ] && break
  echo "== $name B$b: timeout $left s" | tee -a $R/steps.txt
  env COLAUTO_REPORT=1 timeout -k 10 $left torchrun --standalone --nproc-per-node $NPROC -m bench.dist_compare \
    --model $m --batch $b --seq $SEQ --configs ${CONFIGS:-colauto,ddp} --warmup 3 --steps 8 --out $R/json $PROFILE > $R/$name.log 2>&1
  echo "   exit $? after $(( $(date +%s) - T0 )) s" | tee -a $R/steps.txt
done
python -m bench.dist_compare --summarize --out $R/json > /dev/null 2>&1
python bench/sessions/dist_brief.py $R/json > $R/brief.txt 2>&1
cat $R/steps.txt $R/versions.txt $R/brief.txt $R/json/summary.md > $OUT/r22.log 2>/dev/null
grep -h "colauto collectives" $R/*.log | sort | uniq -c >> $OUT/r22.log
tar czf $OUT/r22.tgz -C $R .
cat $OUT/r22.log
