"""The policies tfswap is compared with, on the same graph, cost model and simulator.

Every policy has the planner's signature ``(graph, budget_bytes, spec, **options)
-> Plan`` and returns a Plan that :func:`tfswap.core.simulator.simulate` runs
(its ``prediction`` is that simulation).  A policy that cannot keep the step
within ``budget_bytes`` raises :class:`Infeasible`, which says how much the
policy needed.  ``BASELINES`` maps names to policies, for the benchmarks.

* ``ideal``: infinite memory, no swaps: the ops back to back (an upper bound).
* ``no_swap``: the same plan, if its peak fits the budget.
* ``odswap``: on-demand swapping (SwapAdvisor §6.1): when an op needs memory the
  least recently used tensor is swapped out; the swap-ins of later iterations
  are prefetched as early as memory allows, which is what the first
  iteration teaches.  TF's order and the default pool (one size class per
  size), so it is the SwapAdvisor planner with LRU instead of Belady.
* ``vdnn_conv`` / ``vdnn_all``: vDNN: the inputs of every convolution (or of
  every forward op with weights) are copied out after their last forward
  use and brought back one layer ahead of their first backward use.
* ``tflms``: TFLMS-style: a tensor whose next consumer is more than N
  topological levels after its previous use is swapped out, and swapped in
  once the op K levels before that consumer has run; N and K are tuned for
  the fastest plan that fits (``n_levels`` / ``k_levels`` fix them).
* ``capuchin``: Capuchin-style (Capuchin §4): candidates ranked by free time
  FT (time between the swap-out's end and the latest swap-in start that
  still arrives in time); swaps that FT hides come first, then
  recomputation ranked by memory saved per second (MSPS), then swaps that
  stall; each added only while some step still exceeds the budget.
* ``recompute``: recomputation alone (activation checkpointing's trade):
  Capuchin's MSPS-ranked recomputation without its swaps.

Parameters stay on the device in every policy but ``odswap`` (vDNN, TFLMS and
Capuchin swap activations only), and every policy keeps TF's operator order.
Memory: a plan carries the pool its simulation used (one size class per
tensor size, as many objects as were in use at once).  With ``memory="live"``
(the default) a policy fits when the peak of live bytes fits the budget: an
allocator without fragmentation, more generous than any real one and than
the model tfswap's own plans are held to (their size-class pool must fit).
With ``memory="pool"`` the pool the plan carries must fit the budget (one
class per size cannot share memory across sizes, so this is harsher than
TensorFlow's BFC allocator).  With ``memory="shared"`` the pool's objects
that are never busy together share memory (:mod:`tfswap.core.layout`), and
that arena must fit: what tfswap's runtime runs by default.  ``odswap``
always plans within a pool repaired to the budget, as tfswap does.

Example::

    from tfswap.core import baselines
    spec = device_spec("v100-16g-pcie3")
    for name, policy in baselines.BASELINES.items():
        try:
            plan = policy(graph, 8 << 30, spec)
            print(name, plan.prediction.step_time_s)
        except baselines.Infeasible as err:
            print(name, "does not fit:", err)
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from tfswap.core import layout
from tfswap.core import planner as planner_mod
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec, check_planner_arguments
from tfswap.core.graph import DataflowGraph
from tfswap.core.infeasible import Infeasible, InfeasibleAllocation
from tfswap.core.plan import Allocation, Plan, Prediction
from tfswap.core.recompute import chain_index
from tfswap.core.program import (InRec, OutRec, Program, RecomputeRec, _uses_by_position,
                                 canonical, to_plan_swaps)
from tfswap.core.simulator import PlanError, SimResult, run_program, try_program

UNLIMITED = 1 << 62
CONV_PREFIXES = ("Conv", "FusedConv", "DepthwiseConv", "FusedDepthwiseConv")
MEMORY_MODELS = ("pool", "live", "shared")


class _Setting:
    """What every policy needs: the compiled graph, TF's order, the ideal times."""

    def __init__(self, graph, budget_bytes, spec, schedule, keep, compiled,
                 small_threshold_bytes, memory="live"):
        if memory not in MEMORY_MODELS:
            raise ValueError(f"memory must be one of {MEMORY_MODELS}, got {memory!r}")
        self.memory = memory
        check_planner_arguments(budget_bytes, spec)
        if compiled is not None and compiled.graph is not graph:
            raise ValueError("compiled was built from another graph; pass "
                             "CompiledGraph.build(graph, ...) of this graph")
        self.graph, self.budget, self.spec = graph, int(budget_bytes), spec
        self.cg = compiled or CompiledGraph.build(graph, small_threshold_bytes, keep)
        self.order = self.cg.order_of(schedule)
        self.istart, self.iend = planner_mod.ideal_times(self.cg, self.order)
        self.uses = _uses_by_position(self.cg, Program(tuple(int(o) for o in self.order),
                                                       (), (), (), ()))
        self.pool = planner_mod.default_allocation(self.cg, self.order, UNLIMITED)
        cg = self.cg
        self.movable = [not cg.buf_persistent[b] and not cg.buf_pinned[b] and not cg.buf_kept[b]
                        and len(self.uses[b]) > 1 for b in range(cg.n_buffers)]
        self.resident = tuple(b for b in range(cg.n_buffers) if cg.buf_persistent[b])

    def phase(self, k: int) -> str:
        return self.graph.ops[int(self.order[k])].phase

    def simulate(self, prog: Program) -> SimResult:
        if self.memory != "shared":
            return run_program(self.cg, prog, self.pool, self.spec)
        # The shared layout needs the allocation events: the compiled simulation's,
        # and the reference's (which says why) where that one cannot run the program.
        return try_program(self.cg, prog, self.pool, self.spec, allocations=True) or \
            run_program(self.cg, prog, self.pool, self.spec, events=True)

    def used_pool(self, result: SimResult) -> Allocation:
        """The pool ``result`` used: its objects (laid out shared with ``memory="shared"``)."""
        pool = Allocation(self.pool.class_bytes, result.class_peak_objects,
                          self.pool.small_pool_bytes, self.pool.small_threshold_bytes)
        return layout.shared_layout(result, pool) if self.memory == "shared" else pool

    def program(self, outs, ins, recomputes=(), op_waits=()) -> Program:
        return canonical(self.order, self.resident, outs, ins, op_waits, recomputes)

    def plan(self, prog: Program, result: SimResult, name: str) -> Plan:
        """The Plan of ``prog``, with the pool its simulation used."""
        swaps, resident = to_plan_swaps(self.cg, prog)
        return _plan(self, swaps, resident, self.used_pool(result), result, name)

    def need(self, result: SimResult) -> int:
        """Bytes the plan needs under this memory model."""
        if self.memory == "live":
            return result.peak_bytes
        if self.memory == "shared":
            return self.used_pool(result).total_bytes
        return self.pool.small_pool_bytes + int(np.dot(
            np.asarray(self.pool.class_bytes, dtype=np.int64),
            np.asarray(result.class_peak_objects, dtype=np.int64)))

    def check(self, result: SimResult, name: str) -> None:
        need = self.need(result)
        if need > self.budget:
            raise Infeasible(f"{name}: the step needs {need} bytes of device memory "
                             f"({self.memory} model), more than the budget of {self.budget}",
                             need_bytes=need)


