#!/usr/bin/env bash
# 2026-11-28 (one GPU, one call): colauto's kernels as torch.library.triton_ops, launched from Inductor's
# generated wrapper where Inductor compiles the rest (codegen triton on CUDA). 1) the CUDA tests of
# tests/test_triton_hf.py (equal to eager; Inductor's code launches the kernels, calls no colauto custom
# op) with Inductor's output code kept; 2) HF Qwen2 at its bench shape, Inductor and colauto-triton in one
# process (same as bench/results/h200-2026-11-28-triton-inductor-rest-qwen2, where the kernels were
# Python custom-op calls: 0.717x). One tar: $OUT/r17.tgz.
# MODEL (a bench.run spec), M (modes), LIMIT (seconds) override; SKIP_TESTS=1 skips 1).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0
R=/tmp/r17; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
if [ -z "${SKIP_TESTS:-}" ]; then
timeout 200 python -m pytest tests/test_triton_hf.py -q -p no:warnings -k "wrapper" > $R/tests.txt 2>&1
tail -5 $R/tests.txt | cut -c1-600
timeout 100 python - > $R/llama_code.txt 2>&1 <<'PY'
import torch
from torch._inductor.utils import run_and_get_code
from examples.hf_zoo import build_hf
import colauto_backend
model, make = build_hf("llama"); model = model.cuda()
kw = {k: v.cuda() for k, v in make(2, 32).items()}
torch._dynamo.register_backend(colauto_backend.colauto, name="colauto")
compiled = torch.compile(model, backend="colauto", options={"codegen": "triton"})
_, code = run_and_get_code(lambda: compiled(**kw).loss.backward())
print("\n\n#### next graph\n\n".join(code))
PY
fi
left=$(( ${LIMIT:-560} - ($(date +%s) - T0) ))
mkdir -p $R/qwen2
COLAUTO_REPORT=1 timeout -k 5 $left python -m bench.run --models ${MODEL:-hf/qwen2:bench:8:1024} \
    --modes ${M:-inductor,colauto-triton} --steps 10 --warmup 2 --out $R/qwen2 > $R/qwen2/log.txt 2>&1
rm -f $R/qwen2/*.png
grep -h "tok/s\|Error\|error\|fusion (forward)" $R/qwen2/log.txt | head -20
echo "wall $(( $(date +%s) - T0 )) s" | tee $R/wall.txt
tar czf $OUT/r17.tgz -C $R .
