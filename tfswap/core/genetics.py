"""The genetic operators of SwapAdvisor §5: schedules (§5.2), memory
allocations (§5.3) and survival selection (§5.1).

A schedule is an array of op indices in a topological order of the graph;
every schedule operator returns topological orders only.  An allocation is
the paper's (CLS, CNT) pair over the graph's distinct pool sizes TS
(:mod:`tfswap.core.allocation`); the operators return valid CLS lists, and
counts that still have to be fitted to the budget with ``repair_counts``.

Example::

    dag = Precedence.of(graph)
    rng = np.random.default_rng(0)
    child1, child2 = crossover_schedules(parent1, parent2, rng)
    mutant = mutate_schedule(child1, dag, probability=0.05, rng=rng)
    survivors = softmax_select(times, k=50, rng=rng)
    (cls1, cnt1), (cls2, cnt2) = crossover_allocations(((0, 0), (5,)), ((0, 1), (8, 1)), rng)
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tfswap.core.allocation import collapse_counts, expand_counts, repair_classes
from tfswap.core.graph import DataflowGraph


@dataclass(frozen=True)
class Precedence:
    """The graph's dependencies as arrays: CSR successor lists and in-degrees."""

    indegree: np.ndarray        # int64[n_ops]
    succ_start: np.ndarray      # int64[n_ops + 1]
    succ: np.ndarray            # int64[n_edges]

    @classmethod
    def of(cls, graph: DataflowGraph) -> "Precedence":
        n = len(graph.ops)
        lists = [sorted(graph.predecessors(i)) for i in range(n)]
        indegree = np.array([len(p) for p in lists], dtype=np.int64)
        succ_lists = [[] for _ in range(n)]
        for i, preds in enumerate(lists):
            for p in preds:
                succ_lists[p].append(i)
        start = np.zeros(n + 1, dtype=np.int64)
        start[1:] = np.cumsum([len(s) for s in succ_lists])
        succ = np.fromiter((s for lst in succ_lists for s in lst), dtype=np.int64,
                           count=int(start[-1]))
        return cls(indegree, start, succ)

    @property
    def n_ops(self) -> int:
        return len(self.indegree)

    def is_topological(self, schedule: np.ndarray) -> bool:
        if len(schedule) != self.n_ops or len(set(schedule.tolist())) != self.n_ops:
            return False
        position = np.empty(self.n_ops, dtype=np.int64)
        position[schedule] = np.arange(self.n_ops)
        sources = np.repeat(np.arange(self.n_ops), np.diff(self.succ_start))
        return bool(np.all(position[sources] < position[self.succ]))


