"""Reference liveness model: device bytes live at each step of a schedule.

No timing, no pools: a tensor occupies its bytes from the step its producer
runs to the step of its last reader; a swapped tensor's original lives until
its swap-out has read it, and its copy from its trigger step to its last
re-pointed reader.  It is the simple oracle that faster models are tested
against, and what a hand-written plan's "bytes freed" is predicted with.

Example::

    curve = live_bytes(graph, schedule)            # bytes at each step
    freed = peak(graph, schedule) - peak(graph, schedule, plan.swaps)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Swap


def _positions(graph: DataflowGraph, schedule: Sequence[str]) -> np.ndarray:
    pos = np.full(len(graph.ops), -1, dtype=np.int64)
    for k, name in enumerate(schedule):
        pos[graph.op_id(name)] = k
    if (pos < 0).any():
        missing = [graph.ops[i].name for i in np.flatnonzero(pos < 0)[:5]]
        raise ValueError(f"schedule misses ops {missing}")
    return pos


def live_bytes(graph: DataflowGraph, schedule: Sequence[str],
               swaps: Sequence[Swap] = (), keep: Sequence[str] = ()) -> np.ndarray:
    """Bytes live on the device while each scheduled op runs.

    ``keep``: tensors that stay live to the end of the step (the fetches).
    """
    pos = _positions(graph, schedule)
    n = len(schedule)
    delta = np.zeros(n + 1, dtype=np.int64)
    by_tensor = {}
    for s in swaps:
        by_tensor.setdefault(s.tensor, []).append(s)
    kept = set(keep)

    def occupy(start: int, end: int, nbytes: int) -> None:
        delta[start] += nbytes
        delta[end + 1] -= nbytes

    for t in graph.tensors:
        start = pos[t.producer]
        readers = [pos[c] for c in t.consumers]
        end = n - 1 if t.name in kept else max(readers, default=start)
        if t.name not in by_tensor:
            occupy(start, end, t.nbytes)
            continue
        repointed = set()
        for s in by_tensor[t.name]:
            copy_readers = [pos[graph.op_id(c)] for c in s.consumers]
            repointed.update(graph.op_id(c) for c in s.consumers)
            occupy(pos[graph.op_id(s.in_after)], max(copy_readers), t.nbytes)
        original_readers = [pos[c] for c in t.consumers if c not in repointed]
        out_pos = [pos[graph.op_id(s.out_after)] for s in by_tensor[t.name]]
        original_end = n - 1 if t.name in kept else max(original_readers + out_pos + [start])
        occupy(start, original_end, t.nbytes)
    return np.cumsum(delta[:n])


def peak(graph: DataflowGraph, schedule: Sequence[str], swaps: Sequence[Swap] = (),
         keep: Sequence[str] = ()) -> int:
    """Largest value of :func:`live_bytes`."""
    curve = live_bytes(graph, schedule, swaps, keep)
    return int(curve.max()) if len(curve) else 0