def _plan(s: _Setting, swaps, resident, pool, result, name) -> Plan:
    return Plan(schedule=tuple(s.graph.ops[int(o)].name for o in s.order), swaps=swaps,
                budget_bytes=s.budget, allocation=pool, resident_parameters=resident,
                planner=name, prediction=Prediction(
                    peak_bytes=result.peak_bytes, step_time_s=result.step_time_s,
                    ideal_time_s=result.ideal_time_s, swap_out_bytes=result.d2h_bytes,
                    swap_in_bytes=result.h2d_bytes))


def ideal(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
          schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
          compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
          memory: str = "live") -> Plan:
    """No swaps and as much memory as the step needs (``budget_bytes`` is recorded, not
    enforced): the ops back to back, the bound every policy is measured against.

    Example::

        ideal(graph, 16 << 30, spec).prediction.step_time_s
    """
    s = _Setting(graph, budget_bytes, spec, schedule, keep, compiled, small_threshold_bytes,
                 memory)
    prog = s.program([], [])
    return s.plan(prog, s.simulate(prog), "baseline.ideal")


def no_swap(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
            schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
            compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
            memory: str = "live") -> Plan:
    """The unmodified step: the ideal plan if its peak fits ``budget_bytes``, else
    :class:`Infeasible` naming the peak.

    Example::

        no_swap(graph, 16 << 30, spec)   # raises Infeasible if the step needs more
    """
    s = _Setting(graph, budget_bytes, spec, schedule, keep, compiled, small_threshold_bytes,
                 memory)
    prog = s.program([], [])
    result = s.simulate(prog)
    s.check(result, "no_swap")
    return s.plan(prog, result, "baseline.no_swap")


