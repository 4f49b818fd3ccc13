"""Issue #43 item 3 on two emulated devices: a replicated step's parameters in host memory.

    .venv/bin/python benchmarks/replica_parameters.py [--layers 4] [--hidden 512]
        [--over 1.6] [--device-fraction 1.0] [--runs 21] [--generations 2]
        [--link 0] [--out benchmarks/out/replica_parameters.csv]

Two emulated devices (CPU:0 and CPU:2, the host CPU:1) under one
``MirroredStrategy`` train ``tfswap.zoo.replicated_mlp`` (Adam).  Rows, each on
a model of its own built from one seed:

* ``device``: ``parameters="device"`` at ``--device-fraction`` of the unmodified
  step's larger per-device peak (the larger budget: every variable and Adam
  slot on each device);
* ``auto``: ``parameters="auto"`` at the parameters plus Adam state over
  ``--over`` (they do not fit: one host copy of each mirrored variable, the
  updates where the simulator places them);
* ``auto_host_updates``: the same with every update group placed on the host
  (``tfswap.tf.update_places.choose`` replaced for this row): ZeRO-Offload,
  Adam once on the host after the all-reduce.

Each row's step trains 3 steps beside a twin trained by the unmodified
replicated step, compared bit for bit (losses, weights, Adam state:
``identical``).  Then ``--runs`` rounds: in each, every row's planned step and
the unmodified replicated step of one more twin are called once each, in a
rotated order; ``step_ms`` is a row's median, ``over_plain`` the median of its
per-round ratio to the unmodified step of the same round (paired: the machine
is shared).  Peaks are what ``optimize`` measured on each device (step stats,
worst of 3 runs in each of 2 sessions).  ``host_bytes``: the variables in host
memory (one copy); ``per_replica_copies_bytes``: what one copy per replica
would take.  ``--link 0`` (default): the emulated device's link, a memcpy, and
each row planned by ``tfswap.optimize``; ``--link B``: an emulated link of ``B``
bytes/s each way (``swap_ops.cc``; the two devices share it), each row planned
by the pipeline's stages for it (``cpu_emulated(link_bytes_per_s=B)``, one plan,
no re-plan) and rewritten with it, its peaks measured the same way.  A row
whose step fits as it is (``device`` at the unmodified peak) runs unmodified:
its peaks are the unmodified step's.
"""

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfswap.tf import emulate  # noqa: E402

DEVICES = emulate.setup(replicas=2)

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfswap  # noqa: E402
from tfswap import parameters as parameters_mod  # noqa: E402
from tfswap import pipeline, zoo  # noqa: E402
from tfswap.core.devices import cpu_emulated  # noqa: E402
from tfswap.tf import capture, measure, runtime, update_places  # noqa: E402
from research.update_choices import every_update_on_the_host  # noqa: E402

STRATEGY = tf.distribute.MirroredStrategy(list(DEVICES.replicas))
COLUMNS = ("row", "parameters", "budget_bytes", "state_bytes", "unmodified_peak_bytes",
           "peak_cpu0_bytes", "peak_cpu2_bytes", "host_bytes", "per_replica_copies_bytes",
           "update_places", "step_ms", "plain_step_ms", "over_plain", "identical", "plan_s")


def plan_row(step, budget: int, parameters: str, args):
    """(the planned step, its measured peak per device, the variables moved, the
    update places): by ``tfswap.optimize``, or with ``--link`` by the pipeline's
    stages, the plan priced and rewritten for the emulated link (which ``optimize``
    does not take)."""
    if not args.link:
        fast = tfswap.optimize(step.concrete_fn, budget, parameters=parameters,
                               generations=args.generations, workers=1, seed=0,
                               inputs=step.batch)
        return fast, fast.measured_peaks, fast.relocation, fast.plan.update_places
    options = tfswap.Options.of(budget, device_spec=cpu_emulated(link_bytes_per_s=args.link),
                                parameters=parameters, generations=args.generations,
                                workers=1, seed=0, inputs=step.batch)
    prepared = pipeline.prepare(step.concrete_fn, options)
    if parameters == "auto" and parameters_mod.movable_parameters(prepared):
        prepared = parameters_mod.place_parameters(prepared)
    planned = pipeline.plan(prepared, pipeline.first_attempt(prepared))
    graph_def = pipeline.rewritten_graph(planned, emulated_link_bytes_per_s=args.link).graph_def
    peaks = {} if planned.plan.planner == pipeline.NO_SWAP else {
        d: max(measure.measure(dataclasses.replace(prepared.captured, device=d), graph_def,
                               step.batch, runs=3, device=d).peak_bytes for _ in range(2))
        for d in DEVICES.replicas}
    return (runtime.bind(prepared.captured, graph_def), peaks, prepared.relocation,
            planned.plan.update_places)


