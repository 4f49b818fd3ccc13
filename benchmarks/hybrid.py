"""Issue #30 on the emulated device: hybrid (swap or recompute) against swap-only plans.

    .venv/bin/python benchmarks/hybrid.py [--models cnn,bert,resnet50] [--fraction 0.6]
        [--link-bandwidth 50e6] [--parameters device] [--generations 5] [--runs 5]
        [--rounds 3] [--planner tfswap.ga] [--out benchmarks/out/hybrid.csv]

Per model, at ``--fraction`` of the unmodified step's measured peak, two plans
from ``tfswap.optimize(..., device_spec=cpu_emulated(link_bytes_per_s=B))``:
``recompute=False`` (swap-only) and ``recompute=True`` (hybrid).  Each is
rewritten with the same emulated link (``rewrite(...,
emulated_link_bytes_per_s=B)``: a copy completes when a link of B bytes/s
each way would have moved it) and measured: the median of ``--runs`` traced
runs, the two plans alternating ``--rounds`` times; the hybrid/swap-only
ratio is given per round.  Also: the measured peak against the budget, the
plan's recomputations and round trips, and whether 3 training steps of the
hybrid are bit-identical to the unmodified function's.
"""

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfswap.tf import emulate  # noqa: E402

emulate.setup()

import numpy as np  # noqa: E402

import tfswap  # noqa: E402
from tfswap import zoo  # noqa: E402
from tfswap.core.devices import cpu_emulated  # noqa: E402
from tfswap.tf import capture, measure, rewrite  # noqa: E402

MODELS = {"cnn": lambda: zoo.cnn(batch=32), "bert": lambda: zoo.bert(batch=16),
          "resnet50": lambda: zoo.resnet50(batch=8, image=64),
          # activations well above the parameters and Adam state (283 MB), so they
          # stay on the device and the link carries activations
          "resnet50_b32": lambda: zoo.resnet50(batch=32, image=64)}
COLUMNS = ("model", "plan", "budget_bytes", "round_trips", "recomputes", "predicted_peak_bytes",
           "optimize_measured_peak_bytes", "predicted_step_s",
           "measured_step_s", "ratio_rounds", "measured_peak_bytes", "identical")


def state(step) -> list:
    return [v.numpy() for v in list(step.model.weights) + list(step.optimizer.variables)]


def run(name: str, args) -> list[dict]:
    reference = MODELS[name]()
    captured = capture.capture(reference.concrete_fn)
    budget = int(args.fraction * measure.measure(captured, captured.graph_def, reference.batch,
                                                 inter_op_threads=1).peak_bytes)
    expected = [float(reference.concrete_fn(*reference.batch)["loss"]) for _ in range(3)]
    made = {}
    for plan in ("swap-only", "hybrid"):
        step = MODELS[name]()
        fast = tfswap.optimize(step.concrete_fn, budget, generations=args.generations, seed=0,
                               workers=1, inputs=step.batch, parameters=args.parameters,
                               planner=args.planner,
                               recompute=plan == "hybrid", device_spec=cpu_emulated(
                                   link_bytes_per_s=args.link_bandwidth))
        made[plan] = (step, fast, rewrite.rewrite(
            fast.captured, fast.plan, fast.device, fast.host,
            emulated_link_bytes_per_s=args.link_bandwidth).graph_def)
    times = {plan: [] for plan in made}
    peaks = {plan: 0 for plan in made}
    for _ in range(args.rounds):
        for plan, (step, fast, graph_def) in made.items():
            m = measure.measure(fast.captured, graph_def, step.batch, runs=args.runs)
            times[plan].append(m.step_time_s)
            peaks[plan] = max(peaks[plan], m.peak_bytes)
    ratios = [h / s for h, s in zip(times["hybrid"], times["swap-only"])]
    rows = []
    for plan, (step, fast, _) in made.items():
        # measure ran copies of the variables: the step's own are untrained.
        losses = [float(fast(*step.batch)["loss"]) for _ in range(3)]
        kinds = [s.kind for s in fast.plan.swaps]
        rows.append(dict(
            model=name, plan=plan, budget_bytes=budget, round_trips=kinds.count("round_trip"),
            recomputes=kinds.count("recompute"),
            predicted_peak_bytes=fast.plan.prediction.peak_bytes,
            optimize_measured_peak_bytes=fast.measured_peak_bytes,
            predicted_step_s=fast.plan.prediction.step_time_s,
            measured_step_s=statistics.median(times[plan]),
            ratio_rounds=" ".join(f"{r:.3f}" for r in ratios) if plan == "hybrid" else "",
            measured_peak_bytes=peaks[plan],
            identical=losses == expected and all(
                np.array_equal(a, b) for a, b in zip(state(reference), state(step)))))
        if fast.relocation is not None:
            fast.restore_parameters()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,bert,resnet50")
    parser.add_argument("--fraction", type=float, default=0.6)
    parser.add_argument("--link-bandwidth", type=float, default=50e6)
    parser.add_argument("--parameters", default="device", choices=("device", "auto", "host"))
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--planner", default="tfswap",
                        help="optimize's planner: tfswap (the default, the fastest of them "
                             "all) or a registered one for an ablation, e.g. tfswap.ga (the "
                             "genetic search alone)")
    parser.add_argument("--out", default="benchmarks/out/hybrid.csv")
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        for row in run(name, args):
            rows.append(row)
            print(f"{row['model']:9s} {row['plan']:9s} budget {row['budget_bytes']} B: "
                  f"{row['round_trips']} round trips, {row['recomputes']} recomputes; "
                  f"predicted {row['predicted_step_s'] * 1e3:.1f} ms, measured "
                  f"{row['measured_step_s'] * 1e3:.1f} ms, peak {row['measured_peak_bytes']} B "
                  f"(predicted {row['predicted_peak_bytes']} B, optimize measured "
                  f"{row['optimize_measured_peak_bytes']} B with instant copies), "
                  f"identical {row['identical']}"
                  + (f"; hybrid/swap-only by round: {row['ratio_rounds']}"
                     if row["ratio_rounds"] else ""), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
