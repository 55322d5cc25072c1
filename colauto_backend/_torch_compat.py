"""The one place colauto touches private PyTorch APIs (torch 2.11-2.13). A torch upgrade edits this file."""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import hashlib
import inspect
import itertools
import math
import operator
import re
from typing import Collection, Any, Callable, Sequence

import sympy
import torch
from torch._dynamo.backends.common import aot_autograd as _aot_autograd
from torch._dynamo.backends.debugging import boxed_nop          # boxed call: frees inputs at last use
from torch._dynamo.exc import BackendCompilerFailed, ShortenTraceback
from torch._functorch.partitioners import default_partition    # noqa: F401  (re-exported)
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx.experimental import _config as fx_config

from . import counters


class PassThroughError(ShortenTraceback):
    """Base of the errors colauto raises for its user (ConfigError, BudgetError): one line, reaching the
    caller of the compiled model as itself.

    Dynamo wraps whatever a backend raises in BackendCompilerFailed (the message under "backend='colauto'
    raised:", Dynamo's hints, "please report a bug"), except a few types `OutputGraph.call_user_compiler`
    re-raises as they are: on torch 2.11-2.13 `ShortenTraceback` (and RestartAnalysis; 2.13 adds IndexError),
    which is how Inductor's own user-facing errors (TritonMissing, InductorError) get out.
    `convert_frame` then appends "from user code" / "TORCHDYNAMO_VERBOSE" text to `args[0]`
    (augment_exc_message): `str()` stays the one message line regardless. `eval_frame` re-raises it
    with `remove_dynamo_frames()`: the traceback keeps only the frame that raised it (all of it with
    TORCHDYNAMO_VERBOSE=1). With torch._dynamo.config.suppress_errors it is logged and the frame runs
    eagerly, as any backend error."""

    def __init__(self, message: str) -> None:
        super().__init__(message, first_useful_frame=None)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self):
        return (_rebuild_error, (type(self), self.message, self.__dict__))

    def remove_dynamo_frames(self) -> "PassThroughError":
        if torch._dynamo.config.verbose or self.__traceback__ is None:
            return self
        tb = self.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        return self.with_traceback(tb)


def _rebuild_error(cls: type, message: str, state: dict) -> PassThroughError:
    err = cls.__new__(cls)
    PassThroughError.__init__(err, message)
    err.__dict__.update(state)
    return err


def aot_autograd(**kwargs) -> Callable:
    """torch's AOTAutograd backend (`torch._dynamo.backends.common.aot_autograd`), which first writes the
    Dynamo graph's module paths relative to the compiled module (`name_modules_from_root`), so that what
    the joint graph's nodes inherit (`nn_module_stack`, `fwd_nn_module_stack`) names the model's own
    layers whatever the compiled frame calls the module."""
    compile_graph = _aot_autograd(**kwargs)

    def compile_with_names(gm: torch.fx.GraphModule, example_inputs: list, **kw) -> Callable:
        name_modules_from_root(gm)
        return compile_graph(gm, example_inputs, **kw)
    return compile_with_names


# -- torch's compile cache (AOTAutograd's cache over Inductor's FX graph cache) ---------------------
def cacheable(compiler: Callable) -> Callable:
    """`compiler` (it returns Inductor's compiled graph) marked as one whose output AOTAutograd may store:
    a later launch of the same graph then gets the compiled forward and backward from torch's
    AOTAutograd cache, without tracing the joint graph or calling colauto's partitioner."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
    from torch._inductor.output_code import OutputCode
    return SerializableAOTDispatchCompiler(OutputCode, compiler)


@contextlib.contextmanager
def compile_cache_keyed(uuid: str):
    """Within: `uuid` is part of the keys of torch's AOTAutograd and FX graph caches, as the uuid of a
    no-op joint-graph pass (Inductor hashes its custom passes' uuids), so that an entry is reused only
    under the same colauto code and settings, and never mistaken for plain torch.compile's."""
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class _Key(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            return None

        def uuid(self) -> str:
            return uuid
    with inductor_config.patch(joint_custom_post_pass=_Key()):
        yield


@contextlib.contextmanager
def backward_compiled_now():
    """Within: AOTAutograd compiles a training graph's backward together with its forward, inside the
    backend call, not at the first backward (`torch._functorch.config.force_non_lazy_backward_lowering`).
    Yields whether it does (False where this torch lacks the setting)."""
    import torch._functorch.config as functorch_config
    if not hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        yield False
        return
    with functorch_config.patch(force_non_lazy_backward_lowering=True):
        yield True


def compile_cache_hits() -> int:
    """How many graphs AOTAutograd's cache has returned in this process."""
    return int(torch._dynamo.utils.counters["aot_autograd"]["autograd_cache_hit"])


def run_as_aten(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Run a partitioned graph op by op; inputs and intermediates are freed after their last use."""
    return boxed_nop(gm, example_inputs)


def inductor_decompositions() -> dict:
    """Inductor's decomposition table. Some of its entries read an Inductor module that compile_fx imports
    and the table's module does not (max_pool2d_with_indices asks `torch._inductor.lowering` whether to
    fall back): Inductor's own entries import it when they first run. Importing it costs about a second, which a launch
    whose compiled step comes from torch's cache (nothing traced) does not need."""
    from torch._inductor.decomposition import select_decomp_table
    table = dict(select_decomp_table())
    for op, fn in table.items():
        if getattr(fn, "__module__", None) == "torch._inductor.decomposition":   # Inductor's own entries
            table[op] = _importing_lowering(fn)
    return table


def decomposed_for_inductor(gm: torch.fx.GraphModule, inline: Callable | None = None) -> tuple[torch.fx.GraphModule, int]:
    """`gm` re-traced through Inductor's decomposition table, at its placeholders' example values (fake
    tensors and their symbolic sizes), as Inductor's own trace would leave it. A graph partitioned without
    that table (codegen triton) holds ops that Inductor lowers only decomposed (aten.arange.default, the
    loss and norm backwards); custom ops (colauto's generated kernels) stay single calls, which Inductor
    runs as fallback kernels. Then, as Inductor's joint passes do: random ops (dropout's `rand`, which
    appears only once `native_dropout` is decomposed) become Inductor's seeded ones, which it lowers;
    and the placeholders keep their names (`primals_*`, `tangents_*`: Inductor and CUDA graph trees read
    which inputs are static from them). `inline(target, args)`: for a call the re-trace should trace
    into rather than keep, the body to trace (colauto's kernels: their `wrap_triton` launches become
    Inductor's user-defined Triton kernel calls), else None. Returns the graph and how many calls were
    traced into."""
    from torch._guards import detect_fake_mode
    from torch._inductor.fx_passes.replace_random import replace_random_passes
    from torch._inductor.virtualized import V
    from torch.fx.experimental.proxy_tensor import make_fx
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = [n.meta["val"] for n in placeholders]
    fake_mode = detect_fake_mode(examples)
    inlined = 0

    class Inlining(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            nonlocal inlined
            body = inline(target, args[0]) if inline is not None and args and isinstance(args[0], list) else None
            if body is None:
                return super().call_function(target, args, kwargs)
            inlined += 1
            return body(*args, **kwargs)
    with fake_mode:
        out = make_fx(Inlining(gm).run, decomposition_table=inductor_decompositions())(*examples)
    with V.set_fake_mode(fake_mode):
        replace_random_passes(out)
    # copied into a graph whose placeholders take the old names first (the saved activations a backward
    # graph reads are named after forward ops, names the traced ops may hold already)
    graph, env = torch.fx.Graph(), {}
    for old, new in zip(placeholders, [n for n in out.graph.nodes if n.op == "placeholder"]):
        env[new] = graph.placeholder(old.name)
        env[new].meta = new.meta
    for node in out.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)
    return torch.fx.GraphModule(out, graph), inlined


def decompose_nodes(graph: torch.fx.Graph, ops: Collection) -> int:
    """Every call of `ops` in `graph` replaced, in place, by its decomposition in Inductor's table, traced
    at the call's example values (fake tensors) and spliced in; the new nodes keep the call's meta (its
    forward/backward tag) with their own values. For ops a trace kept whole (`backend._decompositions`)
    that Inductor must see decomposed. The number of calls replaced."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree as pytree
    table = inductor_decompositions()
    done = 0
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in ops and n.target in table]:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
        leaves = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        flat, spec = pytree.tree_flatten((args, kwargs))
        tensor_at = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]

        def run(*tensors, _flat=flat, _spec=spec, _at=tensor_at, _target=node.target):
            values = list(_flat)
            for i, t in zip(_at, tensors):
                values[i] = t
            a, k = pytree.tree_unflatten(values, _spec)
            return _target(*a, **k)
        with detect_fake_mode(leaves):
            traced = make_fx(run, decomposition_table=table)(*leaves)
        arg_nodes = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)]
        env = dict(zip([n for n in traced.graph.nodes if n.op == "placeholder"], arg_nodes))
        meta = {k: v for k, v in node.meta.items() if k != "val"}
        result = None
        with graph.inserting_before(node):
            for t in traced.graph.nodes:
                if t.op == "placeholder":
                    continue
                if t.op == "output":
                    result = torch.fx.node.map_arg(t.args[0], env.__getitem__)
                    continue
                if t.op == "get_attr":     # a constant the trace made (a tensor literal): not expected here
                    raise RuntimeError(f"colauto: the decomposition of {node.target} holds a constant")
                env[t] = graph.node_copy(t, env.__getitem__)
                env[t].meta.update(meta)
        if isinstance(result, torch.fx.Node):
            node.replace_all_uses_with(result)
        else:   # a tuple-valued op: its getitem readers take the parts
            for user in list(node.users):
                user.replace_all_uses_with(result[user.args[1]])
                graph.erase_node(user)
        graph.erase_node(node)
        done += 1
    return done


def _importing_lowering(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def run(*args, **kwargs):
        import torch._inductor.lowering  # noqa: F401
        return fn(*args, **kwargs)
    return run


@contextlib.contextmanager
def _inductor_context(gm: torch.fx.GraphModule, example_inputs=()):
    """What Inductor's compile_fx sets up around its joint-graph passes, partitioner and compile_fx_inner
    (colauto calls them from its own AOTAutograd callbacks, outside compile_fx): the virtualized fake mode
    (V.fake_mode; passes such as the seed fusion of replace_random run `with V.fake_mode:`, a NullHandler
    outside it: "TypeError: 'NullHandler' object does not support the context manager protocol"), the
    Python dispatcher, and the graph's CUDA device."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._inductor import compile_fx
    from torch._inductor.virtualized import V
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = (detect_fake_mode(list(example_inputs) + vals)
                 or torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True))
    device_context = getattr(compile_fx, "get_cuda_device_context", None)
    with V.set_fake_mode(fake_mode), enable_python_dispatcher(), \
            (device_context(gm) if device_context is not None else contextlib.nullcontext()):
        yield


def _input_device(gm: torch.fx.GraphModule) -> torch.device | None:
    """The first device of the graph's inputs (Inductor registers its device-specific joint patterns,
    pad_mm and fused attention, for it)."""
    for n in gm.graph.nodes:
        val = n.meta.get("val") if n.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and val.device.type != "meta":
            return val.device
    return None


_CSE_DONE = "colauto_cse_done"


def min_cut_partition(joint: torch.fx.GraphModule, joint_inputs, **kwargs) -> tuple:
    """Inductor's own partitioner (min-cut over fusible ops); it honours MUST_SAVE/MUST_RECOMPUTE tags and
    decides every untagged node itself. Its first call replaces `joint`'s graph by the graph's CSE; later
    calls on the same joint (the planner's candidates, which change tags only) skip that pass, which
    then finds nothing to merge (about 2 s of a 28-layer model's partition on a 2-core CPU)."""
    again = joint.meta.get(_CSE_DONE) is joint.graph
    with _inductor_context(joint, joint_inputs), torch._functorch.config.patch(
            cse=torch._functorch.config.cse and not again):
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)
    joint.meta[_CSE_DONE] = joint.graph
    return fw, bw


