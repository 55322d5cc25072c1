"""ProcessGroupGloo's heap corruption under concurrent collectives, reproduced without colauto (CPU only).

    python -m bench.gloo_race --mode gathers --seconds 240        # aborts within minutes (torch 2.13)
    python -m bench.gloo_race --mode serial --seconds 240         # the same all-gathers, one at a time: clean
    python -m bench.gloo_race --mode all_reduces --seconds 240    # all-reduces in flight: clean

Each mode runs 4 gloo ranks on a 2x2 device mesh and, on the first mesh axis's group, issues 64
functional collectives of 8 shapes (as a compiled graph issues them: `_c10d_functional` ops, then
`wait_tensor`), with small allocations beside each wait, until a rank dies or `--seconds` pass (then every rank is killed). `gathers` issues all 64
all-gathers before waiting for any, `serial` waits for each before the next, `all_reduces` is `gathers`
with all-reduces. A group runs its collectives on two worker threads; after each, `runLoop` writes the
group's status (the name of the last completed op, a heap string for "ALLGATHER_COALESCED") outside
its lock, so two all-gathers finishing at once free one buffer twice. This is why colauto keeps the
collectives of a CPU graph in their traced order (parallel/overlap.py). Prints one JSON line: the
mode, whether the launch ended early (a rank died) and of what signal, glibc's message, the seconds,
and the rounds rank 0 had finished (by hundreds).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

SHAPES = [(256, 64), (8,), (96, 64), (32,), (64, 64), (8,), (128, 64), (32,)] * 8


def worker(mode: str, seconds: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("a", "b"))
    group = mesh.get_group("a").group_name
    c10d = torch.ops._c10d_functional
    xs = [torch.randn(s) for s in SHAPES]

    def start(x):
        return c10d.all_reduce(x, "sum", group) if mode == "all_reduces" else c10d.all_gather_into_tensor(x, 2, group)

    rounds = 0
    while True:      # until the parent's time limit (a fixed schedule: no synchronization between rounds)
        if mode == "serial":
            for x in xs:
                c10d.wait_tensor(start(x))
                [torch.empty(n) for n in (3, 17, 40, 100)]
        else:
            outs = [start(x) for x in xs]
            for o in outs:
                c10d.wait_tensor(o)
                [torch.empty(n) for n in (3, 17, 40, 100)]
        rounds += 1
        if dist.get_rank() == 0 and rounds % 100 == 0:
            print(f"ROUNDS {rounds}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("gathers", "serial", "all_reduces"), required=True)
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.mode, args.seconds)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
           "-m", "bench.gloo_race", "--worker", "--mode", args.mode, "--seconds", str(args.seconds)]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONFAULTHANDLER": "1"},
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out, err = proc.communicate(timeout=args.seconds)
        crashed = True
    except subprocess.TimeoutExpired:      # ran the whole time: torchrun stops its ranks on SIGTERM
        proc.terminate()
        out, err = proc.communicate(timeout=120)
        crashed = False
    signal = re.search(r"Signal (6|7|11) \(SIG\w+\)", err) or re.search(r"Signal \d+ \(SIG\w+\)", err)   # the rank that died first
    glibc = re.search(r"^(malloc\(\)|free\(\)|double free|corrupted|malloc_consolidate\(\))[^\n]*", err, re.M)
    rounds = re.findall(r"ROUNDS (\d+)", out)
    print(json.dumps({"mode": args.mode, "ranks": args.ranks, "collectives_in_flight": 1 if args.mode == "serial" else len(SHAPES),
                      "ended_early": crashed, "signal": signal.group(0) if signal else None,
                      "glibc": glibc.group(0) if glibc else None, "seconds": round(time.time() - start, 1),
                      "rounds_at_least": int(rounds[-1]) if rounds else 0}), flush=True)


if __name__ == "__main__":
    main()
