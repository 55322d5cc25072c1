"""On a 48-layer GPT-2 (1.5B) joint graph: the cost model builds in under 1 s, `.at` takes under 10 ms,
and the rematerialization solve takes under 1 s.

Weights are allocated uninitialized (meta, then to_empty) so the test needs no 6 GB of real data:
untouched pages are never backed by memory, and capture reads no values.
"""
import os
import subprocess
import sys
import time

import pytest
import torch

import colauto_backend
from colauto_backend import graph
from colauto_backend.backend import ANALYSES
from colauto_backend.solver.remat import solve
from examples.models import build
from torchrun import ROOT, clean_env

HERE = os.path.dirname(os.path.abspath(__file__))


def test_gpt2_48_layers_cost_model_and_solve_under_one_second():
    """Measured in a fresh process: in a long-lived pytest worker, after hundreds of other tests, the same
    cost model took 1.24 CPU-s (0.27 alone; cause not found: not the garbage collector, not test_overlap's
    process group); the bounds are about colauto's code, not about what earlier tests left in the process."""
    in_fresh_process("measure_48_layers")


def in_fresh_process(function: str) -> None:
    """Runs test_speed.`function` in a new interpreter; it prints "measured" when its asserts passed."""
    proc = subprocess.run([sys.executable, "-c", f"import test_speed; test_speed.{function}()"],
                          cwd=HERE, env=clean_env() | {"PYTHONPATH": os.pathsep.join([ROOT, HERE])},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "measured" in proc.stdout, proc.stdout[-2000:]


def test_solve_48_layers_on_2x4_under_two_seconds():
    """Issue 15's bound: the joint parallel solve of the 48-layer GPT-2 on a 2x4 mesh (6 candidate meshes)
    in under 2 s, in the solving thread's CPU seconds, in a fresh process (0.51 s there; 0.79 s in a
    pytest worker after 51 other tests, and CI's worker once measured 3.7 s)."""
    in_fresh_process("measure_48_layer_solve")


def measure_48_layer_solve():
    with torch.device("meta"):
        model, _ = build("gpt2", "1.5b")
    model = model.to_empty(device="cpu")
    idx = torch.zeros(8, 1024, dtype=torch.long)
    plan = colauto_backend.explain(model, idx, idx.clone(), mesh="2x4", device="h100")
    assert len(plan.predicted["candidates"]) == 6
    assert plan.predicted["solve_cpu_s"] < 2.0, plan.predicted
    print("measured", plan.predicted["solve_s"], plan.predicted["solve_cpu_s"])


def measure_48_layers():
    with torch.device("meta"):
        model, _ = build("gpt2", "1.5b")
    n = sum(p.numel() for p in model.parameters())   # before to_empty, which unties the shared head
    model = model.to_empty(device="cpu")
    assert len(model.blocks) == 48
    idx = torch.randint(0, 50304, (8, 1024))
    prof = colauto_backend.profile(model, idx, idx.clone(), options={"memory_budget": "none"})
    assert prof.timings["cost_cpu_s"] < 1.0, prof.timings   # CPU seconds: unaffected by tests sharing the cores
    # The rematerialization solve on the same joint graph (problem construction + DP): under 1 s.
    analysis = ANALYSES[-1]
    start = time.thread_time()      # this thread's CPU seconds: not tests sharing the cores (pytest -n) nor stray threads
    times = graph.node_times(analysis.costs, analysis.evaluate(analysis.hints)["_node_times"])
    problem, nodes, _ = graph.remat_problem(analysis.joint.graph, times, analysis.hints)
    frontier = solve(problem)
    assert time.thread_time() - start < 1.0
    assert len(nodes) > 48 * 30 and len(frontier.memory) > 10
    big = torch.empty(16, 1024, dtype=torch.long)
    seconds = []
    for _ in range(3):   # the best of three, as timeit takes: one call measured 3.4 ms here and once > 10 ms
        start = time.thread_time()
        at = prof.at(big, big)
        seconds.append(time.thread_time() - start)
    assert min(seconds) < 0.010, seconds
    # FLOPs per token = 6N + 12 L d T (the anchors' formula), N without the position table (a lookup);
    # the token table is counted once, as the tied head's matmul. Biases and norms make the 1% slack.
    expected = (6 * (n - 1024 * 1600) + 12 * 48 * 1600 * 1024) * 16 * 1024
    assert abs(at.flops_fwd + at.flops_bwd - expected) / expected < 0.01
    print("measured", prof.timings)


def test_a_model_on_the_meta_device_is_costed_as_on_the_cpu():
    """A model built on the meta device (how explain plans an 8B model on a laptop) is costed exactly as
    the same model on the CPU, the loss's backward included. Under AOTAutograd's trace, torch's meta
    kernel for aten.nll_loss hid its derivative: the joint graph had no nll_loss_backward (HF models'
    plans left out the gradient over the whole logits) and this project's GPT-2 lost its last layer's
    gradients (meta.gpu_attention restores it). HF models with eager attention, so attention is the
    same op on both devices: the same peak, saved bytes and step time; GPT-2 (fused attention on meta):
    the same FLOPs, its backward twice its forward."""
    import transformers
    from examples import hf_zoo
    for name in ("qwen2", "gpt_neox"):
        cfg = hf_zoo.config_of(name, "tiny")
        cfg._attn_implementation = "eager"
        got = {}
        for dev in ("cpu", "meta"):
            with torch.device(dev):
                model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
            ids = torch.zeros(2, 64, dtype=torch.long, device=dev)
            ANALYSES.clear()
            plan = colauto_backend.explain(model, kwargs={"input_ids": ids, "labels": ids}, device="h200")
            ops = {c.op for c in ANALYSES[-1].costs.nodes}
            assert "aten.nll_loss_backward.default" in ops and "aten._log_softmax_backward_data.default" in ops, dev
            got[dev] = (plan.peak_without_bytes, plan.saved_without_bytes, plan.step_time_without_s)
        assert got["meta"] == got["cpu"], (name, got)
    flops = {}
    for dev in ("cpu", "meta"):
        with torch.device(dev):
            model, _ = build("gpt2")
        idx = torch.randint(0, 512, (2, 8), device=dev)
        prof = colauto_backend.profile(model, idx, idx.clone())
        flops[dev] = (prof.flops_fwd, prof.flops_bwd)
    assert flops["meta"] == flops["cpu"] and flops["cpu"][1] == 2 * flops["cpu"][0], flops


def test_an_op_without_a_derivative_is_a_clear_error():
    """A backward that stops at an op autograd has no kernel for (it only warns) leaves the parameters
    before it without gradients: profile() says so in one line instead of costing a partial step."""
    lib = torch.library.Library("colauto_test_speed", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")     # no Autograd kernel

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.b(torch.ops.colauto_test_speed.twice(self.a(x))).sum()
    try:
        with torch.device("meta"):
            model = Net()
        with pytest.raises(RuntimeError) as err:
            colauto_backend.profile(model, torch.randn(4, 8, device="meta"))
        msg = str(err.value)
        assert "colauto_test_speed::twice has no autograd kernel here, and 288 B of parameters get no gradient" in msg
        assert "register_autograd" in msg and "\n" not in msg
    finally:
        lib._destroy()


def test_explain_twenty_budgets_of_gpt2_355m_in_seconds():
    """After the first capture, explain() at 20 budgets of GPT-2 355M (8x1024) takes under 10 CPU-s in
    all: the DP is solved once and each candidate's partition is modeled, not run (it took 26 CPU-s
    when each of 12 candidates was partitioned). The plans fit their budgets and are monotone."""
    with torch.device("meta"):
        model, _ = build("gpt2", "355m")
    model = model.to_empty(device="cpu")
    idx = torch.randint(0, 50304, (8, 1024))
    unplanned = colauto_backend.explain(model, idx, idx.clone(), budget="none", device="h100")   # captures
    held = unplanned.peak_without_bytes - unplanned.saved_without_bytes
    budgets = [int(held + f * (unplanned.peak_without_bytes - held)) for f in
               [1 - 0.04 * i for i in range(1, 21)]]
    start = time.thread_time()
    plans = []
    for budget in budgets:
        try:
            plans.append((budget, colauto_backend.explain(model, idx, idx.clone(), budget=budget, device="h100")))
        except colauto_backend.BudgetError:
            plans.append((budget, None))
    assert time.thread_time() - start < 10.0
    fitted = [(b, p) for b, p in plans if p is not None]
    assert len(fitted) >= 10 and all(p.peak_with_bytes <= b and p.partitions_run == 0 for b, p in fitted)
    assert all(p.modeled_plans > 12 for _, p in fitted)
    peaks = [p.peak_with_bytes for _, p in fitted]
    assert peaks == sorted(peaks, reverse=True)
    assert plans[-1][1] is None or plans[-1][1].recomputed      # the smallest budgets need recomputation