def inductor_joint_passes(joint: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The pattern rewrites Inductor runs on the joint graph before partitioning, so that colauto plans
    the graph Inductor would compile. On a model on the meta device (planned, never run) Inductor's
    folding of uniform constants is left out: it breaks the graph's order there ("Argument
    'empty_strided_default_1' ... used before it has been defined", torch 2.11 and 2.13), so such a
    plan keeps the graph's `full` tensors as computed values."""
    import inspect
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import _recursive_joint_graph_passes
    kwargs = {}
    device = _input_device(joint)
    if "input_device" in inspect.signature(_recursive_joint_graph_passes).parameters:
        kwargs["input_device"] = device
    on_meta = device is None and any(isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].device.type == "meta"
                                     for n in joint.graph.find_nodes(op="placeholder"))
    with _inductor_context(joint), inductor_config.patch(
            joint_graph_constant_folding=inductor_config.joint_graph_constant_folding and not on_meta):
        return _recursive_joint_graph_passes(joint, **kwargs)


def _output_leaves(gm: torch.fx.GraphModule) -> list:
    """The values a graph returns, flattened (fx nodes, or constants)."""
    from torch.utils import _pytree as pytree
    return pytree.arg_tree_leaves(*gm.graph.find_nodes(op="output")[0].args)


def num_outputs(gm: torch.fx.GraphModule) -> int:
    """How many values a (Dynamo) graph returns: the user's outputs of what AOTAutograd makes of it."""
    return len(_output_leaves(gm))


def _mark_user_visible_outputs(gm: torch.fx.GraphModule, *, is_backward: bool, is_inference: bool,
                               num_user_outputs: int | None) -> None:
    """Which outputs of a graph the user sees, as torch.compile's Inductor path marks them before
    compile_fx_inner (`output.meta["user_visible_output_idxs"]`): Inductor keeps their eager strides.
    Unmarked, it may lay them out as it likes: GPT-2's logits came back padded to a 50304-wide row, and
    the copy the next graph then made cost 0.77 GiB of peak memory."""
    import torch._inductor.config as inductor_config
    leaves = _output_leaves(gm)
    if is_backward:   # the gradients (Inductor: config.bw_outputs_user_visible, absent in older torch)
        visible = range(len(leaves)) if getattr(inductor_config, "bw_outputs_user_visible", False) else range(0)
    elif not inductor_config.keep_output_stride or num_user_outputs is None:
        visible = range(0)
    else:             # training forward: the user's outputs follow the mutated inputs' new values
        context = torch._guards.TracingContext.try_get()
        start = (context.fw_metadata.num_mutated_inp_runtime_indices
                 if context is not None and context.fw_metadata is not None and not is_inference else 0)
        visible = range(start, min(start + num_user_outputs, len(leaves)))
    gm.graph.find_nodes(op="output")[0].meta["user_visible_output_idxs"] = [
        i for i in visible if isinstance(leaves[i], torch.fx.Node)]


RECOMPUTE_KEPT_APART = counters.counter("horizontal fusions of a planned recomputation refused")
REUSE_KEPT = counters.counter("planned graphs compiled with Inductor's own buffer reuse")


@dataclasses.dataclass(frozen=True)
class RematCodegen:
    """A planned graph's recomputation, for Inductor to run as colauto's memory model has it:
    `recomputed`, the backward's recomputed ops (empty for a forward); `needed_at`, each op's position
    in the graph (`cost.memory.needed_at`: a recomputed op's is that of its first reader outside the
    recomputation); `rules`, which of `_as_planned`'s rules apply (Config.planned_rules)."""
    recomputed: frozenset[str]
    needed_at: dict[str, int]
    rules: frozenset[str]


