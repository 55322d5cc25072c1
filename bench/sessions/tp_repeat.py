"""By hand (session 26): does GPT-NeoX's tp=2 inductor step give each rank the same gradients, and the same
gradients at every step? Two gloo ranks run the compiled step 8 times on the same parameters and inputs
(no optimizer step) and compare each rank's local gradient sums.

    python bench/sessions/tp_repeat.py          # launches itself under tests/torchrun.py's torchrun
"""
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def rank_main(out: str) -> None:
    import torch
    import torch.distributed as dist
    from examples import hf_zoo
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batch = hf_zoo.build_hf("gpt_neox", "tiny")
    local = {k: v.chunk(world)[rank] for k, v in batch(2 * world, 16).items()}
    compiled = torch.compile(model, backend="colauto", options={"mesh": "tp=2", "codegen": "inductor"})
    steps = []
    for _ in range(8):
        hf_zoo.loss_of(compiled(**local)).backward()
        steps.append({n: float((p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).double().sum())
                      for n, p in model.named_parameters() if p.grad is not None})
        model.zero_grad(set_to_none=True)
    json.dump(steps, open(os.path.join(out, f"rank{rank}.json"), "w"))
    dist.destroy_process_group()


def main() -> None:
    from torchrun import torchrun
    with tempfile.TemporaryDirectory() as out:
        proc = torchrun(2, [os.path.abspath(__file__), "--rank-out", out], timeout=900)
        if proc.returncode:
            sys.exit(proc.stderr[-2000:])
        r0, r1 = (json.load(open(os.path.join(out, f"rank{r}.json"))) for r in (0, 1))
    # step 0 is the unplanned data-parallel first call; the tp graphs run from step 1 on
    for i, (a, b) in enumerate(zip(r0, r1)):
        worst = max((abs(a[n] - b[n]) / max(abs(a[n]), 1e-30) for n in a), default=0.0)
        print(f"step {i}: {sum(a[n] != b[n] for n in a)} of {len(a)} gradients differ between the ranks "
              f"(largest relative difference of a gradient's sum {worst:.1e}); "
              f"against step 1: rank 0 {sum(a[n] != r0[1][n] for n in a)}, rank 1 {sum(b[n] != r1[1][n] for n in b)}")


if __name__ == "__main__":
    if "--rank-out" in sys.argv:
        rank_main(sys.argv[sys.argv.index("--rank-out") + 1])
    else:
        main()
