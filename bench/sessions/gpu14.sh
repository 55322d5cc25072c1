#!/usr/bin/env bash
# 2026-11-28 (1 GPU): HF OPT-1.3B (B4, T1024) alone on the machine. In both 4-GPU first-step calls
# (gpu12.sh, gpu13.sh) colauto's default ran OPT at 0.42-0.56x Inductor's tokens/s (3-5 timed steps, beside
# other launches' compiles), against 0.991x in gpu4.sh (10 steps). Here: Inductor and colauto alternate,
# two launches each, 20 timed steps, nothing else running; then one colauto launch with Dynamo's
# recompile and graph-break logs and the kernel profile. Everything lands in one tar ($OUT/r14.tgz).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r14; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
T0=$(date +%s)
left() { local s=$(( 560 - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
run() {   # run NAME MODE [ENV...]
  local name=$1 mode=$2; shift 2
  mkdir -p $R/$name
  env "$@" timeout -k 5 $(left) python -m bench.run --models hf/opt:bench:4:1024 --modes $mode --steps 20 --warmup 3 \
      --out $R/$name > $R/$name/log.txt 2>&1
  rm -f $R/$name/*.png
}
run inductor-1 inductor
run colauto-1 colauto
run inductor-2 inductor
run colauto-2 colauto
run colauto-logs colauto TORCH_LOGS=recompiles,graph_breaks COLAUTO_REPORT=1
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r14.tgz -C $R .
grep -h "tok/s" $R/*/log.txt
grep -c "Recompiling\|recompil" $R/colauto-logs/log.txt