@contextlib.contextmanager
def _as_planned(remat: RematCodegen):
    """Two of Inductor's memory heuristics raise the measured peak of a planned step above the one the
    plan was chosen by (bench/results/cpu-2026-11-29-peak-noreuse, -planned: CPU allocator, 8 HF models);
    under a plan both give way:

    - Non-adjacent buffer reuse. Inductor holds a freed buffer for a later allocation of its size
      whenever its own peak estimate (EfficientPeakEstimate) says the graph's peak does not rise; that
      estimate is not the step's peak (HF Qwen2 at a 0.8 budget: 19.43 MiB measured, 17.51 without).
      Reuse at the very next kernel stays (it never raises a peak).
    - Horizontal fusion of a recomputation. Inductor fuses two kernels that only share an input when
      they sit within 64 nodes. That can fuse a recomputation into work that runs long before its
      result is used. On HF T5 at a 0.8 budget, one layer's recomputed softmax was fused into the kernel
      that recomputes another layer's (both read the relative-position-bias inputs). That pulled its
      8 MiB attention scores about 250 wrapper lines ahead of their use: 17.7% over the prediction.
      Inductor's own comment on its distance rule names the case ("recomputed nodes from different
      checkpointed regions get fused"). On HF Qwen2 the same fusion ran layer 0's recomputed attention
      inputs beside layer 1's attention backward, in kernels that also held backward work. Here a
      kernel that runs a recomputed op fuses horizontally only with a kernel needed at the same
      position (`needed_at`; of a kernel, its ops' latest: what it inlines may be needed earlier by
      other readers). So each recomputation runs where the memory model places it
      (`cost.memory.inductor_order`: just before its reader). Vertical fusion, into its reader, is
      untouched. Refusals are counted.
      On an H200 this rule cost HF Qwen2 (17.7 GiB budget) 3.3% and Qwen3 (21.0 GiB) 2.2% of their
      throughput and lowered neither peak, whose predictions there are 11-12% high; on the CPU
      allocator, without it, 3 of 4 points (T5, Qwen2) went over their budgets. Allowing fusions
      while the pulled kernel's outputs fit the plan's predicted slack took 2 CPU points over their
      budgets too (bench/results/h200-2026-12-02-planned-rules). `COLAUTO_PLANNED_RULES=reuse` drops it.

    The fusion rule goes through Inductor's documented heuristics hook (`V.set_choices_handler`); the
    reuse rule replaces `AllocateLine.should_reuse_buffer` (torch 2.11-2.13) for the compile."""
    from torch._inductor.codegen import wrapper
    from torch._inductor.virtualized import V
    base = type(V.choices)

    def kernel(snode) -> tuple[bool, int | None]:
        """(whether it runs a recomputed op, the latest position its ops are needed at)"""
        names = {o.name for sub in snode.get_nodes() for o in getattr(sub.node, "origins", ()) if o.op == "call_function"}
        return (bool(names & remat.recomputed),
                max((remat.needed_at[n] for n in names if n in remat.needed_at), default=None))

    class KeepRecomputationInPlace(base):
        def can_fuse_horizontal(self, scheduler, node1, node2, shared_data_score):
            (again_a, at_a), (again_b, at_b) = kernel(node1), kernel(node2)
            if (again_a or again_b) and at_a != at_b:
                RECOMPUTE_KEPT_APART["refused"] += 1
                return False
            return base.can_fuse_horizontal(scheduler, node1, node2, shared_data_score)

    def adjacent_only(self, free_line, size: int) -> bool:
        return bool(getattr(self, "comm_buffer", False)) or free_line.scheduler_node_index + 1 == self.scheduler_node_index

    # Inductor's FX graph cache keys on neither: a no-op post-grad pass whose uuid names them keys the
    # compiled graph apart from one compiled without them (unless the user set a pass of their own)
    import torch._inductor.config as inductor_config
    key = {"post_grad_custom_post_pass": _PlannedCacheKey(remat.rules)} \
        if inductor_config.post_grad_custom_post_pass is None else {}
    original = None
    if "reuse" not in remat.rules:
        REUSE_KEPT["COLAUTO_PLANNED_RULES without reuse"] += 1
    elif (original := getattr(wrapper.AllocateLine, "should_reuse_buffer", None)) is None:
        REUSE_KEPT["AllocateLine.should_reuse_buffer missing"] += 1   # a torch without it: Inductor's reuse stays
    else:
        wrapper.AllocateLine.should_reuse_buffer = adjacent_only
    try:
        # a forward recomputes nothing: Inductor's own fusion choices, with no per-pair check
        fusion = V.set_choices_handler(KeepRecomputationInPlace()) if remat.recomputed and "fusion" in remat.rules \
            else contextlib.nullcontext()
        with fusion, inductor_config.patch(key):
            yield
    finally:
        if original is not None:
            wrapper.AllocateLine.should_reuse_buffer = original


class _PlannedCacheKey(CustomGraphPass):
    """Changes nothing in the graph; its uuid, the rules' source and which of them apply, is part of
    Inductor's cache key (`_as_planned`)."""

    def __init__(self, rules: frozenset[str]):
        self.rules = rules

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        return f"{_PLANNED_RULES_KEY} {','.join(sorted(self.rules)) or 'none'}"


# the rules' own source, hashed: a change to them keys every graph compiled under them anew (a fixed
# string served graphs compiled under an earlier version of the rules from Inductor's cache)
try:
    _PLANNED_RULES_KEY = "colauto _as_planned " + hashlib.sha256(inspect.getsource(_as_planned).encode()).hexdigest()[:16]
except OSError:   # installed without its .py sources
    _PLANNED_RULES_KEY = "colauto _as_planned (no source)"


# graphs compiled by Inductor whose wrapper's allocations were not read (a cache hit compiles nothing;
# config.memory_planning plans its own pools): their peak stays the memory model's
WRAPPER_UNREAD = counters.counter("Inductor graphs whose allocations were not read")


@contextlib.contextmanager
def wrapper_allocations(sink: list):
    """Appends to `sink`, for each graph Inductor generates code for meanwhile, what its Python wrapper
    allocates and frees, in its order, once Inductor's buffer reuse is planned (`memory_plan_reuse`):
    a list of (bytes, freed input, buffer), at the compile's sizes. An allocation (`empty_strided`, an
    extern kernel's result, an indexed multi-output) is (+bytes, "", "buf7 (mm_3)": the buffer and the
    graph node that made it); a freed buffer that was not reused is (-bytes, "", its name); a reused one
    (in place, or a freed buffer of the same key) is nothing; `del` of a graph input is (0, its
    placeholder's name, that name): whether its storage dies is the caller's to know; an input the graph
    returns as a copy of its own (`returned_copies`) is (+bytes, `memory.RETURNED_COPY` + the input's
    name, the copy) after the last line, which the replay of this graph skips. An extern kernel's own
    buffers where the memory model knows them (`memory.op_workspace`) are allocated after its outputs and
    freed at once. Replaces
    `PythonWrapperCodegen.memory_plan_reuse` (torch 2.11-2.13) for the compile."""
    from torch._inductor.codegen import wrapper
    original = wrapper.PythonWrapperCodegen.memory_plan_reuse

    def memory_plan_reuse(self):
        original(self)
        try:
            sink.append(_allocations(self))
        except Exception as exc:  # noqa: BLE001 - an unreadable wrapper leaves the model's figure, counted
            WRAPPER_UNREAD[f"unreadable: {type(exc).__name__}"] += 1
    wrapper.PythonWrapperCodegen.memory_plan_reuse = memory_plan_reuse
    try:
        yield
    finally:
        wrapper.PythonWrapperCodegen.memory_plan_reuse = original


