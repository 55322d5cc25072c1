"""The parallel planner in one process: COLAUTO_MESH, candidate meshes, the communication model,
shard sizes, tensor-parallel layouts, the joint choice against the sequential one, and solve time."""
import itertools
import math

import numpy as np
import pytest
import torch

import colauto_backend
from colauto_backend import calibrate, config as cfg, report
from colauto_backend.parallel import comm, entry, mesh, strategy
from colauto_backend.parallel.plan import ParallelPlan
from examples.models import build


@pytest.mark.parametrize("value", ["2x", "0", "dp=2,dp=2", "pp=2", "2x2x2x2", "dp=two"])
def test_bad_mesh_is_one_line(value):
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(environ={"COLAUTO_MESH": value})
    assert "\n" not in str(err.value) and "COLAUTO_MESH" in str(err.value)


def test_mesh_forms():
    assert cfg.load(environ={"COLAUTO_MESH": "4"}).mesh == ((None, 4),)
    assert cfg.load(environ={"COLAUTO_MESH": "2x2"}).mesh == ((None, 2), (None, 2))
    assert cfg.load(environ={"COLAUTO_MESH": "dp=2,tp=2"}).mesh == (("dp", 2), ("tp", 2))
    assert cfg.load(environ={"COLAUTO_MESH": "auto"}).mesh is None


def test_mesh_product_must_match_world():
    with pytest.raises(cfg.ConfigError, match="has 6 devices but the job has 8 ranks"):
        mesh.candidates(((None, 2), (None, 3)), 8)


def test_candidates_are_every_factorization_with_distinct_roles():
    for world in (2, 4, 6, 8, 12):
        # brute force: every way to write world as a product of 1-3 factors >= 2, each given a role
        want = set()
        for n in (1, 2, 3):
            for roles in itertools.permutations(cfg.ROLES, n):
                for sizes in itertools.product(range(2, world + 1), repeat=n):
                    if math.prod(sizes) == world:
                        want.add(tuple(sorted(zip(roles, sizes), key=lambda a: cfg.ROLES.index(a[0]))))
        assert set(mesh.candidates(None, world)) == want


def test_named_axes_are_kept_and_unnamed_get_the_other_roles():
    assert mesh.candidates((("tp", 2), (None, 2)), 4) == [(("dp", 2), ("tp", 2)), (("fsdp", 2), ("tp", 2))]
    assert mesh.candidates((("fsdp", 4),), 4) == [(("fsdp", 4),)]


def test_collective_costs_are_the_ring_formulas():
    link = comm.Link("x", alpha_s=1e-5, bandwidth=1e11)
    n, p = 8e8, 4
    assert link.all_gather(n, p) == pytest.approx(3 * 1e-5 + 0.75 * n / 1e11)
    assert link.reduce_scatter(n, p) == link.all_gather(n, p)
    assert link.all_reduce(n, p) == pytest.approx(2 * link.all_gather(n, p))
    assert link.all_reduce(n, 1) == 0.0


def test_calibration_fit_recovers_alpha_and_beta():
    alpha, beta, p = 2e-5, 3e11, 4
    points = [(n, 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / beta) for n in (2 ** k for k in range(16, 28))]
    a, b = calibrate.fit(points, p)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)


def test_bad_comm_setting():
    with pytest.raises(cfg.ConfigError, match="COLAUTO_COMM"):
        cfg.load(environ={"COLAUTO_COMM": "infiniband9"})


def test_local_shape_is_torch_chunk():
    plan = ParallelPlan((("fsdp", 3), ("tp", 2)), {"w": ("S1", "S0"), "b": ("R", "S0")}, {})
    w = torch.empty(7, 10)
    for i, j in itertools.product(range(3), range(2)):   # fsdp index i splits dim 1, tp index j dim 0
        assert plan.local_shape("w", (7, 10), (i, j)) == tuple(w.chunk(2, 0)[j].chunk(3, 1)[i].shape)
    assert plan.local_shape("b", (5,), (2, 1)) == (2,)


