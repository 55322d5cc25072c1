"""Predicted peak of a whole training step (forward, backward, AdamW) against PyTorch's MemTracker,
which watches every storage allocated and freed (CPU, fp32). MemTracker is a TorchDispatchMode, under
which Dynamo runs the step eagerly: this checks the model of what a step holds against eager PyTorch,
whose saved tensors the unplanned partition reproduces. The compiled step is measured in
test_remat.py (profiler) and on GPUs by bench/ (torch.cuda.max_memory_allocated)."""
import functools
import itertools
import json
from typing import NamedTuple
import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

import colauto_backend
from examples.models import build


def measured_peak(model, inputs) -> int:
    compiled = torch.compile(model, backend="colauto", dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), fused=True)   # the "adamw" assumption
    for _ in range(2):   # steady state: optimizer moments exist
        compiled(*inputs).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model, opt, *inputs)
    with tracker:
        compiled(*inputs).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("name", ["gpt2", "llama", "cnn"])
def test_peak_matches_mem_tracker_at_two_sizes(name):
    model, make = build(name)
    sizes = [(2, 16), (4, 24)] if name == "cnn" else [(2, 16), (4, 32)]
    prof = colauto_backend.profile(model, *make(*sizes[0]))
    for b, s in sizes:
        torch._dynamo.reset()
        inputs = make(b, s)
        predicted = prof.at(*inputs).peak_memory_bytes
        assert predicted == pytest.approx(measured_peak(model, inputs), rel=2e-3), (name, b, s)


def test_peak_accounts_for_parameters_gradients_and_adamw_state():
    model, make = build("gpt2")
    prof = colauto_backend.profile(model, *make(2, 8))
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    d = prof.details
    assert d["param_bytes"] == n_bytes and d["grad_bytes"] == n_bytes
    assert d["optimizer_state_bytes"] == 2 * n_bytes
    assert prof.peak_memory_bytes > 4 * n_bytes
    sgd = colauto_backend.profile(model, *make(2, 8), options={"optimizer": "sgd"})
    assert sgd.details["optimizer_state_bytes"] == 0
    assert prof.peak_memory_bytes - sgd.peak_memory_bytes >= 2 * n_bytes


def test_live_at_peak_names_storages_that_add_up_to_the_peak(monkeypatch):
    """bench/peak_snapshot.py's view of the model: the storages `memory.live_at_peak` lists at the peak
    add up to its peak, which equals the symbolic timeline's peak for the same partition at the same
    sizes (two implementations of the liveness simulation), with parameters and AdamW state among them."""
    from colauto_backend import backend
    from colauto_backend.cost import memory
    calls = []
    real = memory.simulate_step

    def recording(fw, bw, **kw):
        calls.append((fw, bw, kw))
        return real(fw, bw, **kw)
    monkeypatch.setattr(memory, "simulate_step", recording)
    model, make = build("llama")
    backend.ANALYSES.clear()
    torch.compile(model, backend="colauto")(*make(2, 16)).backward()
    analysis = backend.ANALYSES[-1]
    fw, bw, kw = calls[-1]
    peak, where, live = memory.live_at_peak(fw, bw, param_indices=kw["param_indices"],
                                            num_fwd_outputs=kw["num_fwd_outputs"], device=kw["device"],
                                            optimizer=kw["optimizer"], hints=analysis.hints, fused=kw["fused"])
    assert sum(b for _, b in live) == peak == analysis.evaluate(analysis.hints)["peak_memory_bytes"]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(b for name, b in live if name == "start") >= 3 * params     # parameters and two moments
    assert where and any(name.startswith(("fwd:", "bwd:")) for name, _ in live)


def test_a_recomputed_group_runs_just_before_its_first_reader():
    """Inductor's order as the memory model has it: recomputed memory-bound ops that feed one another run
    as one kernel just before the first op outside them that reads one of them, not where the first of
    them sits in the backward graph (on HF Qwen2 under a budget, one H200, the recomputed residual stream
    ran after the loss's backward had freed the logits; modeled at its first op, the peak was 5% high)."""
    from colauto_backend.cost import memory
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    for n in (x, y):
        n.meta["val"] = torch.empty(4, 4)
    r1 = g.call_function(aten.add.Tensor, (x, 1))
    r2 = g.call_function(aten.mul.Tensor, (r1, 2))
    m = g.call_function(aten.mm.default, (y, y))
    u = g.call_function(aten.add.Tensor, (r2, m))
    g.output(u)
    for n in (r1, r2, m, u):
        n.meta["val"] = torch.empty(4, 4)
    names = [n.name for n in memory.inductor_order(g, frozenset({r1.name, r2.name}))]
    assert names == ["x", "y", m.name, r1.name, r2.name, u.name, "output"], names
    # not recomputed: the graph's order
    assert [n.name for n in memory.inductor_order(g, frozenset())] == [n.name for n in g.nodes]


def test_a_value_read_twice_is_written_once_it_reads_more_than_four_buffers():
    """Inductor's lowering rule as the memory model has it (`fused_away`), on hand-built graphs: a sum
    of 4 inputs that several pointwise ops read is recomputed inside each of them (no buffer), however
    many they are; one more input makes it 5 buffers read, so it is written; a value a matmul reads and
    the graph's return are written; a value read once is inlined with up to 8 buffers read."""
    from colauto_backend.cost import memory
    aten = torch.ops.aten

    def build(readers_of_a3: int):
        g = torch.fx.Graph()
        p = [g.placeholder(f"p{i}") for i in range(6)]
        a1 = g.call_function(aten.add.Tensor, (p[0], p[1]))
        a2 = g.call_function(aten.add.Tensor, (a1, p[2]))
        a3 = g.call_function(aten.add.Tensor, (a2, p[3]))        # reads p0..p3
        cs = [g.call_function(aten.mul.Tensor, (a3, 2 + k)) for k in range(readers_of_a3)]
        a4 = g.call_function(aten.add.Tensor, (a3, p[4]))        # reads p0..p4, read twice
        d1 = g.call_function(aten.mul.Tensor, (a4, 2))
        d2 = g.call_function(aten.mul.Tensor, (a4, 3))
        out = cs[0]
        for c in cs[1:] + [d1, d2]:                               # reads p0..p3 and a4: 5, each read once
            out = g.call_function(aten.add.Tensor, (out, c))
        e = g.call_function(aten.mul.Tensor, (p[5], 2))
        m = g.call_function(aten.mm.default, (e, e))
        g.output((out, m))
        for n in g.nodes:
            if n.op != "output":
                n.meta["val"] = torch.empty(4, 4)
        written = {n.name for n in g.nodes if n.op == "call_function"} - {n.name for n in memory.fused_away(g)}
        return written, {a4.name, out.name, e.name, m.name}

    for readers in (2, 6):
        written, expected = build(readers)
        assert written == expected, (readers, written)