def _allocations(code) -> list[tuple[int, str, str]]:
    from torch._inductor import ir
    from torch._inductor.codegen import wrapper
    from torch._inductor.utils import get_dtype_size
    from torch._inductor.virtualized import V

    from .cost.memory import RETURNED_COPY, op_workspace
    sizevars = V.graph.sizevars
    hint = getattr(sizevars, "optimization_hint", None) or sizevars.size_hint

    def nbytes(node) -> int:
        layout = node.get_output_spec() if hasattr(node, "get_output_spec") else node.get_layout()
        if isinstance(layout, (ir.MultiOutputLayout, ir.NoneLayout)) or node.get_inputs_that_alias_output():
            return 0
        return int(hint(V.graph.get_allocation_storage_size(node), fallback=0)) * get_dtype_size(node.get_dtype())

    def named(node) -> str:   # the buffer, and the graph node that made it
        origin = node.get_origin_node() if hasattr(node, "get_origin_node") else None
        return node.get_name() + (f" ({origin.name})" if origin is not None else "")
    # A multi-output extern kernel (CPU attention's backward: three gradients) allocates every output when
    # it runs; the lines that take each out of its tuple may come later, after other kernels (Inductor
    # schedules them as nodes of their own): each output is placed right after its kernel's line (HF OPT
    # on CPU: the compiled figure was 0.5 MiB low of the CPU allocator's peak, 2026-12-06).
    events: list[tuple[tuple[int, int], tuple[int, str, str]]] = []    # ((anchor line, line), event)
    at: dict[str, int] = {}             # a kernel's buffer -> its line
    for i, line in enumerate(code.lines):
        if isinstance(line, (wrapper.AllocateLine, wrapper.ExternKernelAllocLine)):
            events.append(((i, i), (nbytes(line.node), "", named(line.node))))
            at[line.node.get_name()] = i
            # the kernel's graph node is among its origins (a fallback kernel has no `origin_node`)
            scratch = max((op_workspace(o) for o in getattr(line.node, "origins", ())), default=0) if isinstance(
                line, wrapper.ExternKernelAllocLine) else 0
            if scratch:     # the kernel's own buffers, after its outputs (a multi-output's too), until it returns
                name = "workspace of " + named(line.node)
                events += [((i, math.inf), (scratch, "", name)), ((i, math.inf), (-scratch, "", name))]
        elif isinstance(line, wrapper.MultiOutputLine):
            buf = V.graph.get_buffer(line.result_name)
            events.append(((at.get(line.arg_name, i), i), (nbytes(buf), "", named(buf))))
        elif isinstance(line, wrapper.FreeIfNotReusedLine) and not line.is_reused:
            events.append(((i, i), (-nbytes(line.node), "", named(line.node))))
        elif isinstance(line, wrapper.FreeLine) and line.node.get_name() in V.graph.graph_inputs:
            events.append(((i, i), (0, line.node.get_name(), line.node.get_name())))
    # An input the graph returns may come back as a buffer of its own: Inductor lays a convolution's input
    # and weight out channels-last in copies, and a saved input is returned as its copy (HF ViT's pixels and
    # patch weight on CPU, 2026-12-07: 144 KiB the backward's peak missed, 8% of it). The copy outlives the
    # graph, held by the next graph's input of that name.
    end = len(code.lines)
    for name, buf in returned_copies():
        events.append(((end, end), (nbytes(buf), RETURNED_COPY + name, named(buf))))
    return [event for _, event in sorted(events, key=lambda e: e[0])]


def returned_copies() -> list[tuple[str, Any]]:
    """(placeholder name, buffer) for each graph input the graph being lowered returns as a buffer of its
    own instead of the input itself."""
    from torch._inductor.virtualized import V
    outputs = [n for n in V.graph.module.graph.nodes if n.op == "output"]
    if not outputs:
        return []
    args = outputs[0].args[0]
    args = args if isinstance(args, (tuple, list)) else (args,)
    found, seen = [], set()
    for arg, name in zip(args, V.graph.get_output_names()):
        if (isinstance(arg, torch.fx.Node) and arg.op == "placeholder" and name != arg.name
                and name not in V.graph.graph_inputs and name in V.graph.name_to_buffer and name not in seen):
            seen.add(name)      # one buffer in two output slots is one storage
            found.append((arg.name, V.graph.get_buffer(name)))
    return found


def run_with_inductor(gm: torch.fx.GraphModule, example_inputs: list, *, is_backward: bool,
                      is_inference: bool = False, num_user_outputs: int | None = None,
                      own_buckets: bool = False, own_gathers: bool = False, keep_order: bool = False,
                      remat: RematCodegen | None = None, allocations: list | None = None) -> Callable:
    """Hand an already-partitioned aten graph to Inductor's code generation (no re-partition).
    `num_user_outputs`: the Dynamo graph's outputs, whose strides Inductor keeps as eager's. A graph
    with collectives (a distributed plan) gets Inductor's collective bucketing and compute/communication
    reordering: one all-reduce per parameter, unbucketed and unoverlapped, ran 7% slower on 2 H200s.
    `own_buckets`: the graph's waits were moved to its end and its all-reduces bucketed
    (`parallel.overlap`); Inductor's all-reduce and reduce-scatter bucketing, which merges waits that
    sit side by side into one collective issued there, stays off. `own_gathers`: the graph's parameter
    all-gathers were moved ahead of their uses (`parallel.overlap.prefetch_gathers`); Inductor's
    all-gather bucketing, which would wait for a whole bucket at its first use, stays off. `keep_order`:
    the graph's collectives must each be waited before the next starts (gloo, `parallel.overlap`);
    Inductor's compute/communication reordering stays off.
    `remat`: the recomputation of a graph colauto planned (`_as_planned`); None: compiled as torch.compile would.
    `allocations`: gets what the compiled wrapper allocates and frees (`wrapper_allocations`), where
    Inductor generates its code."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    _mark_user_visible_outputs(gm, is_backward=is_backward, is_inference=is_inference,
                               num_user_outputs=num_user_outputs)
    passes = {}
    if any(n.op == "call_function" and getattr(n.target, "namespace", "") == "_c10d_functional"
           for n in gm.graph.nodes):
        passes = {k: v for k, v in (("bucket_all_reduces_fx", "all"), ("bucket_reduce_scatters_fx", "all"),
                                    ("bucket_all_gathers_fx", "all"), ("reorder_for_compute_comm_overlap", True))
                  if hasattr(inductor_config, k)}
        if own_buckets:
            passes.pop("bucket_all_reduces_fx", None)
            passes.pop("bucket_reduce_scatters_fx", None)
        if own_gathers:
            passes.pop("bucket_all_gathers_fx", None)
        if keep_order:
            passes.pop("reorder_for_compute_comm_overlap", None)
        for name in (_bucketing_views_a_convolution_tensor(gm) if _BUCKETING_VIEWS else ()):
            if passes.pop(name, None) is not None:
                UNBUCKETED[f"torch {torch.__version__.split('+')[0]}'s {name} views convolution weights or gradients"] += 1
    _register_fallbacks(gm)
    if remat is not None and _only_recomputed_convolutions(gm, remat.recomputed):
        passes = dict(passes, layout_optimization=False)
    from ._cpu_kernels import batched
    with inductor_config.patch(passes), _inductor_context(gm, example_inputs), batched(), \
            (_as_planned(remat) if remat is not None else contextlib.nullcontext()), \
            (wrapper_allocations(allocations) if allocations is not None else contextlib.nullcontext()):
        return compile_fx_inner(gm, example_inputs, is_backward=is_backward, is_inference=is_inference)   # as compile_fx calls it


def _only_recomputed_convolutions(gm: torch.fx.GraphModule, recomputed: frozenset[str]) -> bool:
    """Whether every convolution of a planned graph is one the plan recomputes. Inductor lays a graph out
    channels-last when it holds a convolution (`GraphLowering.decide_layout_opt`); a backward holds none
    unless the plan recomputes one, so a recomputed convolution switched the whole backward's layout. On
    CPU, aten's convolution backward then allocated 1.5 MiB of its own, unseen by any wrapper line (HF
    ConvNeXt at 0.8 of its unplanned peak: 2.29 MiB measured against a 0.88 MiB budget, 2026-12-07).
    Such a backward keeps the unplanned backward's layout: Inductor's layout optimization stays off."""
    from torch._inductor.graph import is_mkldnn_conv   # the test decide_layout_opt itself uses (2.11-2.13)
    convs = [n for n in gm.graph.nodes if n.op == "call_function"
             and (n.target is torch.ops.aten.convolution.default or is_mkldnn_conv(n))]
    return bool(convs) and all(n.name in recomputed for n in convs)


# torch 2.11's and 2.12's all-reduce and reduce-scatter bucketing flatten each input with view (2.13:
# reshape), which fails on a convolution weight's gradient once Inductor lays the convolution out
# channels-last ("Cannot view a tensor with shape [64, 3, 8, 8] and strides (192, 1, 24, 3)": HF ViT under
# dp, HF ResNet under fsdp and tp on the captured graph, codegen inductor; on 2.12 found by the full suite
# in a torch==2.12.0 venv, 2026-12-06).
def torch_at_least(major: int, minor: int) -> bool:
    """torch's version is major.minor or later (a local suffix such as +cpu ignored)."""
    found = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    return found >= (major, minor)


