#!/usr/bin/env bash
# 2026-12-04 session 29 (one GPU, one call): gpu36.sh's first-step comparison on more HF families. For each
# model=budget of MODELS: plain Inductor, Inductor under activation_memory_budget AMB
# (bench/sessions/amb/sitecustomize.py) and colauto under the budget, each a fresh process with its own empty
# caches, timed from torch.compile to the end of the first optimizer step (bench.run's warm-up s).
# LIMIT: seconds for the whole call (default 570). AMB (default 0.5). One tar: $OUT/r37.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r37; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
for mb in ${MODELS:-hf/qwen2:bench:8:1024=17.7GiB hf/mistral:bench:4:1024=14.5GiB}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)
  for mode in inductor inductor-amb colauto-budget; do
    d=$R/$name-$mode; mkdir -p $d; benchmode=$mode; extra=""
    case $mode in inductor-amb) benchmode=inductor extra="AMB=${AMB:-0.5} PYTHONPATH=$PWD/bench/sessions/amb:$PWD";;
                  colauto-budget) benchmode=colauto extra="COLAUTO_MEMORY_BUDGET=$budget";; esac
    [ $(left) -lt 30 ] && { echo "== $name $mode: no time left"; continue; }
    env TORCHINDUCTOR_CACHE_DIR=/tmp/c37/$name-$mode/inductor COLAUTO_CACHE_DIR=/tmp/c37/$name-$mode/colauto \
        TRITON_CACHE_DIR=/tmp/c37/$name-$mode/triton $extra \
        timeout -k 5 $(left) python -m bench.run --models $spec --modes $benchmode --steps 3 --warmup 2 --out $d > $d/log.txt 2>&1
    echo "== $name $mode: rc $?"; rm -f $d/*.png; grep -h "planned in\|Error" $d/log.txt | cut -c1-300 | head -3; grep -h "^| hf" $d/results.md 2>/dev/null
  done
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r37.tgz -C $R .