# points where the memory model is known to be high, and by at most how much: Qwen2 at 0.8 (below); T5 at
# 0.6 since the model holds the logits' gradient to the addmm at the backward's end (2026-12-07: the unplanned
# peak it predicts rose, and with it this point's budget; the plan there recomputes T5's residual chain, which
# the model holds as one group: +10.4%, six more of its values and a zeros buffer Inductor folds)
KNOWN_HIGH = {("qwen2", "inductor", 0.8): 1.07, ("t5", "inductor", 0.6): 1.12}


@pytest.mark.parametrize("name, codegen, fraction, drop", [
    ("gpt_neox", "aten", None, False), ("qwen2", "aten", 0.6, False), ("qwen2", "triton", None, False),
    ("t5", "inductor", 0.6, False), ("gpt2", "inductor", None, False), ("qwen2", "inductor", 0.8, False),
    ("gpt2", "inductor", 0.8, True), ("mpt", "inductor", None, False), ("gpt_neox", "inductor", 0.8, False)])
def test_hf_step_peak_equals_the_cpu_allocators(name, codegen, fraction, drop):
    """The predicted peak of a compiled HF training step against the CPU allocator's (every allocation and
    free of the step, replayed: `bench.cpu_peak`), fp32, batch 8 x 256 on tiny configs so activations
    make the peak; with a budget (0.6 of the way from the held state to the unplanned peak) the plan
    recomputes and the measured peak stays under the budget. aten and triton (its rest op by op here) to
    0.5%, Inductor's code generation to 5% (issue 16's goal; on CPU, not yet on OPT -8.5% and ViT -6.7%,
    nor under half the budgets: bench/results/cpu-2026-11-29-peak-planned). Found by it: views of a split past
    the first held no storage, so GPT-NeoX's fused qkv output was freed while its views were saved
    (-16.5%); the logits' unused gradient is zeros that aten and the triton path's aten ops allocate
    (Qwen2 -5.8%); what a fused-away value reads was freed at the value, not at the last kernel that
    computes it (T5 -13.7%: its attention-probability gradient); a kernel writes in place into a value
    that dies in it also when it reads that value through fused-away ones (GPT-2 +9.5% once the
    previous rule held its GELU gradient's inputs), but not into one a reduction it fuses also reads;
    and under a plan, Inductor's horizontal fusion computed T5's recomputed attention scores long before
    their use, and its buffer reuse held freed buffers for later ones (T5 at 0.6: 57.96 MiB measured
    against 47.67 predicted, over the budget; now 47.04: `compat._as_planned`); Inductor's post-grad pass
    makes the product a tied weight's gradient adds to the other use's one addmm at the backward's end,
    holding the logits' gradient until then (MPT -5.8%; now 0.0%: `memory.addmm_fused`).
    Under Inductor the peak of the compiled code (each graph run as its generated wrapper allocates and
    frees: `Analysis.compiled_peak`) is within 2% whatever the model's error: Qwen2 at 0.8 (-0.1%), where
    the model runs the recomputed residual chain as one group held until each layer's backward (+6.3%);
    T5 at 0.6 0.0%; GPT-2 -0.1%. The buffers ATen's CPU attention allocates inside itself count in both
    (`memory.op_workspace`): GPT-NeoX at 0.8 was -7.8% (bench/results/cpu-2026-12-04-compiled-peak), -1.5% at
    b219731 and 0.1% since.
    `drop`: the step keeps only the loss, not the model's output until after the optimizer step as the
    model assumes; the compiled peak for such a step (`outputs_dropped`) is as close (GPT-2 at 0.8: 15.85
    MiB against 15.86 measured), where the model, holding the logits, is 38% high (43% since the addmm
    rule, its looser plan chosen under more of the budget): it stays above."""
    from bench import cpu_peak
    rows = cpu_peak.points(name, codegen, [] if fraction is None else [fraction], drop_outputs=drop)
    for row in rows:
        assert "error" not in row, row
        high = KNOWN_HIGH.get((name, codegen, row["fraction"]), 1.5 if drop else None)
        if high is not None:     # the model's known error: high
            assert row["measured_bytes"] < row["predicted_bytes"] < high * row["measured_bytes"], row
        else:
            tolerance = 0.05 if codegen == "inductor" else 5e-3
            assert row["predicted_bytes"] == pytest.approx(row["measured_bytes"], rel=tolerance), row
        assert not row["over_budget"], row
        if codegen == "inductor":
            assert row["compiled_bytes"] == pytest.approx(row["measured_bytes"], rel=0.02), row
        else:   # no graph Inductor compiled: nothing read
            assert "compiled_bytes" not in row, row
    assert len(rows) == (1 if fraction is None else 2)