_BUCKETING_VIEWS = not torch_at_least(2, 13)
UNBUCKETED = counters.counter("graphs whose collectives Inductor does not bucket")
_BUCKETED = {"bucket_all_reduces_fx": torch.ops._c10d_functional.all_reduce.default,
             "bucket_reduce_scatters_fx": torch.ops._c10d_functional.reduce_scatter_tensor.default}


def _bucketing_views_a_convolution_tensor(gm: torch.fx.GraphModule) -> list[str]:
    """Inductor's bucketing passes whose views torch 2.11 cannot lower or run on a convolution tensor in `gm`:
    a convolution weight's gradient (through the scaling, padding and indexing between it and the
    collective), or a gathered convolution weight or bias
    (all-gather bucketing: torch 2.11's convolution lowering rejects the bucket's views of it, "LoweringException:
    NotImplementedError: View": HF ViT and ConvNeXt under fsdp=2 with codegen inductor, CPU, 2026-12-07)."""
    through = (operator.getitem, torch.ops.aten.div.Tensor, torch.ops.aten.mul.Tensor,
               torch.ops.aten.constant_pad_nd.default, torch.ops.aten.clone.default)
    found = []
    for name, target in _BUCKETED.items():
        for node in gm.graph.find_nodes(op="call_function", target=target):
            x = node.args[0]
            while isinstance(x, torch.fx.Node) and x.target in through:
                x = x.args[0]
            if isinstance(x, torch.fx.Node) and x.target is torch.ops.aten.convolution_backward.default:
                found.append(name)
                break
    onward = (torch.ops._c10d_functional.wait_tensor.default, operator.getitem, torch.ops.aten.narrow.default,
              torch.ops.aten.slice.Tensor, torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
              torch.ops.aten.reshape.default, torch.ops.aten.clone.default, torch.ops.aten.alias.default,
              torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default, torch.ops.aten.contiguous.default)
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops._c10d_functional.all_gather_into_tensor.default):
        todo, seen = [node], set()
        while todo and "bucket_all_gathers_fx" not in found:
            x = todo.pop()
            for u in x.users:
                if u.target is torch.ops.aten.convolution.default and x in u.args[1:3]:
                    found.append("bucket_all_gathers_fx")
                    break
                if u.target in onward and u not in seen:
                    seen.add(u)
                    todo.append(u)
    return found


def _register_fallbacks(gm: torch.fx.GraphModule) -> None:
    """Custom ops (colauto's generated kernels and fused loss; a model's own, such as transformers'
    grouped_mm_fallback_backward) registered as Inductor fallbacks before Inductor lowers `gm`, with the
    layout constraint its implicit fallback gives a custom op. Left to the implicit fallback, torch 2.11
    formats the IR behind every input of each op's first call into a log message, eagerly
    (exc.operator_str): each input's string holds the whole graph that computes it, so HF Qwen2's
    24-layer forward did not finish lowering in 400 s on an H200 (torch 2.13 formats it lazily)."""
    from torch._decomp import get_decompositions
    from torch._inductor import lowering
    from torch._library.utils import get_layout_constraint_tag, is_builtin
    for node in gm.graph.nodes:
        op = node.target
        if (node.op == "call_function" and isinstance(op, torch._ops.OpOverload) and not is_builtin(op)
                and op not in lowering.lowerings and not get_decompositions([op])):
            constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            lowering.make_fallback(op, layout_constraint=constraint, warn=False)


def shape_env_of(graph: torch.fx.Graph):
    for n in graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and getattr(val, "fake_mode", None) is not None:
            return val.fake_mode.shape_env
    return None


def symbol_hints(shape_env) -> dict[sympy.Symbol, int]:
    """Size symbol -> its example value (`backed_var_to_val` in 2.13, `var_to_val` before)."""
    if shape_env is None:
        return {}
    table = getattr(shape_env, "backed_var_to_val", None)
    if table is None:
        table = shape_env.var_to_val
    return {s: int(v) for s, v in table.items()}


def symbol_sources(shape_env) -> dict[sympy.Symbol, tuple[str, int]]:
    """Size symbol -> (forward argument name, dim) for symbols that are an input tensor's size."""
    from torch._dynamo.source import LocalSource, TensorProperty, TensorPropertySource
    out: dict[sympy.Symbol, tuple[str, int]] = {}
    for s, sources in (getattr(shape_env, "var_to_sources", None) or {}).items():
        for src in sources:
            if not (isinstance(src, TensorPropertySource) and src.prop == TensorProperty.SIZE):
                continue
            base = src.base
            if isinstance(base, LocalSource):
                out[s] = (base.local_name, int(src.idx))
                break
            # a keyword argument through `**kwargs` (transformers' decorators): L['kwargs']['input_ids']
            key = getattr(base, "index", None)
            if isinstance(key, str) and isinstance(getattr(base, "base", None), LocalSource):
                out[s] = (key, int(src.idx))
                break
    return out


def no_duck_sizing():
    """Equal example sizes (B == T) must stay separate symbols."""
    return fx_config.patch(use_duck_shape=False)


_DIM_MARKS = ("_dynamo_weak_dynamic_indices", "_has_dynamo_dim_marking")   # what maybe_mark_dynamic sets


@contextlib.contextmanager
def every_dim_dynamic(tensors: Sequence[Any]):
    """Every dimension of these tensors a size symbol for the Dynamo trace inside, and the tensors as they
    were after it: `torch._dynamo.maybe_mark_dynamic` marks the caller's tensors for good (the private
    attributes in `_DIM_MARKS`), so a later torch.compile of the same inputs once compiled dynamically
    after a profile() of them."""
    tensors = list({id(t): t for t in tensors if isinstance(t, torch.Tensor)}.values())
    missing = object()
    before = [{a: copy.copy(v) if (v := getattr(t, a, missing)) is not missing else v for a in _DIM_MARKS}
              for t in tensors]
    for t in tensors:
        for d in range(t.dim()):
            torch._dynamo.maybe_mark_dynamic(t, d)
    try:
        yield
    finally:
        for t, was in zip(tensors, before):
            for attr, value in was.items():
                if value is missing:
                    if hasattr(t, attr):
                        delattr(t, attr)
                else:
                    setattr(t, attr, value)


