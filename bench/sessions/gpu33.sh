#!/usr/bin/env bash
# 2026-12-03 session 27 (one GPU, one call): where the budgeted cold first step's time goes. Each launch is a
# fresh process with its own empty cache folders, under cProfile, one after another:
#   inductor         plain torch.compile
#   colauto          backend="colauto", no budget
#   colauto-budget   COLAUTO_MEMORY_BUDGET = the budget given
# MODELS: model=budget pairs (default HF Llama 1.1B at 17.1 GiB, session 26's). RUNS: the modes (default all three).
# Each launch's profile is summarised into top.txt (cumulative, colauto and the compile's stages; and tottime).
# LIMIT: seconds for the whole call (default 570). One tar: $OUT/r33.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r33; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
for mb in ${MODELS:-hf/llama:bench:4:1024=17.1GiB}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)
  for mode in ${RUNS:-inductor colauto colauto-budget}; do
    d=$R/$name-$mode; mkdir -p $d; benchmode=$mode; extra=""
    case $mode in colauto-budget*) benchmode=colauto extra="COLAUTO_MEMORY_BUDGET=$budget";; esac
    left=$(( ${LIMIT:-570} - ($(date +%s) - T0) )); [ $left -lt 20 ] && { echo "== $name $mode: no time left"; continue; }
    env TORCHINDUCTOR_CACHE_DIR=/tmp/c33/$name-$mode/inductor COLAUTO_CACHE_DIR=/tmp/c33/$name-$mode/colauto \
        TRITON_CACHE_DIR=/tmp/c33/$name-$mode/triton $extra \
        timeout -k 5 $left python -m cProfile -o $d/prof.out -m bench.run --models $spec --modes $benchmode \
        --steps 2 --warmup 1 --out $d > $d/log.txt 2>&1
    echo "== $name $mode ($d): rc $?"; rm -f $d/*.png; grep -h "planned in\|tok/s\|Error" $d/log.txt | cut -c1-400 | head -4
    grep -h "^| hf" $d/results.md 2>/dev/null
    python - $d/prof.out > $d/top.txt 2>&1 <<'PY'
import pstats, sys
p = pstats.Stats(sys.argv[1]); p.sort_stats("cumulative")
p.print_stats("colauto_backend|compile_fx|aot_module_simplified|convert_frame.py.*\\(_compile\\)|partitioners.py|codecache|async_compile|select_algorithm|autotune|graph.py.*(run|codegen|compile_to_module)|scheduler.py.*\\(__init__|fuse|codegen\\)|wrapper.py.*generate|compile_threads|SubprocPool|wait|triton_heuristics.py.*precompile", 120)
p.sort_stats("tottime"); p.print_stats(40)
PY
  done
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r33.tgz -C $R --exclude=prof.out .
