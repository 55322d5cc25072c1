"""colauto_backend.expand_layers: a joint graph captured with K=4 decoder layers, expanded to N=6 by cloning
layer 1's forward and backward, must be the graph of the 6-layer model. The references are independent of the
expansion: the same model built with 6 layers and captured as the backend captures it (its op counts, and the
FLOPs and predicted peak of the project's analysis of it), and eager PyTorch's loss and gradients of that
6-layer model on the same weights. A model whose repeated layers alternate is refused, not expanded wrongly."""
from __future__ import annotations

import collections
import dataclasses
import re

import pytest
import torch
import torch.fx as fx
import transformers

from colauto_backend import _torch_compat as compat, backend, config as cfg, expand_layers as X
from colauto_backend.analysis import Analysis, analyze
from colauto_backend.emit import remat as emit_remat
from examples.hf_zoo import SPECS, config_of

N, K, MIDDLE = 6, 4, 1
OPTIONS = {"codegen": "aten"}     # aten's partition follows the tags: the analysis of a graph is exact
LAYER_KEYS = {"llama": ("num_hidden_layers",), "gpt2": ("n_layer",), "t5": ("num_layers", "num_decoder_layers"),
              "gemma3": ("num_hidden_layers",)}
COMPARED = ("flops_fwd", "flops_bwd", "peak_memory_bytes", "saved_activation_bytes")


def hf_model(name: str, layers: int) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The tiny examples/hf_zoo model `name` with `layers` layers (seeded weights), and a batch of 2 x 16."""
    config = config_of(name)
    for key in LAYER_KEYS[name]:
        setattr(config, key, layers)
    if name == "gemma3":     # one type a layer, alternating sliding and full attention as the tiny spec does
        pattern = SPECS[name].tiny["layer_types"]
        config.layer_types = [pattern[i % len(pattern)] for i in range(layers)]
    torch.manual_seed(0)
    model = getattr(transformers, SPECS[name].model)(config).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config.vocab_size, (2, 16), generator=g)
    labels = torch.randint(1, config.vocab_size, (2, 16), generator=g) if SPECS[name].kind == "seq2seq" else ids
    return model, {"input_ids": ids, "labels": labels}


@dataclasses.dataclass
class Capture:
    joint: fx.GraphModule       # the joint forward+backward graph the backend costed
    analysis: Analysis          # the backend's unplanned analysis of it (backend.analyze_only)
    analyze_kwargs: dict        # what the backend passed analysis.analyze: num_fwd_outputs, param_indices, ...
    inputs: list                # Dynamo's example inputs: the joint's primals, in order

    def primals(self) -> list[fx.Node]:
        return _primals(self.joint)


def _primals(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]


def capture(loss_fn, batch: dict) -> Capture:
    """`loss_fn(**batch)` captured by Dynamo (one graph) and traced and costed by the backend's own path."""
    seen: dict = {}
    real = backend.analyze

    def spy(joint, fw, bw, **kwargs):
        if bw is not None and not seen:
            seen.update(joint=joint, kwargs=kwargs)
        return real(joint, fw, bw, **kwargs)
    got = []

    def compiler(gm, inputs):
        got.append((backend.analyze_only(cfg.load(OPTIONS), gm, inputs), list(inputs)))
        return gm.forward    # run as captured: nothing compiled

    torch._dynamo.reset()
    # HF's loss logs a warning the first time a model computes it: not a graph break (compat.logging_ignored)
    with pytest.MonkeyPatch.context() as patch, compat.logging_ignored():
        patch.setattr(backend, "analyze", spy)
        torch.compile(loss_fn, backend=compiler, fullgraph=True)(**batch)
    assert len(got) == 1 and seen, "expected one training graph"
    analysis, inputs = got[0]
    assert analysis.joint is seen["joint"]
    return Capture(seen["joint"], analysis, seen["kwargs"], inputs)


def names_by_id(model: torch.nn.Module) -> dict[int, str]:
    return {id(t): name for name, t in [*model.named_parameters(), *model.named_buffers()]}