def capture(model, *inputs):
    """The Dynamo graph and parameter names, as the distributed backend sees them."""
    got = {}

    def backend(gm, example_inputs):
        names = entry.state_names(gm)
        got.update(gm=gm, names=names)
        return gm.forward
    torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    return got["gm"], got["names"]


def test_tp_layout_pairs_column_and_row_linears():
    model, make = build("llama", "tiny")
    gm, names = capture(model, *make(2, 16))
    layout = strategy.tp_layout(gm, names, 2)
    roles = {k: v for k, v in layout.roles.items() if k.startswith("blocks.0.")}
    assert roles == {"blocks.0.q.weight": "col", "blocks.0.k.weight": "col", "blocks.0.v.weight": "col",
                     "blocks.0.o.weight": "row", "blocks.0.gate.weight": "col", "blocks.0.up.weight": "col",
                     "blocks.0.down.weight": "row"}
    assert layout.roles["lm_head.weight"] == "col" and not layout.indivisible
    assert len(layout.row_outputs) == 2 * len(model.blocks)
    # two k/v heads cannot be split over four ranks
    assert any("blocks.0.k.weight (2 heads)" in w for w in strategy.tp_layout(gm, names, 4).indivisible)


def test_fused_projection_that_is_split_stays_replicated():
    model, make = build("gpt2", "tiny")
    gm, names = capture(model, *make(2, 16))
    roles = strategy.tp_layout(gm, names, 2).roles
    assert "blocks.0.attn.qkv.weight" not in roles
    assert roles["blocks.0.mlp.fc.weight"] == "col" and roles["blocks.0.mlp.proj.weight"] == "row"


def test_indivisible_tp_is_a_clear_error():
    model, make = build("llama", "tiny")
    with pytest.raises(ValueError) as err:
        colauto_backend.explain(model, *make(2, 16), mesh="tp=4", device="h100")
    assert "tp=4 cannot split" in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def gpt2_124m():
    model, make = build("gpt2", "124m")
    return model, make(8, 1024)


def test_joint_never_slower_than_sequential_and_better_in_one_case(gpt2_124m):
    model, inputs = gpt2_124m
    better = []
    for budget in ("none", "12GiB", "9GiB", "8.5GiB", "8GiB", "7GiB"):
        plan = colauto_backend.explain(model, *inputs, mesh="4", device="h100", budget=budget)
        p = plan.predicted
        cands = {c["mesh"]: c for c in p["candidates"]}
        # the joint choice is the fastest candidate that fits (brute force over the table); on a tie
        # the one with fewest axes (a dp=2,fsdp=2 replicating every layer is dp=4 with two reductions)
        best = min(c["step_time_s"] for c in p["candidates"] if c["fits"])
        tied = [c["mesh"] for c in p["candidates"] if c["fits"] and c["step_time_s"] - best < 1e-6]
        assert plan.mesh_str == min(tied, key=lambda m: m.count(","))
        assert p["memory_bytes"] <= (math.inf if p["budget_bytes"] is None else p["budget_bytes"])
        if p["sequential_mesh"] is not None:
            assert p["step_time_s"] <= p["sequential_step_time_s"] + 1e-12
            assert cands[p["sequential_mesh"]]["step_time_s"] == p["sequential_step_time_s"]
            if p["step_time_s"] < p["sequential_step_time_s"]:
                better.append((budget, plan.mesh_str, p["sequential_mesh"]))
    # The documented case (README): at 8.5 GiB per device the fastest sharding before recomputation
    # (dp=4) needs more recomputation than fsdp=4 saves in communication.
    assert ("8.5GiB", "fsdp=4", "dp=4") in better


