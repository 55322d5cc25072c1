"""The rematerialization DP against brute-force enumeration: random DAGs and a real captured block."""
import itertools
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


def random_problem(rng: random.Random, n: int) -> RematProblem:
    return RematProblem(
        size=tuple(rng.randint(0, 5) for _ in range(n)),
        time=tuple(float(rng.randint(1, 9)) for _ in range(n)),
        inputs=tuple(tuple(sorted(rng.sample(range(i), k=min(i, rng.randint(0, 3))))) for i in range(n)),
        needed=tuple(rng.random() < 0.5 for _ in range(n)),
        can_keep=tuple(rng.random() < 0.85 for _ in range(n)),
        can_recompute=tuple(rng.random() < 0.85 for _ in range(n)),
        keep_time=tuple(float(rng.randint(0, 3)) for _ in range(n)) if rng.random() < 0.5 else ())


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
