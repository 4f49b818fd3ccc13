"""Two replicas on one host link (issue #31): the simulator's prediction against the run.

    python benchmarks/replicas.py [--models cnn,bert] [--fraction 0.5] [--link 100e6]
        [--runs 5] [--generations 3] [--link-latency 40e-6] [--issue-cost 13e-6]
        [--out benchmarks/out/replicas.csv]

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
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = {"cnn": ("cnn", dict(batch=32, image=32, blocks=4)),
          "bert": ("bert", dict(batch=16, seq=128))}
FIELDS = ["model", "device", "budget_bytes", "predicted_peak_bytes",
          "predicted_live_peak_bytes", "measured_peak_bytes", "measured_with_arguments_bytes",
          "predicted_slowdown", "unshared_slowdown", "measured_slowdown", "swapped_bytes",
          "joint_slowdown", "joint_calibrated_s", "joint_ready_s", "measured_step_s", "measured_unmodified_s",
          "time_error"]


def study(name: str, fraction: float, link: float, runs: int, generations: int,
          link_latency_s: float, issue_cost_s: float) -> list[dict]:
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
    prepared = pipeline.prepare(step.concrete_fn, options)
    peaks = {d: p.peak_bytes for d, p in zip(devices, [prepared.profile] + [
        r.profile for r in prepared.replicas])}
    prepared = pipeline.with_budget(prepared, int(fraction * max(peaks.values())))
    planned = pipeline.plan(prepared, pipeline.first_attempt(prepared))
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
                         time_error=calibrated / measured_s - 1))
        print(f"{name} {device}: peak predicted {plan.prediction.peak_bytes} (live "
              f"{live_peak}) measured {peak} (with the fed arguments {with_args}) "
              f"(budget {prepared.budget_bytes}); slowdown predicted {predicted:.3f} "
              f"(unshared {max(unshared) / ideal:.3f}) measured {measured:.3f}", flush=True)
    return rows


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
                             args.link_latency, args.issue_cost)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


STRATEGY = None

if __name__ == "__main__":
    main()
