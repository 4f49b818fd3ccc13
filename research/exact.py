"""The fastest plan of a small step, by exhaustive search under tfswap's own model (issue #40).

Checkmate (Jain et al., MLSys'20) solves rematerialization exactly with an
ILP, and Chen et al. (2016) give the sqrt(n) checkpointing heuristic it is
measured against; issue #40 asks the same question of tfswap: on graphs small
enough to search completely, how far is the default planner's plan from the
best plan there is?  "Best" is judged by the model the planners are judged by,
so the comparison is apples to apples: every candidate here is a
:class:`~tfswap.core.program.Program` of the records tfswap's plans are made
of (round trips, drops, recomputations, waits), run by the same compiled
simulator (:func:`tfswap.core.simulator.try_program_rows`), and its pool laid
out shared (:func:`tfswap.core.layout.shared_layout_rows`) exactly as the
byte-cap planner's and the recomputation baseline's are; a candidate fits when
that arena and the small-tensor pool fit the budget.

What is searched (all of it, with branch and bound):

* the op order: TensorFlow's order (``orders="tf"``) or every topological
  order (``orders="all"``; refused beyond ``max_orders``);
* for every gap between two consecutive uses of a pool buffer that may leave
  the device (not a parameter, not kept to the end, not unswappable), one of:
  keep it; a round trip (copied out after the use before the gap, copied in
  for the use after it); or drop it and recompute it right before the use
  after it (the ops :func:`tfswap.core.recompute.value_chain` names, when
  ``Problem.recomputable`` allows them all);
* for every round trip, its trigger: the swap-in starts after any op from the
  use before the gap to the one just before the reader;
* two rules for the waits that hold allocations back until a copy-out has
  freed its memory (a Program's ``op_waits`` and swap-ins' ``waits``): none,
  or the fewest (in the device-to-host stream's order) that keep the bytes an
  op may find held, counting each copy-out still held until waited for and
  each swap-in held from its trigger on, under the budget;
* every choice of size classes for the pool (each a subset of the buffer
  sizes), the arena laid out from each until one fits.

What it does not search, so "exact" means exact over the above: parameters
and optimizer state stay on the device (no prefetches or write-backs; a
problem whose parameters start on the host is refused); activations always
round trip (no drop of a device copy whose host copy is current, which no
tfswap plan does either); a value is made again only right before the reader
after its gap and only by the chain ``value_chain`` allows; waits other than
the two rules; an arena packed better than the planners' greedy layout
packs it; and each link's copies run in the program's canonical order (by
position), as in every tfswap plan.  The bounds that prune the search only
skip programs that cannot be faster than the best found or cannot fit
(``solve(..., bound=False)`` simulates them all, for the tests to compare).

Example::

    found = solve(problem, budget_bytes, spec, orders="all")
    found.plan.prediction.step_time_s, found.programs
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tfswap.core import layout
from tfswap.core.devices import DeviceSpec
from tfswap.core.infeasible import Infeasible, UnsupportedProblem
from tfswap.core.plan import Allocation, Plan, Prediction
from tfswap.core.problem import Problem
from tfswap.core.program import (InRec, OutRec, RecomputeRec, _uses_of_order, canonical,
                                 inputs_back, to_plan_swaps)
from tfswap.core.recompute import ChainIndex, value_chain
from tfswap.core.simulator import simulate, try_program_rows

ORDERS = ("tf", "all")
# Programs simulated before the search gives up: a 14-op step with a few gaps
# needs thousands; one that needs millions is not a small problem.
MAX_PROGRAMS = 200_000
# Distinct buffer sizes whose size-class choices (2 ** (sizes - 1)) are all tried.
MAX_SIZES = 6
PLANNER_NAME = "exact"


class SearchTooLarge(RuntimeError):
    """The search would exceed its limits; nothing inexact is returned instead."""


@dataclass(frozen=True)
class ExactResult:
    """The fastest plan found and how much was searched: ``orders`` op orders,
    ``leaves`` complete keep/swap/recompute assignments reached by the bound,
    ``programs`` simulated, of which ``rejected`` the simulator could not run
    and ``over_budget`` whose shared arena did not fit."""
    plan: Plan
    orders: int
    leaves: int
    programs: int
    rejected: int
    over_budget: int

    @property
    def step_time_s(self) -> float:
        return self.plan.prediction.step_time_s


@dataclass(frozen=True)
class _Gap:
    buf: int
    after: int                        # position of the use before the gap
    need: int                         # position of the use after it
    nbytes: int
    remake: tuple[int, ...] | None    # ops that make the value again; None: may not
    remake_s: float
    temp_bytes: int                   # what those ops make besides the buffer


def topological_orders(problem: Problem, limit: int) -> list[tuple[int, ...]]:
    """Every topological order of the problem's ops (op ids), TF's first; raises
    :class:`SearchTooLarge` where there are more than ``limit``."""
    cg = problem.compiled
    graph = cg.graph
    n = len(graph.ops)
    preds = [graph.predecessors(i) for i in range(n)]
    succ = [[] for _ in range(n)]
    for i in range(n):
        for p in preds[i]:
            succ[p].append(i)
    indeg = [len(p) for p in preds]
    found: list[tuple[int, ...]] = []
    current: list[int] = []

    def walk():
        if len(current) == n:
            found.append(tuple(current))
            if len(found) > limit:
                raise SearchTooLarge(f"the step has more than {limit} topological orders; "
                                     "search TF's order alone (orders='tf') or raise max_orders")
            return
        for i in range(n):
            if indeg[i] == 0 and i not in placed:
                placed.add(i)
                current.append(i)
                for s in succ[i]:
                    indeg[s] -= 1
                walk()
                for s in succ[i]:
                    indeg[s] += 1
                current.pop()
                placed.discard(i)

    placed: set[int] = set()
    walk()
    tf = tuple(int(o) for o in cg.order_of(problem.schedule))
    return [tf] + [o for o in found if o != tf]


def _class_choices(ts: Sequence[int]) -> list[tuple[int, ...]]:
    """Every set of class sizes a pool of ``ts`` may have (each buffer in the
    smallest class it fits, so a class is a run of neighbouring sizes): the
    subsets of ``ts`` holding its largest, one class per size first."""
    ts = tuple(int(t) for t in ts)
    if len(ts) > MAX_SIZES:
        raise SearchTooLarge(f"{len(ts)} distinct buffer sizes make {2 ** (len(ts) - 1)} "
                             f"choices of size classes; the exact search takes {MAX_SIZES}")
    if not ts:
        return [()]
    rest = ts[:-1]
    choices = [tuple(c for c, keep in zip(rest, mask) if keep) + ts[-1:]
               for mask in itertools.product((True, False), repeat=len(rest))]
    return choices


def _pool(cg, classes: tuple[int, ...], small: int) -> Allocation:
    of = np.searchsorted(np.asarray(classes, dtype=np.int64), cg.buf_bytes, side="left")
    counts = np.bincount(of, minlength=len(classes)).tolist() if len(classes) else []
    return Allocation(class_bytes=classes, class_count=counts, small_pool_bytes=small,
                      small_threshold_bytes=cg.small_threshold_bytes)


class _OrderSearch:
    """The branch and bound over one op order (see the module docstring)."""

    def __init__(self, problem: Problem, order: tuple[int, ...], budget: int, spec: DeviceSpec,
                 owner: "_Search"):
        cg = self.cg = problem.compiled
        self.order, self.budget, self.spec, self.owner = order, budget, spec, owner
        n = self.n = len(order)
        self.small = cg.small_pool_peak(np.asarray(order))
        self.cap = budget - self.small
        nbytes = self.nbytes = cg.buf_bytes.tolist()
        # Every choice of size classes (a subset of the sizes with the largest in
        # it; each buffer takes the smallest class it fits), each class with an
        # object for every buffer it may hold: the program, not the pool, decides
        # what is held at once.  The simulated step does not depend on the classes
        # (memory never holds anything up: the waits are the program's), but the
        # shared arena laid out from it does: the greedy packer can leave holes
        # that a coarser class closes.
        self.pools = [_pool(cg, classes, self.small) for classes in _class_choices(cg.ts)]
        self.resident = tuple(b for b in range(cg.n_buffers) if cg.buf_persistent[b])
        uses = _uses_of_order(cg, order)
        self.allocates = [False] * n
        for k, op in enumerate(order):
            if cg.op_out_ptr[op + 1] > cg.op_out_ptr[op]:
                self.allocates[k] = True
        ideal = 0.0
        self.op_start, self.op_end = [], []
        for op in order:   # left to right, as the simulator adds
            self.op_start.append(ideal)
            ideal += float(cg.op_time[op])
            self.op_end.append(ideal)
        self.ideal = ideal
        self.out_s = [spec.copy_time_s(b, "d2h") for b in nbytes]
        self.in_s = [spec.copy_time_s(b, "h2d") for b in nbytes]
        allowed = {i for i, op in enumerate(cg.graph.ops) if op.name in problem.recomputable}
        index = ChainIndex(cg, order)
        # Bytes held at each position with every gap away (the bound's start).
        self.base = np.zeros(n, dtype=np.int64)
        gaps = []
        for b in range(cg.n_buffers):
            u = uses[b]
            if cg.buf_persistent[b]:
                self.base += nbytes[b]
                continue
            if not u:
                continue
            last = n - 1 if cg.buf_kept[b] else u[-1]
            self.base[u[0]:last + 1] += nbytes[b]
            if cg.buf_pinned[b] or cg.buf_kept[b]:
                continue
            for a, c in zip(u, u[1:]):
                if c - a < 2:
                    continue
                self.base[a + 1:c] -= nbytes[b]
                ops = value_chain(cg, index, b, a, c, allowed) if allowed else None
                temp = 0
                if ops:
                    made = {int(x) for op in ops
                            for x in cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]]}
                    temp = sum(nbytes[x] for x in made if x != b)
                gaps.append(_Gap(b, a, c, nbytes[b], ops or None,
                                 sum(float(cg.op_time[op]) for op in ops) if ops else 0.0, temp))
        # Largest first: deciding them first prunes most.
        self.gaps = sorted(gaps, key=lambda g: (-g.nbytes, g.after, g.buf))
        self.d2h_s = [spec.copy_time_s(g.nbytes, "d2h") for g in self.gaps]
        self.h2d_s = [spec.copy_time_s(g.nbytes, "h2d") for g in self.gaps]

    def _time_bound(self, swaps, remake_s) -> float:
        """A bound on any plan of these round trips and remakes: the ops' time with
        the remakes' added (one compute stream), every byte copied at its link's
        full rate, and each round trip's copies back to back between the ops
        around its gap."""
        bound = self.ideal + remake_s
        out_s = in_s = 0.0
        for i in swaps:
            g = self.gaps[i]
            out_s += self.d2h_s[i]
            in_s += self.h2d_s[i]
            between = self.op_start[g.need] - self.op_start[g.after + 1]
            bound = max(bound, self.ideal + self.d2h_s[i] + self.h2d_s[i] - between)
        return max(bound, out_s, in_s)

    def _program_bound(self, prog) -> float:
        """A bound on ``prog``'s step: its copies run on their streams in its order,
        each as soon as what it waits for could be done if no op ever waited (ops
        at their ideal times, copies at their link's full rate), and the ops from
        each swap-in's reader on, or each waiting op on, after it."""
        end, rest = self.op_end, self.ideal
        start = self.op_start
        bound = rest
        done, t = [], 0.0
        for o in prog.outs:
            if o.copy:
                t = max(t, end[o.out_after]) + self.out_s[o.buf]
                done.append(t)
            else:
                done.append(end[o.out_after])
        for k, j in prog.op_waits:
            bound = max(bound, done[j] + rest - start[k])
        t = 0.0
        for r in prog.ins:
            t = max(t, end[r.trigger] if r.trigger >= 0 else 0.0,
                    done[r.own_out] if r.own_out >= 0 else 0.0,
                    max((done[j] for j in r.waits), default=0.0)) + self.in_s[r.buf]
            bound = max(bound, t + rest - start[r.need])
        return bound

    def _trigger_beaten(self, i, p) -> bool:
        """Whether round trip ``i`` with its swap-in after the op at ``p`` cannot
        beat the best so far whatever else the plan does: its copy in starts once
        that op and its copy out could be done, and the ops from its reader on
        follow it."""
        if not self.owner.bound:
            return False
        g = self.gaps[i]
        arrive = max(self.op_end[p], self.op_end[g.after] + self.d2h_s[i]) + self.h2d_s[i]
        return arrive + self.ideal - self.op_start[g.need] >= self.owner.best_time

    def run(self) -> None:
        held = self.base.copy()
        if self.owner.bound and held.max(initial=0) > self.cap:
            return   # even with every gap away some op's own buffers do not fit
        self._branch(0, held, [], [], 0.0)

    def _fits(self, held) -> bool:
        return not self.owner.bound or held.max(initial=0) <= self.cap

    def _beaten(self, swaps, remake_s) -> bool:
        return self.owner.bound and self._time_bound(swaps, remake_s) >= self.owner.best_time

    def _branch(self, i, held, swaps, remakes, remake_s):
        if self._beaten(swaps, remake_s):
            return
        if i == len(self.gaps):
            self.owner.leaves += 1
            self._leaf(held, swaps, remakes, remake_s)
            return
        g = self.gaps[i]
        held[g.after + 1:g.need] += g.nbytes
        if self._fits(held[g.after + 1:g.need]):
            self._branch(i + 1, held, swaps, remakes, remake_s)
        held[g.after + 1:g.need] -= g.nbytes
        self._branch(i + 1, held, swaps + [i], remakes, remake_s)
        if g.remake is not None:
            held[g.need] += g.temp_bytes
            if self._fits(held[g.need:g.need + 1]):
                self._branch(i + 1, held, swaps, remakes + [i], remake_s + g.remake_s)
            held[g.need] -= g.temp_bytes

    def _leaf(self, kept, swaps, remakes, remake_s):
        gaps = self.gaps
        triggers = [[p for p in range(gaps[i].after, gaps[i].need)
                     if not self._trigger_beaten(i, p)] for i in swaps]
        # Bytes held at each position when every round trip's buffer is counted
        # until its swap-out is waited for: what the wait rule holds under the cap.
        held = kept.copy()
        for i in swaps:
            g = gaps[i]
            held[g.after + 1:g.need] += g.nbytes
        for chosen in itertools.product(*triggers):
            if self._beaten(swaps, remake_s):   # the best so far may have come down to it
                return
            waits = self._waits(swaps, chosen, held)
            self._evaluate(swaps, chosen, remakes, None)
            if waits[0] or any(waits[1]):
                self._evaluate(swaps, chosen, remakes, waits)

    def _waits(self, swaps, triggers, held):
        """The wait rule: walking the positions, an op waits for the fewest
        further copy-outs (in their stream's order) that bring what it may find
        held under the cap; a copy-out counts as held from its use to its
        swap-in's trigger until some op has waited for it, and a swap-in waits
        for what the op after its trigger waits for.  (op waits, in waits), as
        indices into the records :meth:`_evaluate` makes (swaps first)."""
        gaps = self.gaps
        fifo = sorted(range(len(swaps)), key=lambda j: (gaps[swaps[j]].after, gaps[swaps[j]].buf))
        done = 0            # copy-outs waited for, a prefix of ``fifo``
        waited_by_ops = 0
        freed = np.zeros(self.n, dtype=np.int64)
        at = [0] * (self.n + 1)
        op_waits = []
        for k in range(self.n):
            while held[k] - freed[k] > self.cap and done < len(fifo) \
                    and gaps[swaps[fifo[done]]].after < k:
                j = fifo[done]
                g = gaps[swaps[j]]
                freed[g.after + 1:triggers[j] + 1] += g.nbytes
                done += 1
            at[k] = done
            if done > waited_by_ops and self.allocates[k]:
                op_waits.append((k, fifo[done - 1]))
                waited_by_ops = done
        in_waits = []
        for j, p in enumerate(triggers):
            w = at[p + 1]
            in_waits.append((fifo[w - 1],) if w and fifo.index(j) < w - 1 else ())
        return op_waits, in_waits

    def _evaluate(self, swaps, triggers, remakes, waits):
        owner, gaps = self.owner, self.gaps
        outs, ins, recs = [], [], []
        for j, (i, p) in enumerate(zip(swaps, triggers)):
            g = gaps[i]
            outs.append(OutRec(g.buf, g.after, True))
            ins.append(InRec(g.buf, p, waits[1][j] if waits else (), j, g.need))
        for i in remakes:
            g = gaps[i]
            outs.append(OutRec(g.buf, g.after, False))
            recs.append(RecomputeRec(g.buf, len(outs) - 1, g.need, g.remake))
        prog = inputs_back(self.cg, canonical(self.order, self.resident, outs, ins,
                                              waits[0] if waits else (), recs))
        if owner.bound and self._program_bound(prog) >= owner.best_time:
            return
        owner.programs += 1
        if owner.programs > owner.max_programs:
            raise SearchTooLarge(f"more than {owner.max_programs} programs to simulate; "
                                 "the step is too large to search exactly")
        for pool in self.pools:
            got = try_program_rows(self.cg, prog, pool, self.spec, allocations=True)
            if got is None:
                owner.rejected += 1
                return
            result, run = got
            if result.step_time_s >= owner.best_time:
                return
            # What is in use at once, at class sizes, is in the arena at once.
            if result.peak_bytes > self.budget:
                continue
            arena = layout.shared_layout_rows(run.event_rows, result.class_peak_objects, pool)
            if arena.total_bytes <= self.budget:
                owner.best_time = result.step_time_s
                owner.best = (self, prog, arena, result)
                return
        owner.over_budget += 1


class _Search:
    def __init__(self, max_programs, bound):
        self.best_time = math.inf
        self.best = None
        self.leaves = self.programs = self.rejected = self.over_budget = 0
        self.max_programs, self.bound = max_programs, bound


def solve(problem: Problem, budget_bytes: int, spec: DeviceSpec, *, orders: str = "tf",
          max_orders: int = 2000, max_programs: int = MAX_PROGRAMS,
          bound: bool = True) -> ExactResult:
    """The fastest plan of ``problem`` within ``budget_bytes`` over the space the
    module docstring describes, as the simulator predicts it.  ``bound`` False
    simulates every program of the space (what the bounds are checked against:
    they may only skip programs that cannot be faster or cannot fit).  Raises
    :class:`Infeasible` where no plan of that space fits, :class:`UnsupportedProblem`
    where parameters start the step on the host, :class:`SearchTooLarge` where the
    space is beyond ``max_orders`` or ``max_programs``."""
    if orders not in ORDERS:
        raise ValueError(f"orders must be one of {ORDERS}, got {orders!r}")
    if problem.host_parameters:
        raise UnsupportedProblem("the exact search keeps every parameter on the device, and "
                                 "this step's parameters start it in host memory")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)) \
            or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be an int >= 0, got {budget_bytes!r}")
    cg = problem.compiled
    todo = topological_orders(problem, max_orders) if orders == "all" else \
        [tuple(int(o) for o in cg.order_of(problem.schedule))]
    search = _Search(max_programs, bound)
    for order in todo:
        _OrderSearch(problem, order, int(budget_bytes), spec, search).run()
    if search.best is None:
        raise Infeasible(f"exact: no plan of the searched space fits {budget_bytes} bytes "
                         f"({search.programs} programs simulated, {search.over_budget} over "
                         "the budget)")
    where, prog, pool, result = search.best
    swaps, resident = to_plan_swaps(cg, prog)
    plan = Plan(schedule=tuple(cg.graph.ops[o].name for o in where.order), swaps=swaps,
                budget_bytes=int(budget_bytes), allocation=pool, resident_parameters=resident,
                planner=PLANNER_NAME, prediction=Prediction(
                    peak_bytes=result.peak_bytes, step_time_s=result.step_time_s,
                    ideal_time_s=result.ideal_time_s, swap_out_bytes=result.d2h_bytes,
                    swap_in_bytes=result.h2d_bytes))
    # The plan as saved must be the program searched: simulated from its own
    # records it gives the same step.
    again = simulate(problem.graph, plan, spec, keep=problem.keep, compiled=cg)
    if again.step_time_s != result.step_time_s:
        raise RuntimeError(f"exact: the plan simulates to {again.step_time_s} s, its program "
                           f"to {result.step_time_s} s: a record did not survive the Plan")
    return ExactResult(plan, len(todo), search.leaves, search.programs, search.rejected,
                       search.over_budget)


__all__ = ["ExactResult", "MAX_PROGRAMS", "ORDERS", "PLANNER_NAME", "SearchTooLarge",
           "solve", "topological_orders"]
