"""Two steps that compute the same thing on different devices, matched op by op
(:func:`match`), and a plan of one in the other's names (:func:`map_plan`):
what lets a replicated step's replicas share one search
(:mod:`tfswap.core.carry` fits the mapped plan to the other step).

The replicas' names do not line up (TensorFlow names the second replica's ops
``replica_1/...``, its optimizer's ``adam/update_1...`` where the first's are
``adam/update_0...``, and suffixes ``_1`` where a name is taken), and their
graphs need not be identical (the first replica holds the step's outputs, the
second a ``NoOp`` that groups its cross-device control edges), so the match is
structural.  Each op gets a *forward hash*: its type, phase and outputs (bytes,
dtype, shape, kind, whether swappable, and for a pooled tensor the output it
shares a buffer with) and the hashes of what it reads, as a multiset (Grappler
orders a commutative op's inputs by name, and names differ).  Two ops of equal
hashes compute the same thing from inputs made the same way, so a difference
between the graphs changes the hashes of the ops that depend on it, never the
rest.  What TensorFlow decides at run time is left out: which buffer a small
tensor shares (the forwards the trace saw), and the control edges, which the
lowering draws from those forwards and from the order the trace ran (one
replica's ``Square`` ran after its ``Sub`` read their shared input, the other's
before).  The plan does not depend on slots or on those edges: the schedule
carried is made topological for the other graph's own edges.

Ops whose hash is unique on both sides are paired first; pairs then pair their
producers of one hash (the ops of one hash that only their readers tell apart,
such as two variables' reads of one shape) and their readers of one hash where a
single one is left on each side; ops still alike are paired in each graph's
order.  Every pair is then checked: an op stays matched *exactly* only where its
inputs are its partner's, from exactly matched producers, so those pairs are a
partial isomorphism of the data edges whatever a hash collision or an ambiguous
pairing did.  Last, what a difference changed the hashes of (everything after
an op that Grappler rewrote on one replica alone) is paired by its neighbours:
from each pair, a reader or producer alike apart from what it reads, where one
such candidate is left (``Match.exact`` tells the two kinds apart).  No names
and no op times are compared (the times are each replica's own).

Example::

    m = match(first.graph, other.graph)
    if m.coverage >= MIN_COVERAGE:
        plan_there, dropped = map_plan(plan, first.graph, other.graph, m)
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter, defaultdict
from dataclasses import dataclass

from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Plan

# Below this share of the other graph's ops matched, the graphs are taken as
# different steps, and a plan is not carried (it would be mostly a guess).
MIN_COVERAGE = 0.95


@dataclass(frozen=True)
class Match:
    """Ops and tensors of graph ``a`` paired with graph ``b``'s (by name), and
    what each has that the other lacks.  ``exact``: ``a``'s ops whose pairing
    is exact (its inputs are its partner's, from exactly paired producers); the
    others were paired by their place among exact pairs (a neighbour that
    Grappler rewrote differently on one replica, say)."""

    ops: dict            # a's op name -> b's
    tensors: dict        # a's tensor name -> b's (the outputs of matched ops)
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    exact: frozenset = frozenset()

    @property
    def coverage(self) -> float:
        """The share of ``b``'s ops matched (1.0: every one)."""
        total = len(self.ops) + len(self.only_b)
        return len(self.ops) / total if total else 1.0

    def describe(self) -> str:
        loose = len(self.ops) - len(self.exact)
        return (f"{len(self.ops)} of {len(self.ops) + len(self.only_b)} ops matched"
                + (f", {loose} of them by their neighbours" if loose else "")
                + (f"; {len(self.only_a)} only on the first, {len(self.only_b)} only here"
                   if self.only_a or self.only_b else ""))


def _local(graph: DataflowGraph, op) -> tuple:
    """What an op is, apart from what it reads: type, phase, outputs' bytes,
    dtypes, shapes and whether they can be swapped."""
    return (op.type, op.phase, tuple(
        (t.nbytes, t.dtype, tuple(t.shape), t.swappable)
        for t in (graph.tensors[graph.tensor_id(name)] for name in op.outputs)))


def forward_hashes(graph: DataflowGraph) -> list[int]:
    """Each op's forward hash (see the module's docstring), by op index."""
    tensors, ops = graph.tensors, graph.ops
    out_index = {}
    for op in ops:
        for k, name in enumerate(op.outputs):
            out_index[name] = k
    h = [0] * len(ops)
    for i in graph.topological_order():
        op = ops[i]
        reads = sorted((h[tensors[graph.tensor_id(name)].producer], out_index[name])
                       for name in op.inputs)
        h[i] = hash((_local(graph, op), tuple(reads)))
    return h


def match(a: DataflowGraph, b: DataflowGraph) -> Match:
    """The structural match of ``a``'s ops with ``b``'s (see the module's docstring)."""
    ha, hb = forward_hashes(a), forward_hashes(b)
    by_a, by_b = defaultdict(list), defaultdict(list)
    for i, x in enumerate(ha):
        by_a[x].append(i)
    for j, x in enumerate(hb):
        by_b[x].append(j)
    pair: dict[int, int] = {}
    taken: set[int] = set()
    queue: list[tuple[int, int]] = []

    def join(i: int, j: int) -> None:
        if i in pair or j in taken or ha[i] != hb[j]:
            return
        pair[i] = j
        taken.add(j)
        queue.append((i, j))

    readers_a, readers_b = _readers(a), _readers(b)
    producers_a, producers_b = _producers(a), _producers(b)

    def spread() -> None:
        while queue:
            i, j = queue.pop()
            # Producers of one hash, in order (the hashes guarantee as many each side).
            pa = _grouped(producers_a[i], lambda p: ha[p[0]])
            pb = _grouped(producers_b[j], lambda p: hb[p[0]])
            for x, members in pa.items():
                for (p, _), (q, _) in zip(members, pb.get(x, ())):
                    join(p, q)
            # Readers of one hash, reading one output: where one is left each side.
            ra = _grouped([r for r in readers_a[i] if r[0] not in pair],
                          lambda r: (ha[r[0]], r[1]))
            rb = _grouped([r for r in readers_b[j] if r[0] not in taken],
                          lambda r: (hb[r[0]], r[1]))
            for key, members in ra.items():
                if len(members) == 1 and len(rb.get(key, ())) == 1:
                    join(members[0][0], rb[key][0][0])

    for x, members in by_a.items():
        if len(members) == 1 and len(by_b.get(x, ())) == 1:
            join(members[0], by_b[x][0])
    spread()
    # What only its position tells apart: paired in each graph's order, the
    # classes of later ops first, so that their producers follow from them.
    for x in sorted(by_a, key=lambda x: -max(by_a[x])):
        left_a = [i for i in by_a[x] if i not in pair]
        left_b = [j for j in by_b.get(x, ()) if j not in taken]
        for i, j in zip(left_a, left_b):
            join(i, j)
            spread()
    exact = _consistent(a, b, pair)
    pair = dict(exact)
    _by_neighbours(a, b, pair, readers_a, readers_b, producers_a, producers_b)
    ops = {a.ops[i].name: b.ops[j].name for i, j in sorted(pair.items())}
    tensors = {}
    for i, j in pair.items():
        for ta, tb in zip(a.ops[i].outputs, b.ops[j].outputs):
            tensors[ta] = tb
    matched_b = set(pair.values())
    return Match(ops, tensors, tuple(op.name for i, op in enumerate(a.ops) if i not in pair),
                 tuple(op.name for j, op in enumerate(b.ops) if j not in matched_b),
                 frozenset(a.ops[i].name for i in exact))


def _by_neighbours(a, b, pair: dict[int, int], readers_a, readers_b, producers_a,
                   producers_b) -> None:
    """Pair (into ``pair``) the ops left whose forward hashes differ because
    something they depend on does (an op Grappler rewrote on one replica and not
    on the other): from every pair, its unpaired readers of one output, and its
    unpaired producers, that are alike apart from what they read
    (:func:`_local`) and read what their partner reads wherever what they read
    is paired, where one such candidate is left; then from those pairs in turn."""
    taken = set(pair.values())
    local_a = [_local(a, op) for op in a.ops]
    local_b = [_local(b, op) for op in b.ops]
    reads_b = [Counter(producers_b[j]) for j in range(len(b.ops))]

    def fits(p: int, q: int) -> bool:
        """Whether ``q`` reads what ``p``'s paired producers map to."""
        need = Counter((pair[x], k) for x, k in producers_a[p] if x in pair)
        return not need - reads_b[q]

    queue = list(pair.items())
    while queue:
        i, j = queue.pop()
        for near_a, near_b in ((readers_a[i], readers_b[j]), (producers_a[i], producers_b[j])):
            ga = _grouped([r for r in near_a if r[0] not in pair],
                          lambda r: (local_a[r[0]], r[1]))
            gb = _grouped([r for r in near_b if r[0] not in taken],
                          lambda r: (local_b[r[0]], r[1]))
            for key, members in ga.items():
                for p, _ in members:
                    if p in pair:
                        continue
                    left = [q for q, _ in gb.get(key, ()) if q not in taken]
                    if len(members) > 1 or len(left) > 1:
                        left = [q for q in left if fits(p, q)]
                    if len(left) == 1:
                        q = left[0]
                        pair[p] = q
                        taken.add(q)
                        queue.append((p, q))


def _readers(graph: DataflowGraph) -> list[list[tuple[int, int]]]:
    """Each op's readers: (reader, the output it reads; -1 for a control edge),
    by op index."""
    out = [[] for _ in graph.ops]
    for r, op in enumerate(graph.ops):
        for name in dict.fromkeys(op.inputs):
            t = graph.tensors[graph.tensor_id(name)]
            out[t.producer].append((r, graph.ops[t.producer].outputs.index(name)))
        for c in op.control_inputs:
            out[graph.op_id(c)].append((r, -1))
    return out


def _producers(graph: DataflowGraph) -> list[list[tuple[int, int]]]:
    """Each op's producers: (producer, its output read), one per input, by op index."""
    out = []
    for op in graph.ops:
        row = []
        for name in op.inputs:
            t = graph.tensors[graph.tensor_id(name)]
            row.append((t.producer, graph.ops[t.producer].outputs.index(name)))
        out.append(row)
    return out


def _grouped(items, key) -> dict:
    out = defaultdict(list)
    for item in items:
        out[key(item)].append(item)
    return out


def _consistent(a: DataflowGraph, b: DataflowGraph, pair: dict[int, int]) -> dict[int, int]:
    """``pair`` less every pair whose inputs are not its partner's (as multisets,
    from matched producers) or whose outputs differ, in topological order, so
    that a pair dropped drops what reads it."""
    kept: dict[int, int] = {}
    for i in a.topological_order():
        if i not in pair:
            continue
        j = pair[i]
        oa, ob = a.ops[i], b.ops[j]
        if _local(a, oa) != _local(b, ob) or len(oa.inputs) != len(ob.inputs):
            continue
        if sorted(str(_mapped_tensor(a, b, kept, t)) for t in oa.inputs) == sorted(ob.inputs):
            kept[i] = j
    return kept


def _mapped_tensor(a, b, kept, name: str) -> str | None:
    t = a.tensors[a.tensor_id(name)]
    j = kept.get(t.producer)
    if j is None:
        return None
    return b.ops[j].outputs[a.ops[t.producer].outputs.index(name)]


class CarryError(ValueError):
    """A plan that cannot be carried across a match (a name it needs is unmatched)."""


def map_plan(plan: Plan, a: DataflowGraph, b: DataflowGraph, m: Match) -> tuple[Plan, int]:
    """``plan`` (of graph ``a``) for graph ``b`` across ``m``: its schedule in
    ``b``'s names (``b``'s ops that ``a`` lacks placed as soon as what they read
    has run), its swaps and recomputations of the matched tensors mapped onto
    their partners, its resident parameters mapped, its pool as it is.  (plan,
    swaps dropped): a swap naming an op or tensor ``a`` alone has is dropped
    (with the waits of others on it), and so is a recomputation whose ops are not
    all matched exactly (run again there, they would read other values).  Its
    prediction is ``plan``'s: the caller simulates it on ``b``."""
    position = {name: k for k, name in enumerate(plan.schedule)}
    rank = {}
    for name_a, name_b in m.ops.items():
        if name_a in position:
            rank[b.op_id(name_b)] = position[name_a]
    schedule = tuple(b.ops[i].name for i in _following(b, rank))
    op_map, tensor_map = m.ops, m.tensors

    def op(name: str) -> str:
        if not name:
            return ""
        if name not in op_map:
            raise CarryError(name)
        return op_map[name]

    def tensor(name: str) -> str:
        if name not in tensor_map:
            raise CarryError(name)
        return tensor_map[name]

    def swap_id(sid: str) -> str:
        # A planner's id is a tensor's name, "#n" after it for its later moves;
        # a finished plan's parts add "|" and the value each carries.
        parts = []
        for part in sid.split("|"):
            base, sep, n = part.partition("#")
            parts.append(tensor(base) + sep + n)
        return "|".join(parts)

    swaps, ids, dropped = [], {}, 0
    for sw in plan.swaps:
        if sw.kind == "recompute" and not all(
                x in m.exact for x in (sw.tensor.rpartition(":")[0],) + sw.ops):
            dropped += 1   # its ops would read what their partners do not
            continue
        try:
            new = dataclasses.replace(
                sw, tensor=tensor(sw.tensor), out_after=op(sw.out_after),
                in_after=op(sw.in_after), consumers=tuple(op(c) for c in sw.consumers),
                out_before=tuple(op(c) for c in sw.out_before),
                ops=tuple(op(c) for c in sw.ops), id=swap_id(sw.id))
        except CarryError:
            dropped += 1
            continue
        ids[sw.id] = new.id
        swaps.append(new)
    swaps = [dataclasses.replace(sw, in_wait_for=tuple(ids[w] for w in sw.in_wait_for
                                                       if w in ids)) for sw in swaps]
    resident = tuple(tensor_map[t] for t in plan.resident_parameters if t in tensor_map)
    return dataclasses.replace(plan, schedule=schedule, swaps=tuple(swaps),
                               resident_parameters=resident), dropped


def _following(graph: DataflowGraph, rank: dict[int, int]) -> list[int]:
    """A topological order of ``graph`` in ``rank``'s order (op index -> position);
    an op without a rank runs as soon as it is ready, right after the last of its
    predecessors."""
    indeg, succ = [0] * len(graph.ops), [[] for _ in graph.ops]
    for i in range(len(graph.ops)):
        for p in graph.predecessors(i):
            indeg[i] += 1
            succ[p].append(i)
    key = {}

    def key_of(i: int) -> float:
        return rank[i] if i in rank else key.get(i, -1) + 0.5

    ready = [(key_of(i), i) for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k, i = heapq.heappop(ready)
        order.append(i)
        for s in succ[i]:
            key[s] = max(key.get(s, -1), k)
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (key_of(s), s))
    if len(order) != len(graph.ops):
        raise ValueError("the graph has a cycle")
    return order


__all__ = ["CarryError", "MIN_COVERAGE", "Match", "forward_hashes", "map_plan", "match"]
