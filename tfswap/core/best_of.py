"""Composing planners: the fastest plan of several, each one's outcome kept.

The plan a user gets (the registered ``tfswap`` planner,
:func:`tfswap.core.planners.default`) is the fastest, as simulated, of every
planner tfswap has.  A :class:`Contest` runs the planners one after the
other, records each one's predicted step time or why it planned nothing
(:class:`Candidate`, shown in the report), and keeps the fastest plan; a
later planner may start from an earlier one's result (the byte-cap planner
plans the genetic search's best schedule too).

Example::

    contest = Contest()
    contest.enter("tfswap.order", lambda: planners.run("tfswap.order", problem, budget, spec))
    contest.enter("tfswap.bytes", lambda: planners.run("tfswap.bytes", problem, budget, spec))
    result = contest.winner()          # Infeasible if neither planned
    [c.describe() for c in contest.candidates]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tfswap.core import byte_planner
from tfswap.core.devices import DeviceSpec
from tfswap.core.infeasible import Infeasible, UnsupportedProblem
from tfswap.core.plan import Plan
from tfswap.core.problem import Problem
from tfswap.core.simulator import PlanError, held_peak_bytes

# The byte-cap planner's prefetch rule, tried each way: as early as memory
# allows (None), and no earlier than 4 copy times before the reader, which
# leaves the early bytes to the buffers it makes again instead (BERT-base b64 on
# the simulated V100: 0.816 of ideal against 0.793 after the recomputation pass).
BYTE_LOOKAHEADS = (None, 4.0)
# The prefetch rules whose scans also read checkpoints
# (:data:`tfswap.core.byte_planner.CHECKPOINT_VARIANTS`, where the fastest plan
# of the others still copies; each plan polished only where it is the fastest
# as scanned): TF's alone, which on the
# issue #40 rows (50 MB/s link, 40%) plans as fast as both and keeps the planning
# time within a few percent (BERT-base b64 on the simulated V100: 0.844 of ideal
# against 0.811 without checkpoints, 5.7 s -> 6.0 s).
CHECKPOINT_LOOKAHEADS = (None,)
# The byte-cap planner's plans (fastest first, as polished) whose remakes are
# moved to share ops (``share``, :func:`tfswap.core.recompute.shared_remakes`):
# each pass is up to MAX_SHARE_TRIALS simulations, so the fastest few only.
# Four since the scan with shared temporaries
# (:data:`tfswap.core.byte_planner.SHARED_VARIANTS`): its plan, whose remakes
# share already, took a place among three that the pass brought to the front
# elsewhere (the zoo's LSTM-4 at 60% on a 50 MB/s link, a problem saved
# 2026-11-28: 1.28x of ideal with three passes before that scan, 1.40x with it,
# 1.28x with it and four).
SHARED_PLANS = 4
# The byte-cap planner's plans polished (the recomputation pass, many
# simulations each): those scanned within this factor of the fastest scanned;
# the others are kept as scanned.  On the Fig. 6 rows the pass never brought a
# plan scanned 1.5x or more behind to the front (BERT-base b64 on the H100 bf16:
# 27 plans polished, the best from one scanned 1.00x the fastest; Inception-V3
# b256: from one at 1.15x), and 15 of BERT-base's 27 polishes were such.
POLISH_WITHIN = 1.5
# What serves the step's memory, and so what of a plan must fit its budget:
# "pool", tfswap's pool allocator (a budget arena on a GPU): the plan's pool,
# laid out; "exact", an allocator that gives each buffer its own bytes
# (TensorFlow's, wherever no budget arena is installed) on a step whose plan is
# measured: the bytes the step holds at once; "guarded", that allocator on a
# step nothing measures: both, the pool's slack standing in for the
# measurement.  The pool alone is not enough there: a swap-in's buffer is taken
# when its op runs, which may be well before its copy (and the pool object's
# interval) starts, and a random step planned to its pool held 8% over its
# budget in 2 of 12 runs, as the held model predicted (fuzz seed 8331).
ALLOCATORS = ("pool", "exact", "guarded")

R = TypeVar("R")


@dataclass(frozen=True)
class Candidate:
    """One planner's outcome in a :class:`Contest`: its plan's predicted step time
    in seconds, or (``step_time_s`` None) why it planned nothing."""
    planner: str
    step_time_s: float | None
    why_not: str = ""
    chosen: bool = False

    def describe(self) -> str:
        if self.step_time_s is None:
            return f"{self.planner}: {self.why_not}"
        return f"{self.planner} {self.step_time_s * 1e3:.4g} ms" + \
            (" (chosen)" if self.chosen else "")


class Contest:
    """Planners run one after the other; the fastest plan is kept.

    ``enter(name, run)`` calls ``run()`` (which returns an object with a
    ``plan``), records the outcome and returns the result, or None where the
    planner raised :class:`Infeasible` or :class:`UnsupportedProblem`, or where
    the simulator rejected what it made (:class:`~tfswap.core.simulator.PlanError`,
    a planner bug: a warning says so, and the other planners' plans still serve).
    A tie keeps the earlier entrant.
    """

    def __init__(self, admit: Callable[[Plan], None] | None = None):
        """``admit``: a plan -> None, raising :class:`NotAdmitted` where the plan
        may not serve though its planner made it (:func:`held_within`)."""
        self._entries: list[tuple[str, object | None, Exception | None]] = []
        self._best: int | None = None
        self._admit = admit

    def enter(self, name: str, run: Callable[[], R]) -> R | None:
        try:
            result = run()
            if self._admit is not None:
                self._admit(result.plan)
        except (Infeasible, UnsupportedProblem) as err:
            self._entries.append((name, None, err))
            return None
        except PlanError as err:
            warnings.warn(f"planner {name!r}: the simulator rejected its plan ({err}); the "
                          "other planners' plans are used. This is a planner bug: please "
                          "report it with the step", RuntimeWarning, stacklevel=2)
            self._entries.append((name, None, err))
            return None
        self._entries.append((name, result, None))
        best = self._best
        if best is None or _time(result) < _time(self._entries[best][1]):
            self._best = len(self._entries) - 1
        return result

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return tuple(Candidate(name, _time(result), why_not=_why_not(err), chosen=k == self._best)
                     if result is not None else Candidate(name, None, why_not=_why_not(err))
                     for k, (name, result, err) in enumerate(self._entries))

    def winner(self):
        """The fastest result; raises :class:`Infeasible` (the smallest need any
        planner named) when none planned."""
        if self._best is not None:
            return self._entries[self._best][1]
        errors = [err for _, _, err in self._entries]
        needs = [e.need_bytes for e in errors if isinstance(e, Infeasible) and e.need_bytes]
        reasons = "; ".join(f"{name}: {err}" for name, _, err in self._entries)
        raise Infeasible(f"no planner found a plan within the budget ({reasons})",
                         need_bytes=min(needs) if needs else None)


def _time(result) -> float:
    return result.plan.prediction.step_time_s


def _why_not(err: Exception | None) -> str:
    if err is None:
        return ""
    if isinstance(err, PlanError):
        return f"rejected by the simulator ({err})"
    if isinstance(err, NotAdmitted):
        return f"does not fit: {err}"
    return "does not fit" if isinstance(err, Infeasible) else f"cannot plan this step ({err})"


class NotAdmitted(Infeasible):
    """A planner's plan that a :class:`Contest`'s ``admit`` refused."""


def _held_bytes(problem: Problem, plan: Plan, spec: DeviceSpec) -> int:
    """:func:`tfswap.core.simulator.held_peak_bytes` of ``plan``, kept on the problem's
    compiled graph: the byte-cap planner checks its plan and the default planner's
    contest checks it again (a simulation with events each, 0.13 s on BERT-base b64)."""
    key = (plan.schedule, plan.swaps, plan.resident_parameters, plan.allocation, spec)
    return problem.compiled.memo("held_peak_bytes", key, lambda: held_peak_bytes(
        problem.graph, plan, spec, keep=problem.keep, compiled=problem.compiled))


def held_within(problem: Problem, budget_bytes: int, spec: DeviceSpec) -> Callable[[Plan], None]:
    """A :class:`Contest`'s ``admit`` where an allocator that gives each buffer its
    own bytes serves the step ("exact", "guarded"): a plan whose step holds more
    than ``budget_bytes`` at once (:func:`tfswap.core.simulator.held_peak_bytes`)
    raises :class:`NotAdmitted`.  The planners fit their pool, and the bytes a
    step holds can pass the pool's peak where a swap-in's op runs before its
    copy starts."""
    def admit(plan: Plan) -> None:
        held = _held_bytes(problem, plan, spec)
        if held > budget_bytes:
            raise NotAdmitted(f"its step holds {held} B at once, more than the budget of "
                             f"{budget_bytes} B")
    return admit


def byte_planned(problem: Problem, budget_bytes: int, spec: DeviceSpec,
                 schedules: Sequence[Sequence[str] | None],
                 polish: Callable[[Plan], Plan] = lambda plan: plan,
                 allocator: str = "pool",
                 share: Callable[[Plan], Plan] = lambda plan: plan) -> Plan:
    """The fastest plan of :mod:`tfswap.core.byte_planner` on ``schedules`` (each
    way of :data:`BYTE_LOOKAHEADS`, each variant ``polish``-ed, the fastest
    :data:`SHARED_PLANS` of them also ``share``-d, kept beside their own) that fits:
    ``allocator`` "pool", its shared arena; "exact", the bytes it holds at once
    (:func:`tfswap.core.simulator.held_peak_bytes`); "guarded", both.  Raises :class:`Infeasible`
    when none fits and :class:`UnsupportedProblem` when parameters start the
    step in host memory (that planner keeps every parameter on the device).

    The class planner evicts within a size class; with a shared arena what must
    fit is bytes, and on steps several times the device (Inception-V3 at batch
    512 on a 16 GiB V100) evicting across classes moves far less.
    """
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    cg = problem.compiled
    if problem.host_parameters:
        raise UnsupportedProblem("the byte-cap planner keeps every parameter on the device, "
                                 "and this step's parameters start it in host memory")
    scanned, seen = [], set()
    for schedule in schedules:
        order = cg.order_of(schedule).tobytes()
        if order in seen:    # the search's best schedule can be TF's order itself
            continue
        seen.add(order)
        for lookahead in BYTE_LOOKAHEADS:
            scan = dict(schedule=schedule, compiled=cg, lookahead=lookahead,
                        memory="live" if allocator == "exact" else "shared",
                        recomputable=problem.recomputable)
            try:
                # The plan without recomputation is scanned with TF's prefetch
                # only: with the later one it never was the fastest on the Fig. 6
                # rows (V100 and H100 bf16, 2026-11-27).
                found = byte_planner.variants(problem.graph, budget_bytes, spec, **scan,
                                              swaps_alone=lookahead is None, checkpoints=False)
            except Infeasible:
                continue
            fastest = min(found, key=lambda p: p.prediction.step_time_s)
            held = []
            if lookahead in CHECKPOINT_LOOKAHEADS and problem.recomputable \
                    and fastest.prediction.swap_out_bytes:
                # Chains that read checkpoints, where the fastest plan still copies.
                try:
                    held = byte_planner.variants(problem.graph, budget_bytes, spec, **scan,
                                                 swaps_alone=False, checkpoints="only")
                except Infeasible:
                    pass
            scanned += [(p, False, fastest) for p in found] + [(p, True, fastest) for p in held]
    best_scanned = min((p.prediction.step_time_s for p, _, _ in scanned), default=0.0)
    candidates, polished = [], set()
    for plan, checkpointed, fastest in scanned:
        # The prefetch rules often agree (ResNet-50 b256: 4 distinct plans of 6),
        # and the pass costs many simulations: each plan is polished once.
        if (plan.schedule, plan.swaps) in polished:
            continue
        polished.add((plan.schedule, plan.swaps))
        if checkpointed and plan.prediction.step_time_s >= fastest.prediction.step_time_s:
            # A checkpoint plan no faster than the others as scanned is kept
            # as it is: the pass, which makes round trips recomputations, costs
            # more there than it ever gained (LSTM-4 at 40%).
            candidates.append(plan)
            continue
        if plan.prediction.step_time_s > POLISH_WITHIN * best_scanned:
            candidates.append(plan)   # far behind as scanned: kept, not polished
            continue
        try:
            got = polish(plan)
        except PlanError as err:   # the plan, read back, is not what was scanned
            warnings.warn(f"byte planner: a plan read back from its swaps was rejected "
                          f"by the simulator ({err}); kept the others. This is a "
                          "planner bug: please report it with the graph",
                          RuntimeWarning, stacklevel=2)
            continue
        candidates.append(got)
    # Fastest first; with each buffer its own bytes, the first whose held peak fits (a
    # swap-in held from its op, before its copy, can pass the budget).  Each check
    # is a simulation with events: only as many as it takes.
    ranked = sorted(candidates, key=lambda p: p.prediction.step_time_s)
    shared = [got for got, p in ((share(p), p) for p in ranked[:SHARED_PLANS]) if got is not p]
    for plan in sorted(shared + ranked, key=lambda p: p.prediction.step_time_s):
        if allocator == "pool":
            return plan
        try:
            if _held_bytes(problem, plan, spec) <= budget_bytes:
                return plan
        except PlanError as err:
            warnings.warn(f"byte planner: a plan read back from its swaps was rejected by the "
                          f"simulator ({err}); kept the others. This is a planner bug: please "
                          "report it with the graph", RuntimeWarning, stacklevel=2)
    fits = {"pool": "its shared arena", "exact": "held at once",
            "guarded": "its shared arena and held at once"}[allocator]
    raise Infeasible(f"the byte-cap planner found no plan that fits {budget_bytes} bytes "
                     f"({fits})")


__all__ = ["ALLOCATORS", "BYTE_LOOKAHEADS", "Candidate", "Contest", "NotAdmitted", "byte_planned",
           "held_within"]
