"""Sizes as sympy expressions, read from the fake tensors that AOTAutograd leaves in `node.meta['val']`.

Portable across torch 2.11-2.13: only `SymInt.node.expr` / `.node.hint` and `untyped_storage().nbytes()`
are used. Results are cached by the expression tuple, so repeated layers cost sympy nothing.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable

import sympy
import torch

Expr = sympy.Expr
ONE = sympy.Integer(1)
ZERO = sympy.Integer(0)


def sym(x: Any) -> Expr:
    """An int or SymInt as a sympy expression."""
    if isinstance(x, torch.SymInt):
        return x.node.expr
    return _integer(int(x))


@functools.lru_cache(maxsize=4096)
def _integer(x: int) -> Expr:
    return sympy.Integer(x)


def shape(t: torch.Tensor) -> tuple[Expr, ...]:
    return tuple(sym(s) for s in t.shape)


@functools.lru_cache(maxsize=None)
def _prod(dims: tuple[Expr, ...]) -> Expr:
    out = ONE
    for d in dims:
        out = out * d
    return out


def prod(dims: Iterable[Expr]) -> Expr:
    return _prod(tuple(dims))


def numel(t: torch.Tensor) -> Expr:
    return _prod(shape(t))


def nbytes(t: torch.Tensor) -> Expr:
    """Bytes the tensor's elements take (what a kernel reads or writes)."""
    return _nbytes(shape(t), t.dtype.itemsize)


@functools.lru_cache(maxsize=None)
def _nbytes(dims: tuple[Expr, ...], itemsize: int) -> Expr:
    return _prod(dims) * itemsize


def storage_nbytes(t: torch.Tensor) -> Expr:
    """Bytes of the storage behind the tensor (what the allocator holds)."""
    try:
        return sym(t.untyped_storage().nbytes())
    except (NotImplementedError, RuntimeError):  # tensor subclasses without a storage
        return nbytes(t)


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors inside a node value (a tensor, or a tuple/list of them, possibly with None)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []
