"""A lower bound on the step time of any swap-or-recompute plan in a given op order.

Issue #30 asks, for each Fig. 6 row that stays below 0.8 of ideal, what stops
it: the compute that recomputation adds and the link time left.  This module
answers with a linear program (solved by HiGHS through SciPy) whose optimum
no plan in that order can beat:

* Each pool buffer is needed at the positions that read or make it; between
  two such uses more than one position apart (a *gap*) it may leave the
  device.  ``x_g`` of a gap is swapped (the buffer's bytes come back over
  the host-to-device link), ``y_g`` recomputed (the ops that made its value
  run again), ``x_g + y_g <= 1``; ``z_b >= x_g`` is the part of the buffer
  copied out (once, however often it comes back).
* At every position the bytes live (made and not yet past their last use),
  less what the gaps around that position free, fit the budget less the
  small-tensor pool (which tfswap never swaps: its peak is reserved).
* The step takes at least the ops' time plus the recomputations' time
  (one compute stream), at least the bytes copied out over the
  device-to-host rate, in over the host-to-device rate, and both over the
  duplex rate.
* In time: what is away at a position was copied out before that op
  started and comes back after it ended, so the step takes at least the
  bytes away there over the device-to-host rate plus the ops from there on,
  and the ops up to there plus those bytes over the host-to-device rate
  (the wall a swap-only plan meets at the turn from forward to backward).

What it leaves out only makes the bound lower (so it stays a bound): a
copy holds device memory while it moves, a recomputation needs its inputs
on the device, copies have latency, the link idles while it waits for the
first tensor, objects in a pool fragment memory.  Parameters pinned to the
device stay there (as in the Fig. 6 problem); others may leave between
their uses (they are on the device when the step starts and ends); a
problem whose parameters start the step in host memory is refused.

Example::

    b = step_time_bound(problem, 16 << 30, device_spec("v100-16g-pcie3"))
    b.time_s >= b.ideal_s; b.relative   # ideal / bound: no plan does better
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfswap.core.devices import DeviceSpec
from tfswap.core.problem import Problem
from tfswap.core.recompute import ChainIndex


@dataclass(frozen=True)
class Bound:
    """The LP's optimum and how it spends it (seconds, bytes)."""
    time_s: float            # no plan in this order takes less
    ideal_s: float           # the ops back to back
    recompute_s: float       # compute the optimum adds
    d2h_s: float             # its copies out, at the device-to-host rate
    h2d_s: float             # its copies in, at the host-to-device rate
    swapped_out_bytes: float
    swapped_in_bytes: float
    gaps: int                # variables of the LP (gaps that could free memory)
    rows: int                # positions whose live bytes exceed the room

    @property
    def relative(self) -> float:
        """Throughput relative to ideal that no plan in this order exceeds."""
        return self.ideal_s / self.time_s


# Positions the LP constrains; each adds a variable per gap around it.
MAX_ROWS = 240


class NoPlanFits(Exception):
    """Even freeing every gap leaves some position over the budget."""


def _uses(cg, order) -> list[list[int]]:
    uses = [[] for _ in range(cg.n_buffers)]
    in_ptr, op_in = cg.op_in_ptr.tolist(), cg.op_in.tolist()
    out_ptr, op_out = cg.op_out_ptr.tolist(), cg.op_out.tolist()
    for k, op in enumerate(order):
        for b in op_out[out_ptr[op]:out_ptr[op + 1]]:
            uses[b].append(k)
        for b in op_in[in_ptr[op]:in_ptr[op + 1]]:
            uses[b].append(k)
    return uses


