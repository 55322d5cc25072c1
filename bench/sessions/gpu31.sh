#!/usr/bin/env bash
# 2026-12-01 (one GPU, one call): which commit of colauto holds an extra block between steps on HF GPT-2
# (2 layers of GPT-2 large's width, its 50257-token vocabulary, B8 x T1024, bf16 autocast, fused AdamW).
# Each commit's package is exported beforehand, in the repository root (an ignored folder, carried):
#   for c in $COMMITS; do mkdir -p bisect/$c && git archive $c colauto_backend triton_kernels | tar x -C bisect/$c; done
# then: COMMITS="c452b7b 5765055 ..." bash bench/sessions/gpu31.sh   (the device call carries bisect/)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 COLAUTO_PLAN_CACHE=0 TORCHINDUCTOR_CACHE_DIR=/tmp/ic
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../.." && pwd)
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
echo "== FORCE_PAD=0"
timeout 120 python "$here/held_bisect.py" inductor 2>&1 | grep -v Warning
for c in ${COMMITS}; do
  echo "-- $c"
  PYTHONPATH=$root/bisect/$c timeout 150 python "$here/held_bisect.py" colauto 2>&1 | grep -v "Warning\|warn" | tail -12
done