def test_compiled_peak_frees_an_input_storage_once_every_input_holding_it_is_freed():
    """`memory.compiled_peak` by hand: the backward starts from the model's 10 bytes in use; two of its
    inputs (a, b) share one 4-byte storage, which dies only when both are freed; the optimizer row
    (the model's, outside the compiled graphs) is 12. Events +5, del a, +3 (peak 18), del b (-4), +2,
    -6: a peak of 18 in the backward."""
    import numpy as np
    from colauto_backend.cost import memory
    tl = memory.Timeline(rows=np.array([[3.0], [11.0], [12.0]]), labels=["start", "bwd:x", "optimizer"],
                         params=0, grads=0, optimizer_state=0, saved=0, saved_nodes=[], inputs=0,
                         before={"bwd": np.array([10.0])}, freeable={"bwd": [(np.array([4.0]), ("a", "b"))]})
    events = [(5, "", "x"), (0, "a", "a"), (3, "", "y"), (0, "b", "b"), (2, "", "z"), (-6, "", "x")]
    assert memory.compiled_peak(tl, {"bwd": events}, np.array([1.0])) == (18, "bwd:y (compiled)")
    # the storage never dies (b is never freed): 10 + 5 + 3 + 2 = 20
    assert memory.compiled_peak(tl, {"bwd": [e for e in events if e[1] != "b"]}, np.array([1.0]))[0] == 20
    # each allocation rounded to 16 bytes: 10 + 16 + 16 - 4 (the input storage is the model's, not
    # rounded again) + 16 = 54
    assert memory.compiled_peak(tl, {"bwd": events}, np.array([1.0]), alloc_round=16)[0] == 54
    # no compiled graph: the model's rows
    assert memory.compiled_peak(tl, {}, np.array([1.0])) == (12, "optimizer")


def test_compiled_peak_counts_an_input_the_forward_returned_as_a_copy():
    """`memory.compiled_peak` by hand: the forward returns its input `x` as a 6-byte copy of its own
    (Inductor's channels-last copy of a convolution's input, saved for backward: `compat.returned_copies`).
    The model has `x` as the user's storage, so the backward starts from the model's 10 bytes plus the
    copy's 6, which die when the backward frees `x`. Events +5, del x, +3: peak 21 at the +5; without
    the copy's event, 18 at the +3."""
    import numpy as np
    from colauto_backend.cost import memory
    tl = memory.Timeline(rows=np.array([[3.0], [5.0]]), labels=["start", "optimizer"],
                         params=0, grads=0, optimizer_state=0, saved=0, saved_nodes=[], inputs=0,
                         before={"fwd": np.array([3.0]), "bwd": np.array([10.0])}, freeable={})
    fwd = [(6, "", "buf0 (x)"), (6, memory.RETURNED_COPY + "x", "buf0 (x)")]
    bwd = [(5, "", "y"), (0, "x", "x"), (3, "", "z")]
    assert memory.compiled_peak(tl, {"fwd": fwd, "bwd": bwd}, np.array([1.0])) == (21, "bwd:y (compiled)")
    assert memory.compiled_peak(tl, {"fwd": fwd[:1], "bwd": bwd}, np.array([1.0])) == (18, "bwd:z (compiled)")
    # the forward's own replay skips the event: its peak is 3 + 6 = 9 (the backward's start raised above it)
    tl.before["bwd"] = np.array([0.0])
    assert memory.compiled_peak(tl, {"fwd": fwd, "bwd": []}, np.array([1.0])) == (9, "fwd:buf0 (compiled)")
    tl.before["bwd"] = np.array([10.0])
    # a copy the backward never takes (returned to the user) is not the backward's: 18 again
    other = fwd + [(7, memory.RETURNED_COPY + "w", "buf1 (w)")]
    assert memory.compiled_peak(tl, {"fwd": other, "bwd": bwd}, np.array([1.0]))[0] == 21
    # rounded as the allocator takes it (16 bytes): 10 + 16 + 16 = 42 at y
    assert memory.compiled_peak(tl, {"fwd": fwd, "bwd": bwd}, np.array([1.0]), alloc_round=16)[0] == 42


def test_inductor_returns_a_convolutions_input_and_weight_as_copies_the_wrapper_reading_finds():
    """A 2-D convolution compiled by Inductor on CPU (codegen inductor, a training step): Inductor lays the
    convolution's input and weight out channels-last in buffers of its own and returns those for the backward
    in place of the inputs. Under a budget (read only there), the forward's wrapper reading (`compat.wrapper_allocations`) names both, with
    their bytes (the tensors' own sizes), and the backward frees each by the input's name."""
    from colauto_backend import backend
    from colauto_backend.cost import memory
    conv = torch.nn.Conv2d(3, 8, 3, bias=False)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    from torch._inductor.utils import fresh_inductor_cache
    compiled = torch.compile(conv, backend="colauto", options={"codegen": "inductor", "memory_budget": "1GiB"})
    with fresh_inductor_cache():     # generated here, not loaded from an earlier run's cache (nothing to read)
        compiled(x).sum().backward()
    (analysis,) = [a for a in backend.ANALYSES if a.allocations]
    copies = {freed[len(memory.RETURNED_COPY):]: nb for nb, freed, _ in analysis.allocations["fwd"]
              if freed.startswith(memory.RETURNED_COPY)}
    assert sorted(copies.values()) == sorted([x.numel() * 4, conv.weight.numel() * 4]), copies
    freed = {f for _, f, _ in analysis.allocations["bwd"] if f}
    assert set(copies) <= freed, (copies, freed)


def test_convolution_input_copies_count_in_the_compiled_peak_and_hold_the_budget():
    """HF ViT under codegen inductor on CPU, against the CPU allocator (`bench.cpu_peak`). Inductor lays its
    patch convolution's input and weight out channels-last in copies, and returns those copies for the
    backward in place of the inputs; the compiled figure missed them (at 0.8 of the way to the unplanned
    peak: 1.68 MiB against 1.82 measured, over the 1.817 MiB budget, 2026-12-06). Now the compiled figure
    is within 2% of the allocator's and the step is held under the budget. The memory model itself knows
    nothing of these copies and stays low (-6.7% unplanned). Not covered: the work space aten allocates
    inside a convolution's backward, which no wrapper shows (HF ResNet under this suite's settings: the
    compiled figure -4.2%, 2026-12-07)."""
    from bench import cpu_peak
    rows = cpu_peak.points("vit", "inductor", [0.8])
    assert [r["fraction"] for r in rows] == [None, 0.8], rows
    for row in rows:
        assert "error" not in row, row
        assert row["compiled_bytes"] == pytest.approx(row["measured_bytes"], rel=0.02), row
        assert not row["over_budget"], row