class _LRUScan(planner_mod._Scan):
    """The planner's scan evicting the least recently used buffer (no Belady, no
    recency threshold)."""

    def _choose(self, c, k, incoming, swap_in):
        if self.removable:
            f = self.fresh[c]
            while f:
                entry = heapq.heappop(f)
                if self._current(entry) and self.stamp[entry[2]] != k:
                    return entry[2], True
        best, key = -1, None
        for entry in self.heap[c]:
            b = entry[2]
            if self._current(entry) and self.stamp[b] != k:
                cand = (self.last_use[b], b)
                if key is None or cand < key:
                    best, key = b, cand
        if best < 0:
            op = self.cg.graph.ops[self.order[k]]
            raise InfeasibleAllocation(
                f"op {op.name!r} needs more objects of size class {c} than the pool has")
        return best, False


def odswap(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
           schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
           compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
           memory: str = "live") -> Plan:
    """On-demand LRU swapping with prefetch learned from the first iteration
    (SwapAdvisor §6.1), in TF's order with the default pool repaired to the budget
    (that pool is the constraint; ``memory`` is accepted for the common signature).

    Example::

        odswap(graph, 8 << 30, spec).prediction.step_time_s
    """
    s = _Setting(graph, budget_bytes, spec, schedule, keep, compiled, small_threshold_bytes,
                 memory)
    try:
        pool = planner_mod.default_allocation(s.cg, s.order, s.budget)
        prog = planner_mod.build_program(s.cg, s.order, pool, spec, scan=_LRUScan)
        result = run_program(s.cg, prog, pool, spec)
    except Infeasible as err:
        raise Infeasible(f"odswap: {err}", need_bytes=err.need_bytes) from err
    except PlanError as err:
        # LRU prefetches learned from the first iteration can ask for an object
        # the pool does not have when the step runs: this policy does not fit.
        raise Infeasible(f"odswap: {err}") from err
    swaps, resident = to_plan_swaps(s.cg, prog)
    return _plan(s, swaps, resident, pool, result, "baseline.odswap")


def _is_conv(op_type: str) -> bool:
    t = op_type.lstrip("_")
    return t.startswith(CONV_PREFIXES) and "Backprop" not in t


def vdnn(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *, layers: str = "conv",
         schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
         compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
         memory: str = "live") -> Plan:
    """vDNN: swap out the inputs of every convolution (``layers="conv"``) or of every
    forward op that reads a parameter (``"all"``) after their last forward use (the
    next such layer waits for the copy); the swap-in of a layer's inputs starts
    when the backward pass of the layer above it (the previous swap-in's first
    reader) starts.

    Example::

        vdnn(graph, 8 << 30, spec, layers="all")
    """
    if layers not in ("conv", "all"):
        raise ValueError(f"layers must be 'conv' or 'all', got {layers!r}")
    s = _Setting(graph, budget_bytes, spec, schedule, keep, compiled, small_threshold_bytes,
                 memory)
    cg = s.cg
    in_ptr, op_in = cg.op_in_ptr, cg.op_in
    chosen, layer_pos = {}, []
    for k, o in enumerate(s.order):
        op = graph.ops[int(o)]
        reads = op_in[in_ptr[o]:in_ptr[o + 1]].tolist()
        if op.phase != "forward":
            continue
        if layers == "conv" and not _is_conv(op.type):
            continue
        if layers == "all" and not any(cg.buf_persistent[b] for b in reads):
            continue
        layer_pos.append(k)
        for b in reads:
            if not s.movable[b] or b in chosen:
                continue
            u = s.uses[b]
            first_bwd = next((i for i, q in enumerate(u) if s.phase(q) == "backward"), None)
            if first_bwd is None or first_bwd == 0 or u[first_bwd] - u[first_bwd - 1] < 2:
                continue
            chosen[b] = (u[first_bwd - 1], u[first_bwd])
    outs, ins, waits = [], [], []
    needs = sorted({need for _, need in chosen.values()})
    ahead = {need: (needs[i - 1] - 1 if i else need - 1) for i, need in enumerate(needs)}
    for b, (out_after, need) in sorted(chosen.items()):
        outs.append(OutRec(b, out_after, True))
        ins.append(InRec(b, max(out_after, ahead[need]), (), len(outs) - 1, need))
        # As vDNN does, the next layer's forward waits for the offload to finish,
        # so offloads cannot queue up and hold their memory.
        x = bisect_right(layer_pos, out_after)
        if x < len(layer_pos) and layer_pos[x] < need:
            waits.append((layer_pos[x], len(outs) - 1))
    prog = s.program(outs, ins, op_waits=waits)
    result = s.simulate(prog)
    s.check(result, f"vdnn_{layers}")
    return s.plan(prog, result, f"baseline.vdnn_{layers}")


