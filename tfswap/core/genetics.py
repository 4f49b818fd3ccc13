"""The genetic operators of SwapAdvisor §5 on schedules (§5.2) and selection (§5.1).

A schedule is an array of op indices in a topological order of the graph.
Every operator here returns topological orders only.

Example::

    dag = Precedence.of(graph)
    rng = np.random.default_rng(0)
    child1, child2 = crossover_schedules(parent1, parent2, rng)
    mutant = mutate_schedule(child1, dag, probability=0.05, rng=rng)
    survivors = softmax_select(times, k=50, rng=rng)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

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


def crossover_schedules(first: np.ndarray, second: np.ndarray,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Fig. 4: child 1 = second[:cut] then the rest in first's order; child 2 mirrored.

    A prefix of a topological order holds all predecessors of its ops, and the
    rest keeps the other parent's (topological) relative order, so both
    children are topological orders.
    """
    n = len(first)
    if n < 2:
        return first.copy(), second.copy()
    cut = int(rng.integers(1, n))
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
    paper found that much better than moving one op, >2x on RNNs).
    """
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"mutation probability must be in [0, 1], got {probability}")
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
    draws = rng.random(n)
    out = np.empty(n, dtype=np.int64)
    succ_start, succ = dag.succ_start, dag.succ
    for k in range(n):
        if draws[k] < probability:
            op = ready[int(rng.integers(len(ready)))]
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
    nbytes = np.array([t.nbytes for t in graph.tensors], dtype=np.int64)

    def gain(op: int) -> int:
        freed = sum(int(nbytes[t]) for t in reads[op] if remaining_readers[t] == 1)
        return int(produced[op]) - freed

    indeg = dag.indegree.copy()
    ready = {int(i) for i in np.flatnonzero(indeg == 0)}
    out = np.empty(n, dtype=np.int64)
    for k in range(n):
        op = min(ready, key=lambda i: (gain(i), rank[i]))
        ready.remove(op)
        out[k] = op
        for t in reads[op]:
            remaining_readers[t] -= 1
        for s in dag.succ[dag.succ_start[op]:dag.succ_start[op + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.add(int(s))
    return out


def softmax_select(times: np.ndarray, k: int, rng: np.random.Generator,
                   best_time: float | None = None) -> np.ndarray:
    """Eq. 1: indices of ``k`` distinct survivors, drawn with probability softmax(t_norm).

    t_norm = (T_best - t) / T_best, with T_best the best time seen so far
    (``best_time``, default the best of ``times``); infinite times (infeasible
    individuals) never survive while feasible ones remain.
    """
    times = np.asarray(times, dtype=np.float64)
    if k > len(times):
        raise ValueError(f"cannot select {k} survivors from {len(times)} individuals")
    finite = np.isfinite(times)
    best = float(np.min(times[finite])) if best_time is None and finite.any() else best_time
    if best is None or not np.isfinite(best) or best <= 0:
        return rng.choice(len(times), size=k, replace=False)
    t_norm = np.where(finite, (best - times) / best, -np.inf)
    weights = np.exp(t_norm - np.max(t_norm))
    n_feasible = int(finite.sum())
    if n_feasible >= k:
        return rng.choice(len(times), size=k, replace=False, p=weights / weights.sum())
    chosen = np.flatnonzero(finite)
    rest = rng.choice(np.flatnonzero(~finite), size=k - n_feasible, replace=False)
    return np.concatenate([chosen, rest])
