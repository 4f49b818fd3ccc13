"""Two replicas on one host link (issue #31): the simulator's prediction against the run.

    python benchmarks/replicas.py [--models cnn,bert] [--fraction 0.5] [--link 100e6]
        [--runs 5] [--generations 3] [--link-latency 40e-6] [--issue-cost 13e-6]
        [--plan-repeats 3] [--out benchmarks/out/replicas.csv]

On two emulated devices (``emulate.setup(replicas=2)``: CPU:0 and CPU:2, the
host CPU:1) with an emulated link of ``--link`` bytes/s each way, which the op
library keeps one of per direction for the process, so the replicas share it:
per model, the zoo step replicated by a ``MirroredStrategy``
(``tfswap.zoo.replicated``), planned by the pipeline's stages at ``--fraction``
of the per-device unmodified peak with ``cpu_emulated(link_bytes_per_s=link)``
(``prepare`` prices each replica's copies at its share of the link,
``DeviceSpec.shared_by(2)``), rewritten with the emulated link, and run:
``--runs`` untraced runs, each followed by a run of the unmodified replicated
step (2 executor threads, one per replica's chain), and 2 traced runs for each
device's peak.

Time columns.  The replicas simulated together
(``tfswap.replicas.replicated_prediction``: one clock, their copies sharing the link,
their all-reduces meeting), as ``optimize`` predicts the step
(``joint_slowdown``: the plans as the planner prices copies, over the
unmodified replicas simulated together) and as the fidelity benchmark
compares a prediction with a run (``joint_calibrated_s``, against
``measured_step_s``, the rewritten step's median: every compute op's time
scaled by the measured unmodified step over the simulated one, the copies at
the bytes the rewrite moves, each paying ``--link-latency``; ``time_error`` its
relative error; ``joint_ready_s``: the same with the copies in the order
TensorFlow issues them, each costing ``--issue-cost`` of compute, as
``benchmarks/fidelity.py`` does, nan where a plan's pool does not hold in that
order).  For comparison, each replica
alone: the slower replica's plan at its share of the link
(``predicted_slowdown``, ``DeviceSpec.shared_by``: what the planner prices)
and re-simulated as if it had the link to itself (``unshared``), as slowdowns
over the simulated unmodified step, against the measured slowdown (the
rewritten step's median over the paired unmodified step's).  Peaks: each
device's predicted peak (the plan's, and the
live bytes of its simulation, what TF's allocator holds on the emulated
device) and measured peak, also with the step's arguments added
(``measured_with_arguments_bytes``): each replica slices its rows from the whole
batch, which is fed to the first device before the step runs and reaches the other
by a copy between two CPU devices that shares the host's buffer; neither is among
the allocations the step stats record, and the model counts the batch on each
device, as a GPU holds what it is given or sent.

Planning-time columns (issue #43 item 4: identical replicas planned once), in
CPU seconds of this process (``time.process_time``: the machines these run on
are shared, and another process's load would be counted in wall time; the plan
stage runs on one thread with ``workers=1``, so on an idle machine its CPU time
is its wall time), each plan stage the median of ``--plan-repeats`` runs on one
prepared step: ``plan_one_cpu_s``, the plan stage of the first replica alone
(the prepared step without its other replica: planning one replica);
``plan_replicated_cpu_s``, the plan stage of the replicated step as ``optimize``
runs it (the first replica's plan carried to the other where their lowered
steps match, checked there and with the replicas simulated together);
``plan_searched_cpu_s``, the same with every replica searched on its own (each
replica's ``match`` removed: how every replica was planned before);
``plan_ratio``: replicated over one.  ``prepare_cpu_s``: the prepare stage of
the replicated step, once (capture, one traced run profiling both devices, each
replica's lowering, the match; TensorFlow's threads included);
``other_replica_prepare_cpu_s``: its part for the other replica (lowering it and
matching it with the first, timed again); ``planning_ratio``: prepare and plan
of the replicated step over those of one replica (prepare less the other
replica's part, plus ``plan_one_cpu_s``).  ``carried``: how the other replica
got its plan ("plan": the first's carried; "schedule": the first's schedule
carried and its swaps planned again there; "searched": its own search).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = {"cnn": ("cnn", dict(batch=32, image=32, blocks=4)),
          "bert": ("bert", dict(batch=16, seq=128))}
FIELDS = ["model", "device", "budget_bytes", "predicted_peak_bytes",
          "predicted_live_peak_bytes", "measured_peak_bytes", "measured_with_arguments_bytes",
          "predicted_slowdown", "unshared_slowdown", "measured_slowdown", "swapped_bytes",
          "joint_slowdown", "joint_calibrated_s", "joint_ready_s", "measured_step_s", "measured_unmodified_s",
          "time_error", "carried", "prepare_cpu_s", "other_replica_prepare_cpu_s",
          "plan_one_cpu_s", "plan_replicated_cpu_s", "plan_searched_cpu_s", "plan_ratio",
          "planning_ratio"]


def study(name: str, fraction: float, link: float, runs: int, generations: int,
          link_latency_s: float, issue_cost_s: float, plan_repeats: int = 3) -> list[dict]:
    import numpy as np

    from tfswap import pipeline, zoo
    from tfswap import options as options_mod
    from tfswap import replicas as replicas_mod
    from tfswap.core import simulator
    from tfswap.core.devices import cpu_emulated
    from tfswap.tf import emulate, measure, rewrite

    builder, kwargs = MODELS[name]
    devices = emulate.replica_devices(2)
    step = zoo.replicated(getattr(zoo, builder), STRATEGY, **kwargs)
    spec = cpu_emulated(link_bytes_per_s=link)
    options = options_mod.Options.of(1, device=emulate.DEVICE, host=emulate.HOST,
                                  device_spec=spec, generations=generations, workers=1,
                                  inputs=step.batch)
    started = time.process_time()
    prepared = pipeline.prepare(step.concrete_fn, options)
    prepare_s = time.process_time() - started
    peaks = {d: p.peak_bytes for d, p in zip(devices, [prepared.profile] + [
        r.profile for r in prepared.replicas])}
    prepared = pipeline.with_budget(prepared, int(fraction * max(peaks.values())))
    timing = planning_times(prepared, options, plan_repeats)
    planned = timing.pop("planned")
    timing.update(prepare_cpu_s=prepare_s, planning_ratio=(
        prepare_s + timing["plan_replicated_cpu_s"]) / (
        prepare_s - timing["other_replica_prepare_cpu_s"] + timing["plan_one_cpu_s"]))
    print(f"{name}: planning, CPU s: prepare {prepare_s:.2f} (the other replica's part "
          f"{timing['other_replica_prepare_cpu_s']:.2f}); plan one replica "
          f"{timing['plan_one_cpu_s']:.2f}, replicated {timing['plan_replicated_cpu_s']:.2f} "
          f"(other replica: {timing['carried']}), every replica searched "
          f"{timing['plan_searched_cpu_s']:.2f}: plan x{timing['plan_ratio']:.2f}, prepare and "
          f"plan x{timing['planning_ratio']:.2f}", flush=True)
    graph_def = pipeline.rewritten_graph(planned, emulated_link_bytes_per_s=link).graph_def
    reference = rewrite.rewrite(prepared.captured, prepared.step.unconstrained, emulate.DEVICE,
                                emulate.HOST).graph_def
    steps = [prepared.step] + [r.step for r in prepared.replicas]
    plans = [planned.plan] + list(planned.replica_plans)
    # Each device's step as planned (a replica at the attempt's threshold).
    planned_on = [planned.attempt.step] + [
        replicas_mod.replica_attempt(prepared, planned.attempt, r).step for r in prepared.replicas]
    unshared, live = [], []
    for st, plan in zip(planned_on, plans):
        problem = st.problem
        unshared.append(simulator.simulate(problem.graph, plan, spec, keep=problem.keep,
                                           compiled=problem.compiled).step_time_s)
        # What TF's allocator holds on the emulated device: buffers at their own
        # size (benchmarks/fidelity.py's live peak), plus the unread variables.
        sim = simulator.simulate(problem.graph, plan, prepared.spec, events=True,
                                 keep=problem.keep, compiled=problem.compiled)
        outside = plan.prediction.peak_bytes - sim.peak_bytes
        live.append(simulator.live_peak_bytes_timed(sim, problem.compiled, plan.schedule)
                    + outside)
    ideal = max(st.unconstrained.prediction.step_time_s for st in steps)
    traced = measure.run_traced(prepared.captured, graph_def, step.batch, runs=2,
                                inter_op_threads=2, untraced_runs=runs,
                                reference_graph_def=reference)
    measured = statistics.median(np.array(traced.untraced_times_s)
                                 / np.array(traced.reference_times_s))
    predicted = max(p.prediction.step_time_s for p in plans) / ideal
    joint = together(prepared, planned_on, plans)
    unmodified = together(prepared, planned_on, [st.unconstrained for st in planned_on])
    measured_s = statistics.median(traced.untraced_times_s)
    reference_s = statistics.median(traced.reference_times_s)
    # As benchmarks/fidelity.py compares: compute at the speed the unmodified step
    # ran at beside these runs, copies at the bytes the rewrite moves, in TF's order.
    scale = reference_s / unmodified.step_time_s
    latency = dataclasses.replace(prepared.unshared_spec, copy_latency_s=link_latency_s)
    calibrated = together(prepared, planned_on, plans, scale=scale, spec=latency,
                          moved=True).step_time_s
    # ... and the copies in the order TF issues them (each swap-in taking its
    # object when issued): nan where a plan's pool does not hold in that order.
    try:
        ready = together(prepared, planned_on, plans, scale=scale, spec=latency, moved=True,
                         copy_order="ready", issue_cost_s=issue_cost_s).step_time_s
    except RuntimeError as err:
        print(f"{name}: in TF's issue order: {err}", flush=True)
        ready = float("nan")
    print(f"{name}: together {joint.step_time_s * 1e3:.1f} ms (unmodified "
          f"{unmodified.step_time_s * 1e3:.1f}), calibrated x{scale:.3f} {calibrated * 1e3:.1f} "
          f"ms (issue order {ready * 1e3:.1f}); measured {measured_s * 1e3:.1f} ms (unmodified "
          f"{reference_s * 1e3:.1f})", flush=True)
    rows = []
    # The whole batch is on every device (fed to the first, sent to the others: each
    # replica slices its rows from it), not among the allocations the emulated
    # devices' step stats record (a feed; a copy between CPU devices shares the
    # buffer), and counted by the model, as a GPU holds what it is given or sent.
    fed = sum(np.asarray(b).nbytes for b in step.batch)
    for device, plan, live_peak in zip(devices, plans, live):
        on = dataclasses.replace(prepared.captured, device=device)
        peak = max(measure.measure(on, graph_def, step.batch, runs=2, device=device).peak_bytes
                   for _ in range(2))
        with_args = peak + fed
        rows.append(dict(model=name, device=device, budget_bytes=prepared.budget_bytes,
                         predicted_peak_bytes=plan.prediction.peak_bytes,
                         predicted_live_peak_bytes=live_peak, measured_peak_bytes=peak,
                         measured_with_arguments_bytes=with_args, predicted_slowdown=predicted,
                         unshared_slowdown=max(unshared) / ideal, measured_slowdown=measured,
                         swapped_bytes=plan.prediction.swap_out_bytes,
                         joint_slowdown=joint.step_time_s / unmodified.step_time_s,
                         joint_calibrated_s=calibrated, joint_ready_s=ready,
                         measured_step_s=measured_s,
                         measured_unmodified_s=reference_s,
                         time_error=calibrated / measured_s - 1, **timing))
        print(f"{name} {device}: peak predicted {plan.prediction.peak_bytes} (live "
              f"{live_peak}) measured {peak} (with the fed arguments {with_args}) "
              f"(budget {prepared.budget_bytes}); slowdown predicted {predicted:.3f} "
              f"(unshared {max(unshared) / ideal:.3f}) measured {measured:.3f}", flush=True)
    return rows


def planning_times(prepared, options, repeats: int) -> dict:
    """The plan stage's CPU seconds (median of ``repeats``): of the first replica
    alone, of the replicated step (its other replica carried the first's plan
    where it can), of every replica searched; the other replica's part of
    prepare; how the other replica got its plan; the replicated step's Planned."""
    from tfswap import pipeline
    from tfswap import replicas as replicas_mod

    def timed(prep):
        seconds, got = [], None
        for _ in range(max(1, repeats)):
            started = time.process_time()
            got = pipeline.plan(prep, pipeline.first_attempt(prep))
            seconds.append(time.process_time() - started)
        return statistics.median(seconds), got

    one, _ = timed(dataclasses.replace(prepared, replicas=(), rendezvous=()))
    replicated, planned = timed(prepared)
    searched, _ = timed(dataclasses.replace(prepared, replicas=tuple(
        dataclasses.replace(r, match=None) for r in prepared.replicas)))
    other = prepared.replicas[0]
    started = time.process_time()
    replicas_mod.replica_of(prepared.captured, other.device, other.profile, options,
                            prepared.spec, prepared.step)
    other_prepare = time.process_time() - started
    note = next((n for n in planned.notes if n.startswith(f"{other.device}: ")
                 and "carried here" in n), "")
    how = "searched" if not planned.carried[0] else \
        "schedule" if "schedule carried" in note else "plan"
    return dict(planned=planned, plan_one_cpu_s=one, plan_replicated_cpu_s=replicated,
                plan_searched_cpu_s=searched, plan_ratio=replicated / one,
                other_replica_prepare_cpu_s=other_prepare, carried=how)


