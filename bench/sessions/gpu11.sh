#!/usr/bin/env bash
# 2026-11-27 (third session), call 2 (1 GPU): where the first step's time goes under a budget. HF Qwen2-0.5B
# (B8, T1024), fresh cache folders, each launch under cProfile: Inductor, then colauto under 16 GiB.
# The profiles' top entries land in text files; everything in one tar ($OUT/r11.tgz).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/r11; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
T0=$(date +%s)
left() { local s=$(( ${LIMIT:-400} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
launch() {  # name mode [budget]
  local name=$1 mode=$2 budget=${3:-}
  mkdir -p $R/$name
  env TORCHINDUCTOR_CACHE_DIR=/tmp/caches/$name/inductor TRITON_CACHE_DIR=/tmp/caches/$name/triton \
      COLAUTO_CACHE_DIR=/tmp/caches/$name/colauto ${budget:+COLAUTO_MEMORY_BUDGET=$budget} COLAUTO_REPORT=1 \
      timeout -k 5 $(left) python -m cProfile -o $R/$name/prof.out -m bench.run --models hf/qwen2:bench:8:1024 \
      --modes $mode --steps 3 --warmup 1 --out $R/$name > $R/$name/log.txt 2>&1
  rm -f $R/$name/*.png
  python - $R/$name/prof.out > $R/$name/top.txt 2>&1 <<'PY'
import pstats, sys
p = pstats.Stats(sys.argv[1]); p.sort_stats("cumulative")
p.print_stats("colauto_backend|compile_fx|aot_module_simplified|convert_frame.py.*\\(_compile\\)|min_cut_rematerialization|partitioners.py.*default_partition|codecache|async_compile|select_algorithm|autotune|benchmark|graph_lowering|scheduler.py.*\\(__init__\\)|wrapper.py.*generate|triton_heuristics|compile_threads|SubprocPool|wait", 80)
PY
}
# LAUNCHES: name:mode[:budget] ... (the first call ran both and ran out of time in the second; call 3 ran
# LAUNCHES=colauto16b:colauto:16GiB on the same machine, with its own fresh cache folders)
for spec in ${LAUNCHES:-inductor:inductor colauto16:colauto:16GiB}; do
  IFS=: read -r name mode budget <<< "$spec"
  launch $name $mode $budget
done
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r11.tgz -C $R --exclude=prof.out .
for d in $R/*/; do [ -f $d/prof.out ] && cp $d/prof.out $OUT/$(basename $d).prof; done
for d in $R/*/; do [ -f $d/results.json ] && python -c "
import json; r=json.load(open('$d/results.json'))['rows'][0]; print('$d'.split('/')[-2], r['mode'], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '')"; done