def test_equal_times_go_to_the_mesh_with_fewer_axes(gpt2_124m):
    """Without a budget dp=2,fsdp=2 replicates every layer and ties dp=4, but would reduce gradients
    in two collectives (as measured on 4x H200: bench/results/h200x4-2026-11-26-dist)."""
    model, inputs = gpt2_124m
    plan = colauto_backend.explain(model, *inputs, mesh="auto", devices=4, device="h100", budget="none")
    cands = {c["mesh"]: c for c in plan.predicted["candidates"]}
    assert len(cands) == 6                      # 3 one-axis meshes + 3 role pairs of 2x2
    assert cands["dp=2,fsdp=2"]["step_time_s"] == pytest.approx(cands["dp=4"]["step_time_s"], abs=1e-6)
    assert plan.mesh_str == "dp=4"
    with pytest.raises(cfg.ConfigError, match="devices=N"):
        colauto_backend.explain(model, *inputs, mesh="auto", device="h100")


def test_report_shows_the_plan(gpt2_124m):
    model, inputs = gpt2_124m
    plan = colauto_backend.explain(model, *inputs, mesh="2x2", device="h100")
    text = report.render_parallel(plan.to_json())
    assert plan.mesh_str in text and plan.digest() in text
    assert all(c["mesh"] in text for c in plan.predicted["candidates"])


def test_budget_too_small_for_every_mesh(gpt2_124m):
    model, inputs = gpt2_124m
    with pytest.raises(colauto_backend.BudgetError) as err:
        colauto_backend.explain(model, *inputs, mesh="4", device="h100", budget="2GiB")
    assert "\n" not in str(err.value) and err.value.smallest_bytes > 2 * 2**30


def test_plan_mismatch_across_ranks_fails_loudly(monkeypatch):
    plan = ParallelPlan((("dp", 2),), {"w": ("R",)}, {"w": ("R",)})
    monkeypatch.setattr(entry.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(entry.dist, "all_gather_object", lambda out, obj: out.__setitem__(slice(None), [obj, "other"]))
    with pytest.raises(RuntimeError, match="planned different programs"):
        entry.check_same_plan(plan)


def test_layer_dp_equals_brute_force():
    """layers.solve against every assignment of options, placements switched at cuts, on integer
    costs where quantization is exact."""
    from colauto_backend.parallel import layers
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 5))
        opts = [[layers.Option(float(rng.integers(1, 60)), float(rng.integers(0, 20)), rng.choice(["S", "R", None]))
                 for _ in range(int(rng.integers(1, 4)))] for _ in range(n)]
        cost = {(i, a, b): 0.0 if a == b else float(rng.integers(0, 8)) for i in range(n + 1) for a in "SR" for b in "SR"}
        fixed, limit = float(rng.integers(0, 50)), float(rng.integers(50, 250))
        frontier = sorted((float(rng.integers(0, 150)), float(rng.integers(0, 30))) for _ in range(3))

        def remat(excess):
            return min([t for freed, t in frontier + [(0.0, 0.0)] if freed >= excess], default=math.inf)

        def total(chosen):
            place, seconds = "S", 0.0
            for i, o in enumerate(chosen):
                to = place if o.place is None else o.place
                seconds, place = seconds + o.exposed_s + cost[(i, place, to)], to
            seconds += cost[(len(chosen), place, "S")]          # the output leaves batch-sharded
            return seconds + remat(sum(o.state_bytes for o in chosen) + fixed - limit)
        brute = min(total(c) for c in itertools.product(*opts))
        got = layers.solve(opts, lambda i, a, b: cost[(i, a, b)], fixed, limit,
                           lambda ex: np.array([remat(e) for e in ex]))
        if got is None:
            assert brute == math.inf, trial
            continue
        assert total(got[0]) == brute == got[1], (trial, total(got[0]), got[1], brute)


