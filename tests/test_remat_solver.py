"""The rematerialization DP against brute-force enumeration: random DAGs and a real captured block."""
import itertools
import math
import random

import pytest
import torch

from colauto_backend import graph
from colauto_backend.backend import ANALYSES
from colauto_backend.solver.remat import RematProblem, evaluate, solve


def brute_force(p: RematProblem) -> list[tuple[int, float]]:
    """Pareto points (memory, least time) by enumerating every keep set."""
    best: dict[int, float] = {}
    free = [i for i in range(len(p.size)) if p.can_keep[i] and p.can_recompute[i]]
    for bits in itertools.product([False, True], repeat=len(free)):
        keep = [p.can_keep[i] and not p.can_recompute[i] for i in range(len(p.size))]
        for i, b in zip(free, bits):
            keep[i] = b
        result = evaluate(p, tuple(keep))
        if result is not None:
            best[result[0]] = min(best.get(result[0], float("inf")), result[1])
    points, least = [], float("inf")
    for m in sorted(best):
        if best[m] < least:
            least = best[m]
            points.append((m, least))
    return points


def check_against_brute_force(p: RematProblem) -> None:
    frontier = solve(p)
    expected = brute_force(p)
    assert frontier.memory.tolist() == [m for m, _ in expected]
    assert frontier.time.tolist() == pytest.approx([t for _, t in expected])
    for k, (m, t) in enumerate(zip(frontier.memory.tolist(), frontier.time.tolist())):
        memory, seconds = evaluate(p, frontier.keep(k))   # each point's decisions reproduce it
        assert memory == m and seconds == pytest.approx(t)


def random_problem(rng: random.Random, n: int, largest: int = 5, least_inputs: int = 0, needed: float = 0.5,
                   allowed: float = 0.85, keep_costs: bool | None = None) -> RematProblem:
    """`keep_costs`: whether keeping costs time (None: a coin decides)."""
    return RematProblem(
        size=tuple(rng.randint(0, largest) for _ in range(n)),
        time=tuple(float(rng.randint(1, 9)) for _ in range(n)),
        inputs=tuple(tuple(sorted(rng.sample(range(i), k=min(i, rng.randint(least_inputs, 3))))) for i in range(n)),
        needed=tuple(rng.random() < needed for _ in range(n)),
        can_keep=tuple(rng.random() < allowed for _ in range(n)),
        can_recompute=tuple(rng.random() < allowed for _ in range(n)),
        keep_time=tuple(float(rng.randint(0, 3)) for _ in range(n))
        if (rng.random() < 0.5 if keep_costs is None else keep_costs) else ())


@pytest.mark.parametrize("seed", range(200))
def test_dp_equals_brute_force_on_random_dags(seed):
    rng = random.Random(seed)
    check_against_brute_force(random_problem(rng, rng.randint(1, 11)))


class Block(torch.nn.Module):
    """A pre-LN MLP block: small enough to enumerate, real enough to have views, tuples and matmuls."""

    def __init__(self, d=16):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return (x + self.down(torch.nn.functional.gelu(self.up(self.ln(x))))).square().mean()


@pytest.mark.parametrize("shape", [(4, 16), (2, 8, 16)])
def test_dp_equals_brute_force_on_a_real_graph(shape):
    model = Block()
    x = torch.randn(*shape, requires_grad=True)
    torch.compile(model, backend="colauto", options={"memory_budget": "none"})(x).backward()
    analysis = ANALYSES[-1]
    ev = analysis.evaluate(analysis.hints)
    times = graph.node_times(analysis.costs, ev["_node_times"])
    problem, nodes, _ = graph.remat_problem(analysis.joint.graph, times, analysis.hints, units=64)
    free = sum(1 for k, r in zip(problem.can_keep, problem.can_recompute) if k and r)
    assert 6 <= free <= 16 and any(problem.needed)
    check_against_brute_force(problem)


