"""Train a GPT-2 for a few steps with torch.compile(model, backend="colauto").

    python examples/train_gpt2.py                 # tiny model on CPU (seconds)
    python examples/train_gpt2.py --size 124m     # GPT-2 124M, B=16, T=1024, bf16 autocast on a GPU
    torchrun --nproc-per-node 2 examples/train_gpt2.py    # the same script on 2 processes / GPUs

An ordinary single-device training loop: the only colauto-specific lines are the backend name and the
cost summary printed at the start (colauto_backend.profile, the same model the backend builds). Under
torchrun each rank takes its own slice of the global batch, as a DDP script's data loader would, and
colauto plans the mesh (COLAUTO_REPORT=1 prints the plan).
"""
import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import colauto_backend  # noqa: E402
from examples.models import build  # noqa: E402


def main() -> None:
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="124m" if cuda else "tiny")
    ap.add_argument("--batch", type=int, default=16 if cuda else 4)
    ap.add_argument("--seq", type=int, default=1024 if cuda else 64)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()

    device = "cuda" if cuda else "cpu"
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    model, make_inputs = build("gpt2", args.size, device=device)
    x, y = (t.chunk(world)[rank].to(device) for t in make_inputs(args.batch * world, args.seq))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    autocast = torch.autocast("cuda", torch.bfloat16) if cuda else contextlib.nullcontext()

    with autocast:
        prof = colauto_backend.profile(model, x, y)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(prof.report())

    compiled = torch.compile(model, backend="colauto")
    for step in range(args.steps):
        start = time.perf_counter()
        with autocast:
            loss = compiled(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        say(f"step {step}: loss {loss.item():.4f}  ({time.perf_counter() - start:.3f} s)", flush=True)
    if cuda:
        say(f"peak memory: measured {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, "
              f"predicted {prof.peak_memory_bytes / 2**30:.2f} GiB (one device, unsharded)")


if __name__ == "__main__":
    main()