def test_per_layer_mix_beats_every_uniform_plan(gpt2_124m):
    """Between 6.5 and 9 GiB per device on 4 H100s the DP replicates some layers and shards the others
    (the blocks replicated, the 154 MB token embedding sharded, since 2026-11-28's memory model; some
    blocks sharded before it): at some budget such a mix is faster than the best uniform plan, which the
    sequential baseline is, and at none is it slower."""
    model, inputs = gpt2_124m
    layers = {n.rpartition(".")[0] for n, _ in model.named_parameters()}
    mixed = 0
    for gib in (7.0, 7.5, 8.0, 8.5, 9.0):
        plan = colauto_backend.explain(model, *inputs, mesh="4", device="h100", budget=f"{gib}GiB")
        p = plan.predicted
        assert p["step_time_s"] <= p["sequential_step_time_s"] and p["memory_bytes"] <= gib * 2**30, gib
        if (plan.mesh_str == "fsdp=4" and 0 < len(p["replicated_layers"]) < len(layers)
                and p["step_time_s"] < p["sequential_step_time_s"]):
            assert {spec[0] for spec in plan.storage.values()} >= {"R", "S0"}
            mixed += 1
    assert mixed >= 1


def test_mesh_without_torchrun_is_a_clear_error():
    model, make = build("gpt2", "tiny")
    compiled = torch.compile(model, backend="colauto", options={"mesh": "2x2"})
    with pytest.raises(Exception) as err:
        compiled(*make(2, 16))
    inner = entry.compat.unwrap_backend_error(err.value)
    assert isinstance(inner, cfg.ConfigError) and "has 4 devices but the job has 1 ranks" in str(inner)


