"""Shared pool layout: objects that are never in use together share memory.

SwapAdvisor's pool (paper §4.1) gives every object of every size class memory
of its own, so the pool needs the sum over classes of each class's most
objects in use, although those maxima come at different times of the step
(ResNet-50 at batch 256: 29.2 GB of objects for 22.1 GB of live bytes).  A
plan fixes the step, so its simulation says when each object is in use; two
objects whose busy times never intersect can take the same addresses.

:func:`shared_layout` places the objects of a simulated plan in one arena:
largest objects first, each at the lowest offset (a multiple of 256 bytes)
where it overlaps in address only objects that are idle whenever it is busy
(the greedy order Sekiyama et al. and TFLite's arena planner use for tensors;
here it packs objects, so the allocator keeps SwapAdvisor's per-class
semantics and needs no knowledge of tensors).  The allocation it returns
has the same classes, as many objects as the simulation used, and
``object_offsets``; simulating the plan with it gives the same step.

Busy times are the simulation's allocation events, in their recorded order
(a release at an instant precedes an allocation at the same instant).  At
run time the allocator checks every object it hands out against the live
objects that share its memory, so a run that strays from the plan fails
loudly instead of corrupting memory (tfswap/ops/pool_core.h).

Example::

    from tfswap.core import layout, simulator
    result = simulator.simulate(graph, plan, spec, events=True)
    shared = layout.shared_layout(result, plan.allocation)
    shared.pool_bytes <= plan.allocation.pool_bytes      # True
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tfswap.core import native
from tfswap.core.plan import OBJECT_ALIGNMENT, Allocation


def object_busy(result) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Each used object's busy intervals, ``[first, last)`` in event positions.

    An object still held at the end of the step (a kept or resident buffer)
    is busy to the end; the next step starts from the same state, so it is
    held across the step boundary too.
    """
    if not result.allocation_events and any(result.class_peak_objects):
        raise ValueError("shared_layout needs the allocation events: simulate with events=True")
    return _busy(((e.is_alloc, (e.size_class, e.object_index))
                  for e in result.allocation_events), len(result.allocation_events))


