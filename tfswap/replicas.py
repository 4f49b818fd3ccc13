"""A step a ``tf.distribute`` strategy replicates, planned per device: what is
refused (:func:`refuse_unplannable`), the other replicas (:class:`Replica`,
:func:`replica_of`: profiled by the same traced run as the first, lowered, and
matched op by op with the first) and the report's notes on them
(:func:`replication_notes`), an attempt's remedies carried to another replica
(:func:`replica_attempt`), the first replica's plan carried to another
(:func:`carried_plan`), the replicas' plans simulated together
(:func:`replicated_prediction`) and each device measured
(:func:`measure_replicas`).  The stages of :mod:`tfswap.pipeline` call these
for every replica; the first replica is the step itself.

Identical replicas are planned once: the first replica's search serves the
others, its plan mapped onto each one's ops and buffers
(:mod:`tfswap.core.graph_match`, :mod:`tfswap.core.carry`) and checked there,
alone and with the others (:func:`replicated_prediction`); a replica whose step
differs beyond the match, or where the carried plan does not fit, is searched on
its own.

Example::

    first, *profiles = profile_replicas(captured, "auto", spec, feed, captured.replicas)
    others = tuple(replica_of(captured, d, p, options, spec, step)
                   for d, p in zip(captured.replicas[1:], profiles))
    joint, note = replicated_prediction(prepared, members)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfswap.budget_arena import allocator_of
from tfswap.core import carry, graph_match, simulator
from tfswap.core.devices import DeviceSpec
from tfswap.core.plan import Plan
from tfswap.tf import capture, host_copies, measure
from tfswap.tf.finish import finish
from tfswap.tf.lower import Lowered, lower, planner_budget

# A rewritten replicated step that runs this many times its unmodified step (at
# least the minimum) is taken as stuck: replicas waiting for each other never return.
REPLICATED_TIMEOUT_FACTOR = 100
REPLICATED_MIN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Replica:
    """Another replica of a step a ``tf.distribute`` strategy replicates: its
    device (the budget is per device), the step as captured on it, its profile,
    its lowering (:func:`tfswap.tf.ir.lower` keeps this device's part) and that
    lowering matched op by op with the first replica's
    (:class:`tfswap.core.graph_match.Match`), by which the first's plan carries."""

    device: str
    captured: Any
    profile: Any
    step: Lowered
    match: Any = None

    @property
    def alike(self) -> bool:
        """Whether its step matches the first's closely enough for the first's plan
        to be carried to it (:data:`tfswap.core.graph_match.MIN_COVERAGE`)."""
        return self.match is not None and self.match.coverage >= graph_match.MIN_COVERAGE


def replica_of(captured, device: str, profile, options, spec: DeviceSpec,
               first: Lowered) -> Replica:
    """Replica ``device`` of a replicated step, of ``profile`` (its device's,
    :func:`tfswap.tf.device.profile_replicas`), lowered at the small-tensor
    threshold of the first replica's lowering ``first`` and matched with it."""
    on = dataclasses.replace(captured, device=device)
    step = lower(on, profile, spec, first.small, options.recompute)
    return Replica(device, on, profile, step, graph_match.match(first.problem.graph,
                                                                step.problem.graph))


def refuse_unplannable(captured, host: str, parameters: str) -> None:
    """Raise :class:`tfswap.tf.capture.CaptureError` where a replicated step cannot
    be planned: its host is one of the replicas' devices, it reads variables the
    user created in host memory, or ``parameters`` is "host"."""
    if any(capture.same_device(host, d) for d in captured.replicas):
        raise capture.CaptureError(
            f"the host {host} is one of the replicas' devices ({', '.join(captured.replicas)}): "
            "tfswap would swap a replica's tensors into another replica's memory. Pass host= a "
            "device no replica uses; on the emulated device, tfswap.tf.emulate.setup(replicas=2) "
            "and MirroredStrategy(devices.replicas) keep the host (CPU:1) apart")
    if captured.replicas and parameters == "host":
        raise capture.CaptureError(
            "parameters='host' moves every variable, and a replicated step (tf.distribute) "
            "holds variables that each replica updates on its own device (its strategy's and "
            "optimizer's bookkeeping): tfswap moves a replicated step's variables to host "
            "memory only with parameters='auto' (the mirrored variables of at least the "
            "small-tensor threshold, one host copy each, when no plan fits with them on the "
            "devices). Pass parameters='auto' or 'device'")
    if captured.replicas and any(c.host_homed and not host_copies.is_copy(c.variable)
                                 for c in captured.captures):
        raise capture.CaptureError(
            "a replicated step (tf.distribute) reads variables created in host memory "
            "(under tf.device(host)): tfswap does not plan those for replicas. Create them "
            "under the strategy's scope and pass parameters='auto', which keeps one host copy "
            "of each mirrored variable that does not fit the devices")


def replication_notes(captured, replicas: tuple) -> tuple[str, ...]:
    """The report's notes on a step with collectives: planned on this worker alone,
    or over the replicas' devices (``replicas``: the others, :func:`replica_of`)."""
    notes = ()
    if captured.other_workers:
        notes += ("its collectives have members on other workers (MultiWorkerMirroredStrategy): "
                  "this worker's step planned alone, from its shapes (analytic profile), not "
                  "verified; every worker plans its own",)
    if replicas:
        notes += (f"replicated over {', '.join(captured.replicas)}: each device planned for "
                  "the budget" + ("; one traced run profiled every device"
                                  if replicas[0].profile.source == "trace" else ""),)
        notes += tuple(f"{r.device}: its lowered step matched with {captured.replicas[0]}'s: "
                       f"{r.match.describe()}" for r in replicas)
    return notes


def replicated_prediction(prepared, members, spec: DeviceSpec | None = None, **options):
    """A replicated step's devices (``members``: a :class:`tfswap.core.simulator.Replica`
    per device, the first replica's first) simulated together: their copies
    sharing the host's link (``spec``, by default the device's before its share,
    ``prepared.unshared_spec``), their collectives meeting
    (:func:`tfswap.core.simulator.simulate_replicas`, ``options`` passed on).
    (result, note); the result is None where a pool runs out in ``options``' copy
    order.  Raises :class:`ReplicasStuckError` where the plans wait for each other:
    their rewritten step would never finish, and with ``verify_rounds=0`` nothing
    would run it before the user's training does."""
    present = [{op.name for op in m.graph.ops} for m in members]
    groups = [g for g in prepared.rendezvous if all(n in ops for n, ops in zip(g, present))]
    try:
        joint = simulator.simulate_replicas(members, spec or prepared.unshared_spec,
                                            rendezvous=groups, **options)
    except simulator.Deadlock as err:
        raise ReplicasStuckError(
            f"the replicas' plans wait for each other as simulated together ({err}): their "
            "rewritten step would never finish (a tfswap bug: please report it with the "
            "step). The unmodified step is untouched.") from err
    except simulator.PlanError as err:
        return None, (f"the replicas' plans do not run together as simulated ({err}): no "
                      "prediction for the replicated step")
    alone = max(m.plan.prediction.step_time_s for m in members)
    return joint, (f"the replicas together (sharing the link, meeting at {len(groups)} "
                   f"collective(s)): predicted step {joint.step_time_s * 1e3:.3g} ms (each "
                   f"planned alone at its share of the link: {alone * 1e3:.3g} ms at most)")


def replica_attempt(prepared, attempt, replica: Replica):
    """``attempt`` for another replica: its lowering (at the attempt's small-tensor
    threshold), its planner budget less what the attempt's remedies took off the
    first replica's."""
    step = replica.step
    if step.small != attempt.step.small:
        step = lower(replica.captured, replica.profile, prepared.spec, attempt.step.small,
                     prepared.options.recompute)
    first, _ = planner_budget(prepared.budget_bytes, attempt.step.lowered,
                              prepared.options.safety_margin)
    usable, outside = planner_budget(prepared.budget_bytes, step.lowered,
                                     prepared.options.safety_margin)
    return dataclasses.replace(attempt, step=step, outside_bytes=outside,
                               planner_budget=usable - (first - attempt.planner_budget))


def carried_plan(prepared, first, replica: Replica, attempt,
                 held=None) -> tuple[Plan | None, str]:
    """The first replica's plan (``first``: its :class:`tfswap.pipeline.Planned`)
    carried to ``replica`` for ``attempt`` (the replica's, :func:`replica_attempt`)
    and finished for the captured graph, with the report's note: the plan itself
    (:func:`tfswap.core.carry.carry`), else, with the shared pool layout, its
    schedule with swaps planned again there (:func:`tfswap.core.carry.carry_schedule`);
    (None, why not) where the replica's step differs beyond the match or neither
    fits there.

    ``held``: the carried plan -> that plan predicting the peak the device will
    hold (``tfswap.pipeline``'s, as its own search's plan is finished): without
    it the prediction is the pool's, every buffer at its class's size, the small
    pool at its peak throughout and the fed batch counted (the replicated CNN's
    second replica: 4.95 MB predicted where 4.51 MB was measured, issue #44)."""
    source, target = first.attempt.step, attempt.step
    m = replica.match if source is prepared.step and target is replica.step else \
        graph_match.match(source.problem.graph, target.problem.graph)
    where = prepared.device
    args = (first.found, source.problem, target.problem, m, attempt.planner_budget,
            prepared.spec, allocator_of(prepared, attempt))
    why = ""
    try:
        try:
            got = carry.carry(*args)
        except carry.NotCarried as err:
            why = f"the plan itself does not fit here: {err}"
            if attempt.pool_layout != "shared":
                raise
            got = carry.carry_schedule(*args)
        plan = finish(held(got.plan) if held is not None else got.plan, prepared.captured,
                      target.lowered, prepared.budget_bytes, attempt.outside_bytes,
                      prepared.update_places)
    except (carry.NotCarried, RuntimeError) as err:
        # RuntimeError: tensor_swaps found the buffers' readers not lining up.
        reasons = f"{why}; nor its schedule: {err}" if why and str(err) not in why else err
        return None, f"planned on its own: {where}'s plan does not carry here ({reasons})"
    how = "plan carried here, not searched again" if not got.replanned else \
        f"schedule carried here, not searched again ({why})"
    return plan, (f"{where}'s {how} ({got.describe()}): predicted step "
                  f"{plan.prediction.step_time_s * 1e3:.4g} ms")


class ReplicasStuckError(RuntimeError):
    """A replicated step's replicas' plans wait for each other across a collective:
    simulated together before anything runs, or its rewritten graph measured."""


def timeout_s(prepared) -> float:
    """How long one run of a rewritten replicated step may take before it is taken
    as stuck: 100 times the unmodified step (its profile), at least a minute."""
    step = sum(op.time_s for op in prepared.profile.ops)
    return max(REPLICATED_MIN_TIMEOUT_S, REPLICATED_TIMEOUT_FACTOR * step)


def measure_replicas(made, sessions: int) -> tuple[int, str, bool, tuple]:
    """Each replica's device of a materialized step (:class:`tfswap.pipeline.Materialized`)
    measured as :func:`tfswap.pipeline.verify` measures one (``sessions`` of 3 runs
    on the emulated devices): (the worst device's peak, the step's, as the budget
    is per device; how it was measured; whether a device ran out of memory;
    ((device, its peak), ...) in the replicas' order)."""
    prepared = made.planned.prepared
    devices = (prepared.device,) + tuple(r.device for r in prepared.replicas)
    peaks, out_of_memory = {}, False
    for device in devices:
        if prepared.peak_method == measure.ALLOCATOR:   # GPU-only
            m = measure.allocator_peak(made.bound, prepared.feed, prepared.captured, device,
                                       runs=3, warmup=1)
            peaks[device], out_of_memory = m.peak_bytes, out_of_memory or m.out_of_memory
        else:
            on = dataclasses.replace(prepared.captured, device=device)
            try:
                peaks[device] = max(measure.measure(
                    on, made.rewritten.graph_def, prepared.feed, runs=3, warmup=1,
                    device=device, timeout_s=timeout_s(prepared)).peak_bytes
                    for _ in range(sessions))
            except tf.errors.DeadlineExceededError as err:
                raise ReplicasStuckError(
                    f"the rewritten replicated step did not finish within "
                    f"{timeout_s(prepared):.0f} s on the emulated devices: its "
                    "replicas' plans wait for each other (a tfswap bug: please report it with "
                    "the step). The unmodified step is untouched.") from err
    how = "the allocator" if prepared.peak_method == measure.ALLOCATOR else \
        f"step stats, worst of 3 runs in each of {sessions} sessions"
    return (max(peaks.values()),
            "per device (" + ", ".join(f"{d}: {b} B" for d, b in peaks.items()) + f"), {how}",
            out_of_memory, tuple(peaks.items()))


__all__ = ["REPLICATED_MIN_TIMEOUT_S", "REPLICATED_TIMEOUT_FACTOR", "Replica",
           "ReplicasStuckError", "carried_plan", "measure_replicas", "refuse_unplannable",
           "replica_attempt", "replica_of", "replicated_prediction", "replication_notes",
           "timeout_s"]
