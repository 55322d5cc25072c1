#!/usr/bin/env bash
# 2026-12-03 (session 25), one call on one GPU: issue 16's second launch. HF Qwen2-0.5B (B8, T1024, bf16,
# fused AdamW), each launch a fresh process (bench.run, the first step timed from the torch.compile call):
# Inductor, colauto's default and colauto under a 17.7 GiB budget, each cold once (its own empty cache
# folders) and then warm twice (the same folders: torch's AOTAutograd and Inductor caches, colauto's plan
# cache), the warm launches interleaved. Everything lands in $OUT/$TAG.tgz.
# COLD=0 ROUNDS="3 4 5" TAG=r35 (gpu35.sh): warm launches only, on a machine that still holds the caches.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
COLD=${COLD:-1}; ROUNDS=${ROUNDS:-"1 2"}; TAG=${TAG:-r34}
R=/tmp/$TAG; mkdir -p $R; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi -L > $R/cards.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" > $R/versions.txt
echo "${COMMIT:-unknown}" > $R/commit.txt
LIMIT=570; source "$(dirname "$0")/first_step.sh"
if [ "$COLD" = 1 ]; then
  launch inductor-cold ind inductor
  launch colauto-cold col colauto
  launch colauto-17.7GiB-cold colb colauto 17.7GiB
fi
for i in $ROUNDS; do
  launch inductor-warm$i ind inductor
  launch colauto-warm$i col colauto
  launch colauto-17.7GiB-warm$i colb colauto 17.7GiB
done
echo "wall $(( $(date +%s) - T0 )) s" > $R/wall.txt
tar czf $OUT/$TAG.tgz -C $R .
for d in $R/first/*/; do python -c "
import json,sys; r=json.load(open('$d/results.json'))['rows'][0]; print('$d'.split('/')[-2], r['mode'], 'first step %.1f s' % r['warmup_s'] if r.get('warmup_s') else r.get('error'), 'tok/s %.0f' % r['tokens_per_s'] if r.get('tokens_per_s') else '', 'peak %.2f GiB' % (r['peak_bytes'] / 2**30) if r.get('peak_bytes') else '')" 2>&1 | tail -1; done
grep -h "compile cache\|plan cache" $R/first/*/log.txt | sort | uniq -c
