#!/usr/bin/env bash
# Written 2026-12-06 (session 35); run in sessions 36 (h100-2026-12-06-replanned-triton) and 37
# (h100-2026-12-06-half-activation). The re-plan of a step compiled
# over its budget (backend._held_to_budget) on a GPU. For each model=budget of MODELS and each mode of
# MODES, a fresh process with empty caches (the first launch: it may compile up to 3 times), then a
# second launch with the same caches (the margin kept under COLAUTO_CACHE_DIR/plans/margins: planned
# under it at once). Inductor's baseline (mode inductor) runs in the same call. LIMIT: seconds for the
# whole call (default 570). LAUNCHES: "first" for cold launches only (default "first second"). One tar:
# $OUT/r42.tgz.
#   COMMIT=<sha> MODELS="hf/mistral:bench:4:1024=14.5GiB" MODES="inductor colauto-triton" bash bench/sessions/gpu42.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_REPORT=1
R=/tmp/r42; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
python -c "import torch._functorch.config as c; print('force_non_lazy_backward_lowering', hasattr(c, 'force_non_lazy_backward_lowering'))" >> $R/versions.txt
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
for mb in ${MODELS:-hf/mistral:bench:4:1024=14.5GiB hf/llama:bench:4:1024=17.1GiB}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$budget
  for mode in ${MODES:-inductor colauto-triton colauto}; do
    launches=${LAUNCHES:-first second}; [ "$mode" = inductor ] && launches="first"
    for launch in $launches; do
      d=$R/$name/$mode-$launch; mkdir -p $d
      [ $(left) -lt 60 ] && { echo "== $name $mode $launch: no time left"; continue; }
      env TORCHINDUCTOR_CACHE_DIR=/tmp/c42/$name/$mode/inductor COLAUTO_CACHE_DIR=/tmp/c42/$name/$mode/colauto \
          TRITON_CACHE_DIR=/tmp/c42/$name/$mode/triton COLAUTO_MEMORY_BUDGET=$budget \
          timeout -k 5 $(left) python -m bench.run --models $spec --modes $mode --steps 3 --warmup 2 --out $d > $d/log.txt 2>&1
      echo "== $name $mode $launch: rc $?"; rm -f $d/*.png
      grep -h "planned and compiled again\|peak of the compiled code\|Error" $d/log.txt | cut -c1-300 | head -4
      cat $d/results.md 2>/dev/null | tail -1
    done
  done
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r42.tgz -C $R .