@pytest.mark.xfail(not colauto_backend._torch_compat.torch_at_least(2, 13), strict=True,
                   reason="torch 2.11: aten's convolution backward allocates its work space with no plan too (2.49 MiB "
                          "measured unplanned, 2.27 at 0.8, 2026-12-07), unseen by any wrapper line")
def test_a_recomputed_convolution_keeps_the_backwards_layout_and_the_budget():
    """HF ConvNeXt under codegen inductor on CPU at 0.8 of the way to its unplanned peak, against the CPU
    allocator (`bench.cpu_peak`). The plan recomputes convolutions in the backward, which made Inductor lay
    the whole backward out channels-last; aten's convolution backward then allocated 1.5 MiB of its own,
    which no wrapper line shows: 2.29 MiB measured against a 0.88 MiB budget, with no error (2026-12-07).
    Such a backward now keeps the unplanned backward's layout (`compat._only_recomputed_convolutions`):
    measured under the budget, the compiled figure within 2%."""
    from bench import cpu_peak
    rows = cpu_peak.points("convnext", "inductor", [0.8])
    assert [r["fraction"] for r in rows] == [None, 0.8], rows
    for row in rows:
        assert "error" not in row, row
        assert not row["over_budget"], row
        assert row["compiled_bytes"] == pytest.approx(row["measured_bytes"], rel=0.02), row


def test_a_compiled_peak_over_the_budget_is_warned_and_reported(capsys):
    """`report.emit_compiled_peak`: the compiled code's peak and the model's, as COLAUTO_REPORT prints them;
    over the plan's budget, a warning names the excess and the fix, whatever the report setting."""
    import types
    import warnings as w
    from colauto_backend import report
    MiB = 2**20

    def analysis(budget):
        return types.SimpleNamespace(hints={}, evaluate=lambda subs: {"peak_memory_bytes": 110 * MiB},
                                     plan=types.SimpleNamespace(budget_bytes=budget))
    report.emit_compiled_peak(analysis(120 * MiB), (100 * MiB, "bwd:buf3 (compiled)"), "1")
    assert capsys.readouterr().out.strip() == ("colauto: peak of the compiled code 100.00 MiB at bwd:buf3 (compiled) "
                                               "(memory model: 110.00 MiB, +10.0%); budget 120.00 MiB")
    report.emit_compiled_peak(analysis(120 * MiB), (100 * MiB, "bwd:buf3 (compiled)"), "1", (90 * MiB, "bwd:buf3 (compiled)"))
    assert capsys.readouterr().out.strip() == ("colauto: peak of the compiled code 100.00 MiB at bwd:buf3 (compiled) "
                                               "(memory model: 110.00 MiB, +10.0%); 90.00 MiB where the script keeps "
                                               "only the loss, not the model's outputs; budget 120.00 MiB")
    with pytest.warns(UserWarning, match=r"105.00 MiB .*budget 101.00 MiB - OVER THE BUDGET: set COLAUTO_MEMORY_BUDGET lower"):
        report.emit_compiled_peak(analysis(101 * MiB), (105 * MiB, "bwd:buf9 (compiled)"), None)
    assert capsys.readouterr().out == ""    # no report asked for: the warning alone
    with w.catch_warnings():
        w.simplefilter("error")             # under the budget, or no budget: no warning
        report.emit_compiled_peak(analysis(None), (105 * MiB, "bwd:buf9 (compiled)"), None)
        # planned under less than the user's budget (a re-plan's margin): held to the user's, not the plan's
        report.emit_compiled_peak(analysis(101 * MiB), (105 * MiB, "bwd:buf9 (compiled)"), "1", held=110 * MiB)
    assert capsys.readouterr().out.strip() == ("colauto: peak of the compiled code 105.00 MiB at bwd:buf9 (compiled) "
                                               "(memory model: 110.00 MiB, +4.8%); budget 110.00 MiB "
                                               "(planned under 101.00 MiB)")


def test_a_step_compiled_over_the_budget_is_planned_again_and_later_launches_plan_under_the_margin(
        tmp_path, monkeypatch):
    """HF BART with codegen inductor on CPU: at 0.8 of the way from the held state to the unplanned peak, the
    plan the memory model chose compiled to a step 1.01 MiB over its 31.8 MiB budget, as measured by the
    CPU allocator (`bench.cpu_peak`, the independent reference; the compiled code's figure agreed to the
    byte). The backward is now compiled with the forward, the compiled peak read, and the step planned again
    under the budget less the model's error until it fits (backend._held_to_budget): measured under the
    budget. The margin is kept with the plans: a second launch plans under it at once. The model's rule for
    Inductor's addmm (`memory.addmm_fused`: BART's tied head's weight gradient holds the logits' gradient to
    the backward's end) is off here: with it the model is no longer low on this step (2026-12-07), and the
    test is of the re-plan."""
    from bench import cpu_peak
    from colauto_backend import backend
    from colauto_backend.cost import memory
    monkeypatch.setattr(memory, "addmm_fused", lambda *args, **kwargs: {})
    monkeypatch.setenv("COLAUTO_PLAN_CACHE", "1")
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLAUTO_REPORT", str(tmp_path / "report.json"))
    monkeypatch.setenv("COLAUTO_PLANNED_RULES", "fusion,reuse")   # both rules from the first compile
    before = sum(backend.REPLANNED.values())
    _, row = cpu_peak.points("bart", "inductor", [0.8])
    assert "error" not in row, row
    assert row["measured_bytes"] <= row["budget_bytes"] and not row["over_budget"], row
    assert sum(backend.REPLANNED.values()) > before
    # every compile's peak is reported against the user's budget, the re-plans' too (planned under less of
    # it): the last compile's is under it (an H100 run once warned "OVER THE BUDGET" against the re-plan's)
    lines = [json.loads(line) for line in open(tmp_path / "report.compiled_peak.jsonl")]
    budgeted = lines[1:]        # the first: the point without a budget (one graph, the device's memory)
    assert len(budgeted) >= 2 and all(d["budget_bytes"] == row["budget_bytes"] for d in budgeted), budgeted
    assert budgeted[0]["compiled_bytes"] > row["budget_bytes"] >= budgeted[-1]["compiled_bytes"], budgeted
    assert budgeted[-1]["planned_under_bytes"] < row["budget_bytes"], budgeted[-1]
    assert list((tmp_path / "plans" / "margins").glob("*.json"))
    again = sum(backend.REPLANNED.values())
    from examples.hf_zoo import build_hf
    torch.manual_seed(0)
    model, make = build_hf("bart")            # a second launch: a fresh model, the same graph and budget
    measured, _ = cpu_peak.measured_step(model, make(8, 256), {"codegen": "inductor", "memory_budget": row["budget_bytes"]})
    assert measured <= row["budget_bytes"], (measured, row)
    assert sum(backend.REPLANNED.values()) == again    # the kept margin: one plan, one compile