def topological_levels(graph: DataflowGraph) -> np.ndarray:
    """Each op's level: the longest path (in ops) from an op without predecessors."""
    level = np.zeros(len(graph.ops), dtype=np.int64)
    for i in graph.topological_order():
        preds = graph.predecessors(i)
        if preds:
            level[i] = 1 + max(int(level[p]) for p in preds)
    return level


def _tflms_program(s: _Setting, level_pos: np.ndarray, n_levels: int, k_levels: int) -> Program:
    outs, ins = [], []
    for b in range(s.cg.n_buffers):
        if not s.movable[b]:
            continue
        u = s.uses[b]
        for a, c in zip(u, u[1:]):
            if level_pos[c] - level_pos[a] <= n_levels or c - a < 2:
                continue
            target = level_pos[c] - k_levels
            p = c - 1
            while p > a and level_pos[p] > target:
                p -= 1
            outs.append(OutRec(b, a, True))
            ins.append(InRec(b, p, (), len(outs) - 1, c))
    return s.program(outs, ins)


def tflms(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
          n_levels: int | None = None, k_levels: int | None = None,
          schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
          compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
          candidates: int = 10, memory: str = "live") -> Plan:
    """TFLMS-style swapping: a tensor is swapped out after a use whose next consumer is
    more than ``n_levels`` topological levels later, and swapped in once the last op
    at most ``k_levels`` levels before that consumer has run.  Left None, N is tried
    at ``candidates`` quantiles of the level gaps and K in (1, 2, 4, 8), and the
    fastest plan that fits is returned.

    Example::

        plan = tflms(graph, 8 << 30, spec)            # tuned
        plan = tflms(graph, 8 << 30, spec, n_levels=20, k_levels=2)
    """
    s = _Setting(graph, budget_bytes, spec, schedule, keep, compiled, small_threshold_bytes,
                 memory)
    for name, v in (("n_levels", n_levels), ("k_levels", k_levels)):
        if v is not None and (not isinstance(v, (int, np.integer)) or v < 0):
            raise ValueError(f"{name} must be an int >= 0 (levels), got {v!r}")
    level_pos = topological_levels(graph)[s.order]
    if n_levels is None:
        gaps = [int(level_pos[c] - level_pos[a]) for b in range(s.cg.n_buffers) if s.movable[b]
                for a, c in zip(s.uses[b], s.uses[b][1:])]
        if not gaps:
            ns = [0]
        else:
            qs = np.quantile(np.asarray(gaps), np.linspace(0.0, 1.0, candidates + 1)[:-1])
            # The widest gap swaps nothing: no swaps when the step fits as it is.
            ns = sorted({max(0, int(q) - 1) for q in qs} | {max(gaps)}, reverse=True)
    else:
        ns = [int(n_levels)]
    ks = [int(k_levels)] if k_levels is not None else [1, 2, 4, 8]
    best, best_need = None, None
    for n in ns:
        for k in ks:
            prog = _tflms_program(s, level_pos, n, k)
            result = s.simulate(prog)
            need = s.need(result)
            if need > s.budget:
                best_need = min(best_need or need, need)
                continue
            if best is None or result.step_time_s < best[1].step_time_s:
                best = (prog, result, n, k)
    if best is None:
        raise Infeasible(f"tflms: no N in {ns} and K in {ks} fits the budget of {s.budget} "
                         f"bytes (least needed: {best_need})", need_bytes=best_need)
    prog, result, n, k = best
    return s.plan(prog, result, f"baseline.tflms(N={n},K={k})")


