#!/usr/bin/env bash
# Written 2026-12-06 (session 38); not yet run (no machine came for it). Where does the budgeted step lose its time? For each model=budget of
# PROFILE, Inductor and colauto (under the budget) with bench.kernel_profile: three blocks of 10 timed steps,
# then two profiled steps (every kernel's GPU time, the timeline, busy vs span). Then the cold first
# launches of gpu42.sh for MODELS (BLOOM under its budget, which never finished in session 37). Inductor's
# baseline runs in the same call. LIMIT: seconds for the whole call (default 570). One tar: $OUT/r43.tgz.
#   COMMIT=<sha> bash bench/sessions/gpu43.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_REPORT=1
R=/tmp/r43; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
for mb in ${PROFILE:-hf/olmo2:bench:4:1024=24.13GiB}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$budget
  for mode in inductor colauto; do
    d=$R/profile/$name/$mode; mkdir -p $d
    [ $(left) -lt 60 ] && { echo "== profile $name $mode: no time left"; continue; }
    env TORCHINDUCTOR_CACHE_DIR=/tmp/c43/$name/$mode/inductor COLAUTO_CACHE_DIR=/tmp/c43/$name/$mode/colauto \
        TRITON_CACHE_DIR=/tmp/c43/$name/$mode/triton COLAUTO_MEMORY_BUDGET=$budget \
        timeout -k 5 $(left) python -m bench.kernel_profile --models $spec --modes $mode --steps 3 --warmup 2 --profile --out $d > $d/log.txt 2>&1
    echo "== profile $name $mode: rc $?"; rm -f $d/*.png
    cat $d/*.summary.json 2>/dev/null | tr -d '\n'; echo
  done
done
if [ -n "${MODELS-hf/bloom:bench:8:1024=23.95GiB}" ]; then
  OUT=$R/first LIMIT=$(left) LAUNCHES=first MODELS="${MODELS-hf/bloom:bench:8:1024=23.95GiB}" MODES="inductor colauto" \
      bash bench/sessions/gpu42.sh && (cd $R/first && tar xzf r42.tgz && rm r42.tgz)
fi
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r43.tgz -C $R .