def logging_ignored():
    """A capture for profile() or explain() (nothing it traces runs) with every `logging.Logger` method a
    no-op to Dynamo (`torch._dynamo.config.ignore_logging_functions`), not a graph break: the capture is
    one graph, and HF transformers' `loss_function` calls `logger.warning_once` the first time a model
    without a `loss_type` computes its loss (HF GPT-2 explain() and profile() failed on it in a fresh
    process). Methods added to Logger after import (transformers' warning_once, warning_advice) count."""
    import logging
    methods = {fn for name, fn in vars(logging.Logger).items() if callable(fn) and not name.startswith("_")}
    return torch._dynamo.config.patch(
        ignore_logging_functions=set(torch._dynamo.config.ignore_logging_functions) | methods)


@contextlib.contextmanager
def sizes_forgotten(static: bool):
    """A capture for profile() or explain(), which is not the user's compile: `static`, traced at the
    inputs' sizes even where Dynamo saw this code at other sizes before (automatic dynamic shapes off);
    and after it, Dynamo remembers no size it saw there. Dynamo keeps the sizes it traced each code object
    at (torch._dynamo.pgo's code state, private) and traces a later call of other sizes with symbols: a
    compile after explain() or profile() at another batch size traced symbolic sizes."""
    from torch._dynamo import pgo
    state = pgo.get_code_state()
    saved = copy.deepcopy(dict(state))
    try:
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False) if static else contextlib.nullcontext():
            yield
    finally:
        state.clear()
        state.update(saved)


def unwrap_backend_error(exc: BaseException) -> BaseException:
    return exc.inner_exception if isinstance(exc, BackendCompilerFailed) else exc


def register_flop_formula(op: Any, fn: Callable) -> None:
    """Give FlopCounterMode a formula it lacks (e.g. CPU flash attention); `fn` gets the raw tensors."""
    from torch.utils import flop_counter
    if getattr(op, "overloadpacket", op) not in flop_counter.flop_registry:
        flop_counter.register_flop_formula(op, get_raw=True)(fn)




# How Dynamo names what the compiled frame reaches: a root (a local "L['x']" or global "G['x']"), then
# item accesses ("[0]", "['input_ids']") and attributes (".fc", "._modules['fc']", "._parameters['w']").
_QUOTED = r"""(?:'[^']*'|"[^"]*")"""
_ROOT = re.compile(rf"^[LG]\[{_QUOTED}\](?:\[\d+\]|\[{_QUOTED}\])*")
_STATE = re.compile(r"^\._(?:modules|parameters|buffers)\[")
SELF = "L['self']"


def _is_module(root: str, frame: dict | None) -> bool | None:
    """Whether the object `root` names (a frame local and item accesses) is an nn.Module; None where the
    frame is not at hand or the name cannot be followed."""
    if frame is None or not root.startswith("L["):
        return None
    obj: Any = frame
    try:
        for key in re.findall(rf"\[(\d+|{_QUOTED})\]", root):
            obj = obj[int(key)] if key.isdigit() else obj[key[1:-1]]
    except (KeyError, IndexError, TypeError):
        return None
    return isinstance(obj, torch.nn.Module)


def module_root(name: str, frame: dict | None = None) -> str | None:
    """The part of a Dynamo source name that is the compiled module ("L['self']", "L['s']" for
    `def forward(s, x)`, "L['args'][0]" for a wrapper `def f(*args, **kwargs)` as transformers' decorators
    have), or None when `name` is not under a module: its root and item accesses are the module when the
    frame says so, or (no frame) when module state follows them ("._modules[", "._parameters[")."""
    m = _ROOT.match(name)
    if m is None:
        return None
    root, rest = m.group(0), name[m.end():]
    known = _is_module(root, frame)
    if known is None:
        known = bool(_STATE.match(rest)) or (root == SELF and (rest == "" or rest.startswith(".")))
    return root if known else None


def _dotted(rest: str) -> str:
    """"._modules['layers']._modules['0'].mlp" / ".layers[0].mlp" -> "layers.0.mlp"."""
    rest = re.sub(rf"\._(?:modules|parameters|buffers)\[({_QUOTED})\]", lambda m: "." + m.group(1)[1:-1], rest)
    rest = re.sub(r"\[(\d+)\]", r".\1", rest)
    rest = re.sub(rf"\[({_QUOTED})\]", lambda m: "." + m.group(1)[1:-1], rest)
    return rest.lstrip(".")


@functools.lru_cache(maxsize=4096)
def stack_path(path: str) -> str:
    """An `nn_module_stack` entry's path as a path under the compiled module: "L['args'][0].model.layers.0",
    "L['self'].model.layers[0]" and "L['s']._modules['model']..." all give "model.layers.0". Any root and
    the item accesses after it are the module whose forward was compiled (a module stack holds modules)."""
    m = _ROOT.match(path)
    if m is not None:
        path = path[m.end():]
    else:
        path = re.sub(r"^L__self___?", "", path)     # older Dynamo's flattened names
    return _dotted(path)


def name_modules_from_root(gm: torch.fx.GraphModule) -> None:
    """Rewrite each node's `nn_module_stack` paths (in place, new dicts) as "L['self'].<path under the
    compiled module>", the form colauto's readers (cost/table.py, module_path) take apart, whatever
    the compiled frame calls the module (L['self'], L['s'], L['args'][0], ...)."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {
                key: ((SELF + "." + p) if (p := stack_path(v[0])) else SELF, *v[1:]) for key, v in stack.items()}


def source_name(placeholder: torch.fx.Node) -> str | None:
    """Dynamo's source of a graph input ("L['self']._modules['fc']._parameters['weight']", "L['x']"), with
    the compiled module written L['self'] whatever the frame calls it ("L['args'][0]._modules['fc']..."
    from a `def wrapper(*args, **kwargs)`, "L['s']..." from `def forward(s, x)`)."""
    name = raw_source_name(placeholder)
    if name is None:
        return None
    try:
        frame = compiled_frame_locals()
    except Exception:  # noqa: BLE001 - not inside a compile: judge by the name alone
        frame = None
    root = module_root(name, frame)
    return SELF + name[len(root):] if root is not None else name


def compiled_frame_locals() -> dict:
    """The local variables of the frame Dynamo is compiling (call from inside a backend)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator
    return dict(InstructionTranslator.current_tx().f_locals)


def has_unbacked_size(val) -> bool:
    """Whether a traced value (a node's meta["val"]) has a size known only once the op has run."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return bool(free_unbacked_symbols(val))


def example_int(x) -> int:
    """A size as the example had it: ints as they are, a SymInt by its hint (no guard added)."""
    return x if isinstance(x, int) else int(x.node.hint)


def module_path(node: torch.fx.Node) -> str | None:
    """The path under the compiled module of the module whose forward made this graph node
    ("blocks.1.mlp.fc"), from `nn_module_stack`, whatever the compiled frame calls the module (see
    stack_path and stack_module_path); None where the node has none or it is the compiled module itself."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    return stack_module_path(stack) or None


def stack_module_path(stack: dict) -> str:
    """The path of the innermost module of an `nn_module_stack` (outermost first) that is held inside the
    module whose forward called it. A module called from another's forward but held elsewhere is counted
    as its caller's: transformers with `kernels` (a dependency from 5.25) turns functions such as
    `apply_rotary_pos_emb` into one module held once ("apply_rotary_pos_emb"), which every decoder layer's
    attention calls; its ops are that layer's."""
    path = ""
    for entry in stack.values():
        inner = stack_path(entry[0])
        if path and inner != path and not inner.startswith(path + "."):
            break
        path = inner
    return path


