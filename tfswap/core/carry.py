"""A plan of one replica's step carried to another replica's (:func:`carry`):
mapped across the two steps' match (:mod:`tfswap.core.graph_match`), its pool
fitted to the other step, simulated there and accepted only where it fits the
budget.  What lets one search serve every replica of a replicated step.

The plan keeps its schedule, swaps and recomputations (mapped onto the other
step's ops and tensors) and its size classes.  Where the steps differ (the
first replica computes the iteration count and the loss's sum, or Grappler
rewrote a few ops of one replica otherwise) a copy is brought back for the
first op there that reads it, or not at all where no op there reads it again
(:func:`tfswap.core.program.needs_from_uses`); and the other step may need
another object of a class at some moment, or its objects may be busy at other
times than the shared layout's offsets allow: then the pool is laid out again
from the carried plan's own simulation (as many objects of each class as it
uses, placed shared where the plan's pool was), as a planner lays out the
plans it finds.  The result must fit the budget as a planner's plan must, or
it is not carried (:class:`NotCarried`, saying why).  :func:`carry_schedule`
is the next best: the schedule carried, the swaps planned again for it there
(the search, the costly part, still not run again); where neither fits, the
caller searches that step itself.

Example::

    m = graph_match.match(first.graph, other.graph)
    carried = carry(plan, first, other, m, budget_bytes, spec)
    carried.plan.prediction.step_time_s
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tfswap.core import best_of, graph_match, layout, program, search_config, simulator
from tfswap.core.devices import DeviceSpec
from tfswap.core.graph_match import Match
from tfswap.core.infeasible import Infeasible, UnsupportedProblem
from tfswap.core.plan import Plan, Prediction
from tfswap.core.problem import Problem
from tfswap.core.recompute import with_recomputes


class NotCarried(Exception):
    """A plan that does not carry to another step; the text says why."""


@dataclass(frozen=True)
class Carried:
    """A plan carried to another step (:func:`carry`), and how."""

    plan: Plan
    match: Match
    dropped: int = 0         # swaps that named what the other step lacks
    laid_out: bool = False   # the pool laid out again for the other step
    retimed: bool = False    # copies brought back for the other step's own first readers
    replanned: bool = False  # the schedule alone carried, its swaps planned again there

    def describe(self) -> str:
        if self.replanned:
            return (f"{self.match.describe()}; its schedule carried, {len(self.plan.swaps)} "
                    "swap(s) and recomputation(s) planned again for it here by the byte-cap "
                    "planner")
        return (f"{self.match.describe()}; {len(self.plan.swaps)} swap(s) and "
                f"recomputation(s) mapped"
                + (f", {self.dropped} dropped (their ops are the first replica's alone)"
                   if self.dropped else "")
                + ("; copies brought back for this step's own first readers" if self.retimed
                   else "")
                + ("; its pool laid out again for this device" if self.laid_out else ""))


def carry(plan: Plan, source: Problem, target: Problem, m: Match, budget_bytes: int,
          spec: DeviceSpec, allocator: str = "pool") -> Carried:
    """``plan`` (a planner's plan of ``source``) for ``target``, across ``m``
    (``graph_match.match(source.graph, target.graph)``), simulated on ``target``
    with ``spec`` and fitting ``budget_bytes`` (the planner's budget there) as
    ``allocator`` says (:data:`tfswap.core.best_of.ALLOCATORS`: its pool, the
    bytes it holds at once, or both).  Raises :class:`NotCarried`."""
    if m.coverage < graph_match.MIN_COVERAGE:
        raise NotCarried(f"the steps differ beyond a match: {m.describe()}")
    mapped, dropped = graph_match.map_plan(plan, source.graph, target.graph, m)
    for sw in mapped.swaps:
        if sw.kind == "recompute" and not set(
                sw.ops or (sw.tensor.rpartition(":")[0],)) <= target.recomputable:
            raise NotCarried(f"recomputation {sw.id!r} runs again an op this step cannot "
                             "recompute")
    mapped, retimed = _retimed(target, mapped)
    alloc = plan.allocation
    if alloc is not None:
        small = max(alloc.small_pool_bytes,
                    target.compiled.small_pool_peak(target.compiled.order_of(mapped.schedule)))
        alloc = dataclasses.replace(alloc, small_threshold_bytes=target.small_threshold_bytes,
                                    small_pool_bytes=small)
        mapped = dataclasses.replace(mapped, allocation=alloc)
    laid_out = False
    shared = alloc is not None and alloc.shared
    try:
        result = _simulate(target, mapped, spec, events=shared)
        if shared and layout.conflicts(result, alloc):
            raise simulator.PlanError("objects sharing memory are busy at once here")
    except simulator.PlanError:
        if alloc is None:
            raise NotCarried("it does not run on this step") from None
        mapped, result = _laid_out(target, mapped, spec)
        laid_out = True
    need = 0
    if allocator != "pool":
        need = simulator.held_peak_bytes(target.graph, mapped, spec, keep=target.keep,
                                         compiled=target.compiled)
    if allocator != "exact":
        pool = mapped.allocation.total_bytes if mapped.allocation is not None else \
            result.peak_bytes
        need = max(need, pool, result.peak_bytes)
    if need > budget_bytes:
        raise NotCarried(f"it needs {need} B here, more than the planner's budget of "
                         f"{budget_bytes} B")
    prediction = Prediction(peak_bytes=result.peak_bytes, step_time_s=result.step_time_s,
                            ideal_time_s=result.ideal_time_s, swap_out_bytes=result.d2h_bytes,
                            swap_in_bytes=result.h2d_bytes)
    return Carried(dataclasses.replace(mapped, prediction=prediction,
                                       budget_bytes=int(budget_bytes)),
                   m, dropped, laid_out, retimed)


def carry_schedule(plan: Plan, source: Problem, target: Problem, m: Match, budget_bytes: int,
                   spec: DeviceSpec, allocator: str = "pool") -> Carried:
    """Where ``plan`` itself does not carry (:func:`carry`): its schedule carried
    (mapped as :func:`carry` maps it) and its swaps and recomputations planned
    again for that schedule on ``target``, by the byte-cap planner and the
    recomputation pass (:func:`tfswap.core.best_of.byte_planned`, fitting as
    ``allocator`` says, as the default planner plans a schedule the search found): the
    search serves ``target`` still, and what runs again is a fraction of it.
    Raises :class:`NotCarried` where no plan of that schedule fits."""
    if m.coverage < graph_match.MIN_COVERAGE:
        raise NotCarried(f"the steps differ beyond a match: {m.describe()}")
    schedule = graph_match.map_plan(plan, source.graph, target.graph, m)[0].schedule
    try:
        found = best_of.byte_planned(
            target, budget_bytes, spec, [schedule],
            polish=lambda p: with_recomputes(target, p, spec, budget_bytes),
            allocator=allocator)
    except (Infeasible, UnsupportedProblem, simulator.PlanError) as err:
        raise NotCarried(f"no plan of its schedule fits here ({err})") from None
    return Carried(dataclasses.replace(found, planner=search_config.BYTES_PLANNER_NAME), m,
                   replanned=True)


def _retimed(target: Problem, plan: Plan) -> tuple[Plan, bool]:
    """``plan`` with its copies brought back for the first reader ``target``'s
    order has (:func:`tfswap.core.program.needs_from_uses`): where a neighbour
    differs, another op may be the first to read a buffer after it left, or
    none may.  (plan, whether anything moved)."""
    cg = target.compiled
    try:
        prog = program.from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
        fixed = program.needs_from_uses(cg, prog)
    except ValueError as err:
        raise NotCarried(f"it does not map onto this step ({err})") from None
    if fixed is prog:
        return plan, False
    swaps, resident = program.to_plan_swaps(cg, fixed)
    return dataclasses.replace(plan, swaps=swaps, resident_parameters=resident), True


def _simulate(target: Problem, plan: Plan, spec: DeviceSpec, events: bool = False):
    """``plan`` simulated on ``target`` (with its allocation events: what a shared
    layout is checked and laid out by; without, the compiled simulator)."""
    try:
        return simulator.simulate(target.graph, plan, spec, keep=target.keep,
                                  compiled=target.compiled, events=events)
    except ValueError as err:   # names or a schedule that do not fit the graph
        raise NotCarried(f"it does not map onto this step ({err})") from None


def _laid_out(target: Problem, plan: Plan, spec: DeviceSpec) -> tuple[Plan, object]:
    """``plan`` with a pool of its classes that holds what its simulation on
    ``target`` uses at once, laid out shared where ``plan``'s was: (plan, its
    simulation).  Raises :class:`NotCarried` where even an unbounded pool does
    not run it (a reader before its data)."""
    alloc = plan.allocation
    try:
        # As many objects of each class as it has buffers: a pool that never runs out.
        per_class = np.bincount(program.buffer_classes(target.compiled, alloc),
                                minlength=len(alloc.class_count))
    except ValueError as err:   # a buffer larger than every class
        raise NotCarried(f"its pool does not hold this step's buffers ({err})") from None
    roomy = dataclasses.replace(alloc, object_offsets=(), class_count=tuple(
        max(int(c), int(n)) for c, n in zip(alloc.class_count, per_class)))
    try:
        used = _simulate(target, dataclasses.replace(plan, allocation=roomy), spec,
                         events=alloc.shared)
    except simulator.PlanError as err:
        raise NotCarried(f"it does not run on this step ({err})") from None
    if alloc.shared:
        fitted = layout.shared_layout(used, roomy)
    else:
        fitted = dataclasses.replace(alloc, class_count=tuple(
            max(c, u) for c, u in zip(alloc.class_count, used.class_peak_objects)))
    plan = dataclasses.replace(plan, allocation=fitted)
    try:
        return plan, _simulate(target, plan, spec)
    except simulator.PlanError as err:
        raise NotCarried(f"it does not run in a pool laid out for this step ({err})") from None


__all__ = ["Carried", "NotCarried", "carry", "carry_schedule"]
