#!/usr/bin/env bash
# tests/ranks/hf_worker.py's runs on a GPU host's CPU (gloo, CUDA hidden): the host's torch (2.11) and
# transformers (5.17), which this repository's CPU machines cannot install. Results under $OUT (or ./out):
# rank*.json per launch, versions.txt, and the DTensor-rule and tp-lift unit tests' output where pytest exists.
#     RUNS="t5@tp=2 qwen2_moe@dp=2" NPROC=2 bash bench/sessions/cpu_ranks_host.sh
set -uo pipefail
OUT=${OUT:-out}
NPROC=${NPROC:-2}
mkdir -p "$OUT"
export CUDA_VISIBLE_DEVICES=""
python -c "import torch, transformers, sys; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])" > "$OUT/versions.txt"
cat "$OUT/versions.txt"
git rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null || true
if python -c "import pytest" 2>/dev/null; then
    PYTHONPATH=. python -m pytest -q -p no:warnings -p no:cacheprovider tests/test_dtensor_rules.py tests/test_tp_graph.py \
        > "$OUT/unit_tests.txt" 2>&1
    tail -3 "$OUT/unit_tests.txt"
fi
start=$(date +%s)
timeout "${LIMIT:-420}" torchrun --nproc-per-node "$NPROC" tests/ranks/hf_worker.py --out "$OUT/ranks" $RUNS > "$OUT/log.txt" 2>&1
echo "rc $? in $(( $(date +%s) - start )) s"
grep -E "^colauto:|@" "$OUT/log.txt" | tail -40
