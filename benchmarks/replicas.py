"""Two replicas on one host link (issue #31): the simulator's prediction against the run.

    python benchmarks/replicas.py [--models cnn,bert] [--fraction 0.5] [--link 100e6]
        [--runs 5] [--generations 3] [--out benchmarks/out/replicas.csv]

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

Columns: the predicted step (the slower replica's plan: the replicas wait for
each other at the all-reduce) and the same plans re-simulated as if each
replica had the link to itself (``unshared``); both as slowdowns over the
simulated unmodified step, against the measured slowdown (the rewritten
step's median over the paired unmodified step's), so that the machine's
speed at the time cancels; each device's predicted peak (the plan's, and the
live bytes of its simulation, what TF's allocator holds on the emulated
device) and measured peak, also with the step's arguments added on the first device
(fed before the step runs, so not among the allocations its step stats record; the
model counts them, as a GPU holds the batch it is given).
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
          "predicted_slowdown", "unshared_slowdown", "measured_slowdown", "swapped_bytes"]


def study(name: str, fraction: float, link: float, runs: int, generations: int) -> list[dict]:
    import numpy as np

    from tfswap import pipeline, zoo
    from tfswap.core import simulator
    from tfswap.core.devices import cpu_emulated
    from tfswap.tf import emulate, measure, rewrite

    builder, kwargs = MODELS[name]
    devices = emulate.replica_devices(2)
    step = zoo.replicated(getattr(zoo, builder), STRATEGY, **kwargs)
    spec = cpu_emulated(link_bytes_per_s=link)
    options = pipeline.Options.of(1, device=emulate.DEVICE, host=emulate.HOST,
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
    lowered = [pipeline.replica_attempt(prepared, pipeline.first_attempt(prepared), r).step
               for r in prepared.replicas]
    unshared, live = [], []
    for st, plan in zip([prepared.step] + lowered, plans):
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
    rows = []
    # The step's arguments are fed to the first device before it runs: in its memory
    # (the model counts them, as a GPU holds the batch it is given) but not among
    # the allocations the step stats record.
    fed = sum(np.asarray(b).nbytes for b in step.batch)
    for device, plan, live_peak in zip(devices, plans, live):
        on = dataclasses.replace(prepared.captured, device=device)
        peak = max(measure.measure(on, graph_def, step.batch, runs=2, device=device).peak_bytes
                   for _ in range(2))
        with_args = peak + (fed if device == devices[0] else 0)
        rows.append(dict(model=name, device=device, budget_bytes=prepared.budget_bytes,
                         predicted_peak_bytes=plan.prediction.peak_bytes,
                         predicted_live_peak_bytes=live_peak, measured_peak_bytes=peak,
                         measured_with_arguments_bytes=with_args, predicted_slowdown=predicted,
                         unshared_slowdown=max(unshared) / ideal, measured_slowdown=measured,
                         swapped_bytes=plan.prediction.swap_out_bytes))
        print(f"{name} {device}: peak predicted {plan.prediction.peak_bytes} (live "
              f"{live_peak}) measured {peak} (with the fed arguments {with_args}) "
              f"(budget {prepared.budget_bytes}); slowdown predicted {predicted:.3f} "
              f"(unshared {max(unshared) / ideal:.3f}) measured {measured:.3f}", flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,bert")
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--link", type=float, default=100e6, help="bytes/s each way")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/out/replicas.csv")
    args = ap.parse_args(argv)
    import tensorflow as tf

    from tfswap.tf import emulate

    global STRATEGY
    emulate.setup(replicas=2)
    # One strategy for every step: two strategies' collectives share keys.
    STRATEGY = tf.distribute.MirroredStrategy(list(emulate.replica_devices(2)))
    rows = [row for name in args.models.split(",")
            for row in study(name, args.fraction, args.link, args.runs, args.generations)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


STRATEGY = None

if __name__ == "__main__":
    main()
