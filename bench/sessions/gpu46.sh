#!/usr/bin/env bash
# Written 2026-12-07 (session 40). Issue 16's first must-show on one GPU, at HEAD: for each model of
# MODELS (spec=budget), three cold launches start together on the one GPU, so all three compile under the
# same host load: plain Inductor, colauto with no options, and colauto under the budget. Each is a fresh
# process with its own empty cache folders (Inductor, Triton, colauto; COLAUTO_PLAN_CACHE=0); the first
# step is timed from the torch.compile call (bench.run's warmup_s with --warmup 1). Step times of launches
# sharing a GPU are not comparable; only the first step is the point. LIMIT: seconds for the call. One
# tar: $OUT/r46.tgz. AMB=<fraction> (added session 45) starts a fourth launch beside them: plain Inductor under its
# own activation checkpointing, torch._functorch.config.activation_memory_budget = AMB
# (bench/sessions/amb/sitecustomize.py), the other reference for a first step under a budget.
# WARMUP=<n> (added session 47, default 1): untimed steps, the first timed alone; a split step's graphs are
# planned again at its second and third runs, so WARMUP=3 times and measures the plan that stays. BY_BUDGET=1:
# each model's folder is named NAME-BUDGET (one model at several budgets).
#   COMMIT=<sha> MODELS="hf/qwen2:bench:8:1024=17.7GiB ..." LIMIT=560 [AMB=0.5] bash bench/sessions/gpu46.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r46; rm -rf $R; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s); echo "${COMMIT:-unknown}" > $R/commit.txt; nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" > $R/versions.txt
left() { echo $(( ${LIMIT:-560} - ($(date +%s) - T0) )); }
launch() {   # launch NAME SPEC MODE BUDGET [ENV...]
  local d=$R/$1/$3; mkdir -p $d
  env "${@:5}" TORCHINDUCTOR_CACHE_DIR=/tmp/c46/$1/$3/inductor COLAUTO_CACHE_DIR=/tmp/c46/$1/$3/colauto \
      TRITON_CACHE_DIR=/tmp/c46/$1/$3/triton COLAUTO_MEMORY_BUDGET=$4 \
      timeout -k 5 $(left) python -m bench.run --models $2 --modes $(echo ${3%-budget} | sed 's/-amb$//') --steps 3 --warmup ${WARMUP:-1} --out $d > $d/log.txt 2>&1
  echo "$1 $3 rc $?" >> $R/rc.txt; rm -f $d/*.png
}
for mb in ${MODELS}; do
  spec=${mb%=*}; budget=${mb#*=}; name=$(echo $spec | cut -d/ -f2 | cut -d: -f1)
  [ -n "${BY_BUDGET:-}" ] && name=$name-$budget
  [ $(left) -lt 90 ] && { echo "== $name: no time left" | tee -a $R/rc.txt; continue; }
  launch $name $spec inductor none & launch $name $spec colauto none & launch $name $spec colauto-budget $budget &
  [ -n "${AMB:-}" ] && launch $name $spec inductor-amb none AMB=$AMB PYTHONPATH=$PWD/bench/sessions/amb:$PWD &
  wait
  for m in inductor colauto colauto-budget ${AMB:+inductor-amb}; do python - $R/$name/$m/results.json $name $m <<'PY' 2>&1 | tail -1
import json, sys
try:
    r = json.load(open(sys.argv[1]))['rows'][0]
    print(sys.argv[2], sys.argv[3], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'),
          'peak %.2f GiB' % (r['peak_bytes'] / 2**30) if r.get('peak_bytes') else '')
except Exception as e:
    print(sys.argv[2], sys.argv[3], 'no result:', e)
PY
  done
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r46.tgz -C $R .
