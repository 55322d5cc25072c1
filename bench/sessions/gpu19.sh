#!/usr/bin/env bash
# 2026-11-28 (one GPU, one call): why codegen triton is below Inductor on three HF causal LMs (issue 14:
# every row below Inductor's default listed with its measured cause). One model after another, each in
# its own process under its own timeout, colauto-triton then Inductor in that process, with --profile:
#   GPT-NeoX at the Pythia-410M shape (B8), GPT-2 large (B8), Mistral layout at 1B (B4, only if >= 120 s are left)
# T=1024, bf16 autocast, fused AdamW, 3 warm-up steps then 20 timed, no CUDA graphs; each model at most
# MODEL_MAX=300 s, all of them LIMIT=525 s.
# bench.run runs through bench/kernel_profile.py (until 6eff744 written out here as $R/drive.py), which keeps --profile's table and adds,
# per row: three more blocks of 10 timed steps (the row's spread), every kernel's GPU time over the two
# profiled steps (profile-*.kernels.csv), the kernel timeline (profile-*.timeline.csv.gz) and the GPU's
# busy/idle time per step (profile-*.summary.json). One tar, rewritten after each model: $OUT/${TAR:-r19}.tgz.
#   bash bench/sessions/gpu19.sh
#   MODELS="hf/qwen2:bench:8:1024" M=inductor,colauto-triton LIMIT=300 bash bench/sessions/gpu19.sh
# Run from a clean `git archive` (pass COMMIT=<sha>): another checkout's edits must not reach the GPU.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/caches/inductor TRITON_CACHE_DIR=/tmp/caches/triton
R=${R:-/tmp/r19}; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); LIMIT=${LIMIT:-525}
nvidia-smi -L > $R/cards.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
    --format=csv >> $R/cards.txt 2>&1
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
{ echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; git status --short 2>/dev/null; } > $R/commit.txt


bench() {   # MODEL SECONDS
  local d=$R/$(echo $1 | cut -d: -f1 | tr / _); mkdir -p $d
  echo "start $1 at $(( $(date +%s) - T0 )) s, timeout $2 s" | tee -a $R/wall.txt
  PYTHONPATH=$PWD COLAUTO_REPORT=1 timeout -k 5 $2 python -m bench.kernel_profile --models $1 --modes ${M:-colauto-triton,inductor} \
    --steps ${STEPS:-20} --warmup 3 --profile --out $d > $d/log.txt 2>&1
  echo "exit $? after $(( $(date +%s) - T0 )) s" >> $d/log.txt
  rm -f $d/*.png
  tar czf $OUT/${TAR:-r19}.tgz -C $R .          # after each model: a later kill keeps what was measured
}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }

set -- ${MODELS:-hf/gpt_neox:bench:8:1024 hf/gpt2:bench:8:1024 hf/mistral:bench:4:1024}
n=0
for m in "$@"; do
  n=$((n + 1)); t=$(( $(left) - 5 )); [ $t -gt ${MODEL_MAX:-300} ] && t=${MODEL_MAX:-300}
  if [ $n -gt 2 ] && [ $t -lt ${MIN_LEFT:-120} ]; then echo "skip $m: $t s left" | tee -a $R/wall.txt; continue; fi
  bench $m $t
done
for d in $R/*/; do
  echo "== $d"; cat $d/results.md 2>/dev/null
  grep -h "^\[profile\]\|FAILED\|Error\|exit " $d/log.txt | cut -c1-400
done
echo "wall $(( $(date +%s) - T0 )) s" | tee -a $R/wall.txt
tar czf $OUT/${TAR:-r19}.tgz -C $R .