def step_time_bound(problem: Problem, budget_bytes: int, spec: DeviceSpec,
                    order=None, *, max_rows: int = MAX_ROWS) -> Bound:
    """The LP bound (module doc) for ``problem`` in ``order`` (op ids or names;
    default: the problem's schedule) under ``budget_bytes``; at most ``max_rows``
    positions (evenly spaced among those short of memory, and the fullest)."""
    cg = problem.compiled
    if order is None:
        order = cg.order_of(problem.schedule) if problem.schedule else \
            cg.graph.topological_order()
    elif len(order) and isinstance(order[0], str):
        order = cg.order_of(order)
    order = [int(o) for o in order]
    n = len(order)
    pers = cg.buf_persistent.astype(bool)
    pinned = pers & cg.buf_pinned.astype(bool)
    if problem.host_parameters:
        raise ValueError("the bound covers parameters that start the step on the device; "
                         "this problem's start it in host memory")
    nbytes = cg.buf_bytes.astype(np.float64)
    uses = _uses(cg, order)
    room = budget_bytes - cg.small_pool_peak(np.asarray(order))
    live = np.zeros(n + 1)
    for b in range(cg.n_buffers):
        if pers[b]:
            live[0] += nbytes[b]
            live[n] -= nbytes[b]
        elif uses[b]:
            first = min(uses[b])
            last = n - 1 if cg.buf_kept[b] else max(uses[b])
            live[first] += nbytes[b]
            live[last + 1] -= nbytes[b]
    live = np.cumsum(live)[:n]
    ideal = 0.0
    for o in order:   # as the simulator adds them
        ideal += float(cg.op_time[o])
    over = np.flatnonzero(live > room)
    if not len(over):
        return Bound(ideal, ideal, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)

    chains, allowed = ChainIndex(cg, order), problem.recomputable
    if len(over) > max_rows:   # fewer rows: a lower optimum, still a bound
        keep = np.linspace(0, len(over) - 1, max_rows).round().astype(int)
        over = np.union1d(over[keep], over[[int(np.argmax(live[over]))]])
    before = np.cumsum([0.0] + [float(cg.op_time[o]) for o in order])
    op_time, names = cg.op_time, [op.name for op in cg.graph.ops]
    lp = _LP()
    T = lp.var(None)
    z_of: dict[int, int] = {}
    mem = [[] for _ in over]           # (var, bytes) freeing each row's position
    away = [[] for _ in over]          # (var, bytes) copied out at each row's position
    outs, ins, recs = [], [], []       # (var, bytes or seconds) of the totals
    gaps = 0
    for b in range(cg.n_buffers):
        if pinned[b] or len(uses[b]) < 2 and not cg.buf_kept[b] and not pers[b]:
            continue
        u = sorted(set(uses[b]))
        if pers[b]:   # on the device when the step starts and when it ends
            u = [-1] + u + [n]
        elif cg.buf_kept[b] and u[-1] != n - 1:
            u.append(n)   # a fetch may leave after its last reader and come back at the end
        for a, c in zip(u, u[1:]):
            lo, hi = np.searchsorted(over, a + 1), np.searchsorted(over, c - 1, side="right")
            if lo >= hi:   # frees nothing where memory is short
                continue
            gaps += 1
            # Making the buffer's value again runs at least the ops that made it.
            remade = () if pers[b] else chains.value_ops(cg, b, a)
            cost = sum(float(op_time[op]) for op in remade) \
                if remade and all(names[op] in allowed for op in remade) else None
            w = lp.var(1.0)                 # brought back (once for this gap)
            ins.append((w, nbytes[b]))
            if b not in z_of:
                z_of[b] = lp.var(1.0)       # copied out (once for the buffer)
                outs.append((z_of[b], nbytes[b]))
            v = lp.var(1.0) if cost is not None else None
            if v is not None:
                recs.append((v, cost))
            for r in range(lo, hi):
                x = lp.var(1.0)
                lp.row([(x, 1.0), (w, -1.0)], 0.0)
                lp.row([(x, 1.0), (z_of[b], -1.0)], 0.0)
                mem[r].append((x, nbytes[b]))
                away[r].append((x, nbytes[b]))
                if v is not None:
                    y = lp.var(1.0)
                    lp.row([(y, 1.0), (v, -1.0)], 0.0)
                    lp.row([(x, 1.0), (y, 1.0)], 1.0)
                    mem[r].append((y, nbytes[b]))
    for r, k in enumerate(over):
        lp.row([(x, -nb) for x, nb in mem[r]], room - live[k])
        # What is away at k left before op k started and comes back after it ended.
        lp.row([(x, nb / spec.d2h_bytes_per_s) for x, nb in away[r]] + [(T, -1.0)],
               -(ideal - before[k]))
        lp.row([(x, nb / spec.h2d_bytes_per_s) for x, nb in away[r]] + [(T, -1.0)],
               -before[k + 1])
    lp.row([(v, t) for v, t in recs] + [(T, -1.0)], -ideal)
    lp.row([(z, nb / spec.d2h_bytes_per_s) for z, nb in outs] + [(T, -1.0)], 0.0)
    lp.row([(w, nb / spec.h2d_bytes_per_s) for w, nb in ins] + [(T, -1.0)], 0.0)
    lp.row([(z, nb / spec.duplex_bytes_per_s) for z, nb in outs + ins] + [(T, -1.0)], 0.0)
    x = lp.solve(T)
    out_b = sum(x[z] * nb for z, nb in outs)
    in_b = sum(x[w] * nb for w, nb in ins)
    return Bound(time_s=float(x[T]), ideal_s=ideal,
                 recompute_s=float(sum(x[v] * t for v, t in recs)),
                 d2h_s=out_b / spec.d2h_bytes_per_s, h2d_s=in_b / spec.h2d_bytes_per_s,
                 swapped_out_bytes=float(out_b), swapped_in_bytes=float(in_b), gaps=gaps,
                 rows=len(over))


class _LP:
    """A minimisation built row by row: variables in [0, upper], rows ``<= rhs``."""

    def __init__(self):
        self.upper, self.rr, self.cc, self.vv, self.rhs = [], [], [], [], []

    def var(self, upper) -> int:
        self.upper.append(upper)
        return len(self.upper) - 1

    def row(self, terms, rhs) -> None:
        r = len(self.rhs)
        for c, v in terms:
            self.rr.append(r)
            self.cc.append(c)
            self.vv.append(v)
        self.rhs.append(float(rhs))

    def solve(self, objective: int) -> np.ndarray:
        from scipy import sparse
        from scipy.optimize import linprog

        n = len(self.upper)
        a = sparse.csr_matrix((self.vv, (self.rr, self.cc)), shape=(len(self.rhs), n))
        cost = np.zeros(n)
        cost[objective] = 1.0
        res = linprog(cost, A_ub=a, b_ub=np.asarray(self.rhs),
                      bounds=[(0.0, u) for u in self.upper], method="highs")
        if res.status == 2:
            raise NoPlanFits("no plan in this order fits: some position is over the "
                             "budget with everything that may leave gone")
        if res.status != 0:
            raise RuntimeError(f"the bound's LP did not solve: {res.message}")
        return res.x


__all__ = ["Bound", "NoPlanFits", "step_time_bound"]
