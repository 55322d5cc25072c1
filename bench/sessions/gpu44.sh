#!/usr/bin/env bash
# Written 2026-12-06 (session 38); run in session 38 (h100-2026-12-06-auto-rules). COLAUTO_PLANNED_RULES=auto (the default since session 38: a step held to
# the user's budget is compiled letting Inductor fuse recomputed ops horizontally, and again refusing that
# only if the compiled code's peak is over the budget) against the former default (fusion,reuse) and plain
# Inductor, in one call. For each model=budget of MODELS: mode inductor, then colauto under each setting of
# RULES (a fresh process with empty caches each: cold first launches). LIMIT: seconds for the whole call
# (default 570). One tar: $OUT/r44.tgz.
#   COMMIT=<sha> bash bench/sessions/gpu44.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_REPORT=1
R=/tmp/r44; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
for mb in ${MODELS:-hf/olmo2:bench:4:1024=24.13GiB hf/gpt_bigcode:bench:4:1024=19.37GiB}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)-$budget
  for run in inductor ${RULES:-auto fusion,reuse}; do
    mode=colauto; rules=$run; [ "$run" = inductor ] && { mode=inductor; rules=auto; }
    tag=$mode-$(echo $rules | tr , +); [ "$run" = inductor ] && tag=inductor
    d=$R/$name/$tag; mkdir -p $d
    [ $(left) -lt 60 ] && { echo "== $name $tag: no time left"; continue; }
    env TORCHINDUCTOR_CACHE_DIR=/tmp/c44/$name/$tag/inductor COLAUTO_CACHE_DIR=/tmp/c44/$name/$tag/colauto \
        TRITON_CACHE_DIR=/tmp/c44/$name/$tag/triton COLAUTO_MEMORY_BUDGET=$budget COLAUTO_PLANNED_RULES=$rules \
        timeout -k 5 $(left) python -m bench.run --models $spec --modes $mode --steps 5 --warmup 2 --out $d > $d/log.txt 2>&1
    echo "== $name $tag: rc $?"; rm -f $d/*.png
    grep -h "compiled again\|peak of the compiled code\|PLANNED_RULES=\|Error" $d/log.txt | cut -c1-300 | head -5
    cat $d/results.md 2>/dev/null | tail -1
  done
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r44.tgz -C $R .
