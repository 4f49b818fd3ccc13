"""The stages of :func:`tfswap.optimize`, each a function from one typed value to the next.

::

    prepare(concrete_fn, options)   -> Prepared     capture, profile, lower to a Problem
    place_parameters(prepared)      -> Prepared     variables moved to host memory
    plan(prepared, attempt)         -> Planned      a planner from tfswap.core.planners
    materialize(planned)            -> Materialized rewrite with swap ops, bind variables
    verify(materialized)            -> Verified     the device peak, measured
    refine(verified)                -> Attempt      the next attempt, by a named remedy

``optimize`` runs them in that order (``place_parameters``, in
:mod:`tfswap.parameters`, first with ``parameters="host"``, and with "auto"
only once no plan fits with the parameters on the device); ``refine`` sends
it back to ``plan`` with a changed :class:`Attempt` (a smaller small-tensor
threshold, the disjoint pool, less room) until a plan measures within the
budget, the remedies run out (:class:`~tfswap.core.budget.BudgetError`, its
text from :mod:`tfswap.budget_advice`) or the deadline of the whole call
passes.  Benchmarks and tests call the stages directly.  With
``background=True`` ``optimize`` runs them twice: on :func:`first_round`
(each search ends after its first generation) in the caller's thread, then
on :func:`searching_again` in a background thread (:mod:`tfswap.anytime`).

Each stage uses what the values before it hold and the modules beside it
(:mod:`tfswap.tf.finish`, :mod:`tfswap.budget_arena`,
:mod:`tfswap.verification`, :mod:`tfswap.replicas`), never a later stage.
This module imports TensorFlow; ``import tfswap`` loads it on first use of
:func:`tfswap.optimize` (or :func:`tfswap.load_plan`).

Example::

    options = Options.of("12MiB", device_spec="cpu-emulated", generations=5)
    prepared = prepare(cf, options)
    attempt = first_attempt(prepared)
    made = materialize(plan(prepared, attempt))
    verify(made).measured_peak_bytes
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfswap import budget_advice, verification
from tfswap.budget_arena import allocator_of, arena_scope, serves_pool
from tfswap.core import bound, planners, search, simulator
from tfswap.core.budget import BudgetError, parse_budget
from tfswap.core.devices import DeviceSpec
from tfswap.core.infeasible import Infeasible
from tfswap.core.plan import Plan
from tfswap.options import Options
from tfswap.parameters import host_work
from tfswap.planner_settings import planner_settings
from tfswap.replicas import (Replica, ReplicasStuckError, carried_plan, measure_replicas,
                             refuse_unplannable, replica_attempt, replica_of,
                             replicated_prediction, replication_notes)
from tfswap.tf import capture as capture_mod
from tfswap.tf import emulate, homes, ir, measure, mirrored_homes, rewrite, runtime
from tfswap.tf.device import (check_arena, choose_spec, placement, profile_note,
                              profile_replicas, profile_step, sample_inputs)
from tfswap.tf.finish import finish
from tfswap.tf.lower import (SMALLEST_SMALL_BYTES, Lowered, lower, lower_at, planner_budget,
                             small_threshold)
from tfswap.tf.shapes import refuse_unsized

NO_SWAP = "tfswap.no-swap"   # the planner name of a step that fits as it is
# Pool objects never in use together share memory first; a plan measured over
# the budget is planned again with a disjoint pool (refine).
FIRST_LAYOUT = "shared"


# ---------------------------------------------------------------- the values

@dataclass(frozen=True)
class Prepared:
    """Everything ``plan`` needs: the step, its profile, its problem, the budget.
    A replicated step's first replica is the step here; ``replicas`` the others."""

    options: Options
    captured: Any
    profile: Any
    step: Lowered
    spec: DeviceSpec
    budget_bytes: int
    device: str
    host: str
    feed: list
    deadline: float | None    # time.monotonic() by which the whole call ends
    notes: tuple[str, ...]
    relocation: Any = None    # the variables place_parameters moved to the host, if any
    update_places: tuple = ()  # core.plan.UpdatePlace: updates not computed on the device
    replicas: tuple[Replica, ...] = ()   # a replicated step's other replicas
    # A replicated step's collectives, one op per device (ir.rendezvous), and its
    # device's spec before the share of the link (spec is shared_by the replicas):
    # what simulating the replicas together takes (replicated_prediction).
    rendezvous: tuple[tuple[str, ...], ...] = ()
    unshared_spec: DeviceSpec | None = None
    # Asked between the search's generations: True ends it with the best so far
    # (a search in the background, :mod:`tfswap.anytime`, that is stopped).
    stop_when: Callable[[], bool] | None = None
    # (captured, profile) before host_work placed the gathers and updates of host
    # variables: place_parameters moves more variables in this, the user's graph,
    # since host_work on a graph it already rewrote would rewrite its own nodes.
    unplaced: tuple | None = None

    @property
    def measured_over(self) -> bool:
        """The traced unmodified step measured above the budget."""
        return self.profile.source == "trace" and (self.profile.peak_bytes or 0) > self.budget_bytes

    @property
    def peak_method(self) -> str | None:
        """How the device's peak is measured here (:func:`tfswap.tf.measure.peak_method`):
        step stats on the emulated device, the allocator on a GPU, else None."""
        return measure.peak_method(self.device, emulate.is_active())

    @property
    def verifiable(self) -> bool:
        """Whether the rewritten step is measured: verification is on and this
        machine can measure the device's peak (the emulated device, a GPU)."""
        return self.options.verify_rounds > 0 and self.peak_method is not None