def together(prepared, steps, plans, scale=1.0, spec=None, moved=False, **options):
    """The devices' plans on their lowered steps simulated together
    (``tfswap.replicas.replicated_prediction``); ``scale``: every op's time multiplied by
    it; ``moved``: each copy at the bytes the rewrite moves (the tensor it
    copies, where the plan's swap is of a part of its buffer)."""
    from tfswap import replicas as replicas_mod
    from tfswap.core import simulator

    members = []
    for st, plan in zip(steps, plans):
        cg = st.problem.compiled
        cg = dataclasses.replace(cg, op_time=cg.op_time * scale) if scale != 1.0 else cg
        copy_bytes = {sw.id: st.lowered.graph.tensor(sw.tensor).nbytes
                      for sw in plan.swaps} if moved else None
        members.append(simulator.Replica(st.problem.graph, plan, keep=st.problem.keep,
                                         compiled=cg, copy_bytes=copy_bytes))
    joint, note = replicas_mod.replicated_prediction(prepared, members, spec=spec, **options)
    if joint is None:
        raise RuntimeError(note)
    return joint


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,bert")
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--link", type=float, default=100e6, help="bytes/s each way")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--link-latency", type=float, default=40e-6,
                    help="seconds each copy takes beyond its bytes (benchmarks/link_latency.py)")
    ap.add_argument("--issue-cost", type=float, default=13e-6,
                    help="compute seconds issuing each copy costs (link_latency.py --overhead)")
    ap.add_argument("--plan-repeats", type=int, default=3,
                    help="runs of each plan stage whose median the planning-time columns give")
    ap.add_argument("--out", default="benchmarks/out/replicas.csv")
    args = ap.parse_args(argv)
    import tensorflow as tf

    from tfswap.tf import emulate

    global STRATEGY
    emulate.setup(replicas=2)
    # One strategy for every step: two strategies' collectives share keys.
    STRATEGY = tf.distribute.MirroredStrategy(list(emulate.replica_devices(2)))
    rows = [row for name in args.models.split(",")
            for row in study(name, args.fraction, args.link, args.runs, args.generations,
                             args.link_latency, args.issue_cost, args.plan_repeats)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


STRATEGY = None

if __name__ == "__main__":
    main()
