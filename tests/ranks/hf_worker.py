"""Run under torchrun: a few AdamW steps of a tiny HuggingFace model (examples/hf_zoo.py) with colauto on
every rank, each rank feeding its own micro-batch, against eager single-process training on the global
batch (computed on every rank). Each run is NAME@MESH (MESH as COLAUTO_MESH, "auto" for the planner's
choice); options after it: +late (the optimizer is created after the first call), +inductor (codegen
inductor; else aten), +renamed (compiled inside a module whose forward calls its first argument `s`), +break
(a graph break after the first layer of the model's first ModuleList), +eagerembed (the input embedding run eagerly), +skiptop
(compiled inside a module whose forward frame Dynamo skips: the model's body is compiled alone, the output
embedding's weight read eagerly), +split (compiled inside a module that runs the model's body,
breaks the graph, then runs its output embedding and the loss: GPT-2's head is its input embedding, so
one weight is read on both sides of the break), +ckpt
(a torch.distributed.checkpoint round trip after training), +clip (each step's gradients clipped to a norm
of 0.05 by torch.nn.utils.clip_grad_norm_, against torch's own on the reference; +clipc: by
colauto_backend.clip_grad_norm_), +reset (torch._dynamo.reset() after the first step, then compiled
again), +load (after training, the
reference's state dict, whole tensors, loaded into the model: every parameter then equals it), +tight (a memory budget of 1.5 MB per rank,
which the sharded plan fits but the whole model's parameters, gradients and AdamW state do not). Writes rank<r>.json with per run the losses,
the reference losses, a checksum of the trained parameters, and the error if it failed.

    torchrun --nproc-per-node 2 tests/ranks/hf_worker.py --out /tmp/r llama@dp=2 t5@fsdp=2
"""
import argparse
import copy
import datetime
import gc
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import colauto_backend  # noqa: E402
from colauto_backend import output_grads  # noqa: E402
from colauto_backend.backend import ANALYSES  # noqa: E402
from colauto_backend.parallel import _dtensor_rules, data, overlap, tp_graph  # noqa: E402
from colauto_backend.parallel.entry import PLANS  # noqa: E402
from examples import hf_zoo  # noqa: E402

# without `pip install -e .` (a bare GPU host) the torch_dynamo_backends entry point is missing
if "colauto" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(colauto_backend.colauto, name="colauto")


