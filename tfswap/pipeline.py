"""The stages of :func:`tfswap.optimize`, each a function from one typed value to the next.

::

    prepare(concrete_fn, options)   -> Prepared     capture, profile, lower to a Problem
    place_parameters(prepared)      -> Prepared     variables moved to host memory
    plan(prepared, attempt)         -> Planned      a planner from tfswap.core.planners
    materialize(planned)            -> Materialized rewrite with swap ops, bind variables
    verify(materialized)            -> Verified     the device peak, measured
    refine(verified)                -> Attempt      the next attempt, by a named remedy

``optimize`` runs them in that order (``place_parameters`` first with
``parameters="host"``, and with "auto" only once no plan fits with the
parameters on the device); ``refine`` sends it back to ``plan``
with a changed :class:`Attempt` (a smaller small-tensor threshold, the
disjoint pool, less room) until a plan measures within the budget, the
remedies run out (:class:`~tfswap.core.budget.BudgetError`) or the deadline
of the whole call passes.  Benchmarks and tests call the stages directly.
With ``background=True`` ``optimize`` runs them twice: on :func:`first_round`
(each search ends after its first generation) in the caller's thread, then
on :func:`searching_again` in a background thread (:mod:`tfswap.anytime`).

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
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from tfswap.core import bound, layout, planners, search, simulator
from tfswap.core.budget import BudgetError, parse_budget
from tfswap.core.devices import DeviceSpec
from tfswap.core.infeasible import Infeasible
from tfswap.core.plan import Allocation, Plan, Prediction
from tfswap.core.problem import Problem
from tfswap.core.program import from_plan
from tfswap.core.simulator import simulate
from tfswap.ops import allocator
from tfswap.tf import capture as capture_mod
from tfswap.tf import emulate, homes, ir, measure, rewrite, runtime
from tfswap.options import Options
from tfswap.parameters import host_work
from tfswap.replicas import (Replica, ReplicasStuckError, measure_replicas, replica_attempt,
                             replica_of, replicated_prediction)
from tfswap.tf.device import (check_arena, choose_spec, placement, profile_note, profile_step,
                              sample_inputs)
from tfswap.tf.lower import (SMALLEST_SMALL_BYTES, Lowered, lower, lower_default,
                             planner_budget, small_threshold)
from tfswap.tf.shapes import refuse_unsized
from tfswap.tf.tensor_swaps import tensor_swaps

# Sessions the rewritten step is measured in (3 runs each) before it is accepted.
VERIFY_SESSIONS = 2
MINIMUM_SEARCH_DOUBLINGS = 6   # how far above the unconstrained peak a smallest budget is sought
NO_SWAP = "tfswap.no-swap"   # the planner name of a step that fits as it is
# Pool objects never in use together share memory first; a plan measured over
# the budget is planned again with a disjoint pool (refine).
FIRST_LAYOUT = "shared"
# A rewritten replicated step that runs this many times its unmodified step (at
# least the minimum) is taken as stuck: replicas waiting for each other never return.
PARAMETERS = ("auto", "device", "host")   # where variables live between steps


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


@dataclass(frozen=True)
class Planned:
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


@dataclass(frozen=True)
class Materialized:
    planned: Planned
    rewritten: Any
    bound: Any


@dataclass(frozen=True)
class Verified:
    materialized: Materialized
    measured_peak_bytes: int | None   # None: this device's peak cannot be measured here
    measured_on: str | None = None    # what was measured, on which device, and how
    out_of_memory: bool = False       # the step failed for want of device memory

    @property
    def within_budget(self) -> bool:
        if self.out_of_memory:
            return False
        budget = self.materialized.planned.prepared.budget_bytes
        return self.measured_peak_bytes is None or self.measured_peak_bytes <= budget


# ---------------------------------------------------------------- prepare

def prepare(concrete_fn, options: Options) -> Prepared:
    """Capture ``concrete_fn``, profile it and lower it to a :class:`Problem`."""
    started = time.monotonic()
    deadline = None if options.generations is not None else started + options.search_time
    device, host = placement(options.device, options.host)
    # A multi-worker step runs only where every worker runs it: plannable from
    # its shapes, never run here first (capture refuses it otherwise).
    unrun = options.profile == "analytic" and options.verify_rounds == 0
    captured = capture_mod.capture(concrete_fn, device=device, other_workers=unrun)
    if any(capture_mod.same_device(host, d) for d in captured.replicas):
        raise capture_mod.CaptureError(
            f"the host {host} is one of the replicas' devices ({', '.join(captured.replicas)}): "
            "tfswap would swap a replica's tensors into another replica's memory. Pass host= a "
            "device no replica uses; on the emulated device, tfswap.tf.emulate.setup(replicas=2) "
            "and MirroredStrategy(devices.replicas) keep the host (CPU:1) apart")
    if captured.replicas and (captured.host_homed or options.parameters == "host"):
        raise capture_mod.CaptureError(
            "a replicated step (tf.distribute) keeps its variables on its devices: tfswap does "
            "not plan replicas with variables in host memory yet; create them under the "
            "strategy's scope and pass parameters='auto' or 'device'")
    if captured.host_homed:   # variables the user created in host memory
        captured, _ = homes.updates_on_device(captured, device)
    spec, spec_note = choose_spec(options.device_spec, device)
    unshared = spec
    if captured.replicas:   # the replicas copy at the same time, over one host's link
        spec = spec.shared_by(len(captured.replicas))
    budget = parse_budget(options.memory_budget, spec.memory_bytes)
    check_arena(budget, options.memory_budget, device)
    capture_mod.warn_legacy_random(captured)
    feed = list(options.inputs) if options.inputs is not None else \
        sample_inputs(captured, options.seed)
    prof = profile_step(captured, options.profile, spec, feed, device)
    places, unplaced = (), (captured, prof)
    if captured.host_homed:   # the gathers and updates of variables the user put there
        small = options.small_tensor_bytes if options.small_tensor_bytes is not None else \
            small_threshold(prof.peak_bytes or 0)
        captured, prof, places = host_work(captured, prof, spec, device, budget, options, small)
    step = lower(captured, prof, spec, options.small_tensor_bytes, options.recompute) \
        if options.small_tensor_bytes is not None else \
        lower_default(captured, prof, spec, options.recompute)
    if prof.source != "trace":
        refuse_unsized(captured, step.lowered, prof.source)
    replicas = tuple(replica_of(captured, d, options, spec, feed)
                     for d in captured.replicas[1:])
    notes = (spec_note,) if spec_note else ()
    if captured.other_workers:
        notes += ("its collectives have members on other workers (MultiWorkerMirroredStrategy): "
                  "this worker's step planned alone, from its shapes (analytic profile), not "
                  "verified; every worker plans its own",)
    if replicas:
        notes += (f"replicated over {', '.join(captured.replicas)}: each device planned for "
                  "the budget",)
    return Prepared(options, captured, prof, step, spec, budget, device, host, feed, deadline,
                    notes + (profile_note(prof, time.monotonic() - started,
                                          given=prof is options.profile),),
                    update_places=places, replicas=replicas,
                    rendezvous=ir.rendezvous(captured) if replicas else (), unplaced=unplaced,
                    unshared_spec=unshared if replicas else None)


def with_budget(prepared: Prepared, memory_budget) -> Prepared:
    """The same prepared step at another budget (a study of several budgets profiles
    the step once)."""
    return dataclasses.replace(prepared, budget_bytes=parse_budget(
        memory_budget, prepared.spec.memory_bytes),
        options=dataclasses.replace(prepared.options, memory_budget=memory_budget))


# ---------------------------------------------------------------- plan

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
        raise BudgetError(
            f"memory_budget {prepared.options.memory_budget!r} ({prepared.budget_bytes} bytes): "
            f"the parameters that stay on the device take {pinned} bytes, more than the "
            f"{usable} bytes the plan may use; pass a budget well above {pinned} bytes.")
    return Attempt(step, usable, outside, layout, **changes)


def fits_unmodified(prepared: Prepared, attempt: Attempt, profile=None) -> bool:
    """Whether the step needs no swaps: its model fits, and no trace measured otherwise
    (``profile``: a replica's, else the step's)."""
    peak = attempt.step.unconstrained.prediction.peak_bytes
    measured_over = prepared.measured_over if profile is None else \
        profile.source == "trace" and (profile.peak_bytes or 0) > prepared.budget_bytes
    return peak <= attempt.planner_budget and not measured_over


def plan(prepared: Prepared, attempt: Attempt, planner: str | None = None,
         **options) -> Planned:
    """The plan of ``attempt`` by ``Options.planner`` (by default the fastest of
    tfswap's planners, :func:`tfswap.core.planners.default`; the report's notes
    list each one's prediction).  Raises :class:`Infeasible`.
    A replicated step gets a plan per replica (``Planned.replica_plans``), each
    for the attempt's remedies on that replica's lowering.

    ``planner``: run exactly this planner of :mod:`tfswap.core.planners` (with
    ``options``) instead, even where the step fits unmodified.
    """
    # The replicas share what is left of search_time, one after the other.
    n = 1 + len(prepared.replicas)
    planned = _plan_one(prepared, attempt, None, planner, options, share=1 / n)
    if not prepared.replicas:
        return planned
    others = tuple(_plan_one(prepared, replica_attempt(prepared, attempt, r), r.profile,
                             planner, options, share=1 / (n - k))
                   for k, r in enumerate(prepared.replicas, 1))
    notes = planned.notes + tuple(f"{r.device}: {note}" for r, p in zip(prepared.replicas, others)
                                  for note in p.notes if note not in planned.notes)
    per_device = (planned,) + others
    joint, note = replicated_prediction(prepared, [simulator.Replica(
        p.attempt.step.problem.graph, p.plan, keep=p.attempt.step.problem.keep,
        compiled=p.attempt.step.problem.compiled) for p in per_device])
    return dataclasses.replace(planned, replica_plans=tuple(p.plan for p in others),
                               replicated=joint, notes=notes + (note,))


def _plan_one(prepared: Prepared, attempt: Attempt, profile, planner, options,
              share: float = 1.0) -> Planned:
    """``plan`` of one device's step (``profile``: a replica's, None: the step's),
    the search taking ``share`` of the time left."""
    notes = attempt.notes
    problem = attempt.step.problem
    if planner is not None:
        result = planners.run(planner, problem, attempt.planner_budget, prepared.spec, **options)
        return Planned(prepared, attempt, _finish(result.plan, prepared, attempt),
                       result.search, notes)
    if fits_unmodified(prepared, attempt, profile):
        unconstrained = attempt.step.unconstrained
        notes += ("the step already fits the budget: no swaps" if not unconstrained.swaps
                  else "the step already fits the budget: it only fetches the host-homed "
                  "variables it reads",)
        found = dataclasses.replace(unconstrained, planner=NO_SWAP)
        return Planned(prepared, attempt, _finish(found, prepared, attempt), None, notes)
    name = prepared.options.planner
    result = planners.run(name, problem, attempt.planner_budget, prepared.spec,
                          **_planner_options(name, prepared, attempt, share))
    if result.candidates:
        notes += ("planners, predicted step: " + "; ".join(
            c.describe() for c in result.candidates),)
    notes += (_against_bound(result.plan, problem, attempt.planner_budget, prepared.spec),)
    return Planned(prepared, attempt, _finish(result.plan, prepared, attempt), result.search,
                   notes, candidates=result.candidates)


def _against_bound(found: Plan, problem: Problem, budget: int, spec: DeviceSpec) -> str:
    """The report's line on how far ``found`` is from the lower bound of its
    schedule at this budget (:mod:`tfswap.core.bound`)."""
    limit = bound.lower_bound(problem, budget, spec, schedule=found.schedule)
    return (f"{limit.describe()}; this plan is predicted at "
            f"{found.prediction.step_time_s / limit.time_s:.2f}x it (a relaxation: one "
            "position at a time, a remade value costing its producer alone)")


def _planner_options(name: str, prepared: Prepared, attempt: Attempt,
                     share: float = 1.0) -> dict:
    """The keyword arguments planner ``name`` takes of the attempt: the genetic
    search's settings (``config``) and the pool layout (``layout``)."""
    takes = inspect.signature(planners.get(name)).parameters
    options = {}
    if "config" in takes:
        options["config"] = _search_config(prepared, attempt, share)
    if "layout" in takes:
        options["layout"] = attempt.pool_layout
    return options


def _search_config(prepared: Prepared, attempt: Attempt,
                   share: float = 1.0) -> search.SearchConfig:
    o = prepared.options
    limit: dict = {"time_budget_s": None, "max_generations": o.generations}
    if o.generations is None:
        left = (prepared.deadline - time.monotonic()) * share
        # Past the deadline: the first generation only (TF's order and its mutants).
        limit = {"time_budget_s": left, "max_generations": None} if left > 0 else \
            {"time_budget_s": None, "max_generations": 0}
    return search.SearchConfig(**limit, seed=o.seed, workers=o.workers, executor=o.executor,
                               progress=o.progress, pool_layout=attempt.pool_layout,
                               stop_when=prepared.stop_when)


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


def _finish(found: Plan, prepared: Prepared, attempt: Attempt) -> Plan:
    return finish(found, prepared.captured, attempt.step.lowered, prepared.budget_bytes,
                  attempt.outside_bytes, prepared.update_places)


def finish(found: Plan, captured, lowered, budget_bytes: int, outside_bytes: int,
           update_places: tuple = ()) -> Plan:
    """A planner's plan as the rewrite takes it: swaps of the tensors TF holds, the
    user's budget, the graph's fingerprint, the variables in host memory and
    where their updates run, and a peak that counts the device bytes the
    planner does not see."""
    found = tensor_swaps(found, lowered.graph)
    return dataclasses.replace(found, budget_bytes=budget_bytes,
                               tensorflow_version=tf.__version__,
                               graph_fingerprint=capture_mod.fingerprint(captured),
                               prediction=_with_outside(found.prediction, outside_bytes),
                               host_variables=captured.host_homed,
                               update_places=tuple(update_places))


def _with_outside(prediction: Prediction, outside: int) -> Prediction:
    if prediction.peak_bytes is None:
        return prediction
    return dataclasses.replace(prediction, peak_bytes=prediction.peak_bytes + outside)


def minimum_budget(prepared: Prepared, attempt: Attempt) -> int:
    """The smallest budget (with 5% headroom) whose planner budget the plan on TF's
    order accepts."""
    step = attempt.step
    high = step.unconstrained.prediction.peak_bytes
    # The pool gives each size class the most objects one op uses at once, which
    # can exceed the unconstrained peak (parameters far larger than activations).
    for doubling in range(MINIMUM_SEARCH_DOUBLINGS + 1):
        try:
            need, _ = planners.fit_to_budget("tfswap.order", step.problem, prepared.spec,
                                             high=high)
            break
        except Infeasible:
            if doubling == MINIMUM_SEARCH_DOUBLINGS:
                raise
            high *= 2
    # 5% headroom: the default schedule is TF's traced order, which varies from
    # run to run, and the bisection is for this run's order only.
    return int(1.05 * (need + attempt.outside_bytes) / (1.0 - prepared.options.safety_margin)) + 1


# ---------------------------------------------------------------- materialize, verify

def materialize(planned: Planned) -> Materialized:
    """The rewritten graph (swap ops, control edges) bound to the user's variables."""
    prepared = planned.prepared
    rewritten = rewritten_graph(planned)
    return Materialized(planned, rewritten, runtime.bind(
        prepared.captured, rewritten.graph_def, memory_scope=_arena_scope(planned)))


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


def _arena_of(made: Materialized):
    """The budget arena the bound step's pool is registered with, if any."""
    if made.bound.memory_scope is None:
        return None
    return allocator.installed_gpu_arena(made.planned.prepared.device)


def arena_allocation(planned: Planned) -> Allocation:
    """The plan's pool as a budget arena binds it: without the objects of the
    parameters that stay on the device, which the user's variables already hold
    in the arena (:func:`tfswap.core.layout.without_resident`)."""
    problem, plan = planned.attempt.step.problem, planned.plan
    cg = problem.compiled
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    result = simulate(problem.graph, plan, planned.prepared.spec, events=True,
                      keep=problem.keep, compiled=cg)
    resident = [cg.buf_names[b] for b in prog.resident if cg.buf_persistent[b]]
    return layout.without_resident(result, plan.allocation, resident)


def _arena_scope(planned: Planned):
    """On a GPU that allocates from a budget arena (``install_gpu_arena``): the
    plan's pool registered with it, and what makes it serve each call."""
    prepared, plan = planned.prepared, planned.plan
    if prepared.peak_method != measure.ALLOCATOR or plan.allocation is None:
        return None
    arena = allocator.installed_gpu_arena(prepared.device)
    if arena is None:
        return None
    pool = arena_allocation(planned)
    return arena.binding(allocator.PoolAllocation(
        class_bytes=pool.class_bytes, class_count=pool.class_count,
        small_pool_bytes=pool.small_pool_bytes, plan_id=plan.id,
        small_threshold_bytes=pool.small_threshold_bytes, object_offsets=pool.object_offsets))


def verify(made: Materialized) -> Verified:
    """The rewritten step's device peak, measured where this machine can, else None.

    On the emulated device: the step stats of a traced Session run, the worst of
    3 runs in each of 2 sessions.  On a GPU (GPU-only path): the bound step
    itself, the allocator's peak of the worst of 3 runs after a warm-up, the
    user's variables put back afterwards (:func:`tfswap.tf.measure.allocator_peak`).
    """
    prepared = made.planned.prepared
    # A step that fits unmodified was measured by its traced profile already.
    plans = (made.planned.plan,) + made.planned.replica_plans
    if not prepared.verifiable or all(p.planner == NO_SWAP for p in plans):
        return Verified(made, None)
    if prepared.replicas:
        return Verified(made, *measure_replicas(made, VERIFY_SESSIONS))
    if prepared.peak_method == measure.ALLOCATOR:   # GPU-only
        arena = _arena_of(made)
        strays = arena.stats().strays if arena is not None else 0
        m = measure.allocator_peak(made.bound, prepared.feed, prepared.captured,
                                   prepared.device, runs=3, warmup=1)
        described = m.describe()
        if arena is not None:
            stats = arena.stats()
            described += (f"; the device allocates from a budget arena of {stats.arena_bytes} "
                          f"bytes, {stats.strays - strays} of the step's requests fell outside "
                          "the plan's pool" + (f" (last: {stats.last_stray})"
                                               if stats.strays > strays else ""))
        return Verified(made, m.peak_bytes, described, m.out_of_memory)

    # The worst of 3 runs: how soon a swap-in starts after its trigger depends
    # on the executor's threads, which moves the measured peak below the
    # plan's bound from run to run (fuzz seed 1058: 624656 to 690192 B for
    # one plan predicted at 690204 B).  In 2 sessions: runs within a session
    # agree, sessions need not (fuzz seed 1271's byte-cap plan: 394764 B in
    # the first session, 427532 B in the next four, 443916 B in another run).
    peak = max(measure.measure(prepared.captured, made.rewritten.graph_def, prepared.feed,
                               runs=3, warmup=1).peak_bytes for _ in range(VERIFY_SESSIONS))
    return Verified(made, peak, f"the step stats of the emulated device {prepared.device} "
                    f"(allocation records), worst of 3 runs in each of {VERIFY_SESSIONS} "
                    "sessions")


# ---------------------------------------------------------------- refine

def after_infeasible(prepared: Prepared, attempt: Attempt, err: Infeasible) -> Attempt:
    """The next attempt when ``plan`` found no plan, or BudgetError naming the smallest
    budget that can work."""
    if attempt.measured_bytes is not None:
        raise BudgetError(
            f"memory_budget {prepared.budget_bytes} bytes: the rewritten step measured "
            f"{attempt.measured_bytes} bytes on {prepared.device} (more than the memory "
            f"model predicted), and with that much less room no plan fits. Pass at least "
            f"about {int(1.05 * attempt.measured_bytes) + 1} bytes (what that plan measured, "
            f"plus 5%), or raise safety_margin. (Planner: {err})") from err
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
    def smallest(at: Attempt) -> int:   # every replica's device must hold its part
        return max([minimum_budget(prepared, at)] + [
            minimum_budget(prepared, replica_attempt(prepared, at, r))
            for r in prepared.replicas])

    minimum = smallest(attempt)
    if attempt.threshold_lowered:
        minimum = min(minimum, smallest(first_attempt(prepared)))
    raise BudgetError(
        f"memory_budget {prepared.options.memory_budget!r} ({prepared.budget_bytes} bytes) is "
        f"below what this step needs at once: {working_set_text(attempt.step.problem)}. The "
        f"smallest budget that can work is about {minimum} bytes ({minimum / 2**20:.2f} MiB); "
        f"pass at least that. (Planner: {err})") from err


def refine(verified: Verified) -> Attempt:
    """The next attempt after a measured peak over the budget: first the disjoint
    pool (remedy "disjoint pool"), then less room by the excess ("less room"), at
    most ``verify_rounds`` times; then BudgetError."""
    planned = verified.materialized.planned
    prepared, attempt = planned.prepared, planned.attempt
    budget, measured = prepared.budget_bytes, verified.measured_peak_bytes
    what = (f"the step ran out of device memory on {prepared.device} after {measured} B"
            if verified.out_of_memory else f"the measured peak ({measured} B)")
    if attempt.replans >= prepared.options.verify_rounds:
        raise BudgetError(
            f"after {attempt.replans} re-plans {what} still exceeds memory_budget {budget} B "
            "or the device's free memory; pass a budget below the device's free memory, "
            "or raise the safety_margin")
    # Out of memory under the budget: the device has less free memory than the budget.
    excess = max(measured - budget, 0)
    replans = attempt.replans + 1
    if attempt.pool_layout == "shared":
        # A shared arena is packed to the planner's budget, so what the model
        # misses shows at once; the disjoint pool's rounding leaves room for it.
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


def working_set_text(problem: Problem) -> str:
    """Which op needs the most device memory at once, and what else is always there."""
    cg = problem.compiled
    per_op = cg.op_working_set()
    k = int(np.argmax(per_op))
    op = problem.graph.ops[k]
    pinned = problem.pinned_bytes
    small_peak = cg.small_pool_peak(cg.order_of(problem.schedule))
    return (f"op {op.name!r} ({op.type}) needs {int(per_op[k])} bytes at once for its inputs, "
            f"outputs and scratch, while the parameters that stay on the device take {pinned} "
            f"bytes and small tensors up to {small_peak} bytes")


__all__ = ["Attempt", "Materialized", "Planned", "Prepared", "ReplicasStuckError", "Verified",
           "after_infeasible", "finish", "first_attempt", "first_round", "materialize",
           "minimum_budget", "plan", "prepare", "refine", "searching_again", "verify",
           "with_budget", "working_set_text"]
