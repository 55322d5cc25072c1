#!/usr/bin/env bash
# 2026-12-02 session 22 (one GPU, one call per MODELS list): issue 16's first must-show after the DP's compact
# tables and the paused collector (1acc1b6). Each launch is a fresh process with its own empty cache folders
# (a cold first step), timed from the torch.compile call, one after another on the one GPU:
#   inductor         plain torch.compile
#   colauto          backend="colauto", no options (no budget: the default)
#   colauto-budget   COLAUTO_MEMORY_BUDGET = the budget given (80% of Inductor's measured peak)
#   colauto-gcon, colauto-budget-gcon   the same with colauto's garbage-collector pause undone
#                    (bench/sessions/gc_on/sitecustomize.py; added in session 23)
# MODELS: model=budget pairs, space-separated. RUNS: the modes run for each, in order (default "inductor colauto
# colauto-budget"; a mode may repeat: its folders are numbered). LIMIT: seconds for the whole call (default 570). One tar: $OUT/r32.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r32; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
for mb in ${MODELS:-hf/qwen2:bench:8:1024=17.7GiB hf/gpt_neox:bench:8:1024=11.8GiB}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)
  i=0
  for mode in ${RUNS:-inductor colauto colauto-budget}; do
    i=$((i + 1)); d=$R/$name-$mode; [ -e $d ] && d=$d-$i; mkdir -p $d; benchmode=$mode; extra=""
    case $mode in colauto-budget*) benchmode=colauto extra="COLAUTO_MEMORY_BUDGET=$budget";; esac
    case $mode in *-gcon) benchmode=colauto extra="$extra PYTHONPATH=$PWD/bench/sessions/gc_on:$PWD";; esac
    left=$(( ${LIMIT:-570} - ($(date +%s) - T0) )); [ $left -lt 20 ] && { echo "== $name $mode: no time left"; continue; }
    env TORCHINDUCTOR_CACHE_DIR=/tmp/c32/$name-$mode-$i/inductor COLAUTO_CACHE_DIR=/tmp/c32/$name-$mode-$i/colauto \
        TRITON_CACHE_DIR=/tmp/c32/$name-$mode-$i/triton $extra \
        timeout -k 5 $left python -m bench.run --models $spec --modes $benchmode --steps ${STEPS:-5} --warmup 2 --out $d > $d/log.txt 2>&1
    echo "== $name $mode ($d): rc $?"; rm -f $d/*.png; grep -h "planned in\|tok/s\|Error" $d/log.txt | cut -c1-400 | head -4
    grep -h "^| hf" $d/results.md 2>/dev/null
  done
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r32.tgz -C $R .