def _state(step) -> list:
    return [v.numpy() for v in step.model + step.optimizer]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--over", type=float, default=1.6,
                    help="parameters plus Adam state over the per-device budget of the auto rows")
    ap.add_argument("--device-fraction", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--link", type=float, default=0,
                    help="bytes/s each way of an emulated link (0: the memcpy, by optimize)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/replica_parameters.csv"))
    args = ap.parse_args()

    def build():
        return zoo.replicated_mlp(STRATEGY, layers=args.layers, hidden=args.hidden)

    probe = build()
    captured = capture.capture(probe.concrete_fn, device=DEVICES.replicas[0])
    unmodified_peaks = {d: measure.measure(dataclasses.replace(captured, device=d),
                                           captured.graph_def, probe.batch, runs=2,
                                           device=d).peak_bytes for d in DEVICES.replicas}
    unmodified = max(unmodified_peaks.values())
    state_bytes = sum(int(np.prod(v.shape)) * v.dtype.size for v in probe.model + probe.optimizer)
    rows, steps = [], []
    for name, parameters, budget in (
            ("device", "device", int(args.device_fraction * unmodified)),
            ("auto", "auto", int(state_bytes / args.over)),
            ("auto_host_updates", "auto", int(state_bytes / args.over))):
        step, twin = build(), build()
        chooser = update_places.choose
        if name == "auto_host_updates":
            update_places.choose = every_update_on_the_host
        try:
            started = time.perf_counter()
            fast, peaks, moved, places = plan_row(step, budget, parameters, args)
            plan_s = time.perf_counter() - started
        finally:
            update_places.choose = chooser
        identical = [float(fast(*step.batch)["loss"]) for _ in range(3)] == \
            [float(twin.concrete_fn(*twin.batch)["loss"]) for _ in range(3)] and all(
                np.array_equal(a, b) for a, b in zip(_state(step), _state(twin)))
        # A step that fits as it is runs unmodified: its peaks are the unmodified step's.
        peaks = peaks or unmodified_peaks
        host = moved.nbytes if moved is not None else 0
        rows.append(dict(
            row=name, parameters=parameters, budget_bytes=budget, state_bytes=state_bytes,
            unmodified_peak_bytes=unmodified,
            peak_cpu0_bytes=peaks.get(DEVICES.replicas[0]),
            peak_cpu2_bytes=peaks.get(DEVICES.replicas[1]), host_bytes=host,
            per_replica_copies_bytes=host * len(DEVICES.replicas),
            update_places=",".join(sorted({p.place for p in places})) or "-",
            identical=identical, plan_s=round(plan_s, 1)))
        steps.append((fast, step.batch))
        print(f"{name}: planned in {plan_s:.1f} s, peaks {peaks}, host {host} B, "
              f"identical {identical}", flush=True)
    plain = build()
    times = {r["row"]: [] for r in rows}
    ratios = {r["row"]: [] for r in rows}
    plain_times = []
    for k in range(args.runs + 1):
        order = list(range(len(rows) + 1))
        order = order[k % len(order):] + order[:k % len(order)]
        took = {}
        for i in order:
            fn, batch = (plain.concrete_fn, plain.batch) if i == len(rows) else steps[i]
            started = time.perf_counter()
            fn(*batch)["loss"].numpy()
            took[i] = time.perf_counter() - started
        if k == 0:
            continue   # warm-up
        plain_times.append(took[len(rows)])
        for i, r in enumerate(rows):
            times[r["row"]].append(took[i])
            ratios[r["row"]].append(took[i] / took[len(rows)])
    for r in rows:
        r.update(step_ms=round(1e3 * statistics.median(times[r["row"]]), 2),
                 plain_step_ms=round(1e3 * statistics.median(plain_times), 2),
                 over_plain=round(statistics.median(ratios[r["row"]]), 2))
    print("| row | parameters | budget B | state B | peak CPU:0 B | peak CPU:2 B | host B "
          "(one copy) | per-replica copies B | updates | step ms | plain ms | x plain | "
          "identical |")
    print("|---" * 13 + "|")
    for r in rows:
        print(f"| {r['row']} | {r['parameters']} | {r['budget_bytes']} | {r['state_bytes']} | "
              f"{r['peak_cpu0_bytes']} | {r['peak_cpu2_bytes']} | {r['host_bytes']} | "
              f"{r['per_replica_copies_bytes']} | {r['update_places']} | {r['step_ms']} | "
              f"{r['plain_step_ms']} | {r['over_plain']} | {r['identical']} |")
    print(f"unmodified step: {unmodified} B per device at most")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