def crossover_schedules(first: np.ndarray, second: np.ndarray, rng: np.random.Generator,
                        cut: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fig. 4: child 1 = second[:cut] then the rest in first's order; child 2 mirrored.

    A prefix of a topological order holds all predecessors of its ops, and the
    rest keeps the other parent's (topological) relative order, so both
    children are topological orders.  ``cut`` (1..n-1) defaults to a random one.
    """
    n = len(first)
    if len(second) != n:
        raise ValueError(f"the parents schedule {n} and {len(second)} ops; both must be "
                         "orders of the same graph")
    if n < 2:
        return first.copy(), second.copy()
    if cut is None:
        cut = int(rng.integers(1, n))
    if not 1 <= cut < n:
        raise ValueError(f"crossover cut must be in [1, {n - 1}], got {cut}")
    return _splice(second, first, cut), _splice(first, second, cut)


def _splice(prefix_from: np.ndarray, rest_from: np.ndarray, cut: int) -> np.ndarray:
    taken = np.zeros(len(rest_from), dtype=bool)
    head = prefix_from[:cut]
    taken[head] = True
    return np.concatenate([head, rest_from[~taken[rest_from]]])


def mutate_schedule(schedule: np.ndarray, dag: Precedence, probability: float,
                    rng: np.random.Generator) -> np.ndarray:
    """§5.2's mutation: replay the schedule as a dataflow scheduler would.

    Among the ready ops, with ``probability`` a random one runs next, else the
    one earliest in ``schedule``.  Several ops can move in one mutation (the
    paper found that much better than moving one op, >2x on RNNs).  Runs in
    compiled code; :func:`mutate_schedule_reference` is the same algorithm in
    Python, and both use the draws ``rng.random(n)`` then ``rng.random(n)``.
    """
    from tfswap.core.native import schedule_ops

    _check_probability(probability)
    n = dag.n_ops
    draw, pick = rng.random(n), rng.random(n)
    return schedule_ops.mutate(schedule, dag.indegree, dag.succ_start, dag.succ,
                               probability, draw, pick)


def mutate_schedule_reference(schedule: np.ndarray, dag: Precedence, probability: float,
                              draw: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """The mutation in Python, with the draws given (``draw[k]``, ``pick[k]`` in [0, 1)).

    Step ``k`` runs a random ready op if ``draw[k] < probability``: the one at
    index ``floor(pick[k] * len(ready))`` of the ready list; otherwise the
    ready op earliest in ``schedule``.
    """
    _check_probability(probability)
    n = dag.n_ops
    position = np.empty(n, dtype=np.int64)
    position[schedule] = np.arange(n)
    indeg = dag.indegree.copy()
    # Ready ops live in a heap keyed by position (the unmutated choice) and in a
    # list for random picks; an op taken by one is skipped lazily by the other.
    heap = [int(position[i]) for i in np.flatnonzero(indeg == 0)]
    heapq.heapify(heap)
    ready = [int(schedule[p]) for p in sorted(heap)]
    slot = {op: k for k, op in enumerate(ready)}
    done = np.zeros(n, dtype=bool)
    out = np.empty(n, dtype=np.int64)
    succ_start, succ = dag.succ_start, dag.succ
    for k in range(n):
        if draw[k] < probability:
            op = ready[min(int(pick[k] * len(ready)), len(ready) - 1)]
        else:
            while done[schedule[heap[0]]]:
                heapq.heappop(heap)
            op = int(schedule[heapq.heappop(heap)])
        # O(1) removal from the ready list: move its last element into op's slot.
        last = ready.pop()
        if last != op:
            ready[slot[op]] = last
            slot[last] = slot[op]
        del slot[op]
        done[op] = True
        out[k] = op
        for s in succ[succ_start[op]:succ_start[op + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                s = int(s)
                heapq.heappush(heap, int(position[s]))
                slot[s] = len(ready)
                ready.append(s)
    return out


def _check_probability(probability: float) -> None:
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"mutation probability must be in [0, 1], got {probability}")


def random_schedule(dag: Precedence, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random choice among ready ops at every step."""
    return mutate_schedule(np.arange(dag.n_ops), dag, 1.0, rng)


def memory_greedy_schedule(graph: DataflowGraph, dag: Precedence,
                           tie_break: np.ndarray | None = None) -> np.ndarray:
    """Run next the ready op that adds the fewest bytes (outputs minus inputs it frees).

    A tensor is freed by its last remaining reader; ties go to the op earliest
    in ``tie_break`` (e.g. TF's executed order), else the lowest index.
    """
    n = dag.n_ops
    rank = np.arange(n) if tie_break is None else np.argsort(tie_break)
    produced = np.zeros(n, dtype=np.int64)
    remaining_readers = np.array([len(t.consumers) for t in graph.tensors], dtype=np.int64)
    reads = [[] for _ in range(n)]
    for t_id, t in enumerate(graph.tensors):
        produced[t.producer] += t.nbytes
        for c in t.consumers:
            reads[c].append(t_id)
    nbytes = [int(t.nbytes) for t in graph.tensors]
    consumers = [t.consumers for t in graph.tensors]

    def gain(op: int) -> int:
        freed = sum(nbytes[t] for t in reads[op] if remaining_readers[t] == 1)
        return int(produced[op]) - freed

    # A heap of (gain, rank, op) with stale entries skipped: an op's gain only
    # falls (an input's other readers finish), and each fall pushes a new entry.
    indeg = dag.indegree.copy()
    is_ready = indeg == 0
    current = np.zeros(n, dtype=np.int64)
    heap = []
    for op in np.flatnonzero(is_ready).tolist():
        current[op] = gain(op)
        heap.append((int(current[op]), int(rank[op]), op))
    heapq.heapify(heap)
    done = np.zeros(n, dtype=bool)
    out = np.empty(n, dtype=np.int64)
    for k in range(n):
        while True:
            g, _, op = heapq.heappop(heap)
            if not done[op] and g == current[op]:
                break
        done[op] = True
        is_ready[op] = False
        out[k] = op
        for t in reads[op]:
            remaining_readers[t] -= 1
            if remaining_readers[t] == 1:
                for c in consumers[t]:
                    if is_ready[c]:
                        current[c] = gain(c)
                        heapq.heappush(heap, (int(current[c]), int(rank[c]), c))
        for s in dag.succ[dag.succ_start[op]:dag.succ_start[op + 1]].tolist():
            indeg[s] -= 1
            if indeg[s] == 0:
                is_ready[s] = True
                current[s] = gain(s)
                heapq.heappush(heap, (int(current[s]), int(rank[s]), s))
    return out


def softmax_select(times: np.ndarray, k: int, rng: np.random.Generator,
                   best_time: float | None = None, temperature: float = 1.0) -> np.ndarray:
    """Eq. 1: indices of ``k`` distinct survivors, drawn with probability softmax(t_norm).

    t_norm = (T_best - t) / T_best, with T_best the best time seen so far
    (``best_time``, default the best of ``times``); infinite times (infeasible
    individuals) never survive while feasible ones remain.  ``temperature``
    divides t_norm (1.0 is the paper's eq. 1; lower values select harder).
    """
    if not temperature > 0:
        raise ValueError(f"selection temperature must be > 0, got {temperature}")
    times = np.asarray(times, dtype=np.float64)
    if k > len(times):
        raise ValueError(f"cannot select {k} survivors from {len(times)} individuals")
    finite = np.isfinite(times)
    best = float(np.min(times[finite])) if best_time is None and finite.any() else best_time
    # Every individual infeasible (a tight budget's first generations): no chance
    # to weigh, the same draw as the fallback below makes.
    if best is None or not np.isfinite(best) or best <= 0 or not finite.any():
        return rng.choice(len(times), size=k, replace=False)
    p = selection_probabilities(times, best, temperature)
    positive = p > 0
    if int(positive.sum()) >= k:
        return rng.choice(len(times), size=k, replace=False, p=p)
    # Too few with a chance: every one that has it survives, then feasible ones
    # whose chance underflowed to 0 (far slower than the best: a slow link makes
    # times differ by orders of magnitude), fastest first, then infeasible ones.
    chosen = np.flatnonzero(positive)
    slow = np.flatnonzero(finite & ~positive)
    chosen = np.concatenate([chosen, slow[np.argsort(times[slow], kind="stable")]])[:k]
    if len(chosen) == k:
        return chosen
    rest = rng.choice(np.flatnonzero(~finite), size=k - len(chosen), replace=False)
    return np.concatenate([chosen, rest])


def selection_probabilities(times: np.ndarray, best_time: float | None = None,
                            temperature: float = 1.0) -> np.ndarray:
    """Eq. 1's survival probability of each individual (one draw)."""
    times = np.asarray(times, dtype=np.float64)
    finite = np.isfinite(times)
    best = float(np.min(times[finite])) if best_time is None else float(best_time)
    t_norm = np.where(finite, (best - times) / best / temperature, -np.inf)
    weights = np.exp(t_norm - np.max(t_norm))
    return weights / weights.sum()


# ---- memory allocations (§5.3): CLS maps each size of TS to a class, CNT counts objects


def crossover_allocations(first: tuple[Sequence[int], Sequence[int]],
                          second: tuple[Sequence[int], Sequence[int]],
                          rng: np.random.Generator, cut: int | None = None
                          ) -> tuple[tuple[tuple[int, ...], tuple[int, ...]],
                                     tuple[tuple[int, ...], tuple[int, ...]]]:
    """Fig. 5: cross two (CLS, CNT) pairs at one cut; returns two children.

    Child 1 takes CLS and CNT_EXT entries ``[:cut]`` from ``second`` and the rest
    from ``first``; child 2 the other way round.  CLS is repaired to be
    monotone (:func:`~tfswap.core.allocation.repair_classes`) and CNT is the
    mean of the CNT_EXT entries of each class (``collapse_counts``).  Counts
    are not fitted to the budget here (that needs the child's schedule); pass
    them through ``repair_counts``.  ``cut`` (1..len(TS)-1) defaults to a
    random one.
    """
    (cls1, cnt1), (cls2, cnt2) = first, second
    m = len(cls1)
    if len(cls2) != m:
        raise ValueError(f"the parents' CLS have {m} and {len(cls2)} entries; both must have "
                         "one entry per distinct tensor size (TS)")
    if m < 2:
        return (tuple(cls2), tuple(cnt2)), (tuple(cls1), tuple(cnt1))
    if cut is None:
        cut = int(rng.integers(1, m))
    if not 1 <= cut < m:
        raise ValueError(f"crossover cut must be in [1, {m - 1}], got {cut}")
    ext1, ext2 = expand_counts(cls1, cnt1), expand_counts(cls2, cnt2)
    children = []
    for head, tail, ext_head, ext_tail in ((cls2, cls1, ext2, ext1), (cls1, cls2, ext1, ext2)):
        cls = repair_classes(tuple(head[:cut]) + tuple(tail[cut:]))
        cnt = collapse_counts(cls, tuple(ext_head[:cut]) + tuple(ext_tail[cut:]))
        children.append((cls, cnt))
    return children[0], children[1]


def remap_counts(old_cls: Sequence[int], cnt: Sequence[int],
                 new_cls: Sequence[int]) -> tuple[int, ...]:
    """CNT for ``new_cls`` that keeps each size's count from (``old_cls``, ``cnt``)."""
    return collapse_counts(new_cls, expand_counts(old_cls, cnt))


def mutate_classes(cls: Sequence[int], probability: float,
                   rng: np.random.Generator) -> tuple[int, ...]:
    """§5.3's CLS mutation: each entry (after the first) moves with ``probability``.

    An entry equal to its predecessor goes up by one, one above it goes down
    by one; the entries after it move with it, so CLS stays monotone with
    steps of at most one (merging or splitting classes at that size).
    """
    _check_probability(probability)
    out = [int(c) for c in cls]
    draws = rng.random(len(out))
    for i in range(1, len(out)):
        if draws[i] < probability:
            step = 1 if out[i] == out[i - 1] else -1
            for j in range(i, len(out)):
                out[j] += step
    return tuple(out)


def mutate_counts(cnt: Sequence[int], probability: float, rng: np.random.Generator,
                  relative_sigma: float = 0.25) -> tuple[int, ...]:
    """§5.3's CNT mutation: each count, with ``probability``, is redrawn from a
    Gaussian around it (standard deviation ``relative_sigma * count``, at least
    one object), rounded and kept >= 0.  Refit to the budget afterwards."""
    _check_probability(probability)
    if relative_sigma < 0:
        raise ValueError(f"relative_sigma must be >= 0, got {relative_sigma}")
    cnt = np.asarray(cnt, dtype=np.int64)
    draws = rng.random(len(cnt))
    noise = rng.standard_normal(len(cnt))
    sigma = np.maximum(1.0, relative_sigma * cnt)
    moved = np.maximum(0, np.rint(cnt + noise * sigma)).astype(np.int64)
    return tuple(int(x) for x in np.where(draws < probability, moved, cnt))