def _busy(events, n: int) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Each object's busy intervals, in event indices, from ``n`` events (whether it
    is taken, (class, object)); one still taken at the end is busy to ``n``."""
    busy: dict[tuple[int, int], list[tuple[int, int]]] = {}
    opened: dict[tuple[int, int], int] = {}
    for i, (take, key) in enumerate(events):
        if take:
            if key in opened:
                raise ValueError(f"simulation allocates object {key} twice without a release")
            opened[key] = i
        else:
            busy.setdefault(key, []).append((opened.pop(key), i))
    for key, start in opened.items():
        busy.setdefault(key, []).append((start, n))
    return busy


def _aligned(nbytes: int) -> int:
    return -(-int(nbytes) // OBJECT_ALIGNMENT) * OBJECT_ALIGNMENT


def shared_layout(result, allocation: Allocation) -> Allocation:
    """``allocation`` trimmed to the objects ``result`` used, placed so that objects
    busy at the same time never overlap (see the module docstring).

    ``result``: the plan's :class:`~tfswap.core.simulator.SimResult`, simulated
    with ``events=True`` under ``allocation``.
    """
    return _place(object_busy(result), list(result.class_peak_objects), allocation)


def shared_layout_rows(rows, class_peak_objects, allocation: Allocation) -> Allocation:
    """:func:`shared_layout` of a compiled simulation's allocation event rows
    ((take, buffer, class, object) each, in order: ``ProgramRun.event_rows``),
    the same layout without making an event object of each."""
    if not len(rows) and any(class_peak_objects):
        raise ValueError("shared_layout needs the allocation events: simulate with events=True")
    rows = np.asarray(rows)
    counts = [int(x) for x in class_peak_objects]
    intervals = _intervals_of_rows(rows, counts)
    if intervals is not None:
        return _place_intervals(*intervals, counts, allocation)
    # Not a well-formed run: the event by event reading says what is wrong.
    busy = _busy(((take, (c, j)) for take, _, c, j in rows.tolist()), len(rows))
    return _place(busy, list(class_peak_objects), allocation)


def _intervals_of_rows(rows: np.ndarray, counts: list[int]):
    """The busy intervals of allocation event rows (see :func:`shared_layout_rows`)
    as :func:`_place_intervals` takes them, what the loop there makes, or None
    where the rows are not a well-formed run (an object taken twice without a
    release, released untaken, or past its class's peak)."""
    n = len(rows)
    if not n:
        return None
    base = np.zeros(len(counts) + 1, np.int64)
    base[1:] = np.cumsum(counts)
    take = rows[:, 0] != 0
    c = rows[:, 2].astype(np.int64)
    j = rows[:, 3].astype(np.int64)
    if c.min() < 0 or c.max() >= len(counts) or j.min() < 0 or \
            np.any(j >= np.asarray(counts, np.int64)[c]):
        return None
    obj = base[c] + j
    perm = np.argsort(obj, kind="stable")        # each object's events, in time order
    so, st = obj[perm], take[perm]
    idx = np.arange(n)
    first = np.maximum.accumulate(np.where(np.r_[True, so[1:] != so[:-1]], idx, 0))
    if not np.array_equal(st, (idx - first) % 2 == 0):   # take, release, take, ...
        return None
    p = np.flatnonzero(st)
    nxt = np.minimum(p + 1, n - 1)
    closed = (p + 1 < n) & (so[nxt] == so[p])
    iv_start = perm[p].astype(np.int64)
    iv_end = np.where(closed, perm[nxt], n).astype(np.int64)
    iv_ptr = np.searchsorted(so[p], np.arange(int(base[-1]) + 1), side="left")
    return iv_ptr, iv_start, iv_end


def _place(busy: dict, counts: list[int], allocation: Allocation) -> Allocation:
    """Offsets for objects ``0 .. counts[c]-1`` of each class, given their busy times."""
    # The simulator takes objects from LIFO stacks filled in index order, so the
    # objects a step uses are exactly 0 .. peak-1 of each class.
    for (c, j) in busy:
        if j >= counts[c]:
            raise ValueError(f"object {j} of class {c} is used but the class peaked at "
                             f"{counts[c]} objects; the result is not of this allocation")
    objects = [(c, j) for c in range(len(counts)) for j in range(counts[c])]
    # The packing is compiled (tfswap_place_objects, which follows the
    # reference below step by step); the busy sets go to it as intervals.
    iv_ptr, iv_start, iv_end = [0], [], []
    for key in objects:
        for s, e in busy.get(key, ()):
            iv_start.append(s)
            iv_end.append(e)
        iv_ptr.append(len(iv_start))
    return _place_intervals(np.asarray(iv_ptr), np.asarray(iv_start, np.int64),
                            np.asarray(iv_end, np.int64), counts, allocation)


def _place_intervals(iv_ptr, iv_start, iv_end, counts: list[int],
                     allocation: Allocation) -> Allocation:
    """:func:`_place` with the busy times as intervals: object ``r`` (the objects of
    each class in turn, by index) is busy ``iv_start/iv_end[iv_ptr[r]:iv_ptr[r+1]]``."""
    objects = [(c, j) for c in range(len(counts)) for j in range(counts[c])]
    order = sorted(range(len(objects)), key=lambda r: (
        -allocation.class_bytes[objects[r][0]], objects[r]))
    size = [_aligned(allocation.class_bytes[c]) for c, _ in objects]
    placed = native.place_objects(iv_ptr, iv_start, iv_end, np.asarray(order),
                                  np.asarray(size, np.int64)).tolist()
    offsets = [[0] * c for c in counts]
    for r, (c, j) in enumerate(objects):
        offsets[c][j] = placed[r]
    return replace(allocation, class_count=tuple(counts),
                   object_offsets=tuple(tuple(o) for o in offsets))


def without_resident(result, allocation: Allocation, resident) -> Allocation:
    """``allocation`` less the objects that ``resident`` buffers hold all step.

    In a plan's simulation the parameters that stay on the device take pool
    objects before the first op.  Under the budget arena
    (``tfswap/ops/pool_arena.h``) they are the user's variables, allocated
    outside the plan's pool before the plan existed, so the pool the arena
    carves leaves their objects out: every other tensor then gets the object
    the simulation gave it.  A shared layout is placed again without them,
    so their memory is not counted twice.  An object a resident buffer gives
    back during the step (a swapped parameter) stays, and so do small-pool
    bytes; the objects are then handed out in another order than simulated
    (exact when no resident buffer is released, as with TensorFlow's
    device-homed variables, which the planner pins).

    ``result``: the plan simulated with ``events=True`` under ``allocation``;
    ``resident``: names of the buffers resident when the step starts.
    """
    resident = set(resident)
    first: dict[str, tuple[int, int]] = {}   # the object each takes before the first op
    released = set()
    for e in result.allocation_events:
        if e.tensor in resident:
            if e.is_alloc:
                first.setdefault(e.tensor, (e.size_class, e.object_index))
            else:
                released.add(e.tensor)
    held = {key for name, key in first.items() if name not in released}
    kept = [[j for j in range(n) if (c, j) not in held]
            for c, n in enumerate(allocation.class_count)]
    counts = tuple(len(k) for k in kept)
    if not allocation.shared:
        return replace(allocation, class_count=counts)
    rank = {(c, j): i for c, k in enumerate(kept) for i, j in enumerate(k)}
    busy = {(c, rank[c, j]): iv for (c, j), iv in object_busy(result).items()
            if (c, j) not in held}
    used = [0] * len(counts)
    for c, j in busy:
        used[c] = max(used[c], j + 1)
    return _place(busy, used, replace(allocation, object_offsets=()))


def conflicts(result, allocation: Allocation) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Pairs of objects that share memory in ``allocation`` and are busy at once in
    ``result`` (a simulation with events): empty for a valid shared layout.

    A plain interval check, independent of :func:`shared_layout`'s packing.
    """
    if not allocation.shared:
        return []
    busy = object_busy(result)
    keys = sorted(busy)
    out = []
    for a_i, a in enumerate(keys):
        a_lo = allocation.object_offsets[a[0]][a[1]]
        a_hi = a_lo + _aligned(allocation.class_bytes[a[0]])
        for b in keys[a_i + 1:]:
            b_lo = allocation.object_offsets[b[0]][b[1]]
            b_hi = b_lo + _aligned(allocation.class_bytes[b[0]])
            if a_hi <= b_lo or b_hi <= a_lo:
                continue
            if any(s1 < e2 and s2 < e1 for s1, e1 in busy[a] for s2, e2 in busy[b]):
                out.append((a, b))
    return out


def _place_reference(busy: dict, counts: list[int], allocation: Allocation) -> Allocation:
    """:func:`_place` in Python (what the compiled packing follows; the tests
    compare the two)."""
    objects = [(c, j) for c in range(len(counts)) for j in range(counts[c])]
    # Busy sets as boolean rows over event positions, compressed to the
    # positions where some object becomes busy: two sets of intervals
    # intersect exactly when one is busy where the other starts.
    starts = np.unique(np.array([s for iv in busy.values() for s, _ in iv] or [0], np.int64))
    rows = np.zeros((len(objects), len(starts)), dtype=bool)
    for r, key in enumerate(objects):
        for s, e in busy.get(key, ()):
            rows[r, np.searchsorted(starts, s):np.searchsorted(starts, e)] = True
    order = sorted(range(len(objects)), key=lambda r: (
        -allocation.class_bytes[objects[r][0]], objects[r]))
    offsets = [[0] * c for c in counts]
    placed = np.zeros(len(objects), dtype=bool)
    lo = np.zeros(len(objects), np.int64)
    hi = np.zeros(len(objects), np.int64)
    packed_rows = np.packbits(rows, axis=1)
    for r in order:
        c, j = objects[r]
        size = _aligned(allocation.class_bytes[c])
        clash = placed & np.any(packed_rows & packed_rows[r], axis=1)
        offset = 0
        for a, b in sorted(zip(lo[clash].tolist(), hi[clash].tolist())):
            if offset + size <= a:
                break
            offset = max(offset, b)
        offsets[c][j] = offset
        placed[r], lo[r], hi[r] = True, offset, offset + size
    return replace(allocation, class_count=tuple(counts),
                   object_offsets=tuple(tuple(o) for o in offsets))