@dataclass(frozen=True)
class Attempt:
    """One way of planning the prepared step: the lowering, the planner's budget,
    the pool layout, and what led here."""

    step: Lowered
    planner_budget: int
    outside_bytes: int    # device bytes the planner does not see (unread variables)
    pool_layout: str
    replans: int = 0      # remedies after a measured excess
    measured_bytes: int | None = None   # the last plan's measured peak, if one exceeded
    threshold_lowered: bool = False
    notes: tuple[str, ...] = ()
    # Plans may be made to the bytes TensorFlow's allocator holds
    # (budget_arena.allocator_of); False once such a plan measured over the budget.
    exact_fit: bool = True


@dataclass(frozen=True)
class Planned:
    """``attempt``'s plan (finished for the captured graph), the search behind it
    and the report's notes so far."""

    prepared: Prepared
    attempt: Attempt
    plan: Plan
    search: search.SearchResult | None
    notes: tuple[str, ...]
    replica_plans: tuple[Plan, ...] = ()   # one per ``prepared.replicas``, in order
    # A replicated step's devices simulated together (replicated_prediction); None
    # for a step on one device, or where the replicas' plans do not run together.
    replicated: simulator.ReplicatedResult | None = None
    # The planners the default planner weighed (tfswap.core.best_of.Candidate).
    candidates: tuple = ()
    # The planner's plan before it was finished for the captured graph (in the
    # lowered step's names): what carries to a replicated step's other replicas.
    found: Plan | None = None
    # One per ``prepared.replicas``: whether its plan is this one carried to it
    # (not searched again) or its own search's.
    carried: tuple[bool, ...] = ()


@dataclass(frozen=True)
class Materialized:
    """The plan rewritten into the graph (``rewritten``: a
    :class:`tfswap.tf.rewrite.RewrittenGraph`) and bound to the user's variables
    (``bound``: a callable)."""

    planned: Planned
    rewritten: Any
    bound: Any


@dataclass(frozen=True)
class Verified:
    """The materialized step's measured device peak (None where it cannot be measured)."""

    materialized: Materialized
    measured_peak_bytes: int | None   # None: this device's peak cannot be measured here
    measured_on: str | None = None    # what was measured, on which device, and how
    out_of_memory: bool = False       # the step failed for want of device memory
    # ((device, peak bytes), ...): each device measured; a replicated step's every one.
    device_peaks: tuple = ()

    @property
    def within_budget(self) -> bool:
        """Whether the plan is accepted: it ran within the budget, or cannot be measured."""
        if self.out_of_memory:
            return False
        budget = self.materialized.planned.prepared.budget_bytes
        return self.measured_peak_bytes is None or self.measured_peak_bytes <= budget


# Attempts are made beside their type: plan starts from the first, refine makes
# the next ones, and neither reaches into the other's stage for them.

def first_attempt(prepared: Prepared) -> Attempt:
    """The attempt at the default threshold, layout and margin."""
    return _attempt_at(prepared, prepared.step, FIRST_LAYOUT)


