"""Schedules other than TensorFlow's own for the planners to start from.

TensorFlow's executor runs a step in an order that knows nothing of memory:
in a training step it often computes a layer's weight gradient long after the
gradient it reads (a language model's 4 MB logits gradient kept from the head
to the end of the encoder's backward pass, the BERT-style step of the zoo).
Under a budget every byte held that long has to cross the link or be computed
again.  :func:`memory_greedy` is the list schedule that, among the ops ready
to run, runs the one that adds the fewest bytes to what the step holds (an op
that frees more than it allocates first), ties broken by TensorFlow's order.
It is a schedule the planners scan beside TF's order and the genetic search's
best, never a replacement: the contest keeps whichever plans fastest.

The genetic search seeds its first generation with a similar list schedule
(:func:`tfswap.core.genetics.memory_greedy_schedule`), which counts tensors
rather than pool buffers: a value written in place or viewed is counted
again there, and parameters are freed by their last reader.  For the byte-cap
planner the buffers are what must fit (LSTM-4 at 60% on a 50 MB/s link: 2.3x
of ideal on this order against 4.6x on that one); as the search's seed the two
plan alike (1.60x against 1.65x, 3.65x against 3.58x at 40%), so the search
keeps its own.

Example::

    schedule = memory_greedy(problem.compiled, problem.schedule)
    problem.compiled.order_of(schedule)    # a topological order of the step
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from tfswap.core.compiled import CompiledGraph


def memory_greedy(cg: CompiledGraph, schedule: Sequence[str] | None) -> tuple[str, ...]:
    """The ops of ``cg`` in the order of a greedy list schedule: next, the ready op
    whose run grows the bytes held the least (the pool buffers it makes first,
    less those it is the last to touch; parameters, optimizer state and buffers
    kept to the end count as held throughout), ties broken by their position in
    ``schedule`` (TF's order; None: the graph's)."""
    g = cg.graph
    n = cg.n_ops
    rank = np.empty(n, dtype=np.int64)
    rank[cg.order_of(schedule)] = np.arange(n)
    held = (cg.buf_persistent | cg.buf_kept).astype(bool)
    nbytes = cg.buf_bytes
    touches: list[tuple[int, ...]] = []
    left = np.zeros(cg.n_buffers, dtype=np.int64)   # ops yet to touch each buffer
    touched_by: list[list[int]] = [[] for _ in range(cg.n_buffers)]
    for op in range(n):
        bufs = set(cg.op_in[cg.op_in_ptr[op]:cg.op_in_ptr[op + 1]].tolist())
        bufs.update(cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]].tolist())
        mine = tuple(b for b in sorted(bufs) if not held[b])
        touches.append(mine)
        for b in mine:
            left[b] += 1
            touched_by[b].append(op)
    started = np.zeros(cg.n_buffers, dtype=bool)

    def growth(op: int) -> int:
        d = 0
        for b in touches[op]:
            if not started[b]:
                d += int(nbytes[b])
            if left[b] == 1:
                d -= int(nbytes[b])
        return d

    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for op in range(n):
        for p in g.predecessors(op):
            indeg[op] += 1
            succ[p].append(op)
    ready = set(op for op in range(n) if indeg[op] == 0)
    heap = [(growth(op), int(rank[op]), op) for op in ready]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        d, _, op = heapq.heappop(heap)
        if op not in ready or d != growth(op):
            continue    # stale: run already, or its growth changed (a fresher entry is queued)
        ready.discard(op)
        out.append(op)
        changed = set()
        for b in touches[op]:
            if not started[b]:
                started[b] = True
                changed.add(b)
            left[b] -= 1
            if left[b] == 1:
                changed.add(b)
        # A buffer just started or now down to its last toucher changes the growth
        # of the ready ops that touch it: queued again with the new figure.
        again = {o for b in changed for o in touched_by[b] if o in ready}
        for s in succ[op]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.add(s)
                again.add(s)
        for o in again:
            heapq.heappush(heap, (growth(o), int(rank[o]), o))
    if len(out) != n:
        raise ValueError("the graph has a cycle")
    return tuple(g.ops[op].name for op in out)


__all__ = ["memory_greedy"]