def test_op_without_a_dtensor_rule_runs_replicated_and_is_costed(monkeypatch):
    """An op DTensor has no rule for (cdist, forward and backward) is not refused: a tp plan runs it
    replicated, names it in the plan and the report, and costs gathering its inputs over tp (the ring
    all-gather of their bytes, computed here from the shapes by hand)."""
    class Cdist(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(512, 4096), torch.nn.Linear(4096, 512)

        def forward(self, x):
            return torch.cdist(self.down(torch.relu(self.up(x))), x, compute_mode="donot_use_mm_for_euclid_dist").mean()
    plan = colauto_backend.explain(Cdist(), torch.randn(64, 512), mesh="tp=2", device="h100")
    assert plan.tensor_parallel
    assert plan.predicted["replicated_ops"] == ["aten._cdist_forward.default", "aten._cdist_backward.default"]
    assert "run replicated over tp" in report.render_parallel(plan.to_json())
    # forward reads x1, x2 (64x512 fp32); backward reads grad, x1, x2 and the output (64x64); gathered
    # over tp=2, each is the tp group's 2x
    nbytes = 4 * (2 * 64 * 512) + 4 * (2 * 64 * 64 + 2 * 64 * 512)
    link = comm.resolve(None, "h100")
    gathered = link.all_gather(nbytes * 2, 2)
    # the same model planned as if DTensor had rules for them: the plan is the same, its communication
    # shorter by exactly that gather
    with monkeypatch.context() as m:
        m.setattr(entry._dtensor_rules, "uncovered", lambda gm: {})
        ruled = colauto_backend.explain(Cdist(), torch.randn(64, 512), mesh="tp=2", device="h100")
    assert ruled.digest() == plan.digest() and ruled.predicted["replicated_ops"] == []
    assert plan.predicted["comm_total_s"] - ruled.predicted["comm_total_s"] == pytest.approx(gathered, rel=1e-9)
    # dp runs the model's ops on plain tensors: nothing replicated, nothing named
    plan = colauto_backend.explain(Cdist(), torch.randn(64, 512), mesh="dp=2", device="h100")
    assert plan.predicted["replicated_ops"] == []


def test_op_that_cannot_run_replicated_is_named_before_tracing():
    """An op with no DTensor rule that a generic replicated rule cannot cover (it takes a list of
    tensors): tp is refused in one line naming it; the automatic plan leaves tp meshes out."""
    @torch.library.custom_op("colauto_test::list_sum", mutates_args=())
    def list_sum(xs: list[torch.Tensor]) -> torch.Tensor:
        return sum(xs)

    list_sum.register_fake(lambda xs: torch.empty_like(xs[0]))

    class ListSum(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return (self.lin(x) + torch.ops.colauto_test.list_sum([x, x])).mean()
    with pytest.raises(colauto_backend.ConfigError) as err:
        colauto_backend.explain(ListSum(), torch.randn(4, 8), mesh="tp=2", device="h100")
    assert "colauto_test.list_sum.default" in str(err.value) and "register_sharding" in str(err.value)
    assert "\n" not in str(err.value)
    plan = colauto_backend.explain(ListSum(), torch.randn(4, 8), mesh="2", device="h100")
    assert "tp" not in plan.mesh_str


def test_default_budget_leaves_headroom_on_several_devices(gpt2_124m):
    model, inputs = gpt2_124m
    plan = colauto_backend.explain(model, *inputs, mesh="4", device="h100")
    device = colauto_backend.explain(model, *inputs, mesh="4", device="h100", budget=1.0)
    assert plan.predicted["budget_bytes"] == int(device.predicted["budget_bytes"] * entry.DEFAULT_BUDGET_FRACTION)


def test_frozen_parameters_hold_no_gradient_or_optimizer_state():
    """A frozen embedding saves its gradient and AdamW's two moments (3x its fp32 bytes) in the plan's
    model state, and its gradient reduction: the math, not the planner's own numbers."""
    states = {}
    for frozen in (False, True):
        model, make = build("gpt2")
        model.wte.weight.requires_grad_(not frozen)
        plan = colauto_backend.explain(model, *make(2, 16), mesh="dp=2", device="h100")
        states[frozen] = plan.predicted["state_bytes"]
    wte = build("gpt2")[0].wte.weight
    assert states[False] - states[True] == wte.numel() * wte.element_size() * 3


def test_finding_the_owner_module_runs_no_property():
    """owner_module looks parameters up in the modules' own dictionaries: a module sharded earlier (its
    parameters behind properties that gather them, a collective) and still alive is never read through
    them. Reading one on some ranks only hung a CI run."""
    class Gathering(torch.nn.Linear):
        @property
        def weight(self):
            raise AssertionError("a property ran")

    inner = torch.nn.Linear(2, 2)
    outer = torch.nn.Sequential(torch.nn.Linear(2, 2))
    outer[0].__class__ = Gathering
    assert entry._stored_parameter(outer, "0.weight") is outer[0]._parameters["weight"]
    assert entry._stored_parameter(outer, "1.weight") is None and entry._stored_parameter(inner, "bias") is inner.bias


@pytest.mark.parametrize("autocast", [False, True])
def test_backward_reads_a_weight_itself_in_fp32_and_its_bf16_copy_under_autocast(autocast):
    """An fsdp plan holds a parameter's gathered copy from forward to backward only where the backward
    reads the parameter itself: a linear's weight-input gradient reads the weight in fp32, and under
    autocast the bf16 copy the forward made (and saved), which the single-device activations hold
    already. The bias's gradient reads no parameter either way."""
    from colauto_backend import backend, config as cfg, graph
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)

    def step(x):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model(x).float().sum()
    gm, names = capture(step, x)
    inputs = [x if names.get(i) is None else dict(model.named_parameters())[names[i]]
              for i in range(len([n for n in gm.graph.nodes if n.op == "placeholder"]))]
    analysis = backend.analyze_only(cfg.load(environ={}), gm, inputs)
    read = {names[i] for i in graph.inputs_read_by_backward(analysis.joint.graph) if i in names}
    # the first layer's weight gradient needs only the input; the second layer's input gradient needs
    # its weight (fp32) or that weight's bf16 copy (autocast)
    assert read == (set() if autocast else {"2.weight"}), read