def cuda_graph_trees(fn: Callable, gm: torch.fx.GraphModule, static_input_idxs: list[int], *, device_index: int,
                     is_backward: bool, is_inference: bool) -> Callable:
    """`fn` (a boxed call of `gm`) run through Inductor's CUDA graph trees, as mode="reduce-overhead"
    does: the first calls run `fn` as is (warm-up), later ones replay a recorded graph. Inputs at
    `static_input_idxs` keep their addresses between calls (parameters; saved tensors in backward)."""
    from torch._inductor.compile_fx import cudagraphify
    outputs = len(gm.graph.find_nodes(op="output")[0].args[0])
    run = cudagraphify(fn, static_input_idxs, device_index=device_index, stack_traces=[None] * outputs,
                       is_backward=is_backward, is_inference=is_inference)
    run._boxed_call = True          # it takes the input list, as AOT's compiled graphs do
    return run


def static_input_indices(gm: torch.fx.GraphModule, is_backward: bool) -> list[int]:
    """The inputs of an AOT forward or backward graph whose addresses do not change between steps, as
    Inductor computes them: parameters and buffers in forward, the saved tensors in backward."""
    from torch._inductor.compile_fx import get_static_input_idxs
    from torch._inductor.utils import count_tangents
    if is_backward:
        return list(range(count_tangents(gm)))
    return list(get_static_input_idxs(0))      # the compile's fw_metadata; none without one


def skip_zero_grads(outputs: list) -> bool:
    """Tell autograd not to make zero gradients for the outputs of the compiled step's node (AOTAutograd's
    `CompiledFunctionBackward`, found as the outputs' grad_fn or one node below a view of one): its
    backward then gets None for an output no gradient reached. Whether the node was found."""
    for t in outputs:
        fn = t.grad_fn
        for _ in range(2):
            if fn is None:
                break
            if type(fn).__name__ == "CompiledFunctionBackward":
                fn.set_materialize_grads(False)
                return True
            fn = fn.next_functions[0][0] if fn.next_functions else None
    return False


@dataclasses.dataclass(frozen=True)
class InputLayout:
    """What the partitioner needs to know of a compiled graph's inputs, read once at compile time: per
    input, how many primals AOT flattens it into (a tensor subclass: its inner tensors and symbolic sizes
    and strides; otherwise 1) and whether it requires grad. It holds no tensor: a closure handed to
    AOTAutograd that held the example inputs kept them alive as long as the compiled graph (on torch 2.11
    HF GPT-2 large's first logits, the second graph's input across its graph break: 0.77 GiB after every
    step on an H200)."""
    flattened: tuple[int, ...]
    requires_grad: tuple[bool, ...]


def input_layout(example_inputs: Sequence[Any]) -> InputLayout:
    from torch._functorch._aot_autograd.subclass_utils import remap_unwrapped_subclass_arg_indices
    return InputLayout(tuple(len(remap_unwrapped_subclass_arg_indices([t], [0])) for t in example_inputs),
                       tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs))


def joint_param_positions(layout: InputLayout, indices: list[int], num_primals: int) -> tuple[list[int], list[int] | None]:
    """(The joint graph's primal positions of the inputs AOT passes as `static_lifetime_input_indices`,
    parameters and buffers; the position of each one that trains, its gradient's owner), the second None
    where no input is flattened (then a gradient output's position is its input's).

    AOT (torch 2.11-2.13) passes the indices as positions among the compiled graph's inputs, before a
    tensor subclass (a DTensor parameter) is flattened into several primals, and its backward's outputs
    do not line up with the primals either (a DeviceMesh input is a primal with no gradient slot). On a
    sharded graph the memory model counted half of HF Llama's parameters as batch inputs, without
    optimizer state. A DTensor's own tensor is its first flattened primal."""
    if len(layout.flattened) == num_primals or all(n == 1 for n in layout.flattened):
        return list(indices), None
    first = [sum(layout.flattened[:i]) for i in range(len(layout.flattened))]   # each input's first primal
    wanted = set(indices)
    static = [first[i] + k for i in range(len(first)) if i in wanted for k in range(layout.flattened[i])]
    trained = [first[i] for i in indices if layout.requires_grad[i]]
    return static, trained


def mark_running_backward(device_index: int) -> None:
    """Tell the CUDA graph tree manager that a backward runs outside CUDA graphs after a graphed forward."""
    manager = torch._inductor.cudagraph_trees.get_manager(device_index, create_if_none_exists=False)
    if manager is not None:
        manager.set_to_running_backward()


# -- collectives in captured graphs (parallel/) ----------------------------------------------------
def process_group_name(group) -> str:
    """The name functional collectives address a process group by."""
    return group.group_name


def all_reduce_op():
    """Functional all-reduce (input, "sum", group name) -> a tensor to wait for."""
    return torch.ops._c10d_functional.all_reduce.default


def wait_tensor_op():
    return torch.ops._c10d_functional.wait_tensor.default


def collective(name: str, t: torch.Tensor, *args) -> torch.Tensor:
    """A functional collective (torch.ops._c10d_functional.NAME: all_gather_into_tensor(t, group size,
    group name), reduce_scatter_tensor(t, "sum", group size, group name), all_reduce(t, "sum"|"max", group
    name)), waited for: eagerly a collective now, traced two nodes (the ops, not torch 2.13's renamed
    Python wrappers, whose old names warn and whose new ones torch 2.11 lacks)."""
    op = getattr(torch.ops._c10d_functional, name).default
    return torch.ops._c10d_functional.wait_tensor.default(op(t, *args))


def route_clip_grad_norm(route: Callable) -> None:
    """From now on torch.nn.utils.clip_grad_norm_ (and torch.nn.utils.clip_grad's) is `route(parameters,
    max_norm, norm_type, error_if_nonfinite, foreach)`, for code that looks it up when it calls it (HF's
    Trainer, accelerate, `torch.nn.utils.clip_grad_norm_(...)` in a script); a name imported before keeps
    torch's. Installed once, process-wide (public functions, replaced: torch has no hook there)."""
    import torch.nn.utils as nn_utils
    import torch.nn.utils.clip_grad as clip_grad
    if getattr(nn_utils.clip_grad_norm_, "_colauto_route", False):
        return

    @functools.wraps(clip_grad.clip_grad_norm_)
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        return route(parameters, max_norm, norm_type, error_if_nonfinite, foreach)
    clip_grad_norm_._colauto_route = True
    nn_utils.clip_grad_norm_ = clip_grad.clip_grad_norm_ = clip_grad_norm_


def fake_like(val: torch.Tensor) -> torch.Tensor:
    """A new fake tensor like `val`, in `val`'s fake mode (the `val` meta of a node inserted in a traced graph)."""
    from torch._guards import detect_fake_mode
    with detect_fake_mode([val]):
        return torch.empty_like(val)


def fake_call(op, *args):
    """`op` run on fake values (a new node's `val` meta), in the fake mode of the tensors among `args`
    (nested lists included)."""
    from torch._guards import detect_fake_mode
    from torch.utils import _pytree as pytree
    with detect_fake_mode([a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]):
        return op(*args)


def raw_source_name(placeholder: torch.fx.Node) -> str | None:
    """Dynamo's source of a graph input as Dynamo writes it ("L['self']._modules['fc']._buffers['b']")."""
    arg = placeholder.meta.get("grapharg")
    if arg is None:
        return None
    name = arg.source.name
    return name() if callable(name) else name          # a method in 2.11, a property in 2.13


def state_fqn(placeholder: torch.fx.Node) -> str | None:
    """The dotted name under the compiled module of a parameter or buffer input ("model.layers.0.mlp.weight"),
    from Dynamo's source alone; None for any other input."""
    name = raw_source_name(placeholder)
    if name is None:
        return None
    m = _ROOT.match(name)
    if m is None or not _STATE.match(name[m.end():]):
        return None
    return _dotted(name[m.end():])