def _attempt_at(prepared: Prepared, step: Lowered, layout: str, **changes) -> Attempt:
    usable, outside = planner_budget(prepared.budget_bytes, step.lowered,
                                     prepared.options.safety_margin)
    pinned = step.problem.pinned_bytes
    # With "auto", optimize moves the parameters when no plan fits with them on
    # the device; when they alone exceed the budget, no search is needed to know.
    # ("device" goes on, to name the smallest budget that works.)
    if pinned >= usable and prepared.options.parameters != "device":
        raise budget_advice.parameters_over(prepared, pinned, usable)
    return Attempt(step, usable, outside, layout, **changes)


# ---------------------------------------------------------------- prepare

def prepare(concrete_fn, options: Options) -> Prepared:
    """Capture ``concrete_fn``, profile it and lower it to a
    :class:`~tfswap.core.problem.Problem`."""
    started = time.monotonic()
    # Under a strategy the replicas' devices are the strategy's: none need be named.
    device, host = placement(options.device, options.host, () if options.device is not None
                             else capture_mod.strategy_devices(concrete_fn))
    captured = _captured(concrete_fn, options, device, host)
    unshared, spec_note = choose_spec(options.device_spec, device)
    # The replicas copy at the same time, over one host's link.
    spec = unshared.shared_by(len(captured.replicas)) if captured.replicas else unshared
    budget = parse_budget(options.memory_budget, spec.memory_bytes)
    check_arena(budget, options.memory_budget, device)
    capture_mod.warn_legacy_random(captured)
    feed = list(options.inputs) if options.inputs is not None else \
        sample_inputs(captured, options.seed)
    # A replicated step is profiled once for every replica's device.
    prof, *profiles = profile_replicas(captured, options.profile, spec, feed,
                                       captured.replicas) if captured.replicas else \
        (profile_step(captured, options.profile, spec, feed, device),)
    places, unplaced = (), (captured, prof)
    if captured.host_homed:   # the gathers and updates of variables the user put there
        small = options.small_tensor_bytes if options.small_tensor_bytes is not None else \
            small_threshold(prof.peak_bytes or 0)
        captured, prof, places = host_work(captured, prof, spec, device, budget, options, small)
    step = lower_at(captured, prof, spec, options.small_tensor_bytes, options.recompute)
    if prof.source != "trace":
        refuse_unsized(captured, step.lowered, prof.source)
    replicas = tuple(replica_of(captured, d, p, options, spec, step)
                     for d, p in zip(captured.replicas[1:], profiles))
    notes = ((spec_note,) if spec_note else ()) + replication_notes(captured, replicas)
    notes += (profile_note(prof, time.monotonic() - started, given=prof is options.profile),)
    deadline = None if options.generations is not None else started + options.search_time
    return Prepared(options, captured, prof, step, spec, budget, device, host, feed, deadline,
                    notes, update_places=places, replicas=replicas,
                    rendezvous=ir.rendezvous(captured) if replicas else (), unplaced=unplaced,
                    unshared_spec=unshared if replicas else None)


def _captured(concrete_fn, options: Options, device: str, host: str):
    """The step captured for ``device``, refused where tfswap cannot plan it; the
    updates of variables the user created in host memory computed on the device."""
    # A multi-worker step runs only where every worker runs it: plannable from
    # its shapes, never run here first (capture refuses it otherwise).
    unrun = options.profile == "analytic" and options.verify_rounds == 0
    captured = capture_mod.capture(concrete_fn, device=device, other_workers=unrun)
    if captured.replicas:   # traced while mirrored variables have one host copy
        captured = mirrored_homes.onto_copies(captured)
    refuse_unplannable(captured, host, options.parameters)
    if captured.host_homed:
        captured, _ = homes.updates_on_device(captured, device)
    return captured


def with_budget(prepared: Prepared, memory_budget) -> Prepared:
    """The same prepared step at another budget (a study of several budgets profiles
    the step once)."""
    return dataclasses.replace(prepared, budget_bytes=parse_budget(
        memory_budget, prepared.spec.memory_bytes),
        options=dataclasses.replace(prepared.options, memory_budget=memory_budget))


def first_round(prepared: Prepared) -> Prepared:
    """``prepared`` for a plan in seconds: each search ends after its first
    generation (TensorFlow's order, its mutants and the planners' plans of it).
    What :func:`tfswap.optimize` with ``background=True`` starts the step on."""
    return dataclasses.replace(prepared, options=dataclasses.replace(prepared.options,
                                                                     generations=0))