def test_a_step_compiled_well_under_the_budget_is_planned_again_under_more_of_it(tmp_path, monkeypatch):
    """HF Qwen2 with codegen inductor on CPU at 0.75 of the way from the held state to the unplanned peak: the
    memory model puts its plan's peak above what the compiled code reaches (it runs a recomputed residual
    chain as one group; on an H100, HF Qwen2-0.5B at half its activations: 13.57 GiB modelled, 11.91
    measured, under 13.72), so the plan recomputes more than the budget needs. The compiled code's peak
    leaves over 5% of the budget unused, so the step is planned and compiled again under more of it
    (backend._looser_margin; counted, reported; on torch 2.11 a second looser plan goes over the budget
    and the one before it is kept): the CPU allocator (the independent reference) measures it above the
    same budget's plan with that search off and still under the budget, with fewer ops recomputed. A
    second launch plans under the kept margin at once: the same peak, one compile, no search. A looser
    plan whose step goes over the budget is dropped for the plan that held. By default the looser plan
    is compiled only where the planner expects it LOOSER_GAIN (2%) faster: here it expects 0.7%, so the
    default compiles the step once, says so in one report line and counts it (LOOSER_SKIPPED), and runs
    the plan that held; the search is checked with that threshold at 0."""
    from bench import cpu_peak
    from colauto_backend import backend
    from examples.hf_zoo import build_hf
    monkeypatch.setenv("COLAUTO_PLAN_CACHE", "1")
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLAUTO_REPORT", str(tmp_path / "report.json"))
    monkeypatch.delenv("COLAUTO_PLANNED_RULES", raising=False)
    monkeypatch.setattr(backend, "LOOSER_GAIN", 0.0)
    _, row = cpu_peak.points("qwen2", "inductor", [0.75])
    assert "error" not in row, row
    assert row["loosened"] >= 1 and row["looser_over"] <= 1 and row["replanned"] == 0, row
    assert row["measured_bytes"] <= row["budget_bytes"], row
    said = [json.loads(line) for line in open(tmp_path / "report.loosened.jsonl")]
    assert len(said) == row["loosened"] + row["looser_over"], said     # a line a looser plan, and a line a drop
    said = [d for d in said if "kept_bytes" not in d]
    assert all(d["planned_under_bytes"] > d["budget_bytes"] > d["compiled_bytes"] for d in said), said
    assert all(d["model_bytes"] > d["compiled_bytes"] for d in said), said
    from colauto_backend import report
    assert report.render_loosened(said[0]).startswith("colauto: the compiled code's peak "), said[0]
    options = {"codegen": "inductor", "memory_budget": row["budget_bytes"]}
    batch = lambda make: make(8, 256)   # noqa: E731 - cpu_peak's batch
    loosened = sum(backend.LOOSENED.values())
    torch.manual_seed(0)
    model, make = build_hf("qwen2")     # a second launch: a fresh model, the same graph, budget and cache
    second, planned = cpu_peak.measured_step(model, batch(make), options)
    assert sum(backend.LOOSENED.values()) == loosened, "the kept margin was searched again"
    assert second == pytest.approx(row["measured_bytes"], rel=1e-3)
    assert sum(len(a.recomputed) for a in planned) == row["recomputed"]
    # the same budget under the default threshold (a fresh cache: no margin kept): the looser plan is
    # expected under 2% faster, so it is not compiled; said and counted
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path / "off"))
    monkeypatch.setattr(backend, "LOOSER_GAIN", 0.02)
    skipped, loosened = sum(backend.LOOSER_SKIPPED.values()), sum(backend.LOOSENED.values())
    torch.manual_seed(0)
    model, make = build_hf("qwen2")
    off, planned = cpu_peak.measured_step(model, batch(make), options)
    assert sum(backend.LOOSER_SKIPPED.values()) == skipped + 1 and sum(backend.LOOSENED.values()) == loosened
    gated = json.loads(open(tmp_path / "report.loosened.jsonl").readlines()[-1])
    assert 0 < gated["gain"] < gated["least_gain"] == 0.02, gated
    assert "a plan recomputing less is expected only" in report.render_loosened(gated)
    assert off < row["measured_bytes"] <= row["budget_bytes"], (off, row)
    assert sum(len(a.recomputed) for a in planned) > row["recomputed"], row
    off_recomputed = sum(len(a.recomputed) for a in planned)
    # a looser plan whose compiled step goes over the budget (here: planned under twice the budget, which
    # needs no recomputation) is dropped, and the plan that held runs: the search-off plan, measured alike
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path / "over"))
    monkeypatch.setattr(backend, "_looser_margin", lambda analysis, peak, budget, margin: (margin - budget, None))
    over = sum(backend.LOOSER_OVER.values())
    torch.manual_seed(0)
    model, make = build_hf("qwen2")
    held, planned = cpu_peak.measured_step(model, batch(make), options)
    assert sum(backend.LOOSER_OVER.values()) == over + 1
    assert held == pytest.approx(off, rel=1e-3) and held <= row["budget_bytes"], (held, off)
    assert [sum(len(a.recomputed) for a in planned)] == [off_recomputed]
    kept = json.loads(open(tmp_path / "report.loosened.jsonl").readlines()[-1])
    assert kept["looser_bytes"] > row["budget_bytes"] >= kept["kept_bytes"], kept


