"""Program: a swap plan as positions and buffer ids (what the simulator runs).

A :class:`~tfswap.core.plan.Plan` names ops and tensors; a Program is the
same plan on a :class:`~tfswap.core.compiled.CompiledGraph`'s numbering, in
the canonical order both streams execute: swap-outs (device-to-host copies
and drops) sorted by (``out_after`` position, buffer), swap-ins sorted by
(first-reader position, buffer).  The planner builds Programs, the simulator
runs them, and :func:`to_plan_swaps` / :func:`from_plan` convert both ways
(in time linear in the plan's size, up to sorting).

Example::

    swaps, resident = to_plan_swaps(cg, prog)
    assert from_plan(cg, schedule_names, swaps, resident) == prog
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np

from tfswap.core.allocation import size_class_of
from tfswap.core.compiled import CompiledGraph
from tfswap.core.plan import Allocation, Swap

START = -1  # "with the step": a trigger or release before the first op


@dataclass(frozen=True)
class OutRec:
    """The device copy of ``buf`` is released after the op at ``out_after``:
    by a device-to-host copy (``copy``) or by discarding it (a drop)."""
    buf: int
    out_after: int
    copy: bool


@dataclass(frozen=True)
class InRec:
    """``buf`` is copied to the device for the reader at position ``need``.

    Starts once the op at ``trigger`` has run (START: with the step) and the
    swap-outs ``waits`` (indices into ``Program.outs``) have finished; ``own_out``
    is the swap-out of the same buffer this copy brings back (-1: from the
    host home of a parameter).
    """
    buf: int
    trigger: int
    waits: tuple[int, ...]
    own_out: int
    need: int


@dataclass(frozen=True)
class RecomputeRec:
    """``buf``'s producer runs again on the compute stream right before the op at
    ``need``; ``drop`` (an index into ``Program.outs``, a drop) discarded the copy.
    ``ops``: the op ids run again, in order (the producer, then the ops that
    wrote its buffer in place); empty: the producer alone.  ``need`` may come
    before the buffer's first reader after ``drop`` (the plan's ``in_after``):
    there it shares the ops another remake before the same op runs
    (:mod:`tfswap.core.simulator`)."""
    buf: int
    drop: int
    need: int
    ops: tuple[int, ...] = ()


def recompute_ops(cg: CompiledGraph, rec: RecomputeRec) -> tuple[int, ...]:
    """The op ids ``rec`` runs again, in order."""
    if rec.ops:
        return rec.ops
    op = _producers(cg)[rec.buf]
    if op < 0:
        raise ValueError(f"buffer {cg.buf_names[rec.buf]!r} has no producer to run again")
    return (int(op),)


def fresh_copies(cg: CompiledGraph, order, rec: RecomputeRec) -> dict[int, int]:
    """The buffers ``rec``'s ops make that the step still holds at its ``need``
    (another value written over in place since, another output of an op it
    runs), each mapped to the fresh copy (``cg.buf_fresh``) the chain makes it
    in instead, held while the chain runs.  :func:`tfswap.core.recompute.value_chain`
    decides by the same rule, so this is what any chain it gave makes."""
    return recompute_copies(cg, order, (rec,))[0]


def recompute_copies(cg: CompiledGraph, order, recs) -> list[dict[int, int]]:
    """:func:`fresh_copies` of each of ``recs`` (one program's), worked out once
    per order and record: every simulation of the recomputation pass asks."""
    if not recs:
        return []
    if not _has_copies(cg):
        return [{} for _ in recs]
    cache = cg.memo("fresh_copies", id(order), lambda: (order, {}))
    if cache[0] is not order:   # another order at the same address
        cache = (order, {})
        cg.cache("fresh_copies")[id(order)] = cache
    got, last = cache[1], None
    out = []
    fresh = cg.buf_fresh
    for rec in recs:
        key = (rec.buf, rec.need, rec.ops)
        copies = got.get(key)
        if copies is None:
            ops = recompute_ops(cg, rec)
            if last is None and any(fresh[x] >= 0 for p in ops
                                    for x in cg.op_out[cg.op_out_ptr[p]:cg.op_out_ptr[p + 1]]):
                last = last_uses(cg, order)
            copies = got[key] = chain_copies(cg, ops, rec.buf, rec.need, last) if last else {}
        out.append(copies)
    return out


def chain_copies(cg: CompiledGraph, ops, buf: int, need: int, last_use) -> dict[int, int]:
    """The rule of :func:`fresh_copies` for ops that make ``buf`` again before
    position ``need``: each other buffer they make that is used at or after
    ``need`` (``last_use``: :func:`last_uses` of the order) -> its fresh copy."""
    fresh = cg.buf_fresh
    return {int(x): int(fresh[x]) for p in ops
            for x in cg.op_out[cg.op_out_ptr[p]:cg.op_out_ptr[p + 1]]
            if x != buf and fresh[x] >= 0 and last_use[x] >= need}


def _has_copies(cg: CompiledGraph) -> bool:
    return cg.memo("has_copies", None, lambda: bool((cg.buf_fresh >= 0).any()), keep=None)


def last_uses(cg: CompiledGraph, order) -> list[int]:
    """The last position in ``order`` each buffer is read or made at (-1: never),
    kept on ``cg`` for the last few orders."""
    def make() -> list[int]:
        last = [-1] * cg.n_buffers
        in_ptr, op_in, out_ptr, op_out = cg.op_in_ptr, cg.op_in, cg.op_out_ptr, cg.op_out
        for k, op in enumerate(order):
            for b in op_in[in_ptr[op]:in_ptr[op + 1]]:
                last[int(b)] = k
            for b in op_out[out_ptr[op]:out_ptr[op + 1]]:
                last[int(b)] = max(last[int(b)], k)
        return last

    # Programs carry their order as a tuple of ints: the key as it is (built
    # afresh, a long order's tuple cost more than the lookup saves).
    key = order if type(order) is tuple else tuple(int(o) for o in order)
    return cg.memo("last_uses", key, make)


def _producers(cg: CompiledGraph) -> np.ndarray:
    """The first op writing each buffer (-1: none), kept on ``cg``."""
    def make() -> np.ndarray:
        got = np.full(cg.n_buffers, -1, dtype=np.int64)
        for op in range(cg.n_ops - 1, -1, -1):
            got[cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]]] = op
        return got

    return cg.memo("producers", None, make, keep=None)


@dataclass(frozen=True)
class Program:
    order: tuple[int, ...]            # op ids in schedule order
    resident: tuple[int, ...]         # persistent buffers on the device at start (sorted)
    outs: tuple[OutRec, ...]
    ins: tuple[InRec, ...]
    op_waits: tuple[tuple[int, int], ...]  # (position, out index): op waits for the out
    # Sorted by (need, the position of the last op run again, buffer): at one
    # position a remake that reads another's buffer comes after it.
    recomputes: tuple[RecomputeRec, ...] = ()


def canonical(order, resident, outs, ins, op_waits, recomputes=()) -> Program:
    """Sort records into stream order and renumber the references between them."""
    operm = sorted(range(len(outs)), key=lambda j: (outs[j].out_after, outs[j].buf))
    new_of = {old: new for new, old in enumerate(operm)}
    outs_sorted = tuple(outs[j] for j in operm)
    ins_sorted = tuple(sorted(
        (InRec(r.buf, r.trigger, tuple(sorted(new_of[w] for w in r.waits)),
               new_of[r.own_out] if r.own_out >= 0 else -1, r.need) for r in ins),
        key=lambda r: (r.need, r.buf)))
    waits = tuple(sorted((k, new_of[j]) for k, j in op_waits))
    order = tuple(order.tolist()) if isinstance(order, np.ndarray) else tuple(map(int, order))
    recs = _recompute_order(order, (RecomputeRec(r.buf, new_of[r.drop], r.need, tuple(r.ops))
                                    for r in recomputes))
    return Program(order, tuple(sorted(resident)), outs_sorted,
                   ins_sorted, waits, recs)


def _recompute_order(order, recs, ops_of=lambda r: r.ops) -> tuple[RecomputeRec, ...]:
    """``recs`` in stream order: by position, then by the position of the last op each
    runs again (``ops_of``), then by buffer.  A remake's ops read another remake's
    buffer only where that one's ops make it before theirs, so at one position the
    one read comes first (a segment made again forward)."""
    recs = list(recs)
    if not recs:
        return ()
    needs = [r.need for r in recs]
    if len(set(needs)) == len(needs):   # one per position: nothing else to order by
        return tuple(sorted(recs, key=lambda r: (r.need, r.buf)))
    pos, lasts = _positions(order)

    def last(r) -> int:
        if not r.ops:   # the producer alone (ops_of says which)
            return max((pos.get(o, -1) for o in ops_of(r)), default=-1)
        got = lasts.get(r.ops)
        if got is None:
            got = lasts[r.ops] = max((pos.get(o, -1) for o in r.ops), default=-1)
        return got

    return tuple(sorted(recs, key=lambda r: (r.need, last(r), r.buf)))


# id(order) -> (order, op -> position, ops -> their last position): the last few.
_POSITIONS: dict[int, tuple] = {}
_POSITIONS_LOCK = threading.Lock()


def _positions(order) -> tuple[dict, dict]:
    """Each op's position in ``order``, and a cache of the last position of a
    recomputation's ops (kept for the last few orders, by identity: the
    recomputation pass orders the records of many trials of one order)."""
    with _POSITIONS_LOCK:   # background searches (one per step signature) share it
        got = _POSITIONS.get(id(order))
        if got is None or got[0] is not order:
            got = (order, {op: k for k, op in enumerate(order)}, {})
            if len(_POSITIONS) >= 8:
                _POSITIONS.pop(next(iter(_POSITIONS)))
            _POSITIONS[id(order)] = got
        return got[1], got[2]


def remade_for_remakes(cg: CompiledGraph, prog: Program) -> tuple[RecomputeRec, ...]:
    """``prog``'s recomputations, each one whose buffer an earlier one's ops read
    (dropped before that one runs) made at that one's position instead, and so on
    through what it reads: a segment, made again forward from what is on the
    device, the buffers then held for their own readers.  A Plan does not store
    this (a recomputation's consumers are its buffer's readers): :func:`from_plan`
    derives it again through :func:`inputs_back`, and so does the TF rewrite."""
    recs = list(prog.recomputes)
    if len(recs) < 2:
        return tuple(recs)
    by_buf: dict[int, list[int]] = {}
    for i, r in enumerate(recs):
        by_buf.setdefault(r.buf, []).append(i)
    cache = cg.cache("remake_reads")
    todo = list(range(len(recs)))
    moved = False
    while todo:
        ry = recs[todo.pop()]
        key = (ry.buf, ry.ops)
        reads = cache.get(key)
        if reads is None:   # what its ops read but do not make, ascending
            ops = recompute_ops(cg, ry)
            made = {int(x) for p in ops
                    for x in cg.op_out[cg.op_out_ptr[p]:cg.op_out_ptr[p + 1]]}
            reads = cache[key] = sorted({int(x) for p in ops
                                         for x in cg.op_in[cg.op_in_ptr[p]:cg.op_in_ptr[p + 1]]}
                                        - made)
        for x in reads:
            for i in by_buf.get(x, ()):
                r = recs[i]
                if r.need > ry.need and prog.outs[r.drop].out_after < ry.need:
                    recs[i] = RecomputeRec(r.buf, r.drop, ry.need, r.ops)
                    todo.append(i)
                    moved = True
    if not moved:   # a program's records are in stream order already (canonical)
        return prog.recomputes
    return _recompute_order(prog.order, recs, lambda r: recompute_ops(cg, r))


def inputs_back(cg: CompiledGraph, prog: Program, only=None) -> Program:
    """``prog`` with the inputs of each recomputation on the device when it runs.

    A recomputed op reads its inputs right before the op at its ``need``.  An
    input the plan swapped out before then and brings back only for a later
    reader is brought back for the recomputation instead: its swap-in's
    ``need`` becomes the recomputation's, and its trigger at the latest the op
    just before (the copy may then hold up the compute stream; the simulator
    prices it).  A Plan does not store this: :func:`from_plan` derives it again.

    ``only``: the recomputations of ``prog`` to do this for, in stream order,
    where ``prog`` is one this was done for already and these were added (the
    others would move nothing: a swap-in they move is needed by them at the
    latest, and the ones added only bring needs earlier).
    """
    if not prog.recomputes:
        return prog
    remade = remade_for_remakes(cg, prog)
    if only is not None and {(r.buf, r.need) for r in remade} != \
            {(r.buf, r.need) for r in prog.recomputes}:
        only = None   # a segment moved a recomputation ``prog`` had: all of them again
    prog = Program(prog.order, prog.resident, prog.outs, prog.ins, prog.op_waits, remade)
    recomputes = prog.recomputes if only is None else only
    ins = list(prog.ins)
    # The swap-ins of each buffer some recomputation reads, by index (an input
    # is looked up among its own buffer's, in the order of a scan of them all).
    reads = [(rec, _recompute_inputs(cg, rec)) for rec in recomputes]
    wanted = {x for _, inputs in reads for x in inputs}
    of_buf: dict[int, list[int]] = {}
    for i, r in enumerate(ins):
        if r.buf in wanted and r.own_out >= 0:
            of_buf.setdefault(r.buf, []).append(i)
    moved = False
    if of_buf:
        outs = prog.outs
        for rec, inputs in reads:
            for x in inputs:
                for i in of_buf.get(x, ()):
                    r = ins[i]
                    if r.need > rec.need and outs[r.own_out].out_after < rec.need:
                        ins[i] = InRec(r.buf, min(r.trigger, rec.need - 1), r.waits, r.own_out,
                                       rec.need)
                        moved = True
    return Program(prog.order, prog.resident, prog.outs,
                   tuple(sorted(ins, key=lambda r: (r.need, r.buf))) if moved else prog.ins,
                   prog.op_waits, prog.recomputes)


def _recompute_inputs(cg: CompiledGraph, rec: RecomputeRec) -> list[int]:
    """The buffers ``rec``'s ops read but ``rec.buf``, ascending (kept on ``cg``: the
    recomputation pass asks for the same ones for every trial program)."""
    cache = cg.cache("recompute_inputs")
    key = (rec.buf, rec.ops)
    got = cache.get(key)
    if got is None:
        ops = recompute_ops(cg, rec)
        made = {int(x) for p in ops for x in cg.op_out[cg.op_out_ptr[p]:cg.op_out_ptr[p + 1]]}
        got = cache[key] = sorted({int(x) for p in ops
                                   for x in cg.op_in[cg.op_in_ptr[p]:cg.op_in_ptr[p + 1]]}
                                  - made - {rec.buf})
    return got


def copy_on_write_holds(cg: CompiledGraph, prog: Program) -> tuple[tuple[int, int, int], ...]:
    """(persistent buffer, first position, last position) for each value a remake
    reads in a buffer the step keeps (a variable's) after an op that waits for
    the op reading it has run: a control edge orders what the data does not
    show, a variable's update after the ops that read it (the TF lowering), and
    a remake runs such a reader again after the update.  TensorFlow then keeps
    the value read for the remake and the update writes a copy of the variable
    (copy-on-write where the buffer has another reference): the buffer's bytes
    once more, from that op's position to the last such remake's (BERT-style
    at 40% on a 50 MB/s link: 256 KiB the model had missed, an input gradient's
    MatMul made again after Adam's AssignSub of its weight)."""
    if not prog.recomputes:
        return ()
    graph = cg.graph
    waited_at: dict[int, int] = {}   # op -> the first position of an op waiting for it
    for k, op in enumerate(prog.order):
        for name in graph.ops[int(op)].control_inputs:
            c = graph.op_id(name)
            waited_at[c] = min(waited_at.get(c, k), k)
    held: dict[int, list[int]] = {}
    for rec in prog.recomputes:
        for op in recompute_ops(cg, rec):
            at = waited_at.get(int(op))
            if at is None or at >= rec.need:
                continue
            for x in cg.op_in[cg.op_in_ptr[op]:cg.op_in_ptr[op + 1]]:
                x = int(x)
                if cg.buf_persistent[x]:
                    span = held.setdefault(x, [at, rec.need])
                    span[0], span[1] = min(span[0], at), max(span[1], rec.need)
    return tuple(sorted((x, a, b) for x, (a, b) in held.items()))


def buffer_classes(cg: CompiledGraph, allocation: Allocation) -> np.ndarray:
    """Size class of every pool buffer under ``allocation`` (int32 [B])."""
    if allocation.small_threshold_bytes != cg.small_threshold_bytes:
        raise ValueError(f"the allocation's small threshold ({allocation.small_threshold_bytes} "
                         f"bytes) differs from the compiled graph's "
                         f"({cg.small_threshold_bytes}); compile with the same threshold")
    if cg.ts and (not allocation.class_bytes or cg.ts[-1] > allocation.class_bytes[-1]):
        size_class_of(allocation, cg.ts[-1])  # raises, saying what is wrong
    ts_class = np.searchsorted(np.asarray(allocation.class_bytes, dtype=np.int64),
                               np.asarray(cg.ts, dtype=np.int64), side="left").astype(np.int32)
    return ts_class[cg.buf_size_index] if cg.n_buffers else np.zeros(0, np.int32)


def to_plan_swaps(cg: CompiledGraph, prog: Program) -> tuple[tuple[Swap, ...], tuple[str, ...]]:
    """The Plan's swaps and resident parameters for ``prog``."""
    names = cg.graph.ops
    order = prog.order
    op_name = lambda k: names[order[k]].name  # noqa: E731
    uses = _uses_by_position(cg, prog)
    paired = {r.own_out: i for i, r in enumerate(prog.ins) if r.own_out >= 0}
    recomputed = {r.drop: r for r in prog.recomputes}
    entries = []   # (kind, out index or -1, in index or -1)
    for j, o in enumerate(prog.outs):
        if j in paired:
            entries.append(("round_trip", j, paired[j]))
        elif j in recomputed:
            entries.append(("recompute", j, -1))
        else:
            entries.append(("writeback" if o.copy else "drop", j, -1))
    entries += [("prefetch", -1, i) for i, r in enumerate(prog.ins) if r.own_out < 0]
    # In step order, so a tensor's first move gets the plain id.
    entries.sort(key=lambda e: (prog.outs[e[1]].out_after if e[1] >= 0 else prog.ins[e[2]].need,
                                e[1] < 0))
    ids, count = [], {}
    swap_of_out = {}
    for e, (kind, j, i) in enumerate(entries):
        buf = prog.outs[j].buf if j >= 0 else prog.ins[i].buf
        name = cg.buf_names[buf]
        n = count.get(name, 0)
        count[name] = n + 1
        ids.append(name if n == 0 else f"{name}#{n}")
        if j >= 0:
            swap_of_out[j] = e
    out_before: dict[int, list[str]] = {}
    for k, j in prog.op_waits:
        out_before.setdefault(j, []).append(op_name(k))
    # Positions after which each buffer leaves the device, ascending (outs are in
    # stream order), so a copy's readers are found by bisection, not by a scan.
    leaves: dict[int, list[int]] = {}
    nbytes = cg.buf_bytes.tolist()
    for o in prog.outs:
        leaves.setdefault(o.buf, []).append(o.out_after)
    swaps = []
    for e, (kind, j, i) in enumerate(entries):
        buf = prog.outs[j].buf if j >= 0 else prog.ins[i].buf
        consumers, in_after, waits = (), "", ()
        if i >= 0 or kind == "recompute":
            need = prog.ins[i].need if i >= 0 else recomputed[j].need
            after = leaves.get(buf, ())
            x = bisect_left(after, need)
            end = after[x] if x < len(after) else len(order)
            u = uses[buf]
            read_at = u[bisect_left(u, need):bisect_right(u, end)]
            consumers = tuple(op_name(k) for k in read_at)
        if i >= 0:
            r = prog.ins[i]
            in_after = op_name(r.trigger) if r.trigger >= 0 else ""
            waits = tuple(ids[swap_of_out[w]] for w in r.waits)
        elif kind == "recompute" and read_at and read_at[0] > need:
            # Made before its first reader (to share another remake's ops there, or
            # for a segment): the op just before says where.
            in_after = op_name(need - 1)
        swaps.append(Swap(
            tensor=cg.buf_names[buf], kind=kind, bytes=nbytes[buf], id=ids[e],
            out_after=op_name(prog.outs[j].out_after) if j >= 0 else "",
            out_before=tuple(out_before.get(j, ())) if j >= 0 else (),
            in_after=in_after, consumers=consumers, in_wait_for=waits,
            ops=tuple(names[o].name for o in recomputed[j].ops) if kind == "recompute"
            else ()))
    resident = tuple(cg.buf_names[b] for b in prog.resident if cg.buf_persistent[b])
    return tuple(swaps), resident


def _uses_by_position(cg: CompiledGraph, prog: Program) -> list[list[int]]:
    """Each buffer's positions in ``prog.order``, ascending: kept on ``cg`` for the
    last few orders (the planners convert many programs of one order); callers
    only read them."""
    order = prog.order
    if not isinstance(order, tuple):
        return _uses_of_order(cg, order)
    return cg.memo("uses_by_position", order, lambda: _uses_of_order(cg, order))


def _uses_of_order(cg: CompiledGraph, order) -> list[list[int]]:
    uses: list[list[int]] = [[] for _ in range(cg.n_buffers)]
    in_ptr, op_in = cg.op_in_ptr.tolist(), cg.op_in.tolist()
    out_ptr, op_out = cg.op_out_ptr.tolist(), cg.op_out.tolist()
    for k, op in enumerate(order):
        for b in op_in[in_ptr[op]:in_ptr[op + 1]]:
            uses[b].append(k)
        for b in op_out[out_ptr[op]:out_ptr[op + 1]]:
            uses[b].append(k)
    return uses


def needs_from_uses(cg: CompiledGraph, prog: Program) -> Program:
    """``prog`` with each copy brought back for the first op of its order that
    uses the buffer after it left (a parameter's fetch: after it was last
    dropped, else its first use), each recomputation made for that op, each
    trigger at the latest the op before it, each wait kept on the swap-outs that
    can finish before then; a copy or recomputation of a buffer that no op uses
    after it left is not made (its swap-out with it, where nothing else reads
    it back: the buffer dies after its last use, as any other).  A planner's
    program is so already (``prog`` itself is returned); a plan carried to
    another step's order (:mod:`tfswap.core.carry`) may name readers that are
    not the first there, miss one that reads the buffer there alone, or bring
    back what that step no longer reads."""
    uses = _uses_by_position(cg, prog)
    outs = prog.outs
    # (A copy brought back for a recomputation, :func:`inputs_back`, is needed by
    # no op of the order: it is moved back to its first reader here, and
    # inputs_back moves it again.)

    def first_use(buf: int, after: int) -> int | None:
        u = uses[buf]
        k = bisect_right(u, after)
        return u[k] if k < len(u) else None

    left: dict[int, list[int]] = {}   # each buffer's swap-out positions, ascending
    for o in outs:
        left.setdefault(o.buf, []).append(o.out_after)

    def last_left(buf: int, before: int) -> int:
        """Where ``buf`` last left the device before position ``before`` (a
        parameter's fetch after a drop), else START."""
        after = left.get(buf, ())
        k = bisect_left(after, before)
        return after[k - 1] if k else START

    ins, unread = [], set()   # unread: swap-outs whose buffer is not brought back
    for r in prog.ins:
        need = first_use(r.buf, outs[r.own_out].out_after if r.own_out >= 0
                         else last_left(r.buf, r.need))
        if need is None:
            unread.add(r.own_out)
            continue
        ins.append(InRec(r.buf, min(r.trigger, need - 1), r.waits, r.own_out, need))
    recs = []
    for r in prog.recomputes:
        need = first_use(r.buf, outs[r.drop].out_after)
        if need is None:
            unread.add(r.drop)
            continue
        if outs[r.drop].out_after < r.need < need:
            need = r.need   # made earlier on purpose (``in_after``: shared with another)
        recs.append(RecomputeRec(r.buf, r.drop, need, r.ops))
    # A swap-out another record still brings back stays (-1: a parameter's fetch).
    unread -= {r.own_out for r in ins} | {r.drop for r in recs} | {-1}
    kept = [j for j in range(len(outs)) if j not in unread]
    index = {j: k for k, j in enumerate(kept)}
    ins = [InRec(r.buf, r.trigger, tuple(index[w] for w in r.waits
                                         if w in index and outs[w].out_after < r.need),
                 index.get(r.own_out, -1), r.need) for r in ins]
    recs = [RecomputeRec(r.buf, index[r.drop], r.need, r.ops) for r in recs]
    waits = [(k, index[j]) for k, j in prog.op_waits if j in index and outs[j].out_after < k]
    fixed = inputs_back(cg, canonical(prog.order, prog.resident, [outs[j] for j in kept],
                                      ins, waits, recs))
    return prog if fixed == prog else fixed


def _schedule_lookup(cg: CompiledGraph, schedule):
    """``cg.order_of(schedule)``, each op's position by name, each tensor's buffer
    by name: kept on ``cg`` for the last few schedules (the recomputation pass
    reads every candidate plan of one or two schedules).  Callers only read them."""
    tbuf = cg.memo("tensor_buffers", None, lambda: {
        t.name: int(cg.tensor_buffer[i]) for i, t in enumerate(cg.graph.tensors)}, keep=None)

    def make():
        order = cg.order_of(schedule)
        order.flags.writeable = False
        return order, {cg.graph.ops[o].name: k for k, o in enumerate(order)}, tbuf

    return cg.memo("schedule_lookup", tuple(schedule) if schedule is not None else None, make)


def from_plan(cg: CompiledGraph, schedule, swaps, resident_parameters) -> Program:
    """The Program of a plan's schedule, swaps and resident parameters.

    ``resident_parameters`` None: every persistent buffer stays on the device
    (how version-1 plans, which predate parameter swapping, are read).
    """
    order, pos, tbuf = _schedule_lookup(cg, schedule)

    def where(op: str, what: str) -> int:
        if op not in pos:
            raise ValueError(f"{what} names op {op!r}, which is not in the schedule")
        return pos[op]

    if resident_parameters is None:
        resident = [b for b in range(cg.n_buffers) if cg.buf_persistent[b]]
    else:
        resident = []
        for name in resident_parameters:
            b = tbuf.get(name, -1)
            if b < 0 or not cg.buf_persistent[b]:
                raise ValueError(f"resident parameter {name!r} is not a pool parameter or "
                                 "optimizer-state tensor of this graph")
            resident.append(b)
        resident += [b for b in range(cg.n_buffers)
                     if cg.buf_persistent[b] and cg.buf_pinned[b] and b not in resident]
    outs, ins, op_waits, out_of_swap, recs = [], [], [], {}, []
    ids = {op.name: k for k, op in enumerate(cg.graph.ops)}
    for s in swaps:
        b = tbuf.get(s.tensor, -1)
        if b < 0:
            raise ValueError(f"swap {s.id!r}: tensor {s.tensor!r} is not a pool tensor of this "
                             "graph (unknown, or small enough for the small-tensor pool)")
        if s.kind != "prefetch":
            out_of_swap[s.id] = len(outs)
            outs.append(OutRec(b, where(s.out_after, f"swap {s.id!r}"),
                               s.kind not in ("drop", "recompute")))
            op_waits += [(where(o, f"swap {s.id!r}"), len(outs) - 1) for o in s.out_before]
            if s.kind == "recompute":
                unknown = [o for o in s.ops if o not in ids]
                if unknown:
                    raise ValueError(f"swap {s.id!r}: recomputes op {unknown[0]!r}, which is not "
                                     "in the graph")
                need = min(where(c, f"swap {s.id!r}") for c in s.consumers)
                if s.in_after:   # made earlier than its first reader
                    at = where(s.in_after, f"swap {s.id!r}") + 1
                    if not outs[-1].out_after < at <= need:
                        raise ValueError(f"swap {s.id!r}: a recompute's in_after must be "
                                         f"at or after its out_after {s.out_after!r} and "
                                         f"before its first consumer; {s.in_after!r} is not")
                    need = at
                recs.append(RecomputeRec(b, len(outs) - 1, need,
                                         tuple(ids[o] for o in s.ops)))
    for s in swaps:
        if s.kind in ("round_trip", "prefetch"):
            b = tbuf[s.tensor]
            need = min(where(c, f"swap {s.id!r}") for c in s.consumers)
            trigger = where(s.in_after, f"swap {s.id!r}") if s.in_after else START
            ins.append(InRec(b, trigger, tuple(out_of_swap[w] for w in s.in_wait_for),
                             out_of_swap[s.id] if s.kind == "round_trip" else -1, need))
    return inputs_back(cg, canonical(order, resident, outs, ins, op_waits, recs))
