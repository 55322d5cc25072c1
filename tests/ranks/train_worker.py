"""Run under torchrun: 5 AdamW steps of a tiny model with colauto on every rank, each rank feeding its
own micro-batch, against single-process eager training on the concatenated global batch (computed on
every rank); a no_grad call before training (it is the one that shards) and no_grad evaluation
after it (loss and logits) are compared too. Several runs share one launch; each is MODEL@MESH (MESH as COLAUTO_MESH, "auto" for the
planner's choice), optionally @BUDGET@COMM (COLAUTO_MEMORY_BUDGET and COLAUTO_COMM values). Writes rank<r>.json: per run the losses, the reference losses, the plan, the local
parameter shapes and, with --checkpoint, a torch.distributed.checkpoint round trip.

    torchrun --nproc-per-node 2 tests/ranks/train_worker.py --out /tmp/r gpt2@dp=2 llama@auto

MODEL+outside computes the loss outside the model, from the logits it returns (each rank's part);
MODEL+frozen freezes one parameter in both models; MODEL+triton compiles with codegen triton (as
COLAUTO_CODEGEN=triton; Triton's interpreter on CPU, TRITON_INTERPRET=1).
"""
import argparse
import copy
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from examples.models import build  # noqa: E402

CLIP = 0.5     # below the gradient norms of these runs, so clipping changes every step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="MODEL@MESH")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2, help="micro-batch per rank")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", action="store_true", help="also round-trip torch.distributed.checkpoint")
    args = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))   # a hang fails, named
    os.makedirs(args.out, exist_ok=True)
    results = []
    for spec in args.runs:
        start, cpu = time.perf_counter(), time.process_time()
        results.append(run(spec, args) | {"seconds": time.perf_counter() - start,
                                          "cpu_seconds": time.process_time() - cpu})
        if dist.get_rank() == 0:
            print(f"{spec}: {results[-1]['seconds']:.1f} s ({results[-1]['cpu_seconds']:.1f} s CPU)", flush=True)
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def run(spec: str, args) -> dict:
    model_name, mesh, *extra = spec.split("@")      # MODEL[+outside][+frozen]@MESH[@BUDGET@COMM]
    model_name, *flags = model_name.split("+")     # +outside, +frozen, +triton
    outside = "outside" in flags
    rank, world = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    from colauto_backend.parallel import tp_graph
    from colauto_backend.parallel.entry import PLANS
    lifted_before, plans_before = sum(tp_graph.LIFTED.values()), len(PLANS)
    torch.manual_seed(0)
    model, make = build(model_name, "tiny")
    ref = copy.deepcopy(model)
    if "frozen" in flags:     # a frozen parameter (the position table), in both models
        for m in (model, ref):
            next(p for n, p in m.named_parameters() if "wpe" in n or "norm" in n).requires_grad_(False)
    x, y = make(args.batch * world, args.seq)                  # the global batch, same on every rank
    xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]       # this rank's micro-batch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    options = {"mesh": mesh} | dict(zip(("memory_budget", "comm"), extra))
    if "triton" in flags:
        options["codegen"] = "triton"
    compiled = torch.compile(model, backend="colauto", options=options)
    with torch.no_grad():          # the first call shards; under no_grad it compiles an inference graph
        first = compiled(xs, ys).item()
        ref_first = ref(x, y).item()
    losses, ref_losses, norms = [], [], []
    for _ in range(args.steps):
        if outside:   # the script computes the loss from the model's outputs (the rank's part)
            logits = compiled(xs)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), ys.view(-1))
        else:
            loss = compiled(xs, ys)
        loss.backward()
        if outside:   # this rank's mean; the ranks' mean is the global batch's (equal micro-batches)
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= world
        # clipping reads the gradients through model.parameters() (DTensors): the global norm
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        r = ref(x, y)
        r.backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        norms.append((float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm), float(ref_norm)))
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        ref_losses.append(r.item())

    with torch.no_grad():          # evaluation after training: the loss, and logits as the rank's part
        eval_loss, ref_eval_loss = compiled(xs, ys).item(), ref(x, y).item()
        logits_diff = (compiled(xs) - ref(x).chunk(world)[rank]).abs().max().item()

    from colauto_backend.parallel.entry import SHARDED
    plan = PLANS[-1]
    # each graph plans on its own (the no_grad first call's graph, then the training graph); a parameter is
    # held as the first plan that shards it says (its cut stands: parallel/fsdp.py, parallel/tp_graph.py)
    plans = list(PLANS)[plans_before:]
    holder = {n: next((q for q in plans if any(x != "R" for x in q.storage.get(n, ("R",)))), plan)
              for n, _ in ref.named_parameters()}
    # a sharded plan shards the module (parallel/emit.py); data parallelism leaves the parameters as they are
    sharded = SHARDED[-1] if SHARDED and SHARDED[-1].plan is plan else None
    # the rank's mesh coordinate: init_device_mesh lays the ranks out row-major over the axes
    coord = tuple(int(c) for c in torch.unravel_index(torch.tensor(rank), tuple(size for _, size in plan.axes)))
    out = {"run": spec, "rank": rank, "losses": losses, "ref_losses": ref_losses, "plan": plan.to_json(),
           "replicated_layers": plan.predicted.get("replicated_layers", []),
           "grad_norms": norms, "no_grad_loss_diffs": [abs(first - ref_first), abs(eval_loss - ref_eval_loss)], "logits_diff": logits_diff,
           "coord": coord, "grad_fallbacks": sharded.grad_fallbacks if sharded else 0,
           # graphs of a tp plan run on the captured graph (parallel/tp_graph.py), not as DTensor modules
           "tp_lifted": sum(tp_graph.LIFTED.values()) - lifted_before,
           "local_shapes": {n: list(_local(p).shape) for n, p in model.named_parameters()},
           "planned_shapes": {n: list(holder[n].local_shape(n, tuple(p.shape), coord))  # of the whole (the reference's)
                              for n, p in ref.named_parameters()},
           "held_storage": {n: holder[n].storage.get(n) for n, _ in ref.named_parameters()},
           "plans": [q.to_json() for q in plans],
           "full_shapes": {n: list(p.shape) for n, p in ref.named_parameters()},
           "state_kinds": sorted({type(v).__name__ for v in model.state_dict().values()}),
           "max_param_diff": max((_full(p) - q).abs().max().item()
                                 for p, q in zip(model.parameters(), ref.parameters()))}
    if args.checkpoint:
        out["checkpoint"] = checkpoint_round_trip(model, os.path.join(args.out, f"ckpt-{len(PLANS)}"))
    return out


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t):
    """The whole tensor: a DTensor's (a sharded module's), or a Parameter's cut in place (the captured graph's)."""
    from colauto_backend.parallel import fsdp
    return t.full_tensor() if hasattr(t, "full_tensor") else fsdp.full_tensor(t)


def checkpoint_round_trip(model, path: str) -> dict:
    """Save with torch.distributed.checkpoint, overwrite every value, load, compare."""
    import torch.distributed.checkpoint as dcp
    state = model.state_dict()
    kinds = sorted({type(v).__name__ for v in state.values()})
    before = {k: _full(v).clone() for k, v in state.items()}
    dcp.save(state, checkpoint_id=path)
    with torch.no_grad():
        for v in state.values():
            _local(v).fill_(123.0)
    dcp.load(state, checkpoint_id=path)
    after = model.state_dict()
    diff = max((_full(after[k]) - before[k]).abs().max().item() for k in before)
    return {"kinds": kinds, "max_diff": diff, "n": len(before)}


if __name__ == "__main__":
    main()
