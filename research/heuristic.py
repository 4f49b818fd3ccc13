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
from tfswap.core.liveness import _positions, buffers, live_bytes
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
    # Tensors sharing a buffer (forwarded in place, or views) free it only
    # together: a candidate must be the only member of its buffer read after
    # the peak, and its swap-out waits for every member's earlier readers.
    group_of = {}
    for members in buffers(graph).values():
        for m in members:
            group_of[m] = members
    candidates = []
    for t_id, t in enumerate(graph.tensors):
        if not t.swappable or t.nbytes < min_bytes or t.name in kept or not t.consumers \
                or t.kind in ("parameter", "optimizer_state"):
            continue
        group = [graph.tensors[m] for m in group_of[t_id]]
        if any(m.name in kept for m in group):
            continue
        produced = min(pos[m.producer] for m in group)
        readers = sorted((pos[c], c) for c in t.consumers)
        before = sorted(pos[c] for m in group for c in m.consumers if pos[c] < peak_at)
        after = [(p, c) for p, c in readers if p > peak_at]
        others_after = any(pos[c] >= peak_at for m in group if m.name != t.name
                           for c in m.consumers)
        if produced >= peak_at or pos[t.producer] >= peak_at or not after or others_after \
                or any(p == peak_at for p, _ in readers):
            continue
        first_after = after[0][0]
        trigger = max(peak_at + 1, first_after - lead)
        if trigger >= first_after:
            continue  # its next reader follows the peak at once: nothing to overlap
        out_at = max(before[-1] if before else 0, pos[t.producer])
        # The liveness model frees the original right after ``out_after``; the next
        # op waits for the swap-out so that this holds however the copy is scheduled
        # (a stall the simulator-driven planner avoids; this heuristic is for hand plans).
        candidates.append(Swap(
            tensor=t.name, out_after=schedule[out_at], in_after=schedule[trigger],
            consumers=tuple(graph.ops[c].name for _, c in after), bytes=t.nbytes,
            out_before=(schedule[out_at + 1],)))
    candidates.sort(key=lambda s: (-s.bytes, s.tensor))
    return tuple(candidates[:count])