def _launched(name: str, budget) -> tuple[int, list]:
    """A fresh tiny HF model's step compiled under `budget` with codegen inductor: (its peak on the CPU
    allocator, the planned analyses), `bench.cpu_peak.measured_step`."""
    from bench import cpu_peak
    from examples.hf_zoo import build_hf
    torch.manual_seed(0)
    model, make = build_hf(name)
    return cpu_peak.measured_step(model, make(8, 256), {"codegen": "inductor", "memory_budget": budget})


def test_a_budget_under_the_models_least_plan_runs_where_that_plans_compiled_code_holds_it(tmp_path, monkeypatch):
    """HF Qwen2 with codegen inductor on CPU: the least peak the memory model plans (13.55 MiB, 13.62 with
    headroom, on 2026-12-07) is above what that plan's compiled code reaches (12.55 MiB; the CPU allocator
    measures 12.80). A budget 4% under the model's least (and within LEAST_ROOM of it) was refused; now
    that plan is compiled and its code read, and where it holds the budget less COMPILED_SLACK it runs:
    measured (CPU allocator, the independent reference) under the budget; counted, reported. 7% under
    it, the code does not hold it: a one-line BudgetError names the least budget the compiled code holds,
    and that budget, as the message writes it, runs under itself."""
    import re
    from colauto_backend import BudgetError, backend
    monkeypatch.setenv("COLAUTO_PLAN_CACHE", "0")
    monkeypatch.setenv("COLAUTO_REPORT", str(tmp_path / "report.json"))

    launch = functools.partial(_launched, "qwen2")
    with pytest.raises(BudgetError) as far:      # far under: refused by the model at once, nothing compiled
        launch(2**20)
    least = far.value.smallest_bytes
    held = backend.LEAST_COMPILED["held the budget"]
    measured, planned = launch(int(0.96 * least))
    assert measured <= int(0.96 * least), (measured, least)
    assert backend.LEAST_COMPILED["held the budget"] == held + 1
    assert planned[0].evaluate(planned[0].hints)["peak_memory_bytes"] > int(0.96 * least)   # the model: over
    said = json.loads(open(tmp_path / "report.loosened.jsonl").readlines()[-1])
    assert said["runs"] and said["compiled_bytes"] <= 0.96 * least < said["least_model_bytes"], said
    with pytest.raises(BudgetError) as near:
        launch(int(0.93 * least))
    message = str(near.value)
    assert "\n" not in message and "its least plan's compiled code peaks" in message, message
    assert int(0.93 * least) < near.value.smallest_bytes < least, (message, least)
    written = re.search(r"set it to at least ([0-9.]+) (\w+),", message)
    measured, _ = launch(written[1] + written[2])
    assert measured <= near.value.smallest_bytes * 1.0001, (measured, message)


def test_a_budget_well_under_the_models_least_plan_is_tried_on_that_plans_code():
    """HF Phi-3 with codegen inductor on CPU: the memory model's least plan peaks 11% above a budget
    (0.6 of the way from the held state to the unplanned peak: 14.41 MiB against 16.02 on 2026-12-07);
    with LEAST_ROOM at 10% it was refused, and that plan's code peaks 13.55 MiB. LEAST_ROOM is 30%: the
    plan is compiled and runs, measured on the CPU allocator (the independent reference) under the budget."""
    from colauto_backend import BudgetError, backend

    launch = functools.partial(_launched, "phi3")
    with pytest.raises(BudgetError) as far:
        launch(2**20)
    least = far.value.smallest_bytes
    budget = int(0.89 * least)
    assert least > (1 + 0.10) * budget             # outside the old room
    held = backend.LEAST_COMPILED["held the budget"]
    measured, planned = launch(budget)
    assert measured <= budget, (measured, budget)
    assert backend.LEAST_COMPILED["held the budget"] == held + 1
    assert planned[0].recomputed


def test_the_least_budget_named_holds_where_the_least_plans_code_peaks_over_the_models_least(monkeypatch):
    """A budget under the memory model's least plan whose compiled code peaks above that least (the
    model low): the BudgetError named the model's least, which was refused again; it names the code's
    peak plus COMPILED_SLACK. HF MPT on CPU with the model's addmm rule off (`memory.addmm_fused`: its
    tied head's weight gradient, added to the embedding's at the end of the backward, holds the logits'
    gradient; without the rule the model is 6% low): the model's least 25.82 MiB, the code 27.14, the
    message now says 27.84 MiB, which runs, measured on the CPU allocator under it."""
    import re
    from colauto_backend import BudgetError
    from colauto_backend.cost import memory
    monkeypatch.setattr(memory, "addmm_fused", lambda *args, **kwargs: {})

    launch = functools.partial(_launched, "mpt")
    with pytest.raises(BudgetError) as far:
        launch(2**20)
    least = far.value.smallest_bytes
    with pytest.raises(BudgetError) as near:
        launch(int(0.95 * least))
    message = str(near.value)
    code = re.search(r"compiled code peaks ([0-9.]+) MiB", message)
    assert code and float(code[1]) * 2**20 > least, (message, least)     # the case: the code over the model
    written = re.search(r"set it to at least ([0-9.]+) (\w+),", message)
    assert near.value.smallest_bytes > float(code[1]) * 2**20, message
    measured, _ = launch(written[1] + written[2])
    assert measured <= near.value.smallest_bytes, (measured, message)


