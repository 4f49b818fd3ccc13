"""A swap planner that holds the step's live bytes under a cap (for the shared arena).

SwapAdvisor's planner (:mod:`tfswap.core.planner`) evicts within a size
class: when an op needs an object of class ``c`` and none is free, the
buffer of class ``c`` used farthest ahead goes.  That is exact for the
paper's pool, where each class has memory of its own.  With the shared
layout (:mod:`tfswap.core.layout`) memory is one arena, and what has to fit
is the bytes in use at once, not the objects per class; evicting only
within a class then moves tensors that are needed soon while a larger one
of another class idles (ResNet-50 at batch 512 on a 16 GiB V100: 39 GB
moved by the class planner against 26.7 GB by Capuchin's choice, which
counts bytes).

This planner scans the schedule keeping the planned live bytes at every
position under ``cap_bytes``:

* When an op needs memory (an output, or a swap-in of an input) and the
  bytes at its position would pass the cap, it evicts, across all classes,
  the resident activation whose next use is farthest (Belady), skipping the
  ones whose swap-out and the incoming copy would not finish in ideal time
  before the op starts (the planner's recency rule) while others remain.
  The evicted buffer is copied out after its last use before the gap; the
  allocation waits for that copy (``in_wait_for`` / ``out_before``), and the
  evicted bytes count as taken until that allocation starts, since no other
  allocation waits for the copy (a run slower than the simulation then
  still never holds both).
* A swap-in starts as early as the bytes it takes are free at every
  position up to its reader (and after its own swap-out's op), or, with
  ``lookahead`` set, no earlier than the last op that ends, in ideal time,
  ``lookahead`` copy times before its reader starts.

Parameters and optimizer state stay on the device (as in the baselines but
ODSwap); the small-tensor pool is reserved out of the budget first.  The
plan's pool is one size class per size with as many objects as the
simulation uses.

Which allocator realises such a plan is the open question this module
measures (benchmarks/arena_gap.py, benchmarks/RESULTS.md "Why tfswap loses
three rows"): with ``memory="live"`` a plan fits when its live bytes do,
the baselines' model, which needs an allocator that places every
allocation where the plan says; tfswap's pool allocator reuses objects of a
class last-in first-out, and with ``memory="shared"`` the cap is lowered
until the plan's shared arena (:func:`tfswap.core.layout.shared_layout`)
fits, which is what that allocator can run.

Example::

    from tfswap.core import byte_planner
    plan = byte_planner.plan(graph, 16 << 30, device_spec("v100-16g-pcie3"))
    plan.prediction.peak_bytes <= 16 << 30           # live bytes within the budget
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from tfswap.core import layout
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec, check_planner_arguments
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Allocation, Plan, Prediction
from tfswap.core.infeasible import InfeasibleAllocation
from tfswap.core.planner import default_allocation, ideal_times
from tfswap.core.program import START, InRec, OutRec, Program, canonical, to_plan_swaps
from tfswap.core.simulator import SimResult, run_program

UNLIMITED = 1 << 62
MEMORY_MODELS = ("live", "shared")


class _ByteScan:
    """One pass over the schedule under a byte cap (see the module docstring)."""

    def __init__(self, cg: CompiledGraph, order: np.ndarray, spec: DeviceSpec,
                 lookahead: float | None, margin_s: float):
        self.cg, self.order = cg, [int(o) for o in order]
        self.n = n = len(self.order)
        self.never = 2 * n + 2
        self.h2d, self.d2h = spec.h2d_bytes_per_s, spec.d2h_bytes_per_s
        self.latency = float(spec.copy_latency_s)
        self.lookahead, self.margin = lookahead, float(margin_s)
        self.istart, self.iend = ideal_times(cg, self.order)
        self.pers, self.kept = cg.buf_persistent.tolist(), cg.buf_kept.tolist()
        self.nbytes = cg.buf_bytes.tolist()
        in_ptr, ins = cg.op_in_ptr.tolist(), cg.op_in.tolist()
        out_ptr, outs = cg.op_out_ptr.tolist(), cg.op_out.tolist()
        self.reads = [ins[in_ptr[o]:in_ptr[o + 1]] for o in self.order]
        self.allocs = [outs[out_ptr[o]:out_ptr[o + 1]] for o in self.order]
        self.uses = [[] for _ in range(cg.n_buffers)]
        for k in range(n):
            for b in self.reads[k] + self.allocs[k]:
                if not self.uses[b] or self.uses[b][-1] != k:
                    self.uses[b].append(k)
        self.last = [u[-1] if u else -1 for u in self.uses]

    def run(self, cap_bytes: int) -> Program:
        n, B = self.n, self.cg.n_buffers
        nb, pers, kept = self.nbytes, self.pers, self.kept
        # occ[k]: bytes planned on the device while the op at position k runs.
        self.occ = occ = np.zeros(n + 1, dtype=np.int64)
        self.cap = int(cap_bytes)
        self.resident = resident = [False] * B
        self.cursor = [0] * B
        self.version = [0] * B
        self.last_use = [-1] * B
        self.pending_out = [-1] * B
        self.last_out = [-1] * B
        self.stamp = [-1] * B
        self.heap = []   # (-next use, last use, buffer, version): the top is Belady's choice
        self.outs, self.ins, self.op_waits = [], [], []
        start = [b for b in range(B) if pers[b]]
        for b in start:
            resident[b] = True
        occ += sum(nb[b] for b in start)
        if occ[0] > self.cap:
            raise InfeasibleAllocation(
                f"parameters and optimizer state take {int(occ[0])} bytes, more than the cap "
                f"of {self.cap} (this planner keeps them on the device); raise the budget")
        for k in range(n):
            both = self.reads[k] + self.allocs[k]
            for b in both:
                self.stamp[b] = k
            for b in self.reads[k]:
                if not resident[b]:
                    self._swap_in(b, k)
            for b in self.allocs[k]:
                if not resident[b]:
                    evicted = self._make_room(b, k)
                    self.op_waits += [(k, j) for j in evicted]
                    self._in_flight(evicted, k)
                    self._hold(b, k)
            for b in both:
                self._use(b, k)
            for b in both:
                if resident[b] and not pers[b] and not kept[b] and self.last[b] == k:
                    resident[b] = False
                    self.version[b] += 1
                    occ[k + 1:] -= nb[b]
        return canonical(self.order, start, self.outs, self.ins, self.op_waits)

    def _next_use(self, b: int) -> int:
        u, c = self.uses[b], self.cursor[b]
        return u[c] if c < len(u) else self.never

    def _use(self, b: int, k: int) -> None:
        self.last_use[b] = k
        u = self.uses[b]
        while self.cursor[b] < len(u) and u[self.cursor[b]] <= k:
            self.cursor[b] += 1
        self.version[b] += 1
        if not self.pers[b] and not self.kept[b] and self.last[b] != k:
            heapq.heappush(self.heap, (-self._next_use(b), k, b, self.version[b]))

    def _hold(self, b: int, first: int) -> None:
        """``b`` is on the device from position ``first`` on."""
        self.resident[b] = True
        self.version[b] += 1
        self.occ[first:] += self.nbytes[b]

    def _swap_in(self, b: int, k: int) -> None:
        nb = self.nbytes[b]
        evicted = self._make_room(b, k)
        prev = self.last_out[b]
        floor = max([self.outs[prev].out_after if prev >= 0 else START]
                    + [self.outs[j].out_after for j in evicted])
        if self.lookahead is not None:
            want = self.istart[k] - self.lookahead * (self.latency + nb / self.h2d)
            floor = max(floor, min(k - 1, bisect_right(self.iend, want) - 1))
        # The earliest trigger after which the bytes are free at every position to k.
        lo = floor + 1
        full = np.flatnonzero(self.occ[lo:k] + nb > self.cap)
        trigger = lo + int(full[-1]) if len(full) else floor
        self.ins.append(InRec(b, trigger, tuple(evicted), self.pending_out[b], k))
        self.pending_out[b] = -1
        self._in_flight(evicted, trigger + 1)
        self._hold(b, trigger + 1)

    def _in_flight(self, evicted: list[int], taken: int) -> None:
        """Count each evicted buffer again up to position ``taken``, where the allocation
        that waits for its copy-out takes its bytes: until then the copy may still run,
        and nothing else waits for it (so no other allocation may count on them)."""
        for j in evicted:
            o = self.outs[j]
            if taken > o.out_after + 1:
                self.occ[o.out_after + 1:taken] += self.nbytes[o.buf]

    def _make_room(self, incoming: int, k: int) -> list[int]:
        """Evict until ``incoming`` fits at position ``k``: the out records made."""
        occ, cap, nb = self.occ, self.cap, self.nbytes
        need = nb[incoming]
        in_t = self.latency + need / self.h2d
        limit = self.istart[k] + self.margin
        evicted, put_back, recent = [], [], []
        while occ[k] + need > cap:
            e = -1
            while self.heap:
                entry = heapq.heappop(self.heap)
                b = entry[2]
                if not self.resident[b] or self.version[b] != entry[3]:
                    continue          # stale: used or released since it was pushed
                if self.stamp[b] == k:
                    put_back.append(entry)
                elif self.iend[self.last_use[b]] + self.latency + nb[b] / self.d2h + in_t \
                        > limit:
                    recent.append(entry)  # evicting it would stall the op
                else:
                    e = b
                    break
            if e < 0 and recent:
                # Only recent ones are left: the one used farthest ahead.
                recent.sort()
                e = recent.pop(0)[2]
            if e < 0:
                op = self.cg.graph.ops[self.order[k]]
                raise InfeasibleAllocation(
                    f"op {op.name!r} needs {int(occ[k]) + need} bytes of pool buffers at once, "
                    f"more than the cap of {cap}; raise the budget")
            evicted.append(self._evict(e))
        for entry in put_back + recent:
            heapq.heappush(self.heap, entry)
        return evicted

    def _evict(self, e: int) -> int:
        q = self.last_use[e]
        self.resident[e] = False
        self.version[e] += 1
        # Free after its last use for the allocation it is evicted for, which waits
        # for the copy-out; _in_flight counts it again up to where that one starts.
        self.occ[q + 1:] -= self.nbytes[e]
        self.outs.append(OutRec(e, q, True))
        j = len(self.outs) - 1
        self.last_out[e] = j
        self.pending_out[e] = j if self._next_use(e) < self.never else -1
        return j


def build_program(cg: CompiledGraph, order: np.ndarray, spec: DeviceSpec, cap_bytes: int, *,
                  lookahead: float | None = None, recency_margin_s: float = 0.0) -> Program:
    """The swap program for ``order`` with at most ``cap_bytes`` of pool buffers
    planned at any position (module docstring).  Raises
    :class:`~tfswap.core.planner.InfeasibleAllocation` when an op's own buffers or
    the parameters do not fit.

    Example::

        prog = build_program(cg, cg.order_of(None), spec, 8 << 30)
    """
    if not isinstance(cap_bytes, (int, np.integer)) or cap_bytes <= 0:
        raise ValueError(f"cap_bytes must be an int > 0 (bytes), got {cap_bytes!r}")
    if lookahead is not None and not lookahead >= 0:
        raise ValueError(f"lookahead must be None or >= 0 (copy times), got {lookahead!r}")
    return _ByteScan(cg, order, spec, lookahead, recency_margin_s).run(int(cap_bytes))


def _simulated(cg, order, prog, spec, shared: bool) -> tuple[SimResult, Allocation]:
    """The program's simulation and the pool it used (shared: laid out)."""
    pool = default_allocation(cg, order, UNLIMITED)
    result = run_program(cg, prog, pool, spec, events=shared)
    used = replace(pool, class_count=result.class_peak_objects)
    return result, (layout.shared_layout(result, pool) if shared else used)


