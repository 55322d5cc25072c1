#!/usr/bin/env bash
# 2026-11-28 (session 7, 4 GPUs, one call): codegen triton, with Inductor launching colauto's kernels and
# tracing the joint graph with its own decompositions (df87ecc), against Inductor on four HF causal LMs, one
# model per GPU, each in its own process (each ratio against the Inductor row of its own process):
#   GPU0: the CUDA tests of tests/test_triton_hf.py (-k wrapper), then GPT-2 large (B8)
#   GPU1: Llama at the TinyLlama-1.1B shape (B4)   GPU2: GPT-NeoX at the Pythia-410M shape (B8)
#   GPU3: Mistral layout at 1B (B4)
# T=1024, bf16 autocast, fused AdamW, 2 warm-up steps then 10 timed. One tar: $OUT/r18.tgz.
#   bash bench/sessions/gpu18.sh
#   MODELS="hf/qwen3:bench:8:1024" bash bench/sessions/gpu18.sh     # other models, one a GPU from GPU1 on
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/r18; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); LIMIT=${LIMIT:-540}
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
{ echo "${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; git status --short 2>/dev/null; } > $R/commit.txt
bench() {   # GPU MODEL SECONDS
  local d=$R/$(echo $2 | cut -d: -f1 | tr / _); mkdir -p $d
  CUDA_VISIBLE_DEVICES=$1 TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$1 TRITON_CACHE_DIR=/tmp/caches/t$1 COLAUTO_REPORT=1 \
    timeout -k 5 $3 python -m bench.run --models $2 --modes ${M:-inductor,colauto-triton} --steps 10 --warmup 2 \
    --out $d > $d/log.txt 2>&1
  echo "exit $? after $(( $(date +%s) - T0 )) s" >> $d/log.txt
  rm -f $d/*.png
}
(
  CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/caches/tests timeout 150 \
    python -m pytest tests/test_triton_hf.py -q -p no:warnings -k "wrapper" > $R/tests.txt 2>&1
  bench 0 ${GPT2:-hf/gpt2:bench:8:1024} $(( LIMIT - ($(date +%s) - T0) ))
) &
g=1
for m in ${MODELS:-hf/llama:bench:4:1024 hf/gpt_neox:bench:8:1024 hf/mistral:bench:4:1024}; do
  bench $g $m $LIMIT &
  g=$((g + 1))
done
wait
tail -3 $R/tests.txt | cut -c1-600
for d in $R/*/; do echo "== $d"; grep -h "tok/s\|Error\|error\|exit " $d/log.txt | head -8 | cut -c1-400; done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r18.tgz -C $R .