def allow_implicit_replication() -> None:
    """From now on, DTensor ops take plain tensors as replicated (what `implicit_replication()` does for a
    block; here for the rest of the process: Dynamo re-traces a tensor-parallel module whenever it recompiles)."""
    from torch.distributed.tensor import DTensor
    DTensor._op_dispatcher._allow_implicit_replication = True


def mark_static(t: torch.Tensor) -> None:
    """Every dim of `t` stays static in Dynamo's traces (no automatic dynamic shapes for it)."""
    torch._dynamo.mark_static(t)


def flatten_mesh_axes(device_mesh) -> None:
    """Flattened meshes over every set of two or more of `device_mesh`'s axes (DeviceMesh._flatten), so that
    DTensor turns a redistribution that reduces over several axes (a gradient Partial on dp and tp) into one
    collective over the flattened group instead of one per axis, one after another."""
    names = list(device_mesh.mesh_dim_names or ())
    for n in range(2, len(names) + 1):
        for dims in itertools.combinations(names, n):
            device_mesh[dims]._flatten("_".join(dims))


def local_piece(whole: torch.Tensor, mesh, placements) -> torch.Tensor:
    """This rank's piece of `whole` under DTensor `placements` on `mesh`, with no communication (every rank
    holds `whole`): distribute_tensor's `src_data_rank=None`."""
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(whole, mesh, list(placements), src_data_rank=None).to_local()


def outside_fake_mode():
    """A context where real tensors are real: AOTAutograd calls the partitioner under its FakeTensorMode,
    and the distributed plan made there runs collectives (torch._subclasses.fake_tensor, private)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    return unset_fake_temporarily()


def guard_parameters_by_identity(placeholders: Sequence[torch.fx.Node]) -> None:
    """Inside the backend call, before it returns: Dynamo's guards on these graph inputs (parameters) become
    one identity check each, so a shard put in their `.data` later (parallel/fsdp.py) does not recompile the
    frame. Dynamo turns its guard set into the guard function only after the backend returns
    (torch._guards.TracingContext's guards_context; torch._dynamo.guards.GuardBuilder.ID_MATCH, private).
    Every guard on a parameter's source, or on a source reached through it, is dropped, in one pass over the
    guard set: torch's `remove_guards_with_source` walks (and 2.13 re-indexes) the whole set per source, which
    was O(parameters x guards) per compile (0.7 s of a tiny model's fsdp compile under cProfile). torch 2.11's
    `is_from_source` only compares a chained source's bases: the parameter's size check stayed, "Guard failed
    on the same frame it was created"; the walk here compares the source itself first, as 2.13 does."""
    from torch._dynamo.guards import GuardBuilder
    from torch._guards import TracingContext
    sources = list(dict.fromkeys(n.meta["grapharg"].source for n in placeholders))
    if not sources:
        return
    targets = set(sources)
    guards = TracingContext.get().guards_context.dynamo_guards
    guards.inner = type(guards.inner)(g for g in guards.inner if not _derives_from(g.originating_source, targets))
    if hasattr(guards, "source_to_guards"):  # an index newer versions keep beside the set
        guards.source_to_guards = collections.defaultdict(list)
        for g in guards.inner:
            guards.track_guard_by_source(g)
    for source in sources:
        guards.add(source.make_guard(GuardBuilder.ID_MATCH))


def _derives_from(source, targets: set) -> bool:
    """`source` is one of `targets` or reached through one (a chain of attribute and item sources over it)."""
    from torch._dynamo.source import ChainedSource
    while True:
        if source in targets:
            return True
        if not isinstance(source, ChainedSource):
            return False
        source = source.base


def fake_parameter_like(data: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A fake Parameter like `data` (a parameter's new `.data`) in the fake mode Dynamo traced with, for
    AOTAutograd's example inputs after a parameter's `.data` changed shape (Dynamo's memo still maps the
    parameter to its old fake)."""
    from torch._guards import TracingContext
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        stand_in = torch.nn.Parameter(torch.empty_like(data), requires_grad=requires_grad)
    return TracingContext.get().fake_mode.from_tensor(stand_in, static_shapes=True)


_COMPILE_HOOKS: list[tuple[Callable, Callable]] = []     # (start, end) pairs, registered again after a reset


def on_dynamo_compile(start: Callable, end: Callable) -> None:
    """Run `start` when Dynamo starts compiling a frame and `end` when it ends (torch._dynamo.callback,
    whose callbacks take one argument since about torch 2.7: none before), from now on. torch._dynamo.reset()
    clears Dynamo's callbacks, so it is wrapped (once, process-wide, for code that looks it up when it
    calls it, torch.compiler.reset() included) to register these again after it."""
    if (start, end) not in _COMPILE_HOOKS:
        _COMPILE_HOOKS.append((start, end))
    _register_compile_hooks()
    if not getattr(torch._dynamo.reset, "_colauto_rehooks", False):
        original = torch._dynamo.reset

        @functools.wraps(original)
        def reset() -> None:
            original()
            _register_compile_hooks()
        reset._colauto_rehooks = True
        torch._dynamo.reset = reset


def _register_compile_hooks() -> None:
    handler = torch._dynamo.callback.callback_handler
    for start, end in _COMPILE_HOOKS:
        if start not in handler.start_callbacks:
            torch._dynamo.callback.on_compile_start(start)
            torch._dynamo.callback.on_compile_end(end)


def at_backward_end(fn: Callable[[], None]) -> None:
    """Run `fn` once the backward pass now running ends (autograd's engine callback queue, as DDP and FSDP
    use; an exception `fn` raises reaches the caller of backward())."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def accumulator_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape autograd checks `t`'s gradients against: that of its gradient accumulator, which an autograd
    graph made earlier (and still alive) keeps as it was when made, even after `t.data` changed; a new
    accumulator, made here where none is alive, has `t`'s shape."""
    return tuple(torch.autograd.graph.get_gradient_edge(t).node._input_metadata[0].shape)


# -- storages: identity and weak references (split_step.py) ------------------------------------------
def storage_key(t: torch.Tensor) -> int:
    """An identity of `t`'s storage, shared by its views, equal to `storage_weak_ref(t).cdata` (the
    StorageImpl's address: `UntypedStorage._cdata`, private)."""
    return t.untyped_storage()._cdata


def storage_weak_ref(t: torch.Tensor):
    """A weak reference to `t`'s storage: `.expired()` once it is freed, `.cdata` its `storage_key`
    (torch.multiprocessing.reductions.StorageWeakRef, as torch's own aliasing checks use)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(t.untyped_storage())


def storage_nbytes(t: torch.Tensor) -> int:
    """Bytes of `t`'s whole storage."""
    return t.untyped_storage().nbytes()


def is_fake(t: torch.Tensor) -> bool:
    """Whether `t` is a fake tensor (no storage of its own to weigh or point at)."""
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)


@contextlib.contextmanager
def compile_outside_dynamo():
    """The TracingContext Dynamo's compile provides, for a compile made outside it (a split step's graph
    planned again at its call: split_step.Graph). AOTAutograd records the compiled forward's output strides in
    it and compiles the backward for them (`TracingContext.report_output_strides`, torch._guards, private);
    without one the backward assumed contiguous saved tensors, and where Inductor padded one (a GPU pads a
    stride of 1,025 elements to 1,040) it failed its first run ("expected size 4==4, stride 1040==1025": HF
    OPT under transformers 5.17 on an H100, 2026-12-07). Static sizes: a fake mode without a shape env."""
    from torch._guards import TracingContext, tracing
    if TracingContext.try_get() is not None:
        yield
        return
    from torch._subclasses import FakeTensorMode
    with tracing(TracingContext(FakeTensorMode())):
        yield
