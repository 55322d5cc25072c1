"""Views inside a region: values of different shapes in one kernel.

A view keeps a value's elements in row-major order under a new shape ([B*T, C] -> [B, T, C]); expand
broadcasts. Rather than teach the kernels index arithmetic, a region with views is rewritten before
planning into one without them, over one shape S: the common refinement of the full-size values'
shapes, i.e. the coarsest shape each of whose dims lies within one dim of every such shape
([B*T, C] and [B, T, C] -> S = [B, T, C]; [6, 4] and [4, 6] have none: NotFusible).

Each value gets a *map*: for each dim d of S, None (the value is constant along d: broadcast) or
(k, m): moving one step along d moves m steps along the value's dim k. A full-size value is row-major
over S. Every op relates its operands' maps to its result's: a pointwise op broadcasts (right-aligned,
as torch), a view keeps each step's row-major offset, a last-dim reduction drops the row. Maps are
solved from the full-size values through these relations; a relation that does not hold is NotFusible,
never a wrong index. With maps, a view is the identity on the kernel's registers (both sides hold the
same element at every point of S), so it disappears; only the region's inputs and stored outputs
change, into strided tensors of S's rank (1 where broadcast) whose strides are (k, m) -> m * stride[k].
Splitting a dim of a strided tensor is exact, so non-contiguous inputs are read in place. The kernels
then see a region of one rank with broadcasting only, as before.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .ir import COLUMN_SUM, REDUCTIONS, Instr, NotFusible, Ref

OPS = frozenset({"view", "expand"})     # the instructions view_ops emits; none reaches a kernel

Map = tuple        # per dim of S: None, or (dim of the value, multiplier)


class _NoMap(Exception):
    """A map that does not exist: the relation it comes from cannot be expressed over S."""


def _pitches(shape) -> tuple[int, ...]:
    return tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))


def refinement(shapes, numel: int) -> tuple[int, ...]:
    """The coarsest shape (no size-1 dims) each of whose dims lies within one dim of every shape."""
    bounds = {1, numel}
    for s in shapes:
        bounds.update(math.prod(s[k:]) for k in range(len(s)))
    bounds = sorted(bounds, reverse=True)
    if any(hi % lo for hi, lo in zip(bounds, bounds[1:])):
        raise NotFusible(f"views between shapes {sorted(set(shapes))} are not fusible: no one iteration shape "
                         "refines them all")
    return tuple(hi // lo for hi, lo in zip(bounds, bounds[1:]))


class Space:
    def __init__(self, sizes: tuple[int, ...]):
        self.sizes = sizes

    def locate(self, steps, shape) -> Map:
        """The map of a value of `shape` whose element at point j of S lies sum_d j_d * steps[d] elements
        into its row-major order; _NoMap unless that offset is linear in j per dim of `shape` (no carry)."""
        pitch = _pitches(shape)
        out, reach = [], {}
        for d, s in enumerate(steps):
            if s is None:
                out.append(None)
                continue
            k = next((k for k, n in enumerate(shape) if n > 1 and pitch[k] <= s < pitch[k] * n), None)
            if k is None or s % pitch[k]:
                raise _NoMap
            out.append((k, s // pitch[k]))
            reach[k] = reach.get(k, 0) + (self.sizes[d] - 1) * (s // pitch[k])
        if any(r >= shape[k] for k, r in reach.items()):
            raise _NoMap
        return tuple(out)

    def full(self, shape) -> Map:
        return self.locate(_pitches(self.sizes), shape)

    @staticmethod
    def steps(m: Map, shape) -> tuple:
        pitch = _pitches(shape)
        return tuple(None if e is None else e[1] * pitch[e[0]] for e in m)

    def view(self, m: Map, from_shape, to_shape) -> Map:
        return self.locate(self.steps(m, from_shape), to_shape)

    @staticmethod
    def broadcast(m: Map, shape, operand_shape) -> Map:
        """An operand's map, from the map of the op's result it is broadcast to."""
        lead = len(shape) - len(operand_shape)
        return tuple(None if e is None or e[0] < lead or operand_shape[e[0] - lead] == 1 else (e[0] - lead, e[1])
                     for e in m)

    @staticmethod
    def reduced(m: Map, operand_shape) -> Map:
        return tuple(None if e is None or e[0] == len(operand_shape) - 1 else e for e in m)

    def column_sum(self, m: Map, operand_shape, shape) -> Map:
        """A column sum's map from its operand's: only the operand's last dim, which must be exactly the
        last dim of S (the kernel's columns), remains."""
        last = len(operand_shape) - 1
        if not self.sizes or m[-1] != (last, 1) or self.sizes[-1] != operand_shape[-1]:
            raise _NoMap
        return tuple(None for _ in m[:-1]) + ((len(shape) - 1, 1),)

    def unreduced(self, m: Map, operand_shape) -> Map:
        if not self.sizes or m[-1] is not None or self.sizes[-1] != operand_shape[-1]:
            raise _NoMap
        return m[:-1] + ((len(operand_shape) - 1, 1),)


def _covers(m: Map, shape, sizes) -> bool:
    """Whether the map reaches every element of `shape` from exactly one point of S (ignoring the dims of
    S it is broadcast along): what a stored output needs, so that each element is written."""
    for k, n in enumerate(shape):
        radix = 1
        for mult, size in sorted((e[1], sizes[d]) for d, e in enumerate(m) if e is not None and e[0] == k):
            if mult != radix:
                return False
            radix *= size
        if radix != n:
            return False
    return True


def _solve(space: Space, instrs: list[Instr], shapes: dict[Ref, tuple], numel: int, live: set[Ref]) -> dict[Ref, Map]:
    maps: dict[Ref, Map] = {}
    for r in live:
        if math.prod(shapes[r]) == numel:
            try:
                maps[r] = space.full(shapes[r])
            except _NoMap:                      # the refinement makes this impossible
                raise AssertionError(f"shape {shapes[r]} does not coarsen {space.sizes}") from None
    changed = True

    def derive(target: Ref, rule, *args, what: str) -> None:
        nonlocal changed
        try:
            m = rule(*args)
        except _NoMap:
            raise NotFusible(f"{what} is not fusible: its elements do not line up over the region's iteration "
                             f"shape {list(space.sizes)}") from None
        if target not in maps:
            maps[target] = m
            changed = True
        elif maps[target] != m:
            raise NotFusible(f"{what} is not fusible: its elements do not line up over the region's iteration "
                             f"shape {list(space.sizes)}")

    while changed:
        changed = False
        for j, ins in enumerate(instrs):
            o = Ref("t", j)
            if o not in live:
                continue
            so = shapes[o]
            refs = [a for a in ins.args if isinstance(a, Ref)]
            if ins.op == "view":
                a, sa = refs[0], shapes[refs[0]]
                what = f"a view of shape {list(sa)} as {list(so)}"
                if a in maps:
                    derive(o, space.view, maps[a], sa, so, what=what)
                if o in maps:
                    derive(a, space.view, maps[o], so, sa, what=what)
            elif ins.op == COLUMN_SUM:
                a, sa = refs[0], shapes[refs[0]]
                if a in maps:       # (no way back: the rows it sums over are not in its result)
                    derive(o, space.column_sum, maps[a], sa, so,
                           what=f"a sum over every dim but the last of shape {list(sa)}")
            elif ins.op in REDUCTIONS:
                a, sa = refs[0], shapes[refs[0]]
                what = f"{ins.op} over the last dim of shape {list(sa)}"
                if not space.sizes or space.sizes[-1] != sa[-1]:    # kernels reduce along the last dim of S
                    raise NotFusible(f"{what} is not fusible: a view splits or merges that dim (the region's "
                                     f"iteration shape is {list(space.sizes)})")
                if a in maps:
                    derive(o, space.reduced, maps[a], sa, what=what)
                if o in maps:
                    derive(a, space.unreduced, maps[o], sa, what=what)
            else:                                   # pointwise ops and expand broadcast their operands
                for a in refs:
                    sa = shapes[a]
                    what = f"{ins.op} of shape {list(so)} with an operand of shape {list(sa)}"
                    if o in maps:
                        derive(a, space.broadcast, maps[o], so, sa, what=what)
                    if a in maps and sa == so:
                        derive(o, lambda m: m, maps[a], what=what)
    return maps


def flatten(inputs: list[torch.Tensor], instrs: list[Instr], shapes: dict[Ref, tuple], outputs: list[Ref],
            out_vals: list[Any]):
    """The region re-expressed over one iteration shape with the view and expand instructions gone:
    (inputs, instrs, shapes, outputs, stored, allocs), inputs and stored values as meta tensors whose
    strides reach the real ones' elements (see the module doc); allocs keep eager's outputs."""
    live = {a for ins in instrs for a in ins.args if isinstance(a, Ref)}
    live |= {Ref("t", j) for j in range(len(instrs))} | set(outputs)
    numel = max(math.prod(shapes[r]) for r in live)
    if numel == 0:
        raise NotFusible("views of empty tensors are not fusible")
    space = Space(refinement([shapes[r] for r in live if math.prod(shapes[r]) == numel], numel))
    sizes = space.sizes
    maps = _solve(space, instrs, shapes, numel, live)
    missing = sorted(live - maps.keys())
    if missing:
        raise NotFusible(f"a value of shape {list(shapes[missing[0]])} has no place in the region's iteration shape "
                         f"{list(sizes)}: not fusible")
    for ins in instrs:
        # the kernels reduce along the last dim of S: it must be exactly the operand's row
        if ins.op in REDUCTIONS:
            sa = shapes[ins.args[0]]
            if not sizes or sizes[-1] != sa[-1] or maps[ins.args[0]][-1] != (len(sa) - 1, 1):
                raise NotFusible(f"{ins.op} over the last dim of shape {list(sa)} is not fusible: a view splits "
                                 f"or merges that dim (the region's iteration shape is {list(sizes)})")

    def new_shape(r: Ref) -> tuple[int, ...]:
        """r over S: 1 where it is broadcast (a reduction's row, keepdim or not: its output keeps eager's shape)."""
        return () if shapes[r] == () else tuple(n if e is not None else 1 for n, e in zip(sizes, maps[r]))

    def strided(r: Ref, t) -> torch.Tensor:
        shape = new_shape(r)
        stride = tuple(0 if e is None else e[1] * t.stride()[e[0]] for e in maps[r]) if shape else ()
        return torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")

    # views and expands alias their source's registers
    root: dict[Ref, Ref] = {}
    renumber: dict[Ref, Ref] = {}
    kept: list[Instr] = []

    def source(a):
        if not isinstance(a, Ref):
            return a
        a = root.get(a, a)
        return renumber.get(a, a)
    for j, ins in enumerate(instrs):
        r = Ref("t", j)
        if ins.op in OPS:
            root[r] = root.get(ins.args[0], ins.args[0])     # an expand's source is broadcast where it is not
            continue
        if ins.op in REDUCTIONS and maps[root.get(ins.args[0], ins.args[0])][-1] is None:
            raise NotFusible(f"{ins.op} over a row that an expand broadcasts is not fusible")
        renumber[r] = Ref("t", len(kept))
        attrs = tuple((k, True if k == "keepdim" else v) for k, v in ins.attrs)   # the row is a dim of S either way
        kept.append(Instr(ins.op, tuple(source(a) for a in ins.args), ins.arg_dtypes, ins.dtype, attrs))

    new_inputs = [strided(Ref("in", k), t) if Ref("in", k) in live else torch.empty((), dtype=t.dtype, device="meta")
                  for k, t in enumerate(inputs)]
    new_shapes = {Ref("in", k): tuple(t.shape) for k, t in enumerate(new_inputs)}
    new_shapes |= {renumber[r]: new_shape(r) for r in renumber if r in live}
    new_outputs, stored, allocs = [], {}, []
    stored_from: dict[Ref, Ref] = {}
    for i, (r, val) in enumerate(zip(outputs, out_vals)):
        s = source(r)
        new_outputs.append(s)
        if s.kind == "in":
            if s != r:
                raise NotFusible(f"output {i} is a view of input {s.index}: not fusible (the view stays outside "
                                 "the kernel, aliasing its input)")
            continue
        if s in stored_from:
            if stored_from[s] != r:
                raise NotFusible(f"output {i} is a view of another output: not fusible (the view stays outside "
                                 "the kernel, aliasing it)")
            continue
        if not _covers(maps[r], shapes[r], sizes):
            raise NotFusible(f"output {i} of shape {list(shapes[r])} is not one element per point of the region's "
                             f"iteration shape {list(sizes)}: not fusible")
        stored_from[s] = r
        stored[s] = strided(r, val)
        allocs.append((tuple(val.shape), tuple(val.stride()), val.dtype))
    if not kept:
        raise NotFusible("a region of views alone computes nothing: not fusible")
    return new_inputs, kept, new_shapes, new_outputs, list(stored.items()), allocs
