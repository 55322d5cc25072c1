#!/usr/bin/env bash
# 2026-11-27 (third session), call 1 (4 GPUs): HF LlamaForCausalLM at the Llama-3-8B shape (hf/llama:8b,
# 8.03B parameters, random weights), T=2048, micro-batch 1 per GPU (global batch 4), bf16 autocast over fp32
# weights, fused AdamW: FSDP2 (fully_shard per decoder layer, then the model) + torch.compile, then colauto's
# automatic plan (backend="colauto", codegen inductor, no COLAUTO_MESH). DDP does not fit 8B (fp32 weights,
# gradients and AdamW state: 128 GB a GPU). Each configuration is its own launch with its own compile cache
# folder (cold compiles), under `timeout` so the call ends inside the tool's 10-minute limit.
#   bash bench/sessions/gpu9.sh                 # call 1: T=2048, fsdp2 then colauto
#   CONFIGS="colauto fsdp2" RESERVE=75 bash bench/sessions/gpu9.sh   # call 2 (after the first-call fix): colauto
#                                               # first, FSDP2 again on the same machine with the time left
#   SEQ=8192 CONFIGS="fsdp2 colauto" bash bench/sessions/gpu9.sh   # other shapes / configurations
#   MODEL=hf/llama:tiny SEQ=16 bash bench/sessions/gpu9.sh           # the script's dry run on CPU (gloo)
#   EXTRA=--profile CONFIGS="colauto fsdp2" RESERVE=100 BUDGET=575 FSDP2_MAX=100 bash bench/sessions/gpu9.sh   # 2026-11-28
#                                               # (session 9): each configuration with one profiled step
# Everything lands in one tar ($OUT/r9.tgz) and a log ($OUT/r9.log).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export COLAUTO_PLAN_CACHE=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MODEL=${MODEL:-hf/llama:8b}; SEQ=${SEQ:-2048}; BATCH=${BATCH:-1}; CONFIGS=${CONFIGS:-"fsdp2 colauto"}; BUDGET=${BUDGET:-565}
FSDP2_MAX=${FSDP2_MAX:-230}; RESERVE=${RESERVE:-0}
R=/tmp/r9; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt; nvidia-smi topo -m > $R/topo.txt 2>&1
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
{ echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; git status --short 2>/dev/null; } > $R/commit.txt
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv -l 5 > $R/smi.csv 2>&1 &
SMI=$!
T0=$(date +%s)
left() { local s=$(( BUDGET - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
LAST=${CONFIGS##* }
for c in $CONFIGS; do
  t=$(left); [ "$c" = fsdp2 ] && [ $t -gt $FSDP2_MAX ] && t=$FSDP2_MAX
  [ "$c" != "$LAST" ] && [ $t -gt $(( $(left) - RESERVE )) ] && t=$(( $(left) - RESERVE ))   # time kept for the rest
  name=$c-T$SEQ-B$BATCH
  echo "== $name: timeout $t s" | tee -a $R/steps.txt
  s=$(date +%s)
  env TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$name COLAUTO_REPORT=1 timeout -k 10 $t \
    torchrun --standalone --nproc-per-node 4 -m bench.dist_compare --model $MODEL --batch $BATCH --seq $SEQ \
      --configs $c --warmup 2 --steps 5 --out $R/json ${EXTRA:-} > $R/$name.log 2>&1
  echo "   exit $? after $(( $(date +%s) - s )) s" | tee -a $R/steps.txt
done
kill $SMI 2>/dev/null
echo "wall $(( $(date +%s) - T0 )) s" >> $R/steps.txt
python -m bench.dist_compare --summarize --out $R/json > /dev/null 2>&1
python bench/sessions/dist_brief.py $R/json > $R/brief.txt 2>&1
cat $R/steps.txt $R/versions.txt $R/cards.txt $R/brief.txt $R/json/summary.md 2>/dev/null > $OUT/r9.log
tar czf $OUT/r9.tgz -C $R .
for f in $R/*.log; do echo "--- $f"; grep -v "Warning\|warn(" $f | tail -12 | cut -c1-400; done
cat $OUT/r9.log
