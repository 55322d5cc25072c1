#!/usr/bin/env bash
# Llama-3 8B and 70B planned on 8, 64 and 512 H100s (the commands of ../explain-2026-11-27), at the commit
# that restores nll_loss's backward on the meta device. Run from this directory: bash run.sh
set -u
C=../explain-2026-11-27
for m in 8b 70b; do for d in 8 64 512; do
  s=$(date +%s.%N)
  python -m colauto_backend explain --model $C/llama3-$m/config.json --batch 1 --seq 8192 --devices $d --device h100 > llama3-$m-h100x$d.txt 2> llama3-$m-h100x$d.err
  echo "llama3-$m h100x$d exit $? wall $(python3 -c "import time; print(round(time.time() - $s, 1))") s" | tee -a wall.txt
done; done