def test_problem_rejects_a_node_reading_a_later_one():
    with pytest.raises(ValueError, match="not before it"):
        RematProblem((1, 1), (1.0, 1.0), ((1,), ()), (True, True), (True, True), (True, True))


def reference_frontier(p: RematProblem) -> list[tuple[int, float]]:
    """The same DP written plainly (state -> {memory: least time}, no arrays, no pruning): a reference for
    problems too large to enumerate."""
    values: dict[frozenset, dict[int, float]] = {frozenset(): {0: 0.0}}
    for j in range(len(p.size) - 1, -1, -1):
        new: dict[frozenset, dict[int, float]] = {}

        def offer(state, m, t):
            row = new.setdefault(state, {})
            row[m] = min(row.get(m, float("inf")), t)
        for state, row in values.items():
            rest = state - {j}
            for m, t in row.items():
                if not (p.needed[j] or j in state):
                    offer(rest, m, t)
                    continue
                if p.can_keep[j]:
                    offer(rest, m + p.size[j], t + p.keep_time[j])
                if p.can_recompute[j]:
                    offer(rest | frozenset(p.inputs[j]), m, t + p.time[j])
        values = new
    points, least = [], float("inf")
    for m, t in sorted(values.get(frozenset(), {}).items()):
        if t < least:
            least = t
            points.append((m, t))
    return points


@pytest.mark.parametrize("seed", range(3))
def test_dp_equals_a_plain_reference_where_states_outnumber_a_byte(seed):
    """Many pending sets at once (back-pointers past int8), long value arrays with dominated entries
    (keeping costs time here, so keeping more is not always better): the frontier and each point's
    decisions equal the plain DP's (176-244 states at once for these seeds)."""
    p = random_problem(random.Random(seed), 30, largest=6, least_inputs=1, needed=0.6, allowed=0.95, keep_costs=True)
    frontier = solve(p)
    states = max(len(before) for before, _ in frontier._back)
    assert states >= 128, "the problem no longer exercises int16 back-pointers"
    expected = reference_frontier(p)
    assert frontier.memory.tolist() == [m for m, _ in expected]
    assert frontier.time.tolist() == pytest.approx([t for _, t in expected])
    for k, (m, t) in enumerate(zip(frontier.memory.tolist(), frontier.time.tolist())):
        memory, seconds = evaluate(p, frontier.keep(k))
        assert memory == m and seconds == pytest.approx(t)


def test_planning_pauses_the_collector_and_restores_it():
    """`planner.gc_paused`: the collector is off inside (planning allocates many small objects beside a
    heap full of traced graphs), back on after a return and after an exception, and left off if it was off."""
    import gc

    from colauto_backend import planner
    seen = []

    @planner.gc_paused
    def work(fail=False):
        seen.append(gc.isenabled())
        if fail:
            raise RuntimeError("planning failed")
        return 7
    assert gc.isenabled()
    assert work() == 7 and seen == [False] and gc.isenabled()
    with pytest.raises(RuntimeError, match="planning failed"):
        work(fail=True)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        work()
        assert seen[-1] is False and not gc.isenabled()
    finally:
        gc.enable()
    # the planner's entry point is wrapped the same way
    assert planner.Planner.plan.__code__ is work.__code__


def test_compiling_runs_with_the_collector_paused(monkeypatch):
    """The whole backend call and each graph's code generation (the backward's too, which AOTAutograd may
    compile at the first backward, outside the backend call) run with the collector off; it is back on for
    the training step itself."""
    import gc

    from colauto_backend import backend as colauto_backend_module
    seen = {}
    real = colauto_backend_module.compat.run_as_aten

    def recording(gm, inputs):
        kind = "backward" if any(n.name.startswith("tangents") for n in gm.graph.nodes if n.op == "placeholder") \
            else "forward"
        seen[kind] = gc.isenabled()
        return real(gm, inputs)
    monkeypatch.setattr(colauto_backend_module.compat, "run_as_aten", recording)
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    step = torch.compile(model, backend="colauto", options={"codegen": "aten"})
    x = torch.randn(4, 8)
    step(x).sum().backward()
    assert gc.isenabled()
    assert seen == {"forward": False, "backward": False}
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()   # the compiled step computed eager's gradients
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)