@dataclasses.dataclass
class Expanded:
    model: torch.nn.Module       # the N-layer model (the reference's)
    batch: dict
    full: Capture                # the N-layer model's capture (the reference)
    cut: Capture                 # the same model cut to its first K layers
    gm: fx.GraphModule           # the cut capture's joint expanded to N layers
    names: dict[str, str]        # its primal placeholder -> the N-layer model's parameter (or buffer)
    analysis: Analysis           # the expanded joint partitioned and costed as the backend does


_EXPANDED: dict[str, Expanded] = {}


def expanded(name: str) -> Expanded:
    """Model `name` with N layers captured whole, and captured cut to K layers and expanded to N (once a process)."""
    if name in _EXPANDED:
        return _EXPANDED[name]
    model, batch = hf_model(name, N)
    loss_fn = lambda **kw: model(**kw).loss   # noqa: E731
    full = capture(loss_fn, batch)
    with X.truncated(model, K) as prefixes:
        cut = capture(loss_fn, batch)
    # layer 0 of T5's lists alone holds the relative position bias: the middle layer is 1
    assert prefixes == {"llama": ["model.layers"], "gpt2": ["transformer.h"],
                        "t5": ["encoder.block", "decoder.block"]}[name]
    by_id = names_by_id(model)
    names = {ph.name: by_id[id(t)] for ph, t in zip(cut.primals(), cut.inputs) if id(t) in by_id}
    params = list(cut.analyze_kwargs["param_indices"])
    gm = cut.joint
    for prefix in prefixes:
        e = X.expand(gm, N, middle=MIDDLE, prefix=prefix)
        assert (e.prefix, e.middle, e.added) == (prefix, MIDDLE, N - K)
        names, params, gm = e.names(names), e.positions(params), e.gm
    kwargs = dict(cut.analyze_kwargs, param_indices=params)
    fw, bw = emit_remat.partitioner(False)(gm, [], num_fwd_outputs=kwargs["num_fwd_outputs"],
                                           static_lifetime_input_indices=params)
    _EXPANDED[name] = Expanded(model, batch, full, cut, gm, names, analyze(gm, fw, bw, **kwargs))
    return _EXPANDED[name]


def run_joint(gm: fx.GraphModule, primals: list) -> list:
    """The joint graph run on real tensors; its one tangent (the loss's) is 1."""
    tangents = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    assert len(tangents) == 1 and tangents[0].meta["val"].shape == ()
    with torch.no_grad():
        return fx.Interpreter(gm).run(*primals, torch.ones(()), enable_io_processing=False)


def op_counts(gm: fx.GraphModule) -> collections.Counter:
    return collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_function")


HF = ["llama", "gpt2", "t5"]


@pytest.mark.parametrize("name", HF)
def test_the_expanded_joint_graph_has_the_ops_of_the_six_layer_capture(name):
    run = expanded(name)
    full, cut, got = op_counts(run.full.joint), op_counts(run.cut.joint), op_counts(run.gm)
    assert cut != full        # the comparison tells 4 layers from 6
    assert {str(op): (full[op], got[op]) for op in full.keys() | got.keys() if full[op] != got[op]} == {}
    assert len(_primals(run.gm)) == len(run.full.primals())


@pytest.mark.parametrize("name", HF)
def test_the_expanded_joint_graph_costs_what_the_six_layer_capture_does(name):
    """FLOPs forward and backward, predicted peak and saved activations of the project's analysis."""
    run = expanded(name)
    full = run.full.analysis.evaluate(run.full.analysis.hints)
    cut = run.cut.analysis.evaluate(run.cut.analysis.hints)
    got = run.analysis.evaluate(run.analysis.hints)
    for key in COMPARED:
        assert cut[key] < full[key], key
    assert {key: got[key] for key in COMPARED} == {key: full[key] for key in COMPARED}


