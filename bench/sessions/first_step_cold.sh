#!/usr/bin/env bash
# Cold first steps, one fresh bench.run process per (model, mode), each with empty Inductor, Triton and colauto
# caches of its own: MODELS (comma-separated bench.run specs), MODES (default inductor,colauto, run in that
# order per model; a mode named twice runs twice, in folders numbered by position), LIMIT (seconds for the
# whole call). Results in $OUT/first.tgz (first/<model>_<position>_<mode>/: log.txt, results.json, results.md).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; R=$OUT; mkdir -p $R/first
T0=$(date +%s)
left() { local s=$(( ${LIMIT:-560} - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
for spec in ${MODELS//,/ }; do
  i=0
  for mode in ${MODES:-inductor colauto}; do
    i=$((i + 1)); name=$(echo $spec | tr '/:' '__')_${i}_$mode; c=/tmp/caches/$name; rm -rf $c; mkdir -p $R/first/$name
    [ $(left) -lt 60 ] && { echo "skipped $name" | tee -a $R/skipped.txt; continue; }
    env TORCHINDUCTOR_CACHE_DIR=$c/inductor TRITON_CACHE_DIR=$c/triton COLAUTO_CACHE_DIR=$c/colauto \
        timeout -k 5 $(left) python -m bench.run --models $spec --modes $mode --steps 3 --warmup 1 \
        --out $R/first/$name > $R/first/$name/log.txt 2>&1
    rm -f $R/first/$name/*.png
    grep -h "tok/s" $R/first/$name/log.txt | head -2 | cut -c1-200
  done
done
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $R/first.tgz -C $R first cards.txt versions.txt wall.txt && rm -rf $R/first
