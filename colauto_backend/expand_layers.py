"""Trace K decoder layers, then expand the AOT joint graph to N layers (explain on several devices).

A transformer's joint (forward + backward) graph is, for its repeated `nn.ModuleList`, the same layer
segment again and again. Tracing all N layers costs Dynamo and AOTAutograd time proportional to N
(Llama-3-8B: 32 layers, ~15 s). This module:

* `truncated(model, k)`: a context manager that temporarily cuts the model's repeated ModuleList (every
  child the same class with the same parameter names and shapes) to its first k children;
* `find_layers(graph)`: assigns each joint-graph node to a layer of that list (forward nodes by
  `nn_module_stack`, backward nodes by `fwd_nn_module_stack`; untagged nodes, such as the gradient
  accumulation adds AOT emits, by the layers of their inputs) and finds each layer's own parameter
  placeholders;
* `expand(gm, n)`: clones a middle layer M's segment (forward and backward, layers M and M+1 must be
  isomorphic) n-k times between M and M+1, wiring each clone's external inputs as the original's are
  wired: the previous layer's outputs, the next layer's backward outputs (upstream gradients), its own
  (new) parameter placeholders, and values every layer shares (rotary tables, masks). The new
  parameters' gradients are added to the joint's outputs, next to their primals' positions.

`Expansion.positions` and `Expansion.names` carry the input joint's parameter positions and parameter
names over to the expanded one, for its partition and analysis and to feed it a real N-layer model's weights.

Expansion assumes the layers after the K captured ones repeat the middle layer. A pair of captured layers that
differ (ops, or the shared values they read: Gemma 3's alternating sliding and full attention) is refused with a
ValueError; a pattern longer than the K captured layers (real Gemma 3's five sliding layers to one full) cannot
be seen in them, and the caller must not expand such a model.

`expandable(model)` refuses, before tracing, a list whose layers differ in a plain attribute other than their own
index (Gemma 2 and 3's `layer_type`); `grow` (the hook `parallel/entry.plan_model` hands the backend's partition)
expands every list and refuses (`Refused`) where the traced layers differ. Plain functions and dataclasses,
checked by tests/test_expand_layers.py against the real N-layer capture, eager PyTorch and the plan of a whole
trace.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
from typing import Any, Iterator

import torch
import torch.fx as fx

from . import _torch_compat as compat

BACKWARD = "is_backward"
COPY_OF = "expand_layers_copy_of"    # meta key of a new layer's parameter placeholder


# -- the model side --------------------------------------------------------------------------------
def repeated_lists(model: torch.nn.Module, min_len: int = 3) -> list[tuple[str, torch.nn.ModuleList]]:
    """(dotted name, list) of each ModuleList of at least `min_len` children whose children after the first
    are one class with the same parameter names and shapes (T5's first block alone holds the relative
    position bias); nested ones inside another's children are left out."""
    sig = lambda m: (type(m), tuple((n, tuple(p.shape), p.dtype) for n, p in m.named_parameters()))  # noqa: E731
    found = []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or len(mod) < min_len:
            continue
        if any(name.startswith(f + ".") for f, _ in found):
            continue
        if len({sig(k) for k in list(mod)[1:]}) == 1:
            found.append((name, mod))
    return found


def repeated_list(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList] | None:
    """The longest of `repeated_lists`."""
    lists = repeated_lists(model)
    return max(lists, key=lambda x: len(x[1])) if lists else None


@contextlib.contextmanager
def truncated(model: torch.nn.Module, k: int, every: bool = True) -> Iterator[list[str]]:
    """The model with its repeated ModuleLists (`every`; else the longest) cut to their first k children
    (restored on exit). Yields their names."""
    lists = repeated_lists(model, k + 1) if every else [repeated_list(model)]
    if not lists or lists[0] is None:
        raise ValueError("no repeated ModuleList")
    saved = []
    for name, full in lists:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        parent._modules[attr] = torch.nn.ModuleList(list(full)[:k])
        saved.append((parent, attr, full))
    try:
        yield [name for name, _ in lists]
    finally:
        for parent, attr, full in saved:
            parent._modules[attr] = full