@pytest.mark.parametrize("name", HF)
def test_the_expanded_joint_graph_computes_eagers_loss_and_gradients_of_the_six_layer_model(name):
    """The expanded joint run on the 6-layer model's weights (each placeholder fed the weight `names` gives it)
    against eager PyTorch's backward of that model; and bit for bit the 6-layer capture's joint run."""
    run = expanded(name)
    model = run.model
    model.zero_grad(set_to_none=True)
    eager_loss = model(**run.batch).loss
    eager_loss.backward()
    eager = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    weights = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    cut_inputs = {ph.name: t for ph, t in zip(run.cut.primals(), run.cut.inputs)}     # the batch
    primals = _primals(run.gm)
    out = run_joint(run.gm, [weights[run.names[ph.name]] if ph.name in run.names else cut_inputs[ph.name]
                             for ph in primals])
    n_fwd = run.full.analyze_kwargs["num_fwd_outputs"]
    assert n_fwd == 1
    grads = {run.names[ph.name]: g for ph, g in zip(primals, out[n_fwd:]) if g is not None}
    assert set(grads) == set(eager)
    assert len(eager) == len(list(model.parameters()))      # every parameter of all 6 layers trained
    torch.testing.assert_close(out[0], eager_loss.detach())
    for param, grad in eager.items():
        torch.testing.assert_close(grads[param], grad, msg=lambda m, p=param: f"{p}: {m}")

    by_id = names_by_id(model)
    full_out = run_joint(run.full.joint, run.full.inputs)
    full_grads = {by_id[id(t)]: g for t, g in zip(run.full.inputs, full_out[n_fwd:]) if g is not None}
    assert set(full_grads) == set(grads)
    torch.testing.assert_close(out[0], full_out[0], rtol=0, atol=0)
    for param, grad in full_grads.items():
        torch.testing.assert_close(grads[param], grad, rtol=0, atol=0, msg=lambda m, p=param: f"{p}: {m}")


def test_gemma3s_alternating_sliding_and_full_attention_layers_are_refused():
    """Gemma 3's layers alternate sliding-window and full attention (other masks, other rotary tables): layers
    1 and 2 run the same ops on other shared values. Cloning either would make every new layer its kind."""
    model, batch = hf_model("gemma3", N)
    assert len(set(model.config.layer_types[:K])) == 2
    with X.truncated(model, K) as prefixes:
        cut = capture(lambda **kw: model(**kw).loss, batch)
    assert prefixes == ["model.layers"]
    for middle in (1, 2):
        with pytest.raises(ValueError, match=f"layer {middle + 1} reads .*: the layers alternate"):
            X.expand(cut.joint, N, middle=middle)


class Block(torch.nn.Module):
    def __init__(self, act: str):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.act = act

    def forward(self, x):
        return x + getattr(torch, self.act)(self.lin(x))


class Stack(torch.nn.Module):
    """Blocks of one class and the same parameters, whose activations follow `acts` (repeated)."""
    def __init__(self, acts: list[str], layers: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(acts[i % len(acts)]) for i in range(layers))
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum()


def test_layers_of_one_class_whose_ops_alternate_are_refused():
    """A ModuleList of one class with the same parameters whose layers run other ops (relu, tanh in turn):
    the list is found repeated by its parameters, but layers 1 and 2 differ in the graph. The same stack with
    one activation expands."""
    x = torch.randn(2, 16, 16)
    for acts, refused in ((["relu", "tanh"], True), (["relu"], False)):
        torch.manual_seed(0)
        model = Stack(acts, N)
        with X.truncated(model, K):
            cut = capture(lambda x: model(x), {"x": x})
        for middle in (1, 2):
            if refused:
                with pytest.raises(ValueError, match=f"layers {middle} and {middle + 1} differ"):
                    X.expand(cut.joint, N, middle=middle)
            else:
                assert X.expand(cut.joint, N, middle=middle).added == N - K


# -- explain: planned from the expanded joint graph (parallel/entry.plan_model) ------------------------
FIGURES = ("step_time_s", "compute_s", "comm_s", "recompute_s", "optimizer_s", "memory_bytes", "state_bytes")


