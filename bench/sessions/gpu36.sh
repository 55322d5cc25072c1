#!/usr/bin/env bash
# 2026-12-04 session 29 (one GPU, one call). Two questions of issue 16 on HF models as shipped:
# 1. Where HF Qwen2-0.5B's predicted peak under 17.7 GiB is 10.7% over the measured one
#    (bench/results/h200-2026-12-03-first-fitting): bench.peak_snapshot's live sets at the measured and at the
#    predicted peak (peak.txt, predicted.txt), under the budget and without one.
# 2. What Inductor's own activation checkpointing costs its cold first step: HF Llama 1.1B, plain Inductor,
#    Inductor under activation_memory_budget AMB (bench/sessions/amb/sitecustomize.py) and colauto under
#    17.1 GiB, each a fresh process with its own empty caches, timed from torch.compile to the end of the
#    first optimizer step (bench.run's warm-up s).
# LIMIT: seconds for the whole call (default 570). AMBS: Inductor budgets (default "0.5"). One tar: $OUT/r36.tgz.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 COLAUTO_REPORT=1
R=/tmp/r36; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
for b in 17.7GiB none; do
  d=$R/qwen2-snapshot-$b; mkdir -p $d
  env TORCHINDUCTOR_CACHE_DIR=/tmp/c36/snap-$b TRITON_CACHE_DIR=/tmp/c36/snap-$b-triton \
      timeout -k 5 $(( $(left) < 200 ? $(left) : 200 )) python -m bench.peak_snapshot --model hf/qwen2:bench:8:1024 --budget $b --out $d > $d/log.txt 2>&1
  echo "== qwen2 snapshot $b: rc $?"; head -3 $d/peak.txt 2>/dev/null; head -1 $d/predicted.txt 2>/dev/null
done
spec=hf/llama:bench:4:1024
for mode in inductor $(for a in ${AMBS:-0.5}; do echo inductor-amb$a; done) colauto-budget; do
  d=$R/llama-$mode; mkdir -p $d; benchmode=$mode; extra=""
  case $mode in inductor-amb*) benchmode=inductor extra="AMB=${mode#inductor-amb} PYTHONPATH=$PWD/bench/sessions/amb:$PWD";;
                colauto-budget) benchmode=colauto extra="COLAUTO_MEMORY_BUDGET=17.1GiB";; esac
  [ $(left) -lt 30 ] && { echo "== llama $mode: no time left"; continue; }
  env TORCHINDUCTOR_CACHE_DIR=/tmp/c36/$mode/inductor COLAUTO_CACHE_DIR=/tmp/c36/$mode/colauto TRITON_CACHE_DIR=/tmp/c36/$mode/triton $extra \
      timeout -k 5 $(left) python -m bench.run --models $spec --modes $benchmode --steps 3 --warmup 2 --out $d > $d/log.txt 2>&1
  echo "== llama $mode: rc $?"; rm -f $d/*.png; grep -h "planned in\|Error" $d/log.txt | cut -c1-300 | head -3; grep -h "^| hf" $d/results.md 2>/dev/null
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r36.tgz -C $R .
