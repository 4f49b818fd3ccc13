"""``tfswap.optimize``: plan, rewrite and bind a step so it fits a memory budget.

Example::

    import tfswap
    from tfswap.tf import emulate
    emulate.setup()                          # no GPU here: CPU:0 plays the device
    cf = tf.function(train_step).get_concrete_function(x_spec, y_spec)
    fast = tfswap.optimize(cf, memory_budget="12MiB", search_time=30)
    fast(x, y)                               # same results as cf(x, y)
    print(fast.report())
    fast.plan.save("step.plan.json")
    again = tfswap.load_plan("step.plan.json", cf)
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfswap import anytime, pipeline
from tfswap import options as options_mod
from tfswap import parameters as parameters_mod
from tfswap.budget_arena import allocator_of
from tfswap.tf import lower as tf_lower
from tfswap.tf import device as tf_device
from tfswap.core import search as ga
from tfswap.core.budget import BudgetError
from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph
from tfswap.core.infeasible import Infeasible
from tfswap.core.plan import Plan, PlanFormatError
from tfswap.tf.device import NoDeviceError


class PlanMismatchError(ValueError):
    """A saved plan was made for a different graph than the one given."""


@dataclass(frozen=True)
class OptimizedFunction:
    """A step rewritten to fit ``budget_bytes``; call it like the original function.

    ``plan``: what runs (schedule, swaps, pool, prediction).  ``graph_def``,
    ``feeds``, ``fetches``: the rewritten graph, to inspect or measure it
    independently (``tfswap.tf.measure.measure(fast.captured, fast.graph_def, inputs)``).
    ``search``: the genetic search's result (history, heuristic time), None
    when nothing had to be searched or the search found no pool.
    ``candidates``: each planner the default planner weighed
    (:class:`tfswap.core.best_of.Candidate`: its predicted step time, whether it
    was chosen, or why it planned nothing).  ``problem``: the
    :class:`tfswap.core.problem.Problem` the planner solved (the lowered step
    with its profile; None for a loaded plan), which the core's planners and
    simulator take on a machine without TensorFlow or the device;
    ``planner_budget_bytes``: what the planner was given of ``budget_bytes`` (less
    the device bytes the plan does not see, the safety margin and any re-plan's
    cut), and ``allocator`` what of its plan had to fit it
    (:data:`tfswap.core.best_of.ALLOCATORS`); both None for a loaded plan.
    """

    plan: Plan
    captured: Any
    lowered: Any
    rewritten: Any
    bound: Any
    spec: DeviceSpec
    budget_bytes: int
    device: str
    host: str
    search: ga.SearchResult | None = None
    profile: Any = None
    notes: tuple[str, ...] = ()
    measured_peak_bytes: int | None = None   # when optimize verified the plan by running it
    measured_on: str | None = None   # what measured_peak_bytes is: the device and the method
    # device -> its measured peak (bytes): the device, or each replica's of a replicated
    # step (measured_peak_bytes is the largest); empty where nothing was measured.
    measured_peaks: dict = field(default_factory=dict)
    relocation: Any = None   # the user's variables this call moved to host memory, if any
    problem: Any = None
    replica_plans: tuple = ()   # a replicated step's other replicas' plans (captured.replicas)
    # One per replica_plans: True where it is ``plan`` carried to that replica (its step
    # matched the first's, and the plan fits there), False where it was searched for.
    replica_carried: tuple = ()
    # A replicated step's devices simulated together, their copies sharing the host's
    # link and their collectives meeting (tfswap.core.simulator.ReplicatedResult):
    # ``replicated.step_time_s`` is the step's predicted time; None otherwise.
    replicated: Any = None
    candidates: tuple = ()
    planner_budget_bytes: int | None = None
    allocator: str | None = None

    def parameter_traffic(self) -> tuple:
        """Per variable in host memory, what one step fetches and writes back, the most
        bytes first (:class:`tfswap.tf.homes.Traffic`); empty when none is there.

        Example::

            for row in fast.parameter_traffic()[:5]:
                print(row.describe())
        """
        from tfswap.tf import homes

        return homes.traffic(self.captured, self.plan, self.lowered.writebacks)

    def restore_parameters(self) -> None:
        """Put the variables this call moved to host memory back on the device (values
        kept).  Every function that follows them (:func:`tfswap.tf.homes.follow`:
        the user's ``tf.function``s, traced before the move or while the variables
        were moved) runs on the device again; this function, planned for the
        host, raises :class:`tfswap.tf.homes.MovedVariablesError` if called
        afterwards.

        Example::

            fast = tfswap.optimize(cf, "2GiB")     # may move parameters to the host
            ...
            fast.restore_parameters()              # cf runs as before, on the device
        """
        if self.relocation is not None:
            self.relocation.undo()

    def __call__(self, *args, **kwargs):
        return self.bound(*args, **kwargs)

    @property
    def graph_def(self):
        return self.rewritten.graph_def

    @property
    def feeds(self) -> tuple[str, ...]:
        return self.captured.feeds

    @property
    def fetches(self) -> tuple[str, ...]:
        return self.captured.fetches

    @property
    def graph(self) -> DataflowGraph:
        return self.lowered.graph

    @property
    def keep(self) -> tuple[str, ...]:
        """Tensors live to the end of the step (outputs, assigned variables)."""
        return tuple(self.lowered.fetches) + tuple(self.lowered.assigned)

    def report(self) -> str:
        """A readable table: budget, predicted peak and time against ideal, swaps, search.

        Example::

            print(fast.report())
        """
        from tfswap import report

        name = self.captured.name
        name = name.decode() if isinstance(name, bytes) else name
        return report.summary(
            self.plan, search=self.search, graph=self.graph,
            title=f"tfswap plan {self.plan.id} ({self.plan.planner}) for {name} on "
                  f"{self.device} (device spec {self.spec.name})",
            budget_bytes=self.budget_bytes, measured_peak_bytes=self.measured_peak_bytes,
            measured_on=self.measured_on, notes=self.notes)

    def timeline(self):
        """The plan simulated on this step's graph: :class:`tfswap.report.Timeline`."""
        from tfswap import report

        return report.simulate_timeline(tf_lower.planning_graph(self.lowered, self.spec),
                                        self.plan, self.spec, keep=self.keep)

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the simulated step (compute, H2D, D2H tracks, device memory) as a
        Chrome trace; open it in ui.perfetto.dev or chrome://tracing.

        Example::

            fast.to_chrome_trace("step.trace.json")
        """
        from tfswap import report

        return report.write_chrome_trace(path, self.timeline())

    def plot_memory(self, path: str | Path) -> Path:
        """Write a PNG of simulated device memory over the step against the budget.
        Needs matplotlib (``pip install tfswap[plot]``).

        Example::

            fast.plot_memory("step.memory.png")
        """
        from tfswap import report

        return report.plot_memory(path, self.timeline(), budget_bytes=self.budget_bytes)


def optimize(concrete_fn, memory_budget=None, *, options: options_mod.Options | None = None,
             background: bool = False, **settings):
    """Plan swaps for ``concrete_fn`` so it runs within ``memory_budget`` of device memory.

    ``memory_budget``: bytes, a string such as "12GiB", or a fraction of the
    device's memory.  Every other setting is a field of :class:`tfswap.Options`
    (unit, default and check), as a keyword (``search_time=30``,
    ``generations=10``, ``parameters="host"``, ``recompute=False``,
    ``planner="tfswap.ga"``, ...) or as ``options`` (keywords override it).
    ``background``: False (default) returns an :class:`OptimizedFunction`
    once searched and verified; True returns in seconds a
    :class:`tfswap.anytime.AnytimeFunction` on a first plan (each search's
    first generation), verified, while the full search goes on in a thread
    (all cores but one unless ``workers`` is given); its plan takes over at a
    later call.  The stages are :mod:`tfswap.pipeline`'s.  A step that
    already fits gets no swaps.

    Example::

        fast = tfswap.optimize(cf, memory_budget="12MiB", generations=10)
        fast(x, y)                     # same results as cf(x, y)
        print(fast.report())
        fast = tfswap.optimize(cf, options=tfswap.Options("12MiB", seed=1))
    """
    options = options_of(memory_budget, options, settings)
    if not isinstance(background, bool):
        raise ValueError(f"background must be True or False, got {background!r}")
    started = time.monotonic()
    prepared = pipeline.prepare(concrete_fn, options)
    if not background:
        return _placed(prepared)[0]
    try:
        first, used = _placed(pipeline.first_round(prepared))
    except BudgetError:
        # No first-round plan measured within the budget (its remedies are the
        # full search's, on fewer candidates): the full search, in the foreground.
        return anytime.AnytimeFunction(
            _placed(prepared)[0], outcome="searched in the foreground: no plan of the first "
            "round measured within the budget")
    if all(p.planner == pipeline.NO_SWAP for p in (first.plan,) + first.replica_plans):
        return anytime.AnytimeFunction(first)   # it fits as it is: nothing to search
    spent = time.monotonic() - started
    # The training loop keeps a core of its own unless workers= says otherwise.
    searching = options if options.workers is not None else \
        options.replace(workers=max(1, (os.cpu_count() or 1) - 1))

    def search(stop_when, between_calls) -> OptimizedFunction:
        # The rest of search_time, counted from when this search starts (searches
        # queue behind each other), or the same generations as in the foreground.
        seconds = None if options.generations is not None else \
            max(options.search_time - spent, 0.0)
        again = pipeline.searching_again(used, searching, seconds, stop_when)
        return _planned(again, between_calls)

    return anytime.AnytimeFunction(first, search)


def options_of(memory_budget, options, settings: dict) -> options_mod.Options:
    """The call's :class:`tfswap.Options`: ``options`` (or the defaults) with
    ``memory_budget`` and the keyword ``settings`` (what :func:`optimize` and
    :class:`tfswap.keras.SwapCallback` take)."""
    if options is None:
        return options_mod.Options.of(memory_budget, **settings)
    if not isinstance(options, options_mod.Options):
        raise TypeError(f"options must be a tfswap.Options, got {type(options).__name__}")
    return options.replace(memory_budget=memory_budget, **settings)


def _placed(prepared: pipeline.Prepared) -> tuple[OptimizedFunction, pipeline.Prepared]:
    """The verified plan with the parameters where ``parameters`` says, and the
    step it was planned on (with the variables moved, if they were)."""
    if prepared.options.parameters == "host":
        return _on_host(prepared)
    try:
        return _planned(prepared), prepared
    except BudgetError as on_device:
        # "auto": no plan fits with the parameters on the device; try them on the host.
        if prepared.options.parameters == "device" or \
                not parameters_mod.movable_parameters(prepared):
            raise
        try:
            return _on_host(prepared)
        except BudgetError as on_host:
            # The smaller of the budgets the two name is the one that works
            # (a GRU's: 3.88 MiB with its parameters on the device, 6.90 MiB
            # with them on the host, where a pool serves the fetched ones).
            if getattr(on_device, "smallest_bytes", None) is not None and \
                    on_device.smallest_bytes < getattr(on_host, "smallest_bytes", float("inf")):
                raise on_device from on_host
            raise


def _on_host(prepared: pipeline.Prepared) -> tuple[OptimizedFunction, pipeline.Prepared]:
    moved = parameters_mod.place_parameters(prepared)
    try:
        return _planned(moved), moved
    except BaseException:
        parameters_mod.restore_parameters(moved)   # no plan: the user's variables go back
        raise


def _planned(prepared: pipeline.Prepared,
             between_calls=contextlib.nullcontext) -> OptimizedFunction:
    """Plan, rewrite and verify until a plan measures within the budget; each
    verification inside ``between_calls()`` (a background search's: no call of
    the running step overlaps it)."""
    attempt = pipeline.first_attempt(prepared)
    while True:
        try:
            planned = pipeline.plan(prepared, attempt)
        except Infeasible as err:
            attempt = pipeline.after_infeasible(prepared, attempt, err)
            continue
        made = pipeline.materialize(planned)
        with between_calls():
            verified = pipeline.verify(made)
        if verified.within_budget:
            return _function(verified)
        attempt = pipeline.refine(verified)


def _function(verified: pipeline.Verified) -> OptimizedFunction:
    made = verified.materialized
    planned, prepared = made.planned, made.planned.prepared
    notes = prepared.notes + planned.notes
    if verified.measured_peak_bytes is not None:
        where = "each replica's device" if prepared.replicas else prepared.device
        notes += (f"verified on {where} after {planned.attempt.replans} re-plan(s): "
                  f"measured peak {verified.measured_peak_bytes} B <= budget",)
    elif planned.plan.planner != pipeline.NO_SWAP:
        notes += (f"not verified: {_unverified_reason(prepared)}; the peak is the memory "
                  "model's prediction",)
    if prepared.captured.host_homed:
        from tfswap.tf import homes

        lowered = planned.attempt.step.lowered
        rows = homes.traffic(prepared.captured, planned.plan, lowered.writebacks)
        notes += (parameters_text(planned.plan, lowered, prepared.captured),)
        notes += tuple(f"  most moved: {row.describe()}" for row in rows[:3])
    return OptimizedFunction(
        plan=planned.plan, captured=prepared.captured, lowered=planned.attempt.step.lowered,
        rewritten=made.rewritten, bound=made.bound, spec=prepared.spec,
        budget_bytes=prepared.budget_bytes, device=prepared.device, host=prepared.host,
        search=planned.search, profile=prepared.profile, notes=notes,
        measured_peak_bytes=verified.measured_peak_bytes, measured_on=verified.measured_on,
        measured_peaks=dict(verified.device_peaks),
        relocation=prepared.relocation, problem=planned.attempt.step.problem,
        replica_plans=planned.replica_plans, replica_carried=planned.carried,
        replicated=planned.replicated,
        candidates=planned.candidates, planner_budget_bytes=planned.attempt.planner_budget,
        allocator=allocator_of(prepared, planned.attempt))


def parameters_text(plan: Plan, lowered, captured) -> str:
    """What the variables in host memory cost a step: bytes fetched, bytes copied
    back, and where their gathers and updates run (each update place with what
    decided it)."""
    from tfswap.tf import update_places

    fetched = sum(s.bytes for s in plan.swaps if s.kind == "prefetch")
    names = {c.name.partition(":")[0]: c.variable.name.partition(":")[0]
             for c in captured.captures if c.host_homed}
    types = {op.name: op.type for op in lowered.graph.ops}
    gathers = sum(1 for op in lowered.host_ops if types.get(op) == "GatherV2")
    placed = {v for p in plan.update_places for v in p.variables}
    text = (f"parameters: {len(set(names.values()))} variable(s) in host memory; each step fetches {fetched} "
            f"B of their values before use and copies {sum(lowered.writebacks.values())} B to "
            "the host (charged in the predicted time)")
    if gathers:
        text += (f"; {gathers} gather(s) of their rows run on the host, so only the rows "
                 "gathered travel")
    if len(placed) < len(names):
        text += ("; the other updates are computed on the device and the host stores the "
                 "result" if placed else "; every update is computed on the device and the "
                 "host stores the result")
    for p in plan.update_places:
        text += (f"\n  update of {', '.join(names.get(v, v) for v in p.variables)}: "
                 f"{update_places.describe(p.place, p.pieces)} ({p.why})")
    return text


def _unverified_reason(prepared: pipeline.Prepared) -> str:
    if prepared.captured.other_workers:
        return ("verify_rounds=0: a multi-worker step cannot run alone here, its collectives "
                "wait for the other workers")
    if prepared.options.verify_rounds == 0:
        return "verify_rounds=0"
    return f"this process cannot measure the peak of {prepared.device}"


def load_plan(path: str | Path, concrete_fn, *, device: str | None = None,
              host: str | None = None, device_spec: str | DeviceSpec | None = None,
              unmovable=(), options: options_mod.Options | None = None) -> OptimizedFunction:
    """Apply a plan saved with ``plan.save(path)`` to ``concrete_fn`` without searching.

    ``device``, ``host``, ``device_spec``: as for :func:`optimize`, or taken from
    ``options`` (a :class:`tfswap.Options`; the keywords override it).

    Variables the plan ran with in host memory (``plan.host_variables``) that
    are on the device are moved there again (:mod:`tfswap.tf.homes`), unless
    one of them is in ``unmovable`` (variables other planned steps run with on
    the device).  Raises :class:`PlanMismatchError`, naming why, if the plan
    does not apply as it is: made for another graph (a different model, batch
    shape or TensorFlow version), with a variable on the device that is in host
    memory now (moved by another plan), or needing to move an ``unmovable`` one.

    Example::

        fast = tfswap.load_plan("step.plan.json", cf)
        fast(x, y)                     # same results as cf(x, y)
    """
    from tfswap.tf import capture as capture_mod
    from tfswap.tf import homes, host_side, ir, rewrite, runtime, update_places

    try:
        plan = Plan.load(path)
    except PlanFormatError as err:
        raise PlanFormatError(f"{path}: {err}") from err
    if options is not None:
        device = device if device is not None else options.device
        host = host if host is not None else options.host
        device_spec = device_spec if device_spec is not None else options.device_spec
    device, host = tf_device.placement(device, host, () if device is not None
                                       else capture_mod.strategy_devices(concrete_fn))
    captured = capture_mod.capture(concrete_fn, device=device)
    if captured.replicas:
        raise PlanMismatchError(
            f"{path} is one plan, and this step is replicated over "
            f"{', '.join(captured.replicas)}: a replicated step's plans (one per replica) are "
            "not saved to files yet; plan it with tfswap.optimize")
    _check_assumptions(plan, path, captured, unmovable)
    relocation = None
    to_move = [c for c in captured.captures if c.variable is not None and not c.host_homed
               and c.name in set(plan.host_variables)]
    try:
        if to_move:   # the plan ran with these in host memory: put them there again
            relocation = homes.move_to_host([c.variable for c in to_move], host)
            captured = homes.rehomed(captured, relocation)
        if captured.host_homed:   # as optimize planned it (parameters_mod.place_parameters)
            captured, _ = homes.updates_on_device(captured, device)
            captured, _ = host_side.gathers_on_host(captured)
            try:
                captured = update_places.apply(captured, device, plan.update_places)
            except ValueError as err:
                raise PlanMismatchError(f"the plan in {path}: {err}. Re-plan with "
                                        "tfswap.optimize and save again.") from err
        found = capture_mod.fingerprint(captured)
        if plan.graph_fingerprint and plan.graph_fingerprint != found:
            raise PlanMismatchError(
                f"the plan in {path} was made for another graph (fingerprint "
                f"{plan.graph_fingerprint}, this function's is {found}): a different model, "
                "batch shape or TensorFlow version. Re-plan with tfswap.optimize and save again.")
        lowered = ir.lower(captured, None)
        spec = tf_device.spec_for(device_spec, device)
        rewritten = rewrite.rewrite(captured, plan, device, host)
        bound = runtime.bind(captured, rewritten.graph_def)
    except BaseException:
        if relocation is not None:
            relocation.undo()
        raise
    notes = (f"plan loaded from {path}",) + ((relocation.describe(),) if relocation else ())
    return OptimizedFunction(plan=plan, captured=captured, lowered=lowered, rewritten=rewritten,
                             bound=bound, spec=spec,
                             budget_bytes=plan.budget_bytes or spec.memory_bytes, device=device,
                             host=host, notes=notes, relocation=relocation)


def _check_assumptions(plan: Plan, path, captured, unmovable) -> None:
    """Raise :class:`PlanMismatchError` where ``plan`` assumes what no longer holds:
    the TensorFlow it was made with, or where a variable lives."""
    import tensorflow as tf

    if plan.tensorflow_version and plan.tensorflow_version != tf.__version__:
        raise PlanMismatchError(
            f"the plan in {path} was made with TensorFlow {plan.tensorflow_version}, and this "
            f"is {tf.__version__}, which may optimise the step differently. Re-plan with "
            "tfswap.optimize and save again.")
    on_host = set(plan.host_variables)
    moved = [c.variable.name for c in captured.captures
             if c.variable is not None and c.host_homed and c.name not in on_host]
    if moved:
        raise PlanMismatchError(
            f"the plan in {path} was made with {moved[0]} on the device, and it lives in host "
            f"memory now ({len(moved)} such variable(s): moved by another plan, or created "
            "there). Re-plan with tfswap.optimize, or put the variables back first "
            "(restore_parameters() on the OptimizedFunction that moved them).")
    pinned = {id(v) for v in unmovable}
    held = [c.variable.name for c in captured.captures
            if c.variable is not None and not c.host_homed and c.name in on_host
            and id(c.variable) in pinned]
    if held:
        raise PlanMismatchError(
            f"the plan in {path} moves {held[0]} to host memory ({len(held)} such "
            "variable(s)), and other planned steps run with it on the device. Re-plan with "
            "tfswap.optimize, which plans with the variables where they are.")


__all__ = ["NoDeviceError", "OptimizedFunction", "PlanMismatchError", "load_plan", "optimize"]
