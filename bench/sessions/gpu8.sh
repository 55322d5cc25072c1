#!/usr/bin/env bash
# 2026-11-27 (second session), call 5 (1 GPU, a fresh machine): first step of separate launches of HF Qwen2-0.5B (B8, T1024)
# at HEAD, each a fresh process, the first step now timed from the torch.compile call (bench.run): Inductor cold / warm, colauto default cold / warm, colauto under a 16 GiB
# budget cold / warm (a warm colauto launch reads the compiled step from torch's AOTAutograd cache).
# (call 4 ran on the machine call 3 had warmed: its "cold" Inductor and colauto launches found caches.)
# Everything lands in one tar ($OUT/r8.tgz).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/r8; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
git status --short > $R/tree.txt 2>/dev/null
LIMIT=560; source "$(dirname "$0")/first_step.sh"
launch colauto-cold col colauto
launch colauto-warm col colauto
launch inductor-cold ind inductor
launch inductor-warm ind inductor
launch colauto-16GiB-cold colb colauto 16GiB
launch colauto-16GiB-warm colb colauto 16GiB
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/r8.tgz -C $R .
for d in $R/first/*/; do python -c "
import json,sys; r=json.load(open('$d/results.json'))['rows'][0]; print('$d'.split('/')[-2], r['mode'], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '')" 2>&1 | tail -1; done
grep -h "compile cache\|plan cache" $R/first/*/log.txt | sort | uniq -c