def searching_again(prepared: Prepared, options: Options, seconds: float | None,
                    stop_when: Callable[[], bool] | None) -> Prepared:
    """``prepared`` (as a first round left it: variables where that plan put them)
    searched with ``options`` (the caller's), ``seconds`` from now (None: by
    generations), ending early when ``stop_when`` says so."""
    deadline = None if seconds is None else time.monotonic() + seconds
    return dataclasses.replace(prepared, options=options, deadline=deadline,
                               stop_when=stop_when)


# ---------------------------------------------------------------- plan

def plan(prepared: Prepared, attempt: Attempt, planner: str | None = None,
         **options) -> Planned:
    """The plan of ``attempt`` by ``Options.planner`` (by default the fastest of
    tfswap's planners, :func:`tfswap.core.planners.default`; the report's notes
    list each one's prediction).  Raises :class:`Infeasible`.
    A replicated step gets a plan per replica (``Planned.replica_plans``), each
    for the attempt's remedies on that replica's lowering: the first replica's
    plan carried to each other replica whose step matches it and where it fits
    (:func:`tfswap.replicas.carried_plan`), else that replica's own search; the
    replicas' plans are then simulated together, and carried plans that do not
    run together are searched again.

    ``planner``: run exactly this planner of :mod:`tfswap.core.planners` (with
    ``options``) instead, even where the step fits unmodified.
    """
    # The replicas searched share what is left of search_time, one after the
    # other; a replica alike the first is expected to take its plan.
    searched = 1 + sum(not r.alike for r in prepared.replicas)
    planned = _plan_one(prepared, attempt, None, planner, options, share=1 / searched)
    if not prepared.replicas:
        return planned
    n = 1 + len(prepared.replicas)
    others = tuple(_plan_replica(prepared, planned, r, replica_attempt(prepared, attempt, r),
                                 planner, options, share=1 / (n - k))
                   for k, r in enumerate(prepared.replicas, 1))
    try:
        joint, note = _together(prepared, planned, others)
        again = joint is None
    except ReplicasStuckError:
        if not any(carried for _, carried in others):
            raise
        again = True
    if again and any(carried for _, carried in others):
        # The joint simulation is the carried plans' last check: search those replicas.
        searched_again = []
        for r, (p, carried) in zip(prepared.replicas, others):
            if carried:
                own = _plan_one(prepared, p.attempt, r.profile, planner, options, share=1 / n)
                p = dataclasses.replace(own, notes=own.notes + (
                    "planned on its own: the plans carried here did not run together with "
                    "the others as simulated",))
            searched_again.append((p, False))
        others = tuple(searched_again)
        joint, note = _together(prepared, planned, others)
    notes = planned.notes + tuple(f"{r.device}: {note}" for r, (p, _) in
                                  zip(prepared.replicas, others)
                                  for note in p.notes if note not in planned.notes)
    return dataclasses.replace(planned, replica_plans=tuple(p.plan for p, _ in others),
                               carried=tuple(c for _, c in others), replicated=joint,
                               notes=notes + (note,))


def _plan_replica(prepared: Prepared, first: Planned, replica: Replica, attempt: Attempt,
                  planner, options, share: float) -> tuple[Planned, bool]:
    """Another replica's plan for ``attempt`` (its own, :func:`replica_attempt`):
    the first replica's (``first``) carried to it where the replica was matched
    with the first (``Replica.match``), the first's plan came from a planner, the
    replica does not fit as it is, and the plan carries; else its own
    (:func:`_plan_one`, taking ``share`` of the time left).  (planned, whether
    carried)."""
    why = ()
    if replica.match is not None and first.found is not None and \
            first.plan.planner != NO_SWAP and not fits_unmodified(prepared, attempt,
                                                                  replica.profile):
        found, note = carried_plan(prepared, first, replica, attempt,
                                   held=lambda p: _held(p, prepared, attempt))
        if found is not None:
            return Planned(prepared, attempt, found, None, attempt.notes + (note,)), True
        why = (note,)
    own = _plan_one(prepared, attempt, replica.profile, planner, options, share)
    return dataclasses.replace(own, notes=own.notes + why), False