@pytest.mark.parametrize("seed", range(3))
def test_first_fitting_is_the_linear_scan_where_fitting_starts_once_and_monotone_everywhere(seed):
    """planner.first_fitting against the linear scan (`next(k for k in order if fits(k))`) over candidate
    peaks: equal wherever the peak falls along the order (whatever the budget), in at most 2 ceil(sqrt(n))
    calls; on random (non-monotone) peaks every result fits, and a larger budget never gets a later one."""
    from colauto_backend.planner import first_fitting
    rng = random.Random(seed)
    for n in [*range(0, 12), 37, 64, 100]:
        falling = sorted((rng.random() for _ in range(n)), reverse=True)
        noisy = [rng.random() for _ in range(n)]
        budgets = sorted(rng.random() for _ in range(15))
        for peaks, exact in ((falling, True), (noisy, False)):
            got_before = None
            for budget in reversed(budgets):      # falling budgets: the choice may only move later
                calls = []
                fits = lambda i: calls.append(i) or peaks[i] <= budget   # noqa: E731
                got = first_fitting(list(range(n)), fits)
                scan = next((i for i in range(n) if peaks[i] <= budget), None)
                if exact:
                    assert got == scan, (n, budget)
                    assert len(calls) <= 2 * (math.isqrt(max(n - 1, 0)) + 1), (n, len(calls))
                assert (got is None) == (scan is None) or not exact
                if got is not None:
                    assert peaks[got] <= budget
                    assert got_before is None or got >= got_before, (n, budget)
                    got_before = got
                else:
                    got_before = n


def _in_order(p: RematProblem, order: list[int]) -> RematProblem:
    """`p` with its nodes renumbered into `order` (a topological order of its nodes)."""
    at = {old: new for new, old in enumerate(order)}
    return RematProblem(*(tuple(getattr(p, f)[i] for i in order) for f in ("size", "time")),
                        tuple(tuple(sorted(at[x] for x in p.inputs[i])) for i in order),
                        *(tuple(getattr(p, f)[i] for i in order) for f in ("needed", "can_keep", "can_recompute",
                                                                            "keep_time")))


def _bloom_problem(layers: int):
    """HF BLOOM (tiny width) at `layers` layers: its remat problem in the solver's order, and the order of
    the joint graph (graph.forward_dag's `order`) as positions in it."""
    import transformers
    from examples.hf_zoo import config_of
    config = config_of("bloom", "tiny")
    config.n_layer = layers
    torch.manual_seed(0)
    model = transformers.BloomForCausalLM(config)
    ids = torch.randint(1, config.vocab_size, (2, 16))
    ANALYSES.clear()
    torch.compile(model, backend="colauto", options={"memory_budget": "none"})(input_ids=ids, labels=ids).loss.backward()
    analysis = next(a for a in ANALYSES if a.planner is not None)
    ev = analysis.evaluate(analysis.hints)
    times = graph.node_times(analysis.costs, ev["_recompute_times"])
    problem, nodes, _ = graph.remat_problem(analysis.joint.graph, times, analysis.hints)
    dag = graph.forward_dag(analysis.joint.graph)
    return problem, sorted(range(len(nodes)), key=lambda i: dag.nodes[nodes[i]]["order"])


