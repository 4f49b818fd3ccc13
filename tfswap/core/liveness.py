"""Reference liveness model: device bytes live at each step of a schedule.

No timing, no pools: a tensor's buffer occupies its bytes from the step its
producer runs to the step of its last reader; a swapped tensor's original
lives until its swap-out has read it, and its copy from its trigger step to
its last re-pointed reader.  It is the simple oracle that faster models are
tested against, and what a hand-written plan's "bytes freed" is predicted with.

Buffers, not tensors, hold memory: tensors whose ``alias_of`` names another
tensor (TF forwarded the buffer in place, or a view such as Reshape) share
the root tensor's buffer, counted once, live from the first producer to the
last reader of any tensor in the group.  An op's ``scratch_bytes`` are live
only at the op's own step.  ``resident`` tensors (e.g. variable values) live
for the whole step.  Graphs without aliases, scratch or residents behave as
plain per-tensor intervals.

Example::

    curve = live_bytes(graph, schedule)            # bytes at each step
    freed = peak(graph, schedule) - peak(graph, schedule, plan.swaps)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def buffer_root(graph: DataflowGraph, name: str) -> str:
    """The tensor owning ``name``'s buffer (follows ``alias_of`` chains)."""
    seen = set()
    while True:
        alias = graph.tensor(name).alias_of
        if not alias or alias == name:
            return name
        if name in seen:
            raise ValueError(f"tensor {name!r}: alias_of forms a cycle")
        seen.add(name)
        name = alias


def buffers(graph: DataflowGraph) -> dict[str, list[int]]:
    """Root tensor name -> ids of the tensors sharing its buffer (root first)."""
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(graph.tensors):
        groups.setdefault(buffer_root(graph, t.name), []).append(i)
    for root, members in groups.items():
        r = graph.tensor_id(root)
        members.sort(key=lambda m: (m != r, m))
    return groups


def live_bytes(graph: DataflowGraph, schedule: Sequence[str],
               swaps: Sequence[Swap] = (), keep: Sequence[str] = (),
               resident: Sequence[str] = ()) -> np.ndarray:
    """Bytes live on the device while each scheduled op runs.

    ``keep``: tensors that stay live to the end of the step (the fetches).
    ``resident``: tensors live for the whole step (device-resident variables).
    """
    pos = _positions(graph, schedule)
    n = len(schedule)
    delta = np.zeros(n + 1, dtype=np.int64)
    by_tensor = {}
    for s in swaps:
        by_tensor.setdefault(s.tensor, []).append(s)
    kept = set(keep)
    always = set(resident)

    def occupy(start: int, end: int, nbytes: int) -> None:
        delta[start] += nbytes
        delta[end + 1] -= nbytes

    for i, op in enumerate(graph.ops):
        if op.scratch_bytes:
            occupy(pos[i], pos[i], op.scratch_bytes)

    for root, members in buffers(graph).items():
        tensors = [graph.tensors[m] for m in members]
        nbytes = max(t.nbytes for t in tensors)
        names = {t.name for t in tensors}
        if names & always:
            occupy(0, n - 1, nbytes)
            continue
        start = min(pos[t.producer] for t in tensors)
        readers = [pos[c] for t in tensors for c in t.consumers]
        is_kept = bool(names & kept)
        end = n - 1 if is_kept else max(readers, default=start)
        group_swaps = [s for t in tensors for s in by_tensor.get(t.name, ())]
        if not group_swaps:
            occupy(start, end, nbytes)
            continue
        repointed = set()
        for s in group_swaps:
            copy_readers = [pos[graph.op_id(c)] for c in s.consumers]
            repointed.update(graph.op_id(c) for c in s.consumers)
            occupy(pos[graph.op_id(s.in_after)], max(copy_readers), graph.tensor(s.tensor).nbytes)
        original_readers = [pos[c] for t in tensors for c in t.consumers if c not in repointed]
        out_pos = [pos[graph.op_id(s.out_after)] for s in group_swaps]
        original_end = n - 1 if is_kept else max(original_readers + out_pos + [start])
        occupy(start, original_end, nbytes)
    return np.cumsum(delta[:n])


def variable_copies(graph: DataflowGraph, schedule: Sequence[str],
                    updates: Mapping[str, str]) -> list[tuple[int, int]]:
    """``(step, bytes)`` of the copy each in-place variable update makes.

    ``updates``: op name -> a tensor holding the value of the variable it
    updates in place.  TF updates a variable in place only when nothing else
    holds its buffer; while a read of the current value is still to be used,
    the update first copies the variable (copy-on-write), and the copy becomes
    the variable.  So an update scheduled before the last reader of a value
    read before it allocates the variable's bytes again, held to the end of
    the step.
    """
    pos = _positions(graph, schedule)
    groups = buffers(graph)
    copies = []
    for op_name, value in updates.items():
        root = buffer_root(graph, value)
        at = int(pos[graph.op_id(op_name)])
        # Reads made after the update see the new value; only earlier ones pin the old.
        last = max((pos[c] for m in groups[root] if pos[graph.tensors[m].producer] < at
                    for c in graph.tensors[m].consumers), default=-1)
        if last > at:
            copies.append((at, graph.tensor(root).nbytes))
    return copies


def peak(graph: DataflowGraph, schedule: Sequence[str], swaps: Sequence[Swap] = (),
         keep: Sequence[str] = (), resident: Sequence[str] = ()) -> int:
    """Largest value of :func:`live_bytes`."""
    curve = live_bytes(graph, schedule, swaps, keep, resident)
    return int(curve.max()) if len(curve) else 0