def test_auto_rules_let_inductor_fuse_recomputation_and_refuse_it_where_the_compiled_code_is_over_the_budget(
        tmp_path, monkeypatch):
    """COLAUTO_PLANNED_RULES=auto (the default) on HF Qwen2 with codegen inductor on CPU, the CPU allocator
    (`bench.cpu_peak`) the reference, at 0.8 and 0.65 of the way from the held state to the unplanned peak.
    Each step is compiled with Inductor's own horizontal fusions of recomputed ops first; where they take
    the compiled code over the budget, the same plan's backward is compiled again refusing them (counted,
    said in one line; from a copy of the graph taken before Inductor's passes rewrote it); either way the
    step is measured under the budget, and never re-planned. The rules are kept with the plans, so a
    second launch compiles once, under both. The escalation is Inductor 2.13's: under the planner's pricing
    of 2026-12-07 (a recomputed value a backward matmul reads costs its own kernel) at 0.8, and at 0.65 too
    with the plan cache on (as here); before it at 0.65 and not at 0.8 (bench/results/cpu-2026-12-06-auto-rules).
    torch 2.11's fusions hold both budgets (2026-12-07): under 2.11 the test checks the steps are held
    without the second compile; the escalation forced by an unread peak is checked under both."""
    from bench import cpu_peak
    from colauto_backend import _torch_compat as compat, backend
    from examples.hf_zoo import build_hf
    monkeypatch.setenv("COLAUTO_PLAN_CACHE", "1")
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLAUTO_REPORT", str(tmp_path / "report.json"))
    monkeypatch.delenv("COLAUTO_PLANNED_RULES", raising=False)
    # no looser plan is searched for (a step well under the budget planned again: tested on its own below),
    # so each launch compiles its plan once, or twice where its fusions go over
    monkeypatch.setattr(backend, "_looser_margin", lambda *args: (None, None))
    refused, again = sum(compat.RECOMPUTE_KEPT_APART.values()), sum(backend.FUSION_REFUSED_AGAIN.values())
    esc = 1 if compat.torch_at_least(2, 13) else 0     # whether Inductor's fusions break the budget (above)
    rows = cpu_peak.points("qwen2", "inductor", [0.8, 0.65])
    assert all("error" not in row for row in rows), rows
    points = rows[1:]
    for row in points:     # each held, compiled once or (its fusions over the budget) twice, never re-planned
        assert row["measured_bytes"] <= row["budget_bytes"], row
        assert row["replanned"] == 0 and row["fusion_refused_again"] in (0, 1), row
        assert (row["fusions_refused"] > 0) == bool(row["fusion_refused_again"]), row
    escalated = [row for row in points if row["fusion_refused_again"]]
    assert bool(escalated) == bool(esc), points      # 2.13: at 0.8 (and 0.65 with the plan cache on); 2.11: none
    hot = escalated[0] if escalated else points[0]
    assert sum(backend.FUSION_REFUSED_AGAIN.values()) == again + len(escalated)
    assert (sum(compat.RECOMPUTE_KEPT_APART.values()) > refused) == bool(esc)
    said = [json.loads(line) for line in open(tmp_path / "report.replanned.jsonl")] if esc else []
    assert [d["rules"] for d in said] == [["fusion", "reuse"]] * len(escalated), said
    assert all(d["over_bytes"] > 0 for d in said), said
    rules = [json.loads(line)["rules"] for line in open(tmp_path / "report.planned_rules.jsonl")]
    # 0.8, then 0.65 (a backward compiled twice where it escalated)
    assert rules == [["fusion", "reuse"] if row["fusion_refused_again"] else ["reuse"] for row in points], rules
    # the backward compiled again from its copy computes eager's loss and gradients (a launch with no kept rules)
    import copy
    from test_hf_models import assert_same, step
    torch.manual_seed(0)
    model, make = build_hf("qwen2")
    batch, ref = make(8, 256), copy.deepcopy(model)
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path / "fresh"))
    torch._dynamo.reset()
    from torch._inductor.utils import fresh_inductor_cache
    options = {"codegen": "inductor", "memory_budget": hot["budget_bytes"]}
    with fresh_inductor_cache():   # no compiled step from torch's cache (an earlier run's): compiled here
        got = step(model, torch.compile(model, backend="colauto", options=options), batch)
        assert sum(backend.FUSION_REFUSED_AGAIN.values()) == again + len(escalated) + esc
        assert_same(got, step(ref, ref, batch), atol=1e-5)
        # a backward whose code's allocations were not read (as when Inductor loads it from its cache) is
        # not trusted: compiled again under the rule (its first reading is dropped here, as a hit has none)
        monkeypatch.setenv("COLAUTO_PLAN_CACHE", "0")
        unread = backend.FUSION_REFUSED_AGAIN["peak not read (Inductor's cache)"]
        record, dropped = backend._record_allocations, []

        def unread_once(analysis, tag, allocations, config, again=False):
            if tag == "bwd" and not dropped:
                dropped.append(tag)
                return
            record(analysis, tag, allocations, config, again)
        monkeypatch.setattr(backend, "_record_allocations", unread_once)
        torch._dynamo.reset()
        assert_same(step(model, torch.compile(model, backend="colauto", options=options), batch),
                    step(ref, ref, batch), atol=1e-5)
        assert dropped and backend.FUSION_REFUSED_AGAIN["peak not read (Inductor's cache)"] == unread + 1
        monkeypatch.setattr(backend, "_record_allocations", record)
        # rules set by the user are theirs: `reuse` is never compiled again under the fusion rule
        before = sum(backend.FUSION_REFUSED_AGAIN.values())
        torch._dynamo.reset()
        step(model, torch.compile(model, backend="colauto", options=dict(options, planned_rules="reuse")), batch)
        assert sum(backend.FUSION_REFUSED_AGAIN.values()) == before
        monkeypatch.setenv("COLAUTO_PLAN_CACHE", "1")
    again += 1
    monkeypatch.setenv("COLAUTO_CACHE_DIR", str(tmp_path))
    again = sum(backend.FUSION_REFUSED_AGAIN.values())
    torch.manual_seed(0)
    model, make = build_hf("qwen2")               # a second launch: a fresh model, the same graph and budget
    measured, _ = cpu_peak.measured_step(model, make(8, 256), {"codegen": "inductor", "memory_budget": hot["budget_bytes"]})
    assert measured <= hot["budget_bytes"], (measured, hot)
    assert sum(backend.FUSION_REFUSED_AGAIN.values()) == again          # the kept rules: one compile
    rules = [json.loads(line)["rules"] for line in open(tmp_path / "report.planned_rules.jsonl")]
    # the fresh launch's copy, the unread backward's copy, the user's `reuse`, the kept rules
    kept = ["fusion", "reuse"] if esc else ["reuse"]
    assert rules[2:] == [kept, ["fusion", "reuse"], ["reuse"], kept], rules
    # each escalation is said in one line: the last, the unread peak's (forced above), names no compiled peak
    said = [json.loads(line) for line in open(tmp_path / "report.replanned.jsonl")]
    assert said[-1]["rules"] == ["fusion", "reuse"] and said[-1]["compiled_bytes"] is None, said
    assert len(said) == 1 + len(escalated) + esc, said   # the points' and the fresh launch's escalations