K = 4          # layers of each repeated list that explain traces (`truncated`)
MIDDLE = 1     # the layer cloned: layer 0 of T5's lists alone holds the relative position bias
_PLAIN = (bool, int, float, str, type(None))


class Refused(ValueError):
    """A model or graph whose layers cannot be expanded (why in the message): trace it whole."""


def differing(layers: torch.nn.ModuleList, first: int = MIDDLE) -> str | None:
    """Why layers `first`... of a repeated list may not run alike, read off their modules' plain attributes (Gemma
    3's decoder layers: attention_type 'sliding_attention' in five of six, 'full_attention' in the sixth, a pattern
    longer than the K layers traced); None if none differ. An attribute equal to each layer's own index (HF's
    layer_idx) is expected to differ."""
    def plain(layer: torch.nn.Module) -> dict[tuple[str, str], Any]:
        return {(path, k): v for path, m in layer.named_modules() for k, v in vars(m).items()
                if not k.startswith("_") and (isinstance(v, _PLAIN) or
                                              (isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v)))}
    rows = {i: plain(layers[i]) for i in range(first, len(layers))}
    for key in dict.fromkeys(k for row in rows.values() for k in row):     # in module order
        values = {i: row.get(key, "(absent)") for i, row in rows.items()}
        if len(set(map(repr, values.values()))) == 1:
            continue
        if all(type(v) is int and v == i for i, v in values.items()):     # the layer's own index
            continue
        i = next(i for i, v in values.items() if repr(v) != repr(values[first]))
        where = ".".join(filter(None, key))
        return f"layer {i}'s {where} is {values[i]!r} where layer {first}'s is {values[first]!r}"
    return None


def expandable(model: torch.nn.Module) -> tuple[dict[str, int], str | None]:
    """(list -> its layers, for each repeated list longer than K; why the model cannot be expanded, or None)."""
    lists = repeated_lists(model, K + 1)
    if not lists:
        return {}, f"no repeated ModuleList of more than {K} layers"
    whys = (f"{name}: {why}" for name, layers in lists if (why := differing(layers)))
    return {name: len(layers) for name, layers in lists}, next(whys, None)


@dataclasses.dataclass
class Grown:
    """A joint graph traced with K layers of each repeated list and expanded to the model's."""
    expansions: list["Expansion"]
    names: dict[int, str]      # the expanded joint's primal position -> its parameter or buffer in the whole model

    def rename(self, name: str) -> list[str]:
        """A dotted name of the traced model (parameter, module path, layer) -> its names in the whole one."""
        names = [name]
        for e in self.expansions:
            names = [n for x in names for n in e.rename(x)]
        return names


def grow(joint: fx.GraphModule, static: list[int], names: dict[int, str],
         lengths: dict[str, int]) -> tuple[fx.GraphModule, list[int], Grown]:
    """The joint graph traced under `truncated(model, K)` (its primal i is Dynamo's input i, named by `names`)
    expanded to `lengths` (list -> layers) by cloning layer MIDDLE; `static` (the parameters' primal positions,
    AOTAutograd's static-lifetime inputs) follows. Refused where a list's traced layers differ."""
    primals = lambda gm: [n for n in gm.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]  # noqa: E731
    by_placeholder = {ph.name: names[i] for i, ph in enumerate(primals(joint)) if i in names}
    expansions = []
    for prefix, n in lengths.items():
        try:
            e = expand(joint, n, middle=MIDDLE, prefix=prefix)
        except ValueError as exc:
            raise Refused(f"{prefix}: {exc}") from None
        by_placeholder, static, joint = e.names(by_placeholder), e.positions(static), e.gm
        expansions.append(e)
    return joint, static, Grown(expansions, {i: by_placeholder[ph.name] for i, ph in enumerate(primals(joint))
                                             if ph.name in by_placeholder})


# -- layers of a joint graph ------------------------------------------------------------------------
def _path(n: fx.Node) -> str:
    stack = n.meta.get("nn_module_stack") or n.meta.get("fwd_nn_module_stack")
    return compat.stack_module_path(stack) if stack else ""