CLIP = 0.05     # +clip's norm: below the tiny models' gradient norms, so every step clips
TORCH_CLIP = torch.nn.utils.clip_grad.clip_grad_norm_     # the reference's: torch's own, bound before colauto runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="NAME@MESH[+late]")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2, help="micro-batch per rank")
    ap.add_argument("--seq", type=int, default=16, help="sequence length (image side for vision models)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))   # a hang fails, named
    os.makedirs(args.out, exist_ok=True)
    results = []
    for spec in args.runs:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            results.append(run(spec, args))
        except Exception as exc:  # noqa: BLE001 - recorded, so one failing run does not hide the others
            results.append({"run": spec, "error": f"{type(exc).__name__}: {exc}"[:2000],
                            "traceback": traceback.format_exc()[-4000:]})
        results[-1] |= {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu}
        if dist.get_rank() == 0:
            print(f"{spec}: {results[-1]['seconds']:.1f} s ({results[-1]['cpu_seconds']:.1f} s CPU)", flush=True)
        with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def run(spec: str, args) -> dict:
    name, rest = spec.split("@", 1)
    mesh, *flags = rest.split("+")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    ANALYSES.clear()
    PLANS.clear()
    prefetched, kept_in_order = overlap.SUNK["gathers prefetched"], sum(overlap.KEPT.values())
    specialized, kept = sum(output_grads.SPECIALIZED.values()), dict(output_grads.KEPT)
    eager_averaged = sum(data.EAGER_AVERAGED.values())
    lifted, not_lifted = sum(tp_graph.LIFTED.values()), dict(tp_graph.NOT_LIFTED)
    run_replicated = dict(tp_graph.RUN_REPLICATED)
    strided = dict(_dtensor_rules.STRIDED_VIEWS_GATHERED)
    model, batch = hf_zoo.build_hf(name, "tiny")
    ref = copy.deepcopy(model)
    seq = 32 if hf_zoo.SPECS[name].kind == "image" else args.seq     # the tiny configs' image side
    full = batch(args.batch * world, seq)
    local = {k: v.chunk(world)[rank] for k, v in full.items()}
    options = {"mesh": mesh, "codegen": "inductor" if "inductor" in flags else "aten"}
    if "dtensor" in flags:    # a sharded plan's DTensor path (parallel/emit.py), not the captured graph's
        options["fsdp"] = "dtensor"
    if "tight" in flags:
        options["memory_budget"] = "1.5MB"
    if "break" in flags:      # a graph break after the first layer of the first stack: the next graph reads parameters too
        first = next(stack[0] for stack in model.modules() if isinstance(stack, torch.nn.ModuleList) and len(stack))
        first.register_forward_hook(lambda m, args, out: torch._dynamo.graph_break())
    wrapped = (Renamed(model) if "renamed" in flags else Split(model) if "split" in flags
               else SkipTop(model) if "skiptop" in flags
               else EagerEmbedding(model) if "eagerembed" in flags else model)
    compiled = torch.compile(wrapped, backend="colauto", options=options)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    opt = None if "late" in flags else torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, ref_losses, outputs, norms, ref_norms = [], [], [], [], []
    for step in range(args.steps):
        if "reset" in flags and step == 1:    # Dynamo forgets everything; the model is compiled again
            torch._dynamo.reset()
            compiled = torch.compile(wrapped, backend="colauto", options=options)
        result = compiled(**local)
        outputs.append(_storage_ref(result))
        loss = hf_zoo.loss_of(result)
        del result
        loss.backward()
        if "clip" in flags or "clipc" in flags:   # torch's (colauto routes it), or colauto_backend's
            clip = torch.nn.utils.clip_grad_norm_ if "clip" in flags else colauto_backend.clip_grad_norm_
            norms.append(clip(model.parameters(), CLIP).item())
        if opt is None:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if "skiptop" in flags:   # computed eagerly, outside the graphs that average the loss: the rank's own
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= world
        losses.append(loss.item())
        r = reference_loss(ref, full, world)
        r.backward()
        if norms:
            ref_norms.append(TORCH_CLIP(ref.parameters(), CLIP).item())
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        ref_losses.append(r.item())
    # the next step's forward (no backward): the gradients the optimizer cleared are gone on the module's
    # side too (a sharded module's DTensor parameters share them with the originals: Sharded.release_cleared_grads)
    del loss
    next_out = compiled(**local)
    stale_grads = sum(p.grad is not None for p in model.parameters())
    del next_out
    gc.collect()
    out = {"run": spec, "rank": rank, "losses": losses, "ref_losses": ref_losses, "error": None,
           "stale_grads": stale_grads,
           # the training steps' logits still alive after the next forward (none: nothing holds a step's outputs)
           "outputs_held": sum(r is not None and not r.expired() for r in outputs),
           "param_sum": sum(_full(p).double().sum().item() for p in model.parameters()),
           "full_param_bytes": sum(q.numel() * q.element_size() for q in ref.parameters()),
           "max_param_diff": max((_full(p) - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters())),
           "state_kinds": sorted({type(v).__name__ for v in model.state_dict().values()}),
           "chained_all_reduces": chained_all_reduces(),
           "gathers_prefetched": overlap.SUNK["gathers prefetched"] - prefetched,
           "graphs_kept_in_order": sum(overlap.KEPT.values()) - kept_in_order,
           # backward graphs compiled without the logits' gradient, and why others kept every output's
           "grads_skipped": sum(output_grads.SPECIALIZED.values()) - specialized,
           "grads_kept": {k: v - kept.get(k, 0) for k, v in output_grads.KEPT.items() if v > kept.get(k, 0)},
           # gradients of code Dynamo ran eagerly (a graph break), averaged over the ranks by data.py's hook
           "eager_grads_averaged": sum(data.EAGER_AVERAGED.values()) - eager_averaged,
           # tp plans: graphs run on the captured graph (parallel/tp_graph.py), and why others were not
           "tp_plans": sum(plan.tensor_parallel for plan in PLANS),
           "tp_lifted": sum(tp_graph.LIFTED.values()) - lifted,
           "tp_not_lifted": [k for k, v in tp_graph.NOT_LIFTED.items() if v > not_lifted.get(k, 0)],
           "tp_run_replicated": [k for k, v in tp_graph.RUN_REPLICATED.items() if v > run_replicated.get(k, 0)],
           # views DTensor's rule failed on (a strided shard), run on their gathered input
           "tp_strided_views_gathered": [k for k, v in _dtensor_rules.STRIDED_VIEWS_GATHERED.items()
                                         if v > strided.get(k, 0)],
           } | memory_terms(model)
    if norms:
        out["grad_norms"], out["ref_grad_norms"] = norms, ref_norms
    if "ckpt" in flags:
        out["ckpt_max_diff"] = checkpoint_round_trip(model, os.path.join(args.out, f"ckpt-{name}"))
    if "load" in flags:
        model.load_state_dict(ref.state_dict())
        out["load_max_diff"] = max((_full(p) - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    return out


def _storage_ref(result):
    """A weak reference to the storage of a ModelOutput's logits (a DTensor's local part), or None."""
    from torch.distributed.tensor import DTensor
    from torch.multiprocessing.reductions import StorageWeakRef
    logits = getattr(result, "logits", None)
    if not isinstance(logits, torch.Tensor):
        return None
    return StorageWeakRef((logits.to_local() if isinstance(logits, DTensor) else logits).untyped_storage())


def memory_terms(model) -> dict:
    """The rank's parameter bytes (local shards) and those that train, against the memory model of the
    last graph compiled (the sharded graph, where the plan shards) and the plan's predicted peak."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    last = ANALYSES[-1].evaluate(ANALYSES[-1].hints) if ANALYSES else {}
    return {"local_param_bytes": sum(t.numel() * t.element_size() for t in local),
            "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
            "trained_param_bytes": sum(t.numel() * t.element_size() for t, p in zip(local, model.parameters())
                                       if p.requires_grad),
            "graph_param_bytes": last.get("param_bytes"), "graph_optimizer_bytes": last.get("optimizer_state_bytes"),
            "graph_peak_bytes": last.get("peak_memory_bytes"),
            "plan_peak_bytes": PLANS[-1].predicted.get("memory_bytes") if PLANS and PLANS[-1].predicted else None}


def chained_all_reduces() -> int:
    """All-reduces, in the graphs compiled in this run, whose input is another all-reduce's result: one
    reduction over several mesh axes done as one collective per axis, in sequence."""
    count = 0
    for analysis in ANALYSES:
        for node in analysis.joint.graph.nodes if analysis.joint is not None else ():
            if _is_all_reduce(node):
                source = node.args[0]
                while source.op == "call_function" and "wait_tensor" in str(source.target):
                    source = source.args[0]
                count += _is_all_reduce(source)
    return count


def _is_all_reduce(node) -> bool:
    return node.op == "call_function" and "all_reduce" in str(node.target)


def reference_loss(ref, full: dict, world: int) -> torch.Tensor:
    """The one-process loss of the global batch. With BatchNorm, each rank normalizes its micro-batch by
    its own statistics (as DDP does): the reference is then the mean of the micro-batches' losses, each
    run alone, whose gradient is the ranks' average."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in ref.modules()):
        return hf_zoo.loss_of(ref(**full))
    parts = [{k: v.chunk(world)[i] for k, v in full.items()} for i in range(world)]
    return sum(hf_zoo.loss_of(ref(**part)) for part in parts) / world


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a sharded module's parameters are DTensors; under COLAUTO_FSDP=graph, shards)."""
    from colauto_backend.parallel import fsdp
    return t.full_tensor() if hasattr(t, "full_tensor") else fsdp.full_tensor(t)


class Renamed(torch.nn.Module):
    """A wrapper whose forward names its first argument `s`, not `self`."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(s, **batch):  # noqa: N805 - the point of the test
        return s.inner(**batch)


class Split(torch.nn.Module):
    """A causal LM's body, a graph break, then its output embedding and the loss HF computes (the mean
    cross-entropy of each next token; the labels are the inputs): the same loss as `inner(**batch).loss`."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, labels):
        hidden = self.inner.base_model(input_ids=input_ids).last_hidden_state
        torch._dynamo.graph_break()
        logits = self.inner.get_output_embeddings()(hidden).float()
        return (torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()),)


class SkipTop(torch.nn.Module):
    """What transformers 5.17 makes of HF Qwen2-MoE: Dynamo skips the compiled module's own forward frame and
    compiles the frames it calls, so each graph belongs to a submodule (here the model's body), while the
    skipped frame reads a parameter eagerly (here the output embedding's weight, by F.linear: no module call
    whose frame Dynamo would compile). The loss is `inner(**batch).loss`'s."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    @torch._dynamo.disable(recursive=False)
    def forward(self, input_ids, labels):
        hidden = self.inner.base_model(input_ids=input_ids).last_hidden_state
        logits = torch.nn.functional.linear(hidden, self.inner.get_output_embeddings().weight).float()
        return (torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()),)


class EagerEmbedding(torch.nn.Module):
    """The input embedding run eagerly (outside Dynamo), the rest compiled: with tied embeddings (GPT-2) one
    weight gets a gradient both from a compiled graph (the head) and from eager code."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, labels):
        embeds = torch._dynamo.disable(self.inner.get_input_embeddings())(input_ids)
        return self.inner(inputs_embeds=embeds, labels=labels)


def checkpoint_round_trip(model, path: str) -> float:
    """Save the state dict with torch.distributed.checkpoint, overwrite every value, load it back: the
    largest difference from the saved values."""
    import torch.distributed.checkpoint as dcp
    state = model.state_dict()
    before = {k: _full(v).clone() for k, v in state.items()}
    dcp.save(state, checkpoint_id=path)
    with torch.no_grad():
        for v in state.values():
            v.fill_(123)
    dcp.load(state, checkpoint_id=path)
    after = model.state_dict()
    return max((_full(after[k]).double() - before[k].double()).abs().max().item() for k in before)


if __name__ == "__main__":
    main()