def test_dp_width_does_not_grow_with_depth_and_the_order_changes_no_point():
    """HF BLOOM's GELU has its own backward (a custom autograd Function), whose tanh derivative AOTAutograd
    traces at the end of the joint graph, reading each layer's forward tanh. Walked in the joint graph's
    order, the DP held every layer's pending reads at once: its states multiplied with depth (2,160 at 4
    layers of BLOOM-560m; at 24 its compile planned for more than 8 minutes on a GPU host and was killed).
    In the solver's order those nodes follow their inputs: the width is the same at 2 and 6 layers. The DP
    is exact in any topological order: the joint graph's order gives the same frontier (4 layers), from a
    width that doubles with each layer past the second (96, 192, 384 at 2, 3, 4 layers of this width)."""
    widths = [solve(_bloom_problem(layers)[0]).states for layers in (2, 6)]
    assert widths[0] == widths[1] < 100, widths
    problem, joint_order = _bloom_problem(4)
    ours, theirs = solve(problem), solve(_in_order(problem, joint_order))
    assert theirs.states >= 4 * ours.states, (theirs.states, ours.states)     # the width this order removes
    assert ours.memory.tolist() == theirs.memory.tolist()
    assert ours.time.tolist() == pytest.approx(theirs.time.tolist(), rel=1e-12)


def _long_reads(layers: int) -> RematProblem:
    """Per layer a node, and at the end a reader of it that the backward needs (the shape of BLOOM's
    joint order): recomputing a reader leaves its layer's node pending, so the states double per layer."""
    n = 2 * layers
    return RematProblem(size=tuple([2] * layers + [1] * layers), time=tuple(float(1 + i % 3) for i in range(n)),
                        inputs=tuple([()] * layers + [(i,) for i in range(layers)]),
                        needed=tuple([False] * layers + [True] * layers),
                        can_keep=(True,) * n, can_recompute=(True,) * n)


def test_a_bounded_dp_returns_real_plans_and_says_it_pruned():
    """Past `max_states` the DP keeps the likeliest states: every point it returns is a real plan (its
    decisions give its memory and time), none beats the exact frontier, and it says how many steps it
    pruned; with room for every state it is the exact DP (brute force)."""
    p = _long_reads(8)
    exact = solve(p)
    assert exact.states == 2 ** 8 and exact.pruned_steps == 0
    check_against_brute_force(p)
    assert solve(p, max_states=exact.states).memory.tolist() == exact.memory.tolist()
    bounded = solve(p, max_states=4)
    assert bounded.pruned_steps > 0 and bounded.states > 4 and len(bounded.memory) > 0
    for k, (m, t) in enumerate(zip(bounded.memory.tolist(), bounded.time.tolist())):
        assert evaluate(p, bounded.keep(k)) == (m, pytest.approx(t))
        best = min(et for em, et in zip(exact.memory.tolist(), exact.time.tolist()) if em <= m)
        assert best <= t + 1e-12


def test_a_pruned_dp_is_counted_and_reported_and_still_trains_like_eager(monkeypatch, capsys):
    """The planner bounds the DP (planner.MAX_DP_STATES); a plan from a pruned DP is counted ('remat DP
    pruned'), its report line says it is approximate, and the step it compiles trains like eager."""
    from colauto_backend import counters, planner
    from examples.hf_zoo import build_hf
    monkeypatch.setattr(planner, "MAX_DP_STATES", 1)
    before = sum(counters.snapshot()["counts"].get("remat DP pruned", {}).values())
    from test_hf_models import assert_same, step
    model, make = build_hf("llama")
    ref, _ = build_hf("llama")
    batch = make(2, 32)
    probe = _least_plan(model, batch)
    budget = (probe.peak_without_bytes + probe.peak_with_bytes) // 2   # between the least and the unplanned
    compiled = torch.compile(model, backend="colauto", options={"memory_budget": budget, "report": "1"})
    assert_same(step(model, compiled, batch), step(ref, ref, batch), 1e-5)
    assert sum(counters.snapshot()["counts"]["remat DP pruned"].values()) > before
    assert "approximate: the DP held too many states" in capsys.readouterr().out


def _least_plan(model, batch):
    """The single-device plan at the least memory explain() finds (the budget no plan goes under)."""
    import colauto_backend
    try:
        return colauto_backend.explain(model, kwargs=batch, budget=1)
    except colauto_backend.BudgetError as error:
        return colauto_backend.explain(model, kwargs=batch, budget=error.smallest_bytes)