def test_a_budget_the_compiled_code_cannot_hold_fails_in_one_line_naming_the_budget_that_would(monkeypatch):
    """HF BART on CPU under codegen inductor at 19.8 MiB, just above the smallest peak the memory model finds
    (19.50 MiB plus headroom): that plan compiles to code peaking about 2 MiB higher, and no plan fits the
    room for that error, so the step is not run over the budget: a BudgetError names the user's budget, the
    model's error and the least budget that would be held (the planner's own least, plus the error).
    The model's addmm rule is off (`memory.addmm_fused`): with it BART's least plan models 22.05 MiB, above
    its code, and the budget is refused by the least-plan check instead (`test_a_budget_under_the_models_...`)."""
    from bench import cpu_peak
    from colauto_backend import BudgetError
    from colauto_backend.cost import memory
    from colauto_backend.report import fmt_bytes
    from examples.hf_zoo import build_hf
    monkeypatch.setattr(memory, "addmm_fused", lambda *args, **kwargs: {})
    torch.manual_seed(0)
    model, make = build_hf("bart")
    budget = int(19.8 * 2**20)
    with pytest.raises(BudgetError) as info:
        cpu_peak.measured_step(model, make(8, 256), {"codegen": "inductor", "memory_budget": budget})
    message = str(info.value)
    assert "\n" not in message and message.startswith("COLAUTO_MEMORY_BUDGET (or options['memory_budget']): 19.80 MiB cannot be held")
    assert info.value.smallest_bytes > budget, message
    assert f"set it to at least {fmt_bytes(info.value.smallest_bytes, up=True)}" in message


class _Loss(NamedTuple):
    loss: torch.Tensor


class _Attention(torch.nn.Module):
    """One causal attention block over long sequences: the attention kernels' own buffers outweigh its tensors."""

    def __init__(self, width: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return _Loss(self.out(y.transpose(1, 2).reshape(b, t, c)).square().mean())


def _flash_node(target, args) -> torch.fx.Node:
    graph = torch.fx.Graph()
    nodes = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            nodes.append(graph.placeholder(f"a{i}"))
            nodes[-1].meta["val"] = a
        else:
            nodes.append(a)
    return graph.call_function(target, tuple(nodes))


def _own_bytes(fn) -> tuple[int, object]:
    """(the most an op held beyond what it returned, its result), from the CPU allocator's events."""
    from bench import cpu_peak
    peak, live, result = cpu_peak.allocated(fn)
    return peak - live, result


@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_flash_attentions_own_buffers_are_the_cpu_allocators(threads):
    """memory.op_workspace of ATen's CPU flash attention, forward and backward, against what the CPU allocator saw
    the op hold beyond its outputs: query and key lengths across the kernel's block sizes (32, 64, 256 by 512),
    cross attention, the output gradient laid out as the kernel reads it or not (then copied)."""
    from colauto_backend.cost.memory import op_workspace
    aten = torch.ops.aten
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for (b, h, tq, tk, d), transposed in itertools.product(
                [(2, 4, 64, 256, 16), (2, 4, 300, 40, 8), (1, 3, 1000, 700, 24), (2, 2, 16, 16, 8)], (False, True)):
            q, k, v = torch.randn(b, h, tq, d), torch.randn(b, h, tk, d), torch.randn(b, h, tk, d)
            grad = torch.randn(b, tq, h, d).transpose(1, 2) if transposed else torch.randn(b, h, tq, d)
            held, (out, lse) = _own_bytes(lambda: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True))
            forward = _flash_node(aten._scaled_dot_product_flash_attention_for_cpu.default, [q, k, v, 0.0, True])
            assert op_workspace(forward) == held > 0, (b, h, tq, tk, d)
            held, _ = _own_bytes(lambda: aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, out, lse, 0.0, True))
            backward = _flash_node(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                                   [grad, q, k, v, out, lse, 0.0, True])
            assert op_workspace(backward) == held > 0, (b, h, tq, tk, d, transposed)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("codegen", ["aten", "inductor"])
def test_a_step_whose_peak_is_in_cpu_attentions_backward_is_predicted(codegen):
    """2 x 1024 tokens through one attention block: the step's peak is inside the attention backward, whose own
    buffers (2 MiB on two threads) are most of it. The memory model (and under Inductor the compiled code's
    figure) against the CPU allocator's peak of the third step (`bench.cpu_peak.measured_step`); before the
    buffers were modelled, the model was 35% low under aten and 46% under Inductor."""
    from bench import cpu_peak
    torch.manual_seed(0)
    model = _Attention()
    measured, planned = cpu_peak.measured_step(model, {"x": torch.randn(2, 1024, 32)}, {"codegen": codegen})
    predicted = max(a.evaluate(a.hints)["peak_memory_bytes"] for a in planned)
    assert predicted == pytest.approx(measured, rel=5e-3)
    if codegen == "inductor":
        assert planned[0].compiled_peak()[0] == pytest.approx(measured, rel=5e-3)
