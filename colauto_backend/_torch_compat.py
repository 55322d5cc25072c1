"""The one place colauto touches private PyTorch APIs (torch 2.11-2.13). A torch upgrade edits this file."""
from __future__ import annotations

import re
from typing import Any, Callable

import sympy
import torch
from torch._dynamo.backends.common import aot_autograd          # noqa: F401  (re-exported)
from torch._dynamo.backends.debugging import boxed_nop          # boxed call: frees inputs at last use
from torch._dynamo.exc import BackendCompilerFailed
from torch._functorch.partitioners import default_partition    # noqa: F401  (re-exported)
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.fx.experimental import _config as fx_config


def run_as_aten(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Run a partitioned graph op by op; inputs and intermediates are freed after their last use."""
    return boxed_nop(gm, example_inputs)


def inductor_decompositions() -> dict:
    from torch._inductor.decomposition import select_decomp_table
    return select_decomp_table()


def min_cut_partition(joint: torch.fx.GraphModule, joint_inputs, **kwargs) -> tuple:
    """Inductor's own partitioner (min-cut over fusible ops); it honours MUST_SAVE/MUST_RECOMPUTE tags and
    decides every untagged node itself."""
    return min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)


def inductor_joint_passes(joint: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The pattern rewrites Inductor runs on the joint graph before partitioning, so that colauto plans
    the graph Inductor would compile."""
    from torch._inductor.compile_fx import _recursive_joint_graph_passes
    return _recursive_joint_graph_passes(joint)


def run_with_inductor(gm: torch.fx.GraphModule, example_inputs: list, *, is_backward: bool,
                      is_inference: bool = False) -> Callable:
    """Hand an already-partitioned aten graph to Inductor's code generation (no re-partition). A graph
    with collectives (a distributed plan) gets Inductor's collective bucketing and compute/communication
    reordering: one all-reduce per parameter, unbucketed and unoverlapped, ran 7% slower on 2 H200s."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    passes = {}
    if any(n.op == "call_function" and getattr(n.target, "namespace", "") == "_c10d_functional"
           for n in gm.graph.nodes):
        passes = {k: v for k, v in (("bucket_all_reduces_fx", "all"), ("bucket_reduce_scatters_fx", "all"),
                                    ("bucket_all_gathers_fx", "all"), ("reorder_for_compute_comm_overlap", True))
                  if hasattr(inductor_config, k)}
    with inductor_config.patch(passes):
        return compile_fx_inner(gm, example_inputs, is_backward=is_backward, is_inference=is_inference)


def shape_env_of(graph: torch.fx.Graph):
    for n in graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and getattr(val, "fake_mode", None) is not None:
            return val.fake_mode.shape_env
    return None


def real_tensor(data, device: torch.device, shape: list[int]) -> torch.Tensor:
    """A real tensor made while the backend compiles, which happens under a fake mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return torch.tensor(data, device=device).view(shape)


def fake_constant(val: torch.Tensor, constant: torch.Tensor) -> torch.Tensor:
    """`constant` as a fake tensor of the fake mode that `val` belongs to (an example value for a node
    that a pass adds)."""
    return val.fake_mode.from_tensor(constant)


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
            if (isinstance(src, TensorPropertySource) and src.prop == TensorProperty.SIZE
                    and isinstance(src.base, LocalSource)):
                out[s] = (src.base.local_name, int(src.idx))
                break
    return out


def no_duck_sizing():
    """Equal example sizes (B == T) must stay separate symbols."""
    return fx_config.patch(use_duck_shape=False)


def unwrap_backend_error(exc: BaseException) -> BaseException:
    return exc.inner_exception if isinstance(exc, BackendCompilerFailed) else exc


def register_flop_formula(op: Any, fn: Callable) -> None:
    """Give FlopCounterMode a formula it lacks (e.g. CPU flash attention); `fn` gets the raw tensors."""
    from torch.utils import flop_counter
    if getattr(op, "overloadpacket", op) not in flop_counter.flop_registry:
        flop_counter.register_flop_formula(op, get_raw=True)(fn)




def source_name(placeholder: torch.fx.Node) -> str | None:
    """Dynamo's source of a graph input ("L['self']._modules['fc']._parameters['weight']", "L['x']")."""
    arg = placeholder.meta.get("grapharg")
    if arg is None:
        return None
    name = arg.source.name
    return name() if callable(name) else name          # a method in 2.11, a property in 2.13


def compiled_frame_locals() -> dict:
    """The local variables of the frame Dynamo is compiling (call from inside a backend)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator
    return dict(InstructionTranslator.current_tx().f_locals)


def register_cpu_attention_sharding() -> None:
    """DTensor has no sharding rule for CPU flash attention: shard it on batch or heads (all inputs and
    outputs alike), as its CUDA rule does."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding
    aten = torch.ops.aten

    def rules(n_in: int, n_out: int, mask) -> list:
        m = [Replicate()] if mask is not None else []
        out = [([Replicate()] * n_out, [Replicate()] * n_in + [None, None] + m)]
        for d in (0, 1):
            out.append(([Shard(d)] * n_out, [Shard(d)] * n_in + [None, None] + m))
        return out

    @register_sharding(aten._scaled_dot_product_flash_attention_for_cpu.default)
    def _fwd(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        return rules(3, 2, attn_mask)

    @register_sharding(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
    def _bwd(g, q, k, v, o, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
        return rules(6, 3, attn_mask)


def example_int(x) -> int:
    """A size as the example had it: ints as they are, a SymInt by its hint (no guard added)."""
    return x if isinstance(x, int) else int(x.node.hint)


def module_path(node: torch.fx.Node) -> str | None:
    """The path under the compiled module of the module whose forward made this Dynamo graph node
    ("blocks.1.mlp.fc"), from `nn_module_stack`; None where the node has none."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    path = re.sub(r"\[(\d+)\]", r".\1", path)                 # blocks[1] -> blocks.1
    return re.sub(r"^L\['self'\]\.?|^L__self___?", "", path) or None


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


def mark_running_backward(device_index: int) -> None:
    """Tell the CUDA graph tree manager that a backward runs outside CUDA graphs after a graphed forward."""
    manager = torch._inductor.cudagraph_trees.get_manager(device_index, create_if_none_exists=False)
    if manager is not None:
        manager.set_to_running_backward()