def _capuchin_choice(s: _Setting, target: int, recompute: bool, swap: bool = True,
                     recomputable=None):
    """Swaps and recomputations chosen against the live-bytes profile (no swaps) for
    ``target`` bytes: (outs, ins, recomputes, op waits).  ``swap`` False:
    recomputations only.  ``recomputable``: names of the ops that may run again
    (None: every op)."""
    cg = s.cg
    n = len(s.order)
    istart, iend = np.asarray(s.istart), np.asarray(s.iend)
    nbytes = cg.buf_bytes
    live = np.zeros(n + 1, dtype=np.int64)
    for b in range(cg.n_buffers):
        u = s.uses[b]
        if cg.buf_persistent[b]:
            live += nbytes[b]
        elif u:
            live[u[0]:(n if cg.buf_kept[b] else u[-1] + 1)] += nbytes[b]
    live += s.pool.small_pool_bytes
    swaps, recs = [], []
    for b in range(cg.n_buffers):
        if not s.movable[b]:
            continue
        u = s.uses[b]
        i = max(range(len(u) - 1), key=lambda j: istart[u[j + 1]] - iend[u[j]])
        a, c = u[i], u[i + 1]
        if c - a < 2:
            continue
        out_t, in_t = s.spec.copy_time_s(nbytes[b], "d2h"), s.spec.copy_time_s(nbytes[b], "h2d")
        ft = istart[c] - iend[a] - out_t - in_t
        # Absent from the first op that starts after the copy-out ends to the last
        # op that ends before the just-in-time swap-in must start.
        q = int(np.searchsorted(istart, iend[a] + out_t, side="left"))
        p = int(np.searchsorted(iend, istart[c] - in_t, side="right")) - 1
        swaps.append((ft, b, a, c, max(q, a + 1), max(min(p, c - 1), a)))
    producer = {}
    for o in range(cg.n_ops):
        bufs = cg.op_out[cg.op_out_ptr[o]:cg.op_out_ptr[o + 1]].tolist()
        if len(bufs) == 1:
            producer[bufs[0]] = o
    swaps.sort(key=lambda x: (-x[0], x[1]))
    taken, outs, ins, needed_live, waits = set(), [], [], set(), []

    def relieve(lo, hi, nb):
        if hi < lo or not (live[lo:hi + 1] > target).any():
            return False
        live[lo:hi + 1] -= nb
        return True

    def add_swap(ft, b, a, c, q, p, stall=False):
        if b in taken or b in needed_live:
            return
        if stall:
            # No free time: release right after the last use (the next op waits for
            # the copy) and bring it back as late as still useful.
            q, p = a + 1, min(max(p, a + 1), c - 1)
        trigger = p if p >= a else a
        if relieve(q, trigger, nbytes[b]):
            taken.add(b)
            outs.append(OutRec(b, a, True))
            ins.append(InRec(b, trigger, (), len(outs) - 1, c))
            if q <= trigger:
                # The choice counted on the memory being free from op q on: if
                # the copy-out runs late, op q waits (Capuchin's allocation waits).
                waits.append((q, len(outs) - 1))

    for cand in swaps:
        if live.max() <= target or not swap:
            break
        if cand[0] >= 0:
            add_swap(*cand)
    if recompute and live.max() > target:
        index = chain_index(cg, s.order)
        rec = []
        for ft, b, a, c, q, p in swaps:
            o = producer.get(b)
            if o is None or cg.op_time[o] <= 0 or (
                    recomputable is not None and s.graph.ops[o].name not in recomputable):
                continue
            # The producer alone makes the value dropped after op a only where no
            # op wrote the buffer in place (or viewed it) since: a CNN's gradient
            # Tile, then its ReluGrad in the same buffer, is not made again by Tile.
            if index.value_ops(cg, b, a) != [o]:
                continue
            ins_o = cg.op_in[cg.op_in_ptr[o]:cg.op_in_ptr[o + 1]].tolist()
            if all(cg.buf_persistent[x] or (s.uses[x] and s.uses[x][0] <= c <= s.uses[x][-1])
                   for x in ins_o):
                rec.append((nbytes[b] / cg.op_time[o], b, a, c, ins_o))
        rec.sort(key=lambda x: (-x[0], x[1]))
        for msps, b, a, c, ins_o in rec:
            if live.max() <= target:
                break
            if b in taken or b in needed_live or any(x in taken for x in ins_o):
                continue
            if relieve(a + 1, c - 1, nbytes[b]):
                taken.add(b)
                needed_live.update(ins_o)
                outs.append(OutRec(b, a, False))
                recs.append(RecomputeRec(b, len(outs) - 1, c))
    for cand in swaps:
        if live.max() <= target or not swap:
            break
        add_swap(*cand, stall=True)
    return outs, ins, recs, waits