def _together(prepared: Prepared, first: Planned, others) -> tuple:
    """:func:`tfswap.replicas.replicated_prediction` of the first replica's plan
    and the others' (``others``: (Planned, carried) per replica)."""
    return replicated_prediction(prepared, [simulator.Replica(
        p.attempt.step.problem.graph, p.plan, keep=p.attempt.step.problem.keep,
        compiled=p.attempt.step.problem.compiled) for p in (first,) + tuple(p for p, _ in others)])


def _plan_one(prepared: Prepared, attempt: Attempt, profile, planner, options,
              share: float = 1.0) -> Planned:
    """``plan`` of one device's step (``profile``: a replica's, None: the step's),
    the search taking ``share`` of the time left."""
    notes = attempt.notes
    problem = attempt.step.problem
    if planner is not None:
        result = planners.run(planner, problem, attempt.planner_budget, prepared.spec, **options)
        return Planned(prepared, attempt, _finish(result.plan, prepared, attempt),
                       result.search, notes, found=result.plan)
    if fits_unmodified(prepared, attempt, profile):
        unconstrained = attempt.step.unconstrained
        notes += ("the step already fits the budget: no swaps" if not unconstrained.swaps
                  else "the step already fits the budget: it only fetches the host-homed "
                  "variables it reads",)
        found = dataclasses.replace(unconstrained, planner=NO_SWAP)
        return Planned(prepared, attempt, _finish(found, prepared, attempt), None, notes,
                       found=found)
    name = prepared.options.planner
    result = planners.run(name, problem, attempt.planner_budget, prepared.spec,
                          **planner_settings(name, prepared, attempt, share))
    if result.candidates:
        notes += ("planners, predicted step: " + "; ".join(
            c.describe() for c in result.candidates),)
    limit = bound.lower_bound(problem, attempt.planner_budget, prepared.spec,
                              schedule=result.plan.schedule)
    notes += (limit.against(result.plan.prediction.step_time_s),)
    return Planned(prepared, attempt, _finish(result.plan, prepared, attempt), result.search,
                   notes, candidates=result.candidates, found=result.plan)


def fits_unmodified(prepared: Prepared, attempt: Attempt, profile=None) -> bool:
    """Whether the step needs no swaps: its model fits, and no trace measured otherwise
    (``profile``: a replica's, else the step's)."""
    peak = attempt.step.unconstrained.prediction.peak_bytes
    measured_over = prepared.measured_over if profile is None else \
        profile.source == "trace" and (profile.peak_bytes or 0) > prepared.budget_bytes
    return peak <= attempt.planner_budget and not measured_over


def _finish(found: Plan, prepared: Prepared, attempt: Attempt) -> Plan:
    return finish(_held(found, prepared, attempt), prepared.captured, attempt.step.lowered,
                  prepared.budget_bytes, attempt.outside_bytes, prepared.update_places)


def _held(found: Plan, prepared: Prepared, attempt: Attempt) -> Plan:
    """``found`` predicting the peak the device will hold: where TensorFlow's
    allocator serves the step, its buffers at their own sizes
    (:func:`tfswap.core.simulator.held_peak_bytes`), not the pool's objects at
    their classes' that the planners predict, which only a budget arena holds."""
    if found.prediction.peak_bytes is None or serves_pool(prepared):
        return found
    problem = attempt.step.problem
    held = simulator.held_peak_bytes(problem.graph, found, prepared.spec, keep=problem.keep,
                                     compiled=problem.compiled,
                                     unheld=fed_arguments(prepared, problem.graph),
                                     forwards=forwarding_inputs(problem.graph))
    return dataclasses.replace(found, prediction=dataclasses.replace(found.prediction,
                                                                     peak_bytes=held))


def forwarding_inputs(graph) -> dict:
    """Op name -> the inputs whose buffer its kernel may write its first output
    into (``ir.FORWARDING_OPS``, an input of the output's shape and dtype):
    TensorFlow does when the op holds the buffer's only reference, which a
    swap-in's copy read for the last time is (``simulator.held_peak_bytes``)."""
    forwards = {}
    for op in graph.ops:
        if op.type not in ir.FORWARDING_OPS or not op.outputs:
            continue
        out = graph.tensor(op.outputs[0])
        if out.alias_of:
            continue
        ins = tuple(t for t in dict.fromkeys(op.inputs)
                    if graph.tensor(t).shape == out.shape and graph.tensor(t).dtype == out.dtype)
        if ins:
            forwards[op.name] = ins
    return forwards