_INDEX = re.compile(r"^(.*?)\.(\d+)(?:\.|$)")


def _split(path: str) -> tuple[str, int] | None:
    """'model.layers.3.mlp' -> ('model.layers', 3)."""
    m = _INDEX.match(path)
    return (m.group(1), int(m.group(2))) if m else None


def _leaves(a: Any) -> list:
    out: list = []
    fx.node.map_aggregate(a, lambda x: out.append(x) or x)
    return out


@dataclasses.dataclass
class Layering:
    prefix: str                              # 'model.layers'
    layer: dict[fx.Node, int]                # node -> layer index (layer nodes only)
    segments: dict[int, list[fx.Node]]       # layer -> its call_function nodes, in graph order
    params: dict[int, list[fx.Node]]         # layer -> placeholders only that layer reads, in graph order
    untagged: int                            # nodes placed by their inputs
    ambiguous: list[str]                     # untagged nodes whose inputs come from several layers
    backward: set[fx.Node]                   # backward nodes: tagged is_backward, or untagged reading one

    @property
    def count(self) -> int:
        return len(self.segments)


def backward_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes tagged is_backward, and untagged ones after the first of them or reading one (BLOOM's GeLU is an
    autograd.Function: its backward's ops carry no tag, and some read forward values only)."""
    bwd: set[fx.Node] = set()
    started = False
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        tag = n.meta.get("partitioner_tag")
        started = started or tag == BACKWARD
        if tag == BACKWARD or (tag is None and (started or any(x in bwd for x in n.all_input_nodes))):
            bwd.add(n)
    return bwd


def _stable_toposort(graph: fx.Graph) -> int:
    """Reorder the nodes topologically, each as early as its inputs allow but never before a node that
    preceded it; returns how many moved."""
    import heapq
    nodes = list(graph.nodes)
    idx = {n: i for i, n in enumerate(nodes)}
    waiting = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [idx[n] for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        n = nodes[heapq.heappop(ready)]
        order.append(n)
        for u in n.users:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, idx[u])
    assert len(order) == len(nodes), "cycle"
    moved = sum(a is not b for a, b in zip(order, nodes))
    cursor = order[0]
    for n in order[1:]:
        if cursor.next is not n:
            cursor.append(n)
        cursor = n
    return moved


def find_layers(graph: fx.Graph, prefix: str | None = None) -> Layering:
    """Each call_function node's layer of the list `prefix` (default: the graph's indexed module path with
    the most indices)."""
    tagged: dict[fx.Node, tuple[str, int]] = {}
    prefixes: collections.Counter = collections.Counter()
    for n in graph.nodes:
        if n.op == "call_function":
            s = _split(_path(n))
            if s is not None:
                tagged[n] = s
                prefixes[s[0]] += 1
    if not prefixes:
        raise ValueError("no indexed module path in the graph")
    if prefix is None:
        prefix = max(prefixes, key=lambda p: (len({i for q, i in tagged.values() if q == p}), prefixes[p]))
    bwd = backward_nodes(graph)
    layer: dict[fx.Node, int] = {}
    untagged, ambiguous = 0, []
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        s = tagged.get(n)
        if s is not None:
            if s[0] == prefix:
                layer[n] = s[1]
            continue
        if _path(n):       # tagged with a module outside the list (embeddings, final norm, rotary, loss)
            continue
        # untagged (AOT's gradient accumulation, some detaches): the layer of its inputs; in the backward,
        # an add of the next layer's gradient and this layer's contribution is this layer's (the lower)
        ins = {layer[x] for x in n.all_input_nodes if x in layer}
        if not ins:
            continue
        untagged += 1
        backward = n in bwd
        if len(ins) > 1:
            ambiguous.append(n.name)
        layer[n] = min(ins) if backward else max(ins)
    segments: dict[int, list[fx.Node]] = collections.defaultdict(list)
    for n in graph.nodes:
        if n in layer:
            segments[layer[n]].append(n)
    params: dict[int, list[fx.Node]] = collections.defaultdict(list)
    for n in graph.nodes:
        if n.op == "placeholder":
            users = {layer.get(u) for u in n.users}
            if len(users) == 1 and None not in users:
                params[users.pop()].append(n)
    return Layering(prefix, layer, dict(sorted(segments.items())), dict(params), untagged, ambiguous, bwd)


def _signature(seg: list[fx.Node], lay: Layering, i: int) -> list[tuple]:
    """Per node of a segment: target, phase and its arguments (internal: relative position; external:
    the kind of source; literals as they are)."""
    pos = {n: k for k, n in enumerate(seg)}
    own = set(lay.params.get(i, []))
    own_idx = {p: k for k, p in enumerate(lay.params.get(i, []))}
    rows = []
    for n in seg:
        def leaf(x):
            if isinstance(x, fx.Node):
                if x in pos:
                    return ("in", pos[x])
                if x in own:
                    return ("param", own_idx[x])
                j = lay.layer.get(x)
                return ("layer", j - i) if j is not None else ("shared",)
            return ("lit", repr(x))
        rows.append((str(n.target), n in lay.backward,
                     tuple(leaf(x) for x in _leaves(n.args)),
                     tuple((k, tuple(leaf(x) for x in _leaves(v))) for k, v in sorted(n.kwargs.items()))))
    return rows


def isomorphic(lay: Layering, a: int, b: int) -> str | None:
    """None where layers a and b have the same op sequence and internal wiring; else why not. External
    sources may differ in kind (the last layer's upstream gradient comes from outside the list)."""
    sa, sb = lay.segments.get(a, []), lay.segments.get(b, [])
    if len(sa) != len(sb):
        return f"layer {a} has {len(sa)} nodes, layer {b} {len(sb)}"
    if len(lay.params.get(a, [])) != len(lay.params.get(b, [])):
        return f"layer {a} owns {len(lay.params.get(a, []))} placeholders, layer {b} {len(lay.params.get(b, []))}"
    ra, rb = _signature(sa, lay, a), _signature(sb, lay, b)
    for k, (x, y) in enumerate(zip(ra, rb)):
        strip = lambda r: (r[0], r[1], tuple(v if v[0] in ("in", "param", "lit") else ("ext",) for v in r[2]),  # noqa: E731
                           tuple((kk, tuple(v if v[0] in ("in", "param", "lit") else ("ext",) for v in vs)) for kk, vs in r[3]))
        if strip(x) != strip(y):
            return f"node {k}: {sa[k].name} {x[:2]} vs {sb[k].name} {y[:2]}"
    return None


@dataclasses.dataclass
class Ports:
    """The external inputs of a middle layer M, each as (node position in M, leaf index in its flat
    args+kwargs) -> where it comes from."""
    prev: dict[tuple[int, int], int]      # -> position (in a layer's indexing) of the previous layer's node
    next: dict[tuple[int, int], int]      # -> position of the next layer's node (its backward: upstream grads)
    param: dict[tuple[int, int], int]     # -> index among the layer's own placeholders
    shared: dict[tuple[int, int], fx.Node]  # -> the node itself (rotary tables, masks, constants)

    def summary(self) -> dict[str, int]:
        return {k: len(getattr(self, k)) for k in ("prev", "next", "param", "shared")}


def _flat(n: fx.Node) -> list:
    return _leaves(n.args) + [x for _, v in sorted(n.kwargs.items()) for x in _leaves(v)]


def ports(lay: Layering, m: int) -> Ports:
    """How layer m (whose neighbours m-1 and m+1 are layers, m+1 isomorphic to m) takes its inputs."""
    seg, nxt = lay.segments[m], lay.segments[m + 1]
    pos_m = {n: k for k, n in enumerate(seg)}
    pos_n = {n: k for k, n in enumerate(nxt)}
    own = {p: k for k, p in enumerate(lay.params.get(m, []))}
    p = Ports({}, {}, {}, {})
    for k, n in enumerate(seg):
        for li, x in enumerate(_flat(n)):
            if not isinstance(x, fx.Node) or x in pos_m:
                continue
            j = lay.layer.get(x)
            same = _flat(nxt[k])[li]
            if x in own:
                p.param[(k, li)] = own[x]
            elif same is x:      # what layer m+1 reads too: shared (rotary tables, masks, T5's position bias)
                p.shared[(k, li)] = x
            elif j == m - 1:
                # where the next layer takes this port from, in layer m's indexing
                y = _flat(nxt[k])[li]
                if y not in pos_m:
                    raise ValueError(f"port {n.name}[{li}] comes from layer {m - 1} but layer {m + 1}'s from {y}")
                p.prev[(k, li)] = pos_m[y]
            elif j == m + 1:
                p.next[(k, li)] = pos_n[x]
            elif j is not None:
                raise ValueError(f"{n.name} (layer {m}) reads {x.name} of layer {j}: not a neighbour")
            else:
                # layer m+1 reads another value here: the layers alternate (Gemma 3's sliding and full
                # attention: other masks and rotary tables); cloning layer m would make every new layer m's kind
                raise ValueError(f"{n.name} (layer {m}) reads {x.name} where layer {m + 1} reads "
                                 f"{getattr(same, 'name', same)}: the layers alternate")
    return p


@dataclasses.dataclass
class Expansion:
    gm: fx.GraphModule
    prefix: str                # the list expanded
    middle: int                # the layer cloned
    added: int                 # layers added
    ports: Ports
    notes: list[str]
    primals: list[str]         # the input joint's primal placeholders (not tangents), in order
    new_params: dict[str, tuple[int, str]]   # new placeholder -> (its layer, the middle layer's placeholder it copies)

    def _expanded_primals(self) -> list[str]:
        return [n.name for n in self.gm.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]

    def positions(self, old: list[int]) -> list[int]:
        """The expanded joint's primal positions of the input joint's primals at `old` (the parameters, for
        the partition's static-lifetime inputs and the memory model), and of the new copies of those."""
        kept = {self.primals[i] for i in old}
        return [i for i, name in enumerate(self._expanded_primals())
                if name in kept or (name in self.new_params and self.new_params[name][1] in kept)]

    def rename(self, name: str) -> list[str]:
        """A dotted name of the captured model (parameter, module path, layer) -> its names in the expanded one."""
        return renamed(name, self.prefix, self.middle, self.added)

    def names(self, old: dict[str, str]) -> dict[str, str]:
        """`old`: the input joint's primal placeholder -> the model's parameter (or buffer) name, in the captured
        model. Returns the expanded joint's primal placeholder -> the name in the expanded model: layers after
        the middle one move up by `added`, new placeholders name their own layer. Primals not in `old` (the
        batch) are left out."""
        out = {}
        for name in self._expanded_primals():
            if name in self.new_params:
                layer, copied = self.new_params[name]
                if copied not in old:
                    raise KeyError(f"{name} copies {copied}, which `old` does not name")
                copies = self.rename(old[copied])
                if len(copies) != self.added + 1:
                    raise ValueError(f"{copied} is {old[copied]!r}, not a parameter of {self.prefix}.{self.middle}")
                out[name] = copies[layer - self.middle]
            elif name in old:
                out[name] = self.rename(old[name])[0]
        return out


def renamed(name: str, prefix: str, middle: int, added: int) -> list[str]:
    """`name` ('model.layers.3.mlp.up.weight', a module path or a layer) after layer `middle` of list `prefix`
    was cloned `added` times: a later layer's name moves up by `added`; the middle layer's is its own and
    each clone's, in layer order; any other name is kept."""
    head = prefix + "."
    index, dot, tail = name[len(head):].partition(".") if name.startswith(head) else ("", "", "")
    if not index.isdigit() or int(index) < middle:
        return [name]
    if int(index) > middle:
        return [f"{head}{int(index) + added}{dot}{tail}"]
    return [f"{head}{middle + t}{dot}{tail}" for t in range(added + 1)]


def _renumber(meta: dict, prefix: str, old: int, new: int) -> dict:
    """A copy of a node's meta whose module stacks name layer `new` where they named `old`."""
    meta = dict(meta)
    tail = re.escape(prefix.rpartition(".")[2] or prefix)
    pat = re.compile(rf"(\b{tail}(?:\.|\[|'\]\._modules\['))({old})(?=[\.\]'\s]|$)")
    for key in ("nn_module_stack", "fwd_nn_module_stack"):
        st = meta.get(key)
        if st:
            meta[key] = {k: (pat.sub(lambda mm: mm.group(1) + str(new), v[0]), *v[1:]) for k, v in st.items()}
    return meta


def expand(gm: fx.GraphModule, n_layers: int, middle: int | None = None, renumber: bool = True,
           prefix: str | None = None) -> Expansion:
    """A copy of the joint graph `gm` with n_layers layers of its repeated list, by cloning the segment
    of layer `middle` (default: the last layer but one) between it and the next."""
    gm = fx.GraphModule(gm, _copy_graph(gm.graph))
    graph = gm.graph
    lay = find_layers(graph, prefix)
    k = lay.count
    if sorted(lay.segments) != list(range(k)):
        raise ValueError(f"layers {sorted(lay.segments)} are not 0..{k - 1}")
    m = k - 2 if middle is None else middle
    if not 1 <= m <= k - 2:
        raise ValueError(f"middle layer {m} needs a layer on each side (captured {k})")
    why = isomorphic(lay, m, m + 1)
    if why:
        raise ValueError(f"layers {m} and {m + 1} differ: {why}")
    notes = []
    if lay.ambiguous:
        notes.append(f"{len(lay.ambiguous)} untagged nodes read several layers: {lay.ambiguous[:4]}")
    p = ports(lay, m)
    add = n_layers - k
    if add < 0:
        raise ValueError(f"cannot expand {k} captured layers to {n_layers}")
    seg, nxt = lay.segments[m], lay.segments[m + 1]
    own = lay.params.get(m, [])
    fwd = [n for n in seg if n not in lay.backward]
    bwd = [n for n in seg if n in lay.backward]
    # the new layers' parameters: after layer m's own, in layer order (as Dynamo lifts them)
    new_params: list[list[fx.Node]] = []
    anchor = own[-1] if own else next(n for n in graph.nodes if n.op == "placeholder")
    for t in range(add):
        row = []
        for q in own:
            with graph.inserting_after(anchor):
                ph = graph.placeholder(f"primals_x{m + 1 + t}_{q.name}")
            ph.meta = _renumber(q.meta, lay.prefix, m, m + 1 + t) if renumber else dict(q.meta)
            ph.meta[COPY_OF] = (lay.prefix, m + 1 + t, q.name)   # (its list, its layer, the placeholder it copies)
            anchor = ph
            row.append(ph)
        new_params.append(row)
    clones: list[list[fx.Node | None]] = [[None] * len(seg) for _ in range(add)]
    pos = {n: i for i, n in enumerate(seg)}

    def layer_nodes(t: int) -> list:    # chain position t: 0 is layer m, 1..add clones, add+1 layer m+1
        if t == 0:
            return seg
        if t == add + 1:
            return nxt
        return clones[t - 1]

    def clone(t: int, n: fx.Node) -> fx.Node:     # t: 1..add
        i = pos[n]
        flat = _flat(n)
        new_flat = []
        for li, x in enumerate(flat):
            if not isinstance(x, fx.Node):
                new_flat.append(x)
            elif x in pos:
                y = clones[t - 1][pos[x]]
                assert y is not None, (n.name, x.name)
                new_flat.append(y)
            elif (i, li) in p.prev:
                new_flat.append(layer_nodes(t - 1)[p.prev[(i, li)]])
            elif (i, li) in p.next:
                new_flat.append(layer_nodes(t + 1)[p.next[(i, li)]])
            elif (i, li) in p.param:
                new_flat.append(new_params[t - 1][p.param[(i, li)]])
            else:
                new_flat.append(x)
        it = iter(new_flat)
        args = _rebuild(n.args, it)
        kwargs = {kk: _rebuild(v, it) for kk, v in sorted(n.kwargs.items())}
        new = graph.create_node(n.op, n.target, args, kwargs, name=n.name + f"_x{m + t}")
        new.meta = _renumber(n.meta, lay.prefix, m, m + t) if renumber else dict(n.meta)
        return new

    # forwards in chain order after layer m's forward; backwards in reverse chain order before layer m's
    after = fwd[-1]
    for t in range(1, add + 1):
        for n in fwd:
            with graph.inserting_after(after):
                after = clones[t - 1][pos[n]] = clone(t, n)
    before = bwd[0] if bwd else None
    for t in range(add, 0, -1):
        for n in bwd:
            with graph.inserting_before(before):
                clones[t - 1][pos[n]] = clone(t, n)
    # rewire: layer m's upstream gradients now come from the first clone; layer m+1 reads the last clone
    if add > 0:
        for (i, li), r in p.next.items():
            _set_leaf(seg[i], li, clones[0][r])
        pos_m_set = set(seg)
        for i, n in enumerate(nxt):
            for li, x in enumerate(_flat(n)):
                if isinstance(x, fx.Node) and x in pos_m_set:
                    _set_leaf(n, li, clones[-1][pos[x]])
        if renumber:     # layers after m move up by `add`
            for j in range(m + 1, k):
                for n in lay.segments[j] + lay.params.get(j, []):
                    n.meta = _renumber(n.meta, lay.prefix, j, j + add)
    # gradient outputs of the new parameters, after layer m's own
    out = graph.find_nodes(op="output")[0]
    flat_out = list(out.args[0])
    primals = [n for n in graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    old_primals = [n for n in primals if not any(n in r for r in new_params)]
    n_fwd = len(flat_out) - len(old_primals)
    grads = dict(zip(old_primals, flat_out[n_fwd:]))
    for t, row in enumerate(new_params):
        for q, ph in zip(own, row):
            g = grads[q]
            if g is None:
                grads[ph] = None
            elif g in pos:
                grads[ph] = clones[t][pos[g]]
            else:
                raise ValueError(f"the gradient of {q.name} ({g}) is not computed in layer {m}")
    out.args = (flat_out[:n_fwd] + [grads[n] for n in primals],) + tuple(out.args[1:])
    try:
        graph.lint()
    except RuntimeError:     # a layer's nodes interleave with the next one's: order by inputs
        notes.append(f"reordered {_stable_toposort(graph)} nodes (layers interleave)")
        graph.lint()
    gm.recompile()
    copies = {ph.name: (m + 1 + t, q.name) for t, row in enumerate(new_params) for q, ph in zip(own, row)}
    return Expansion(gm, lay.prefix, m, add, p, notes, [n.name for n in old_primals], copies)


def _rebuild(a: Any, it: Iterator) -> Any:
    if isinstance(a, (tuple, list)):
        return tuple(_rebuild(x, it) for x in a) if isinstance(a, tuple) else [_rebuild(x, it) for x in a]
    if isinstance(a, dict):
        return {k: _rebuild(v, it) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_rebuild(a.start, it), _rebuild(a.stop, it), _rebuild(a.step, it))
    return next(it)


def _set_leaf(n: fx.Node, li: int, new: fx.Node) -> None:
    flat = _flat(n)
    flat[li] = new
    it = iter(flat)
    args = _rebuild(n.args, it)
    kwargs = {k: _rebuild(v, it) for k, v in sorted(n.kwargs.items())}
    n.args, n.kwargs = tuple(args), {k: kwargs[k] for k in n.kwargs}


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    """A node-for-node copy keeping names and meta (the original joint stays as captured)."""
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    out = new.graph_copy(graph, env)
    new.output(out)
    for old, n in env.items():
        n.meta = dict(old.meta)
    return new


# -- comparisons -------------------------------------------------------------------------------------
def op_counts(graph: fx.Graph) -> collections.Counter:
    return collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")


def phase_counts(graph: fx.Graph) -> collections.Counter:
    return collections.Counter((n.meta.get("partitioner_tag"), str(n.target)) for n in graph.nodes
                               if n.op == "call_function")