def assert_same_plan(got, whole) -> None:
    """The same mesh, placements and per-layer choices, and every candidate mesh's predicted figures."""
    assert (got.mesh_str, got.storage, got.compute, got.layer_places) == (
        whole.mesh_str, whole.storage, whole.compute, whole.layer_places)
    rows = lambda plan: [(c["mesh"], *(pytest.approx(c[k], rel=1e-9) for k in FIGURES))  # noqa: E731
                         for c in plan.predicted["candidates"]]
    assert [(c["mesh"], *(c[k] for k in FIGURES)) for c in got.predicted["candidates"]] == rows(whole)


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_explain_on_eight_devices_plans_from_k_traced_layers_what_it_plans_from_all(name):
    """colauto_backend.explain traces 4 of the 6 layers (T5: of each of its two lists, its embedding tied to the
    head) and expands the joint graph; the reference traces all 6 (plan_model(expand=False))."""
    import colauto_backend
    from colauto_backend import report
    from colauto_backend.parallel import entry
    model, batch = hf_model(name, N)
    torch._dynamo.reset()
    got = colauto_backend.explain(model, mesh="auto", devices=8, kwargs=batch)
    lists = {"llama": ["model.layers"], "t5": ["encoder.block", "decoder.block"]}[name]
    assert got.predicted["traced_layers"] == {p: [K, N] for p in lists}
    assert len(got.storage) == len(dict(model.named_parameters()))    # every layer's parameters placed
    torch._dynamo.reset()
    whole = entry.plan_model(model, (), cfg.load({"mesh": "auto"}), 8, batch, expand=False)
    assert "traced_layers" not in whole.predicted
    assert_same_plan(got, whole)
    text = report.render_parallel(got.to_json())
    assert f"traced {K} of the {N} layers of {lists[0]}" in text


def test_explain_traces_gemma3s_alternating_layers_whole_and_says_so(capsys):
    """Gemma 3's layers keep their attention type (sliding or full) as an attribute: refused before tracing, counted."""
    import colauto_backend
    from colauto_backend.parallel import entry
    model, batch = hf_model("gemma3", N)
    before = dict(entry.NOT_EXPANDED)
    torch._dynamo.reset()
    plan = colauto_backend.explain(model, mesh="auto", devices=2, kwargs=batch)
    assert "traced_layers" not in plan.predicted
    new = [why for why, n in entry.NOT_EXPANDED.items() if n > before.get(why, 0)]
    assert len(new) == 1 and re.fullmatch(r"model\.layers: layer 2's \S+ is '?\w+'? where layer 1's is '?\w+'?", new[0]), new
    assert f"tracing every layer (slower), its layers cannot be expanded: {new[0]}" in capsys.readouterr().err


class ByIndex(torch.nn.Module):
    """A layer whose ops follow its index's parity: nothing but the index (expected to differ) tells them apart."""
    def __init__(self, index: int):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.layer_idx = index

    def forward(self, x):
        y = self.lin(x)
        return x + (torch.tanh(y) if self.layer_idx % 2 else torch.relu(y))


class IndexStack(torch.nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(ByIndex(i) for i in range(layers))
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum()


def test_explain_traces_whole_the_layers_whose_graphs_differ(capsys):
    """Layers alike in their attributes but not in their graphs: the expansion is refused after the 4-layer trace,
    and the model is traced again whole (the plan of all 6 layers), counted and said."""
    import colauto_backend
    from colauto_backend.parallel import entry
    torch.manual_seed(0)
    model = IndexStack(N)
    assert X.differing(model.layers) is None
    before = dict(entry.NOT_EXPANDED)
    torch._dynamo.reset()
    plan = colauto_backend.explain(model, torch.randn(2, 8, 16), mesh="auto", devices=2)
    assert "traced_layers" not in plan.predicted
    assert len(plan.storage) == 2 * N + 2
    new = [why for why, n in entry.NOT_EXPANDED.items() if n > before.get(why, 0)]
    assert len(new) == 1 and new[0].startswith("layers: layers 1 and 2 differ"), new
    assert "its layers cannot be expanded: layers: layers 1 and 2 differ" in capsys.readouterr().err


def test_attributes_that_differ_between_layers_are_found_but_not_the_layers_own_index():
    model = IndexStack(N)
    assert X.differing(model.layers) is None
    model.layers[3].lin.kind = "wide"
    assert X.differing(model.layers) == "layer 3's lin.kind is 'wide' where layer 1's is '(absent)'"
    assert X.renamed("layers.3.lin.weight", "layers", 1, 2) == ["layers.5.lin.weight"]
    assert X.renamed("layers.1.lin", "layers", 1, 2) == ["layers.1.lin", "layers.2.lin", "layers.3.lin"]
    assert X.renamed("layers.0.lin", "layers", 1, 2) == ["layers.0.lin"]
    assert X.renamed("head.weight", "layers", 1, 2) == ["head.weight"]