def fed_arguments(prepared: Prepared, graph) -> tuple[str, ...]:
    """The step's arguments that the device reads where the caller put them,
    without allocating them: on the emulated device a fed tensor (or the
    caller's eager tensor) is host memory the device shares, so neither the
    step stats nor the device's allocator ever hold it (a swap-in of one they
    do).  On a GPU an argument is copied there (or was): counted."""
    if prepared.peak_method != measure.STEP_STATS:
        return ()
    names = {t.name for t in graph.tensors}
    return tuple(f for f in prepared.captured.feeds if f in names)


# ---------------------------------------------------------------- materialize

def materialize(planned: Planned) -> Materialized:
    """The rewritten graph (swap ops, control edges) bound to the user's variables
    (on a GPU with a budget arena, its pool registered: :mod:`tfswap.budget_arena`;
    on the emulated device planned for a link, ``cpu_emulated(link_bytes_per_s=B)``,
    its copies complete as that link would move them)."""
    rewritten = rewritten_graph(planned, **_emulated_link(planned.prepared))
    return Materialized(planned, rewritten, runtime.bind(
        planned.prepared.captured, rewritten.graph_def, memory_scope=arena_scope(planned)))


def _emulated_link(prepared: Prepared) -> dict:
    """The rewrite's emulated link where the step was planned for one on the
    emulated device: the step measured (verified) is the one the plan describes.
    With copies at memcpy speed, a plan made to the bytes the step holds measured
    within its budget, and 4% over it with the 50 MB/s link it was planned for
    (the zoo LSTM-4 at 40%: TensorFlow ran other ops while a copy was slow)."""
    link = (prepared.unshared_spec or prepared.spec).shared_link_bytes_per_s
    if link is None or prepared.peak_method != measure.STEP_STATS:
        return {}
    return {"emulated_link_bytes_per_s": link}


def rewritten_graph(planned: Planned, **options):
    """The plan (and each other replica's plan, in turn, on the graph the previous
    ones left, each in a name scope of its own) rewritten into the captured graph
    (:func:`tfswap.tf.rewrite.rewrite`, ``options`` passed on: an emulated link)."""
    prepared = planned.prepared
    scope = f"{rewrite.SWAP_SCOPE}_replica_0" if prepared.replicas else rewrite.SWAP_SCOPE
    rewritten = rewrite.rewrite(prepared.captured, planned.plan, prepared.device, prepared.host,
                                scope=scope, **options)
    swaps = rewritten.swaps
    for k, (replica, found) in enumerate(zip(prepared.replicas, planned.replica_plans), 1):
        on = dataclasses.replace(replica.captured, graph_def=rewritten.graph_def)
        rewritten = rewrite.rewrite(on, found, replica.device, prepared.host,
                                    scope=f"{rewrite.SWAP_SCOPE}_replica_{k}", **options)
        swaps += rewritten.swaps
    if prepared.replicas:
        rewritten = dataclasses.replace(rewritten, swaps=swaps,
                                        schedule=planned.plan.schedule, device=prepared.device)
    return rewritten


# ---------------------------------------------------------------- verify

def verify(made: Materialized) -> Verified:
    """The rewritten step's device peak, measured where this machine can, else None
    (:mod:`tfswap.verification`): on the emulated device, step stats, the worst of
    3 runs in each of 2 sessions; on a GPU, the bound step itself, the
    allocator's peak; a replicated step, each device."""
    prepared = made.planned.prepared
    # A step that fits unmodified was measured by its traced profile already.
    plans = (made.planned.plan,) + made.planned.replica_plans
    if not prepared.verifiable or all(p.planner == NO_SWAP for p in plans):
        return Verified(made, None)
    if prepared.replicas:
        return Verified(made, *measure_replicas(made, verification.SESSIONS))
    if prepared.peak_method == measure.ALLOCATOR:   # GPU-only
        verified = Verified(made, *verification.by_allocator(made))
    else:
        verified = Verified(made, *verification.by_step_stats(made))
    return dataclasses.replace(verified, device_peaks=(
        (prepared.device, verified.measured_peak_bytes),))


# ---------------------------------------------------------------- refine

