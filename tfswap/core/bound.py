"""A lower bound on the step time any plan of one schedule can reach at a budget.

Every plan runs the step's ops (their time, ``C``), and at each position of the
schedule the bytes live there without swapping must fit the pool the budget
leaves (the planner budget less the small-tensor pool).  Where they do not,
the excess ``X`` has to be off the device at that position: each byte of it
either crosses the link (out, and in again for its next reader; a parameter
whose host copy is current only comes in) or is computed again (its producer
runs again: compute time on the one compute stream).  So the step takes at
least ``min over the split of max(C + recompute time, link time)``.

The bound relaxes what a real plan must do (one position at a time, a
buffer's bytes counted fractionally, a remade buffer costing its producer
alone, latencies ignored), so every plan of the schedule, whatever its
swaps, recomputations and pool, simulates at or above it: the report
shows how far from it a plan is, and a plan near it has little left to gain
at this budget (``tests/core/test_bound.py`` checks it against the planners).

Example::

    bound = lower_bound(problem, budget_bytes, spec)
    bound.time_s <= plan.prediction.step_time_s      # True for every planner's plan
    bound.describe()
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tfswap.core.devices import DeviceSpec
from tfswap.core.problem import Problem

# Positions of the schedule bounded (those with the largest excess): the bound
# is the largest of theirs.
POSITIONS = 16


@dataclass(frozen=True)
class Bound:
    """``time_s`` >= the simulated step time of any plan of ``schedule`` at the
    budget; ``compute_s`` the ops' time alone; ``excess_bytes`` what has to be
    off the device at ``position`` (0: the step fits, the bound is the compute)."""

    time_s: float
    compute_s: float
    excess_bytes: int = 0
    position: int = -1
    op: str = ""

    def describe(self) -> str:
        if not self.excess_bytes:
            return (f"lower bound {self.time_s * 1e3:.4g} ms: the ops' time (what the step "
                    "holds at each position fits the budget: nothing has to leave the device)")
        return (f"lower bound {self.time_s * 1e3:.4g} ms for this budget: the ops take "
                f"{self.compute_s * 1e3:.4g} ms, and before op {self.op!r} "
                f"{self.excess_bytes} B live there must be off the device (over the link or "
                "computed again)")

    def against(self, step_time_s: float) -> str:
        """:meth:`describe`, and how far a plan predicted at ``step_time_s`` is from it."""
        return (f"{self.describe()}; this plan is predicted at {step_time_s / self.time_s:.2f}x "
                "it (a relaxation: one position at a time, a remade value costing its producer "
                "alone)")


def lower_bound(problem: Problem, budget_bytes: int, spec: DeviceSpec,
                schedule: Sequence[str] | None = None) -> Bound:
    """The bound for ``schedule`` (None: the problem's, TF's order) within
    ``budget_bytes`` (the planner's budget: pool and small-tensor pool).

    Raises ValueError on a budget below zero.
    """
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    cg = problem.compiled
    order = cg.order_of(schedule if schedule is not None else problem.schedule)
    compute = 0.0
    for o in order:   # left to right, as the simulator adds
        compute += float(cg.op_time[o])
    n = len(order)
    if n == 0 or cg.n_buffers == 0:
        return Bound(compute, compute)
    first, last = cg.buffer_intervals(order)
    live_delta = np.zeros(n + 1, dtype=np.int64)
    used = last >= 0
    np.add.at(live_delta, first[used], cg.buf_bytes[used])
    np.add.at(live_delta, last[used] + 1, -cg.buf_bytes[used])
    live = np.cumsum(live_delta)[:n]
    room = int(budget_bytes) - cg.small_pool_peak(order)
    excess = live - room
    top = np.argsort(-excess, kind="stable")[:POSITIONS]
    top = top[excess[top] > 0]
    if not len(top):
        return Bound(compute, compute)

    persistent = cg.buf_persistent.astype(bool)
    pinned = cg.buf_pinned.astype(bool)
    remake = np.full(cg.n_buffers, math.inf)
    allowed = problem.recomputable
    for op in range(cg.n_ops):
        if cg.graph.ops[op].name not in allowed:
            continue
        for b in cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]]:
            remake[b] = min(remake[b], float(cg.op_time[op]))
    remake[persistent | pinned] = math.inf

    best = Bound(compute, compute)
    for k in top.tolist():
        here = set(cg.op_in[cg.op_in_ptr[order[k]]:cg.op_in_ptr[order[k] + 1]].tolist()) | \
            set(cg.op_out[cg.op_out_ptr[order[k]]:cg.op_out_ptr[order[k] + 1]].tolist())
        alive = np.flatnonzero((first <= k) & (last >= k) & ~pinned)
        alive = np.array([b for b in alive.tolist() if b not in here], dtype=np.int64)
        need = int(excess[k])
        time_s = _split(compute, need, cg.buf_bytes[alive], remake[alive],
                        persistent[alive], spec)
        if time_s > best.time_s:
            best = Bound(time_s, compute, need, k, cg.graph.ops[int(order[k])].name)
    return best


def _split(compute: float, need: int, nbytes: np.ndarray, remake_s: np.ndarray,
           persistent: np.ndarray, spec: DeviceSpec) -> float:
    """min over y (bytes computed again) of max(compute + R(y), L(need - y)): R the
    cheapest recomputation time for y bytes (fractional, cheapest per byte first),
    L the least link time for moving the rest (parameters, which only come in,
    first).  Infinite where the candidates cannot cover ``need``."""
    nbytes = nbytes.astype(np.float64)
    finite = np.isfinite(remake_s)
    per_byte = remake_s[finite] / np.maximum(nbytes[finite], 1.0)
    rank = np.argsort(per_byte, kind="stable")
    r_bytes = np.cumsum(nbytes[finite][rank])
    r_time = np.cumsum(remake_s[finite][rank])
    p_total = float(nbytes[persistent].sum())
    a_total = float(nbytes[~persistent].sum())

    def recompute_s(y: float) -> float:
        if y <= 0:
            return 0.0
        i = int(np.searchsorted(r_bytes, y))
        if i >= len(r_bytes):
            return math.inf
        before_b = r_bytes[i - 1] if i else 0.0
        before_t = r_time[i - 1] if i else 0.0
        share = (y - before_b) / max(r_bytes[i] - before_b, 1.0)
        return float(before_t + share * (r_time[i] - before_t))

    def link_s(s: float) -> float:
        if s <= 0:
            return 0.0
        if s > p_total + a_total:
            return math.inf
        both = max(0.0, s - p_total)   # activations: out and in again
        return max(s / spec.h2d_bytes_per_s, both / spec.d2h_bytes_per_s,
                   (s + both) / spec.duplex_bytes_per_s)

    hi = min(float(need), float(r_bytes[-1]) if len(r_bytes) else 0.0)
    if spec.copies_on_compute:
        # Copies take the compute stream too: the times add, and the sum is
        # piecewise linear in y, so its least is at a breakpoint.
        ys = [0.0, hi] + [float(b) for b in r_bytes if b < hi]
        return min(compute + recompute_s(y) + link_s(need - y) for y in ys)
    lo = 0.0
    cost = lambda y: max(compute + recompute_s(y), link_s(need - y))  # noqa: E731
    # Recomputation grows and the link time falls with y: the minimum of their
    # maximum is where they cross.
    for _ in range(60):
        mid = (lo + hi) / 2
        if compute + recompute_s(mid) < link_s(need - mid):
            lo = mid
        else:
            hi = mid
    return min(cost(lo), cost(hi))


__all__ = ["Bound", "POSITIONS", "lower_bound"]