def plan(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
         schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
         compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
         memory: str = "live", lookahead: float | None = None, rounds: int = 12) -> Plan:
    """Plan ``graph`` in ``schedule`` (default: TF's order) under a byte cap.

    ``memory="live"``: the cap is the budget less the small pool, and the plan
    fits when its simulated live bytes do (the baselines' model).  ``"shared"``:
    the cap is bisected (``rounds`` times at most) to the largest whose plan's
    shared arena plus small pool fits, and the plan carries that layout.

    Example::

        plan(graph, 16 << 30, spec).prediction.step_time_s
        plan(graph, 16 << 30, spec, memory="shared").allocation.total_bytes
    """
    check_planner_arguments(budget_bytes, spec)
    if memory not in MEMORY_MODELS:
        raise ValueError(f"memory must be one of {MEMORY_MODELS}, got {memory!r}")
    if compiled is not None and compiled.graph is not graph:
        raise ValueError("compiled was built from another graph; pass "
                         "CompiledGraph.build(graph, ...) of this graph")
    cg = compiled or CompiledGraph.build(graph, small_threshold_bytes, keep)
    order = cg.order_of(schedule)
    room = int(budget_bytes) - cg.small_pool_peak(order)
    if room <= 0:
        raise InfeasibleAllocation(f"small tensors alone need {budget_bytes - room} bytes, more "
                                   f"than the budget of {budget_bytes}; raise the budget")

    def attempt(cap):
        prog = build_program(cg, order, spec, cap, lookahead=lookahead)
        result, pool = _simulated(cg, order, prog, spec, memory == "shared")
        return prog, result, pool

    best = attempt(room)
    if memory == "live" and best[1].peak_bytes > budget_bytes:
        # The scan plans by positions; the simulation runs in time.  Say so rather
        # than return a plan that does not fit.
        raise InfeasibleAllocation(f"the plan's simulated live bytes ({best[1].peak_bytes}) "
                                   f"exceed the budget of {budget_bytes}")
    if memory == "shared" and best[2].total_bytes > budget_bytes:
        lo, hi, best = 0, room, None
        for _ in range(rounds):
            cap = (lo + hi) // 2
            try:
                got = attempt(cap)
            except InfeasibleAllocation:
                lo = cap
                continue
            if got[2].total_bytes <= budget_bytes:
                lo, best = cap, got
            else:
                hi = cap
        if best is None:
            raise InfeasibleAllocation(f"no cap gives a shared arena within the budget of "
                                       f"{budget_bytes} bytes; raise the budget")
    prog, result, pool = best
    swaps, resident = to_plan_swaps(cg, prog)
    return Plan(schedule=tuple(graph.ops[int(o)].name for o in order), swaps=swaps,
                budget_bytes=int(budget_bytes), allocation=pool, resident_parameters=resident,
                planner=f"bytes.{memory}", prediction=Prediction(
                    peak_bytes=result.peak_bytes, step_time_s=result.step_time_s,
                    ideal_time_s=result.ideal_time_s, swap_out_bytes=result.d2h_bytes,
                    swap_in_bytes=result.h2d_bytes))