def after_infeasible(prepared: Prepared, attempt: Attempt, err: Infeasible) -> Attempt:
    """The next attempt when ``plan`` found no plan, or BudgetError naming the smallest
    budget that can work."""
    if attempt.measured_bytes is not None:
        raise budget_advice.measured_over(prepared, attempt.measured_bytes, err) from err
    if prepared.options.small_tensor_bytes is None and not attempt.threshold_lowered \
            and attempt.step.small > SMALLEST_SMALL_BYTES:
        # Remedy "smaller small pool": tensors under the threshold share one
        # pool that nothing swaps; at a tight budget that pool is what does not
        # fit.  (Or not: more tensors in size classes can also need more; the
        # budget named if both fail is the smaller of the two minimums.)
        step = lower(prepared.captured, prepared.profile, prepared.spec, SMALLEST_SMALL_BYTES,
                     prepared.options.recompute)
        note = (f"no plan with tensors under {attempt.step.small} B kept in the small pool: "
                f"planned with {step.small} B")
        return _attempt_at(prepared, step, attempt.pool_layout, threshold_lowered=True,
                           notes=attempt.notes + (note,))
    minimum = budget_advice.smallest_budget(prepared, attempt)
    if attempt.threshold_lowered:
        minimum = min(minimum, budget_advice.smallest_budget(prepared, first_attempt(prepared)))
    raise budget_advice.below_working_set(prepared, attempt, minimum, err) from err


def refine(verified: Verified) -> Attempt:
    """The next attempt after a measured peak over the budget: a plan made to the
    bytes the step holds is planned again within its shared arena; where the
    plan's pool serves the step, a shared pool's is planned again on the
    disjoint one; then with less room by the excess, at most ``verify_rounds``
    times in all; then BudgetError."""
    planned = verified.materialized.planned
    prepared, attempt = planned.prepared, planned.attempt
    budget, measured = prepared.budget_bytes, verified.measured_peak_bytes
    what = (f"the step ran out of device memory on {prepared.device} after {measured} B"
            if verified.out_of_memory else f"the measured peak ({measured} B)")
    if attempt.replans >= prepared.options.verify_rounds:
        raise budget_advice.still_over(attempt.replans, what, budget)
    # Out of memory under the budget: the device has less free memory than the budget.
    excess = max(measured - budget, 0)
    replans = attempt.replans + 1
    if attempt.exact_fit and allocator_of(prepared, attempt) == "exact":
        # Made to the bytes the step holds, the plan had no slack for what the
        # memory model missed; its shared arena's has. Less room at once can
        # leave nothing that fits (BERT-style at 40% on a 50 MB/s link measured
        # 32% over a plan on the graph's own order, since taken out).
        note = (f"{what} exceeded the budget by {excess} B with a plan made to the bytes "
                "the step holds: re-planned within its shared arena")
        return dataclasses.replace(attempt, exact_fit=False, replans=replans,
                                   measured_bytes=measured, notes=planned.notes + (note,))
    if attempt.pool_layout == "shared" and serves_pool(prepared):
        # A shared arena is packed to the planner's budget, so what the model
        # misses shows at once; the disjoint pool's rounding leaves room for it.
        # Where TensorFlow's allocator serves the step the pool is not what it
        # holds, and plans are made to the bytes it holds: less room is the remedy.
        note = (f"{what} exceeded the budget by {excess} B with the shared "
                "pool layout: re-planned with the disjoint one")
        return dataclasses.replace(attempt, pool_layout="disjoint", replans=replans,
                                   measured_bytes=measured, notes=planned.notes + (note,))
    # The memory model missed what TF did (e.g. an in-place forward that an
    # extra reader prevented): plan again with that much less room.
    note = f"{what} exceeded the budget by {excess} B; re-planned with that much less"
    return dataclasses.replace(attempt, planner_budget=attempt.planner_budget - excess
                               - budget // 100, replans=replans, measured_bytes=measured,
                               notes=planned.notes + (note,))


__all__ = ["Attempt", "BudgetError", "Materialized", "NO_SWAP", "Planned", "Prepared",
           "ReplicasStuckError", "Verified", "after_infeasible", "first_attempt", "first_round",
           "fits_unmodified", "materialize", "plan", "prepare", "refine", "rewritten_graph",
           "searching_again", "verify", "with_budget"]