def capuchin(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
             recompute: bool = True, schedule: Sequence[str] | None = None,
             keep: Sequence[str] = (), compiled: CompiledGraph | None = None,
             small_threshold_bytes: int = 1 << 20, rounds: int = 6,
             memory: str = "live") -> Plan:
    """Capuchin-style hybrid: swaps ranked by free time FT (the hidden ones first),
    then recomputation ranked by MSPS (``recompute``), then the swaps that stall,
    each added while the live bytes still exceed the budget somewhere.  The
    choice is made on ideal times; when the simulated peak still exceeds the
    budget, the target is lowered by the excess and the choice made again
    (``rounds`` times at most).

    Example::

        plan = capuchin(graph, 8 << 30, spec)
        [s.kind for s in plan.swaps]     # "round_trip" and "recompute"
    """
    s = _Setting(graph, budget_bytes, spec, schedule, keep, compiled, small_threshold_bytes,
                 memory)
    return _lowered_targets(s, "capuchin", rounds,
                            lambda target: _capuchin_choice(s, target, recompute))


def recompute_only(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
                   schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
                   compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
                   rounds: int = 6, memory: str = "live", recomputable=None) -> Plan:
    """Recomputation alone, nothing crosses the link: what activation
    checkpointing and greedy rematerialization give.  Capuchin's recomputation
    without its swaps: an activation is dropped after its use before the
    longest gap and its producer runs again before the use after it, from
    inputs that are on the device then (those inputs are never dropped);
    ranked by memory saved per second of compute, each added while the live
    bytes still exceed the budget somewhere; a too-high simulated peak lowers
    the target (``rounds`` times at most), as in :func:`capuchin`.
    ``recomputable``: names of the ops that may run again (None: every op, as
    the published comparisons assume).

    Example::

        plan = recompute_only(graph, 8 << 30, spec)
        {s.kind for s in plan.swaps}      # {"recompute"}
    """
    s = _Setting(graph, budget_bytes, spec, schedule, keep, compiled, small_threshold_bytes,
                 memory)
    return _lowered_targets(s, "recompute", rounds,
                            lambda target: _capuchin_choice(s, target, True, swap=False,
                                                            recomputable=recomputable))


def _lowered_targets(s: _Setting, name: str, rounds: int, choose) -> Plan:
    """The plan of ``choose(target)`` (outs, ins, recomputes, op waits) for the
    budget, and while its simulated need is over, for a target lowered by the
    excess."""
    target, peak = s.budget, None
    for _ in range(rounds):
        outs, ins, recs, waits = choose(target)
        prog = s.program(outs, ins, recs, waits)
        result = s.simulate(prog)
        peak = s.need(result)
        if peak <= s.budget:
            return s.plan(prog, result, f"baseline.{name}")
        target -= peak - s.budget
        if target <= 0:
            break
    raise Infeasible(f"{name}: the step still needs {peak} bytes, more than the budget of "
                     f"{s.budget}", need_bytes=peak)


def _vdnn_all(graph, budget_bytes, spec, **options):
    return vdnn(graph, budget_bytes, spec, layers="all", **options)


BASELINES = {
    "ideal": ideal,
    "no_swap": no_swap,
    "odswap": odswap,
    "vdnn_conv": vdnn,
    "vdnn_all": _vdnn_all,
    "tflms": tflms,
    "capuchin": capuchin,
    "recompute": recompute_only,
}
