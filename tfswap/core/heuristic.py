"""A one-pass swap heuristic: move the largest tensors live at the peak to the host.

Used for hand-made plans (the foundation's tests and the demo) and as the
"single heuristic" that the genetic search must beat.  It finds the step of
peak memory under the given schedule, takes the largest swappable tensors
that are live there but not read there, swaps each out after its last reader
before the peak and back in ``lead`` ops before its first reader after it.

Example::

    swaps = swap_across_peak(graph, schedule, count=3)
    plan = Plan(schedule=schedule, swaps=swaps)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfswap.core.graph import DataflowGraph
from tfswap.core.liveness import _positions, live_bytes
from tfswap.core.plan import Swap


def swap_across_peak(graph: DataflowGraph, schedule: Sequence[str], count: int,
                     lead: int = 2, min_bytes: int = 1, keep: Sequence[str] = ()) -> tuple[Swap, ...]:
    """Up to ``count`` swaps that each free their tensor's bytes at the peak step."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if lead < 1:
        raise ValueError(f"lead must be >= 1 op, got {lead}")
    pos = _positions(graph, schedule)
    curve = live_bytes(graph, schedule, keep=keep)
    peak_at = int(np.argmax(curve))
    kept = set(keep)
    candidates = []
    for t in graph.tensors:
        if not t.swappable or t.nbytes < min_bytes or t.name in kept or not t.consumers:
            continue
        produced = pos[t.producer]
        readers = sorted((pos[c], c) for c in t.consumers)
        before = [c for p, c in readers if p < peak_at]
        after = [(p, c) for p, c in readers if p > peak_at]
        if produced >= peak_at or not after or len(before) + len(after) != len(readers):
            continue
        first_after = after[0][0]
        trigger = max(peak_at + 1, first_after - lead)
        if trigger >= first_after:
            continue  # its next reader follows the peak at once: nothing to overlap
        out_after = graph.ops[before[-1]].name if before else graph.ops[t.producer].name
        candidates.append(Swap(
            tensor=t.name, out_after=out_after, in_after=schedule[trigger],
            consumers=tuple(graph.ops[c].name for _, c in after), bytes=t.nbytes))
    candidates.sort(key=lambda s: (-s.bytes, s.tensor))
    return tuple(candidates[:count])
