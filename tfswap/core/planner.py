"""The swap planner of SwapAdvisor §4.2, for a given schedule and allocation.

It scans the schedule keeping, per size class, the set of pool objects in
use.  When an op needs an object of a class that has none free, it evicts a
resident buffer of that class that the op does not use:

* Belady: the one whose next use is farthest (a buffer not used again in
  the step is farthest of all); ties go to the least recently used, whose
  memory comes free earliest.
* Recency threshold: buffers used too recently are skipped while others
  remain.  The paper leaves the threshold open; here a candidate is "too
  recent" when, in ideal time, its last reader's end plus its swap-out plus
  the incoming swap-in would pass the start of the op that needs the space
  (plus ``recency_margin_s``): evicting it would stall that op.
* An activation (or any non-persistent buffer) is only ever evicted if it
  is needed again, so it is copied out; a dead one was freed after its last
  reader.  A parameter whose host copy is current is dropped (no copy); one
  modified in the step is written back.

Swap-outs are released as early as the last use allows (``out_after`` is
the last reader before the gap).  Swap-ins start as early as memory allows:
the object they fill is the free one released earliest (a FIFO of free
objects per class), so the trigger is the op whose end released it, or the
start of the step; a swap-in into an evicted buffer's object waits for that
eviction.  A swap-in also never starts before its own buffer's previous
device copy is gone: after that copy's swap-out (a round trip) or after the
op its drop follows (a parameter dropped and fetched again from its host
home).

Parameters (and optimizer state) start on the host in the first pass; the
ones resident at its end start on the device in the second.  In the second
pass, pressure is first relieved by removing an initially resident
parameter not yet used (the one used last), as the paper describes; if a
parameter that started resident is not resident at the end, it is removed
and the pass repeated (the paper makes two passes; this needs a third only
then).  Parameters resident at the end but not at the start are dropped or
written back after their last use.  So the resident set at the end of a step
equals the set at its start.

Example::

    from tfswap.core.devices import device_spec
    plan = plan_swaps(graph, budget_bytes=6 << 30, spec=device_spec("v100-16g-pcie3"))
    plan.prediction.step_time_s, plan.swaps[:3]
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

import numpy as np

from tfswap.core import allocation as alloc_mod
from tfswap.core.allocation import default_allocation, default_classes  # noqa: F401 (re-export)
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph
from tfswap.core.infeasible import Infeasible, InfeasibleAllocation
from tfswap.core.plan import Allocation, Plan, Prediction
from tfswap.core.program import START, InRec, OutRec, Program, buffer_classes, canonical

MAX_PASSES = 64




def ideal_times(cg: CompiledGraph, order: Sequence[int]) -> tuple[list[float], list[float]]:
    """Start and end of each position with infinite memory (one op after another)."""
    start, end = [], []
    t = 0.0
    for o in order:
        start.append(t)
        t = t + float(cg.op_time[o])
        end.append(t)
    return start, end


class _Scan:
    """One pass of the planner over the schedule (reference implementation).

    The native library (tfswap/core/native/planner_sim.cc) follows this code
    step by step; keep the two in agreement (tests/core/test_native.py).
    """

    def __init__(self, cg, order, buf_class, counts, spec, margin):
        self.cg, self.order, self.buf_class, self.counts = cg, order, buf_class, counts
        self.n = len(order)
        self.never = 2 * self.n + 2
        self.h2d, self.d2h, self.margin = spec.h2d_bytes_per_s, spec.d2h_bytes_per_s, margin
        self.latency = float(spec.copy_latency_s)
        self.istart, self.iend = ideal_times(cg, order)
        B = cg.n_buffers
        # Python lists, not numpy arrays: the scan indexes them one element at a
        # time, where numpy's scalar indexing costs several times more.
        self.pers, self.kept = cg.buf_persistent.tolist(), cg.buf_kept.tolist()
        self.pinned, self.nbytes = cg.buf_pinned.tolist(), cg.buf_bytes.tolist()
        in_ptr, ins, writes = cg.op_in_ptr.tolist(), cg.op_in.tolist(), cg.op_in_write.tolist()
        out_ptr, outs = cg.op_out_ptr.tolist(), cg.op_out.tolist()
        self.reads = [ins[in_ptr[o]:in_ptr[o + 1]] for o in order]
        self.writes = [writes[in_ptr[o]:in_ptr[o + 1]] for o in order]
        self.allocs = [outs[out_ptr[o]:out_ptr[o + 1]] for o in order]
        self.uses = [[] for _ in range(B)]
        for k in range(self.n):
            for b in self.reads[k]:
                self.uses[b].append(k)
            for b in self.allocs[k]:
                self.uses[b].append(k)
        self.last = [u[-1] if u else -1 for u in self.uses]

    def run(self, start_set, removable):
        cg = self.cg
        B = cg.n_buffers
        pers, kept = self.pers, self.kept
        self.resident = [False] * B
        self.obj = [-1] * B
        self.last_use = [-1] * B
        self.cursor = [0] * B
        self.next_use = [u[0] if u else self.never for u in self.uses]  # after cursor
        self.dirty = [False] * B
        self.touched = [False] * B
        self.initial = [False] * B
        self.pending_out = [-1] * B
        self.last_out = [-1] * B
        self.stamp = [-1] * B
        self.removed = []
        self.outs, self.ins, self.op_waits = [], [], []
        offset = np.concatenate([[0], np.cumsum(self.counts)]).astype(int).tolist()
        self.queue = [deque(range(offset[c], offset[c + 1])) for c in range(len(self.counts))]
        self.rel = [START] * offset[-1]
        # Eviction candidates per class, as heaps of (-next use, last use, buffer,
        # version): the top is the Belady choice.  An entry is stale once its
        # buffer's version moves on (it was placed, used or released since).
        self.version = [0] * B
        self.heap = [[] for _ in self.counts]
        self.fresh = [[] for _ in self.counts]  # initially resident, by next use only
        for b in sorted(start_set):
            c = self.buf_class[b]
            if not self.queue[c]:
                raise InfeasibleAllocation(
                    f"class {c} has {self.counts[c]} objects, too few for the parameters "
                    "that must stay on the device")
            self._place(b, self.queue[c].popleft())
            self._push(b)
            self.initial[b] = True
            self.dirty[b] = bool(cg.buf_modified[b])
            if not self.pinned[b]:
                heapq.heappush(self.fresh[c], (-self.next_use[b], -1, b, self.version[b]))
        self.removable = removable
        for k in range(self.n):
            reads, allocs = self.reads[k], self.allocs[k]
            for b in reads:
                self.stamp[b] = k
            for b in allocs:
                self.stamp[b] = k
            for b in reads:
                if not self.resident[b]:
                    self._alloc(b, k, swap_in=True)
            for b in allocs:
                self._alloc(b, k, swap_in=False)
            for b, w in zip(reads, self.writes[k]):
                self._use(b, k, bool(w))
            for b in allocs:
                self._use(b, k, False)
            for b in reads + allocs:
                if not pers[b] and not kept[b] and self.last[b] == k:
                    self._release(b)
                    self.queue[self.buf_class[b]].append(self.obj[b])
                    self.rel[self.obj[b]] = k
        end_set = [b for b in range(B) if pers[b] and self.resident[b]]
        return end_set

    def _place(self, b, obj):
        # No heap entry yet: b is placed for the op at hand, whose _use pushes one.
        self.resident[b] = True
        self.obj[b] = obj
        self.version[b] += 1

    def _release(self, b):
        self.resident[b] = False
        self.version[b] += 1

    def _push(self, b):
        if not self.pinned[b]:
            heapq.heappush(self.heap[self.buf_class[b]],
                           (-self.next_use[b], self.last_use[b], b, self.version[b]))

    def _current(self, entry):
        b = entry[2]
        return self.resident[b] and self.version[b] == entry[3]

    def _use(self, b, k, writes):
        self.last_use[b] = k
        self.cursor[b] += 1
        u = self.uses[b]
        self.next_use[b] = u[self.cursor[b]] if self.cursor[b] < len(u) else self.never
        self.touched[b] = True
        if writes:
            self.dirty[b] = True
        self.version[b] += 1
        if self.pers[b] or self.kept[b] or self.last[b] != k:  # else it is freed right after
            self._push(b)

    def _alloc(self, b, k, swap_in):
        c = self.buf_class[b]
        if self.queue[c]:
            obj = self.queue[c].popleft()
            trigger, waits = self.rel[obj], ()
        else:
            obj, j, trigger = self._evict(c, k, b, swap_in)
            waits = () if j < 0 else (j,)
            if not swap_in and j >= 0:
                self.op_waits.append((k, j))
        if swap_in:
            own = self.pending_out[b]
            prev = self.last_out[b]
            if prev >= 0:
                # The previous device copy of b must be gone before the new one
                # arrives: a round trip also waits for its own swap-out (own ==
                # prev), a drop is done when the op it follows is.
                trigger = max(trigger, self.outs[prev].out_after)
            self.ins.append(InRec(b, trigger, waits, own, k))
            self.pending_out[b] = -1
            self.dirty[b] = False  # a fresh copy equals the host's
        self._place(b, obj)

    def _choose(self, c, k, incoming, swap_in):
        """The buffer of class ``c`` to evict for the op at ``k``, and whether it is
        an initially resident parameter removed from the start set instead.

        Among the resident, unpinned buffers of the class that op ``k`` does not
        use: in a removable pass, an initially resident one not used yet (the one
        used last); else the largest (not recent, next use, -last use, -buffer).
        The heap pops in the order of the last three, so the first entry that
        is not recent is the choice, and the first eligible one if all are.
        """
        stamp = self.stamp
        if self.removable:
            f = self.fresh[c]
            while f:
                entry = heapq.heappop(f)
                if self._current(entry) and stamp[entry[2]] != k:  # else used since
                    return entry[2], True
        in_t = self.latency + float(self.nbytes[incoming]) / self.h2d if swap_in else 0.0
        limit = self.istart[k] + self.margin
        h, popped, best, fallback = self.heap[c], [], -1, -1
        while h:
            entry = heapq.heappop(h)
            if not self._current(entry):
                continue
            popped.append(entry)
            b = entry[2]
            if stamp[b] == k:
                continue
            if fallback < 0:
                fallback = b
            copy = (not self.pers[b]) or self.dirty[b]
            out_t = self.latency + float(self.nbytes[b]) / self.d2h if copy else 0.0
            if self.iend[self.last_use[b]] + out_t + in_t <= limit:  # not recent
                best = b
                break
        for entry in popped:
            heapq.heappush(h, entry)
        if best < 0:
            best = fallback
        if best < 0:
            op = self.cg.graph.ops[self.order[k]]
            raise InfeasibleAllocation(
                f"op {op.name!r} needs more objects of {self.counts[c]}-object size class {c} "
                f"than the allocation has; give that class more objects or raise the budget")
        return best, False

    def _evict(self, c, k, incoming, swap_in):
        e, removed = self._choose(c, k, incoming, swap_in)
        self._release(e)
        if removed:
            self.removed.append(e)
            return self.obj[e], -1, START
        q = self.last_use[e]
        self.last_out[e] = len(self.outs)
        if self.pers[e] and not self.dirty[e]:
            self.outs.append(OutRec(e, q, False))
            self.pending_out[e] = -1
        else:
            self.outs.append(OutRec(e, q, True))
            self.pending_out[e] = len(self.outs) - 1 if self.next_use[e] < self.never else -1
            self.dirty[e] = False
        return self.obj[e], len(self.outs) - 1, q


def build_program(cg: CompiledGraph, order: np.ndarray, allocation: Allocation, spec: DeviceSpec,
                  recency_margin_s: float = 0.0, params_start_on_host: bool = False,
                  scan: type = _Scan) -> Program:
    """Plan the swaps for ``order`` and ``allocation``: the reference planner.

    ``params_start_on_host``: skip the second pass; every swappable parameter
    starts the step on the host (one iteration as the paper's figures show it).
    ``scan``: the pass to run (a subclass of ``_Scan`` with another eviction
    choice; the baselines' LRU).  Raises :class:`InfeasibleAllocation` if some
    op cannot get its objects.
    """
    buf_class = buffer_classes(cg, allocation).tolist()
    counts = list(allocation.class_count)
    scan = scan(cg, [int(o) for o in order], buf_class, counts, spec, recency_margin_s)
    pers = cg.buf_persistent
    pinned_pers = [b for b in range(cg.n_buffers) if pers[b] and cg.buf_pinned[b]]
    end = scan.run(pinned_pers, removable=False)
    start = pinned_pers if params_start_on_host else end
    if sorted(start) != sorted(pinned_pers):
        for _ in range(MAX_PASSES):
            end = scan.run(start, removable=True)
            effective = sorted(set(start) - set(scan.removed))
            if set(effective) <= set(end):
                start = effective
                break
            start = sorted(set(effective) & set(end))
        else:  # pragma: no cover - the start set shrinks every pass
            raise RuntimeError("the two-pass parameter planning did not converge")
    for b in sorted(set(end) - set(start)):
        scan.outs.append(OutRec(b, scan.last_use[b], bool(scan.dirty[b])))
    return canonical(order, start, scan.outs, scan.ins, scan.op_waits)


def plan_swaps(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
               schedule: Sequence[str] | None = None, allocation: Allocation | None = None,
               keep: Sequence[str] = (), recency_margin_s: float = 0.0,
               params_start_on_host: bool = False, small_threshold_bytes: int = 1 << 20,
               compiled: CompiledGraph | None = None) -> Plan:
    """Plan swaps for ``graph`` under ``budget_bytes`` of device memory on ``spec``.

    ``schedule``: op names in execution order (default: the graph's
    topological order).  ``allocation``: the pool (default: one class per
    distinct size, counts from the no-swap peak repaired to the budget).
    ``keep``: tensors that must stay on the device to the end (fetches).
    ``recency_margin_s``: extra seconds a buffer must have been idle to be
    evicted while older ones remain.  ``params_start_on_host``: plan one pass
    with every parameter on the host at the start (no resident parameters).
    The returned Plan carries the allocation, resident parameters and the
    simulator's prediction.  Raises :class:`InfeasibleAllocation` if an op
    cannot get the objects it needs, ValueError for a bad budget or schedule.

    Example::

        plan = plan_swaps(graph, 8 << 30, device_spec("v100-16g-pcie3"))
    """
    from tfswap.core import simulator  # the simulator imports this module

    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
    if compiled is None:
        thr = allocation.small_threshold_bytes if allocation else small_threshold_bytes
        compiled = CompiledGraph.build(graph, thr, keep)
    cg = compiled
    order = cg.order_of(schedule)
    if allocation is None:
        allocation = default_allocation(cg, order, budget_bytes)
    elif allocation.total_bytes > budget_bytes:
        raise ValueError(f"the allocation takes {allocation.total_bytes} bytes, more than the "
                         f"budget of {budget_bytes}; repair it with allocation.repair_counts")
    prog = build_program(cg, order, allocation, spec, recency_margin_s, params_start_on_host)
    result = simulator.run_program(cg, prog, allocation, spec)
    from tfswap.core.program import to_plan_swaps
    swaps, resident = to_plan_swaps(cg, prog)
    return Plan(
        schedule=tuple(graph.ops[o].name for o in order), swaps=swaps,
        budget_bytes=int(budget_bytes), allocation=allocation, resident_parameters=resident,
        planner="swapadvisor", prediction=Prediction(
            peak_bytes=result.peak_bytes, step_time_s=result.step_time_s,
            ideal_time_s=result.ideal_time_s, swap_out_bytes=result.d2h_bytes,
            swap_in_bytes=result.h2d_bytes))


def augmented_edges(plan: Plan) -> list[tuple[str, str]]:
    """The dependency edges of the augmented graph (paper Fig. 3), as (from, to).

    Nodes are op names, ``"out:<swap id>"`` (a swap-out or drop) and
    ``"in:<swap id>"`` (a swap-in); the schedule chain between ops is left out.
    """
    edges = []
    for s in plan.swaps:
        if s.out_after:
            edges.append((s.out_after, f"out:{s.id}"))
            edges += [(f"out:{s.id}", op) for op in s.out_before]
        if s.kind in ("round_trip", "prefetch"):
            if s.in_after:
                edges.append((s.in_after, f"in:{s.id}"))
            if s.kind == "round_trip":
                edges.append((f"out:{s.id}", f"in:{s.id}"))
            edges += [(f"out:{w}", f"in:{s.id}") for w in s.in_wait_for]
            edges += [(f"in:{s.id}", c) for c in s.consumers]
    return edges
