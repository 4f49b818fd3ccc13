"""Memory-pool allocations in SwapAdvisor's encoding (paper §5.3).

``TS`` is the sorted list of distinct pool tensor sizes of a graph (bytes).
``CLS`` maps each size to a size class: ``CLS[i]`` is the class of ``TS[i]``,
0-based, monotone, and it steps by at most one, so the classes are
``0..max(CLS)``; a class's object size is the largest size mapped to it.
``CNT[c]`` is how many objects class ``c`` has.  The pool is
``sum(CNT[c] * class_size[c])`` bytes, plus the small-tensor pool reserved
out of the budget.

Example::

    ts = (1 << 20, 2 << 20)                      # Fig. 1: 1 MB and 2 MB tensors
    coarse = from_encoding(ts, cls=(0, 0), cnt=(5,))
    fine = from_encoding(ts, cls=(0, 1), cnt=(8, 1))
    coarse.class_bytes, fine.class_count          # (2 MiB,), (8, 1)
    repair_counts((1, 4), (8, 3), budget_bytes=12)   # (4, 2), as in Fig. 5
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfswap.core.compiled import CompiledGraph
from tfswap.core.infeasible import Infeasible
from tfswap.core.plan import Allocation


def repair_classes(cls: Sequence[int]) -> tuple[int, ...]:
    """Make a CLS list valid: starts at 0, never decreases, steps by at most 1.

    A decrease is raised to the previous value (the paper's "increase the
    offending elements by the smallest amount", Fig. 5(a): [1,2,1,1] becomes
    [1,2,2,2]); a jump of more than one is lowered so no class id is unused.
    """
    out = []
    for i, c in enumerate(cls):
        c = int(c)
        if i == 0:
            c = 0
        else:
            c = min(max(c, out[-1]), out[-1] + 1)
        out.append(c)
    return tuple(out)


def class_sizes(ts: Sequence[int], cls: Sequence[int]) -> tuple[int, ...]:
    """Object size of each class: the largest tensor size mapped to it."""
    if len(ts) != len(cls):
        raise ValueError(f"TS has {len(ts)} sizes but CLS {len(cls)} entries; give one "
                         "class per size")
    sizes = [0] * (max(cls) + 1 if cls else 0)
    for s, c in zip(ts, cls):
        sizes[c] = max(sizes[c], int(s))
    return tuple(sizes)


def expand_counts(cls: Sequence[int], cnt: Sequence[int]) -> tuple[int, ...]:
    """CNT_EXT: for each tensor size, the count of its class (paper Fig. 5(b))."""
    return tuple(int(cnt[c]) for c in cls)


def collapse_counts(cls: Sequence[int], cnt_ext: Sequence[float]) -> tuple[int, ...]:
    """CNT from CNT_EXT: each class gets the mean of its sizes' entries, rounded
    half up (Fig. 5(b): [8, 1, 4, 4] under CLS [0, 1, 1, 1] gives [8, 3])."""
    n = max(cls) + 1 if cls else 0
    total = [0.0] * n
    count = [0] * n
    for c, v in zip(cls, cnt_ext):
        total[c] += v
        count[c] += 1
    return tuple(int(total[c] / count[c] + 0.5) for c in range(n))


def repair_counts(class_bytes: Sequence[int], cnt: Sequence[int], budget_bytes: int,
                  min_count: Sequence[int] | None = None) -> tuple[int, ...]:
    """Reduce counts until ``sum(cnt * class_bytes) <= budget_bytes`` (paper §5.3).

    Each class loses objects in inverse proportion to its size: with ``m``
    classes still above their minimum and ``excess`` bytes over budget, class
    ``c`` loses ``ceil(excess / (m * class_bytes[c]))`` objects, so every class
    gives back about the same number of bytes ([8, 3] objects of 1 and 4 MB in
    12 MB become [4, 2], Fig. 5).  ``min_count`` (default 0): counts are never
    reduced below it (the most objects of a class one op needs at once).
    Raises :class:`~tfswap.core.infeasible.Infeasible` if even the minimum does not fit.
    """
    cnt = [int(c) for c in cnt]
    lo = [0] * len(cnt) if min_count is None else [int(m) for m in min_count]
    if len(class_bytes) != len(cnt) or len(lo) != len(cnt):
        raise ValueError("repair_counts: class_bytes, cnt and min_count must have one "
                         "entry per size class")
    cnt = [max(c, m) for c, m in zip(cnt, lo)]
    need = sum(b * m for b, m in zip(class_bytes, lo))
    if need > budget_bytes:
        raise Infeasible(f"the pool needs at least {need} bytes (the most objects of each "
                         f"class that one op uses at once) but the budget leaves "
                         f"{budget_bytes}; raise the memory budget", need_bytes=int(need))
    while True:
        excess = sum(b * c for b, c in zip(class_bytes, cnt)) - budget_bytes
        if excess <= 0:
            return tuple(cnt)
        movable = [i for i in range(len(cnt)) if cnt[i] > lo[i]]
        m = len(movable)
        for i in movable:
            cut = -(-excess // (m * class_bytes[i]))
            cnt[i] -= min(cut, cnt[i] - lo[i])


def fitting_classes(ts: Sequence[int], usage: np.ndarray, pinned: Sequence[int],
                    budget_bytes: int) -> tuple[int, ...]:
    """A CLS whose floor fits ``budget_bytes``: one class per size, merged where needed.

    The floor of an allocation is what every op needs at once: for each
    class, the most objects of it one op uses (``usage``: ops x sizes, objects
    of each size per op) plus the objects pinned for the whole step
    (``pinned``, per size), times the class's object size.  Summed over
    classes, these per-class maxima come from different ops, so with one class
    per distinct size the floor can exceed the step's no-swap peak (a graph
    with many sizes near each other).  Merging neighbouring classes lets ops
    share objects: this greedily merges the adjacent pair that lowers the
    floor most until it fits, and stops (returning the best found) when no
    merge lowers it further; the caller's repair then reports that the budget
    is too small.

    Example::

        ts = (1, 2)
        usage = np.array([[2, 0], [0, 2]])   # op 0 uses two 1-byte, op 1 two 2-byte objects
        fitting_classes(ts, usage, (0, 0), budget_bytes=6)   # (0, 0): one class of 2 bytes
    """
    sizes = np.asarray(ts, dtype=np.int64)
    k = len(sizes)
    if k == 0:
        return ()
    use = np.asarray(usage, dtype=np.int64).reshape(-1, k).copy()
    pin = np.asarray(pinned, dtype=np.int64).copy()
    need = (use.max(axis=0) if len(use) else np.zeros(k, np.int64)) + pin
    top = sizes.copy()              # object size of each current class
    first = np.arange(k)            # first size index of each current class
    floor = int((top * need).sum())
    while floor > budget_bytes and len(top) > 1:
        pair = (use[:, :-1] + use[:, 1:]).max(axis=0) if len(use) else 0
        merged_need = pair + pin[:-1] + pin[1:]
        delta = top[1:] * merged_need - top[:-1] * need[:-1] - top[1:] * need[1:]
        j = int(np.argmin(delta))
        if delta[j] >= 0:
            break
        use[:, j] += use[:, j + 1]
        use = np.delete(use, j + 1, axis=1)
        pin[j] += pin[j + 1]
        pin = np.delete(pin, j + 1)
        need[j] = merged_need[j]
        need = np.delete(need, j + 1)
        top[j] = top[j + 1]
        top = np.delete(top, j + 1)
        first = np.delete(first, j + 1)
        floor += int(delta[j])
    return tuple(int(c) for c in np.searchsorted(first, np.arange(k), side="right") - 1)


def from_encoding(ts: Sequence[int], cls: Sequence[int], cnt: Sequence[int],
                  small_pool_bytes: int = 0,
                  small_threshold_bytes: int = 1 << 20) -> Allocation:
    """The :class:`Allocation` that TS/CLS/CNT describe (CLS must be valid)."""
    cls = tuple(int(c) for c in cls)
    if cls != repair_classes(cls):
        raise ValueError(f"CLS {cls} is not a valid size-class map (0-based, monotone, "
                         "steps of at most 1); pass it through repair_classes first")
    sizes = class_sizes(ts, cls)
    if len(cnt) != len(sizes):
        raise ValueError(f"CLS has {len(sizes)} classes but CNT {len(cnt)} counts")
    return Allocation(class_bytes=sizes, class_count=tuple(int(c) for c in cnt),
                      small_pool_bytes=small_pool_bytes,
                      small_threshold_bytes=small_threshold_bytes)


def size_class_of(allocation: Allocation, nbytes: int) -> int:
    """Index of the smallest class whose objects hold ``nbytes``."""
    for c, b in enumerate(allocation.class_bytes):
        if b >= nbytes:
            return c
    raise ValueError(f"no size class holds {nbytes} bytes (largest is "
                     f"{allocation.class_bytes[-1] if allocation.class_bytes else 0}); "
                     "the allocation must have a class at least as large as the largest "
                     "pool tensor")


def default_allocation(cg: CompiledGraph, order: np.ndarray, budget_bytes: int,
                       cls: Sequence[int] | None = None) -> Allocation:
    """One size class per distinct pool size (merged only where the per-op floor
    would not fit the budget otherwise), with as many objects as are live at
    once without swapping, repaired down to the budget (paper §5.3).

    The small-tensor pool (the most small-tensor bytes live at once under
    ``order``) is reserved out of the budget first.  ``cls``: the size-class
    map to use instead (see :func:`default_classes`).
    """
    small = cg.small_pool_peak(order)
    if small > budget_bytes:
        raise Infeasible(f"small tensors alone need {small} bytes but the budget is "
                         f"{budget_bytes}; raise the budget", need_bytes=int(small))
    if cls is None:
        cls = default_classes(cg, budget_bytes - small)
    cls_arr = np.asarray(cls, dtype=np.int32)
    n_classes = int(cls_arr.max()) + 1 if len(cls_arr) else 0
    buf_class = cls_arr[cg.buf_size_index] if cg.n_buffers else np.zeros(0, np.int32)
    sizes = class_sizes(cg.ts, tuple(cls_arr.tolist()))
    demand = cg.class_demand(order, buf_class, n_classes)
    need = cg.op_class_need(buf_class, n_classes)
    cnt = repair_counts(sizes, demand, budget_bytes - small, min_count=need)
    return Allocation(class_bytes=sizes, class_count=cnt, small_pool_bytes=small,
                      small_threshold_bytes=cg.small_threshold_bytes)


def default_classes(cg: CompiledGraph, pool_bytes: int) -> tuple[int, ...]:
    """CLS of the default allocation: one class per size while the floor (what
    every op needs at once) fits ``pool_bytes``, else neighbouring sizes merged
    (:func:`tfswap.core.allocation.fitting_classes`)."""
    identity = tuple(range(len(cg.ts)))
    if not identity:
        return identity
    ident = np.asarray(identity, dtype=np.int32)[cg.buf_size_index]
    floor = int(np.dot(np.asarray(cg.ts, dtype=np.int64),
                       cg.op_class_need(ident, len(identity))))
    if floor <= pool_bytes:
        return identity
    pinned = cg.pinned_per_class(ident, len(identity))
    return fitting_classes(cg.ts, cg.op_size_usage(), pinned, pool_bytes)
