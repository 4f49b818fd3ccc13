"""Issues #30 and #40 on the emulated device: tfswap's plans against the unmodified
step, swap-only plans and ``tf.recompute_grad``.

    .venv/bin/python benchmarks/hybrid.py [--models cnn,bert,resnet50] [--fractions 0.6]
        [--plans swap-only,hybrid] [--checkpoint] [--chained] [--link-bandwidth 50e6]
        [--parameters device] [--generations 5 | --search-default] [--runs 5] [--rounds 3]
        [--planner tfswap.ga] [--out benchmarks/out/hybrid.csv]
    # issue #40, second criterion: the default planner at 60% and 40%
    .venv/bin/python benchmarks/hybrid.py --models cnn,bert,transformer,lstm4 \
        --fractions 0.6,0.4 --plans hybrid --checkpoint --out benchmarks/out/hybrid_40.csv

Per model and fraction of the unmodified step's measured peak (the budget),
the plans of ``--plans`` from ``tfswap.optimize(...,
device_spec=cpu_emulated(link_bytes_per_s=B))``: ``swap-only``
(``recompute=False``) and ``hybrid`` (``recompute=True``, optimize's default);
``--planner`` is passed to optimize only when given (without it: the default
planner, the fastest of them all); ``--search-default``: the search as optimize
runs it by default (``search_time``, its worker threads) instead of
``--generations`` on one thread.  Each is rewritten with the same emulated
link (``rewrite(..., emulated_link_bytes_per_s=B)``: a copy completes when a
link of B bytes/s each way would have moved it) and measured: the median of
``--runs`` untraced runs (the step as users run it; FULL_TRACE adds a cost
to every op, which made plans with many remakes look slower) for the time,
``--runs`` traced runs for the peak, the plans alternating ``--rounds`` times with the
unmodified step (``plan`` "unmodified", the reference) and, with
``--checkpoint``, the same model's step with ``tf.recompute_grad`` around each
block (``plan`` "checkpoint", ``tf_peers.checkpointed``; its measured peak says
whether it fits the budget) and, with ``--chained``, the unmodified step rewritten
with no swap in TF's order (``plan`` "chained"): every plan's rewrite chains the
step's ops in its schedule, one at a time as the simulator runs them, where TF
runs the unmodified step on all the executor's threads; on the emulated device
(a CPU's cores) that chain costs time by itself, which a GPU's one compute
stream does not.  Per round, each plan's time over the unmodified step's
(``vs_unmodified_rounds``), over the chained step's (``vs_chained_rounds``) and
the hybrid's over swap-only's (``ratio_rounds``).  Also: the measured peak
against the budget, the plan's recomputations and round trips, the bytes it
moves each way, its predicted time against the lower bound of its schedule
that the report prints (``bound_s``, ``predicted_vs_bound``), every planner's
predicted time where the default planner ran (``candidates``), and whether 3
training steps are bit-identical to the unmodified function's.  A plan whose ``optimize`` raises
gets a row with ``error`` (why) and is not timed.
"""

import argparse
import csv
import re
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
from tfswap.core.plan import Plan  # noqa: E402
from tfswap.tf import capture, measure, rewrite  # noqa: E402

MODELS = {"cnn": lambda: zoo.cnn(batch=32), "bert": lambda: zoo.bert(batch=16),
          "resnet50": lambda: zoo.resnet50(batch=8, image=64),
          # activations well above the parameters and Adam state (283 MB), so they
          # stay on the device and the link carries activations
          "resnet50_b32": lambda: zoo.resnet50(batch=32, image=64),
          # benchmarks/gpu_validate.py's --small sizes
          "transformer": lambda: zoo.transformer(batch=16, seq=64, dim=64, heads=4, layers=2,
                                                 vocab=256),
          "lstm4": lambda: zoo.lstm(batch=64, steps=8, features=16, units=32, layers=4)}
PLANS = ("swap-only", "hybrid")
COLUMNS = ("model", "fraction", "plan", "budget_bytes", "round_trips", "recomputes",
           "swap_out_bytes", "swap_in_bytes", "predicted_peak_bytes",
           "optimize_measured_peak_bytes", "predicted_step_s", "ideal_s", "bound_s",
           "predicted_vs_bound", "measured_step_s", "step_s_rounds", "vs_unmodified_rounds",
           "vs_unmodified_median", "vs_chained_rounds", "vs_chained_median", "ratio_rounds",
           "measured_peak_bytes", "within_budget",
           "identical", "planner", "candidates", "error", "load", "problem_file")


def state(step) -> list:
    return [v.numpy() for v in list(step.model.weights) + list(step.optimizer.variables)]


def load() -> str:
    """The 1-minute load average (the machine may be shared)."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return ""


def bound_of(notes) -> tuple:
    """(lower bound s, predicted / bound) from the report's note, or (None, None)."""
    for note in notes:
        found = re.search(r"lower bound ([0-9.e+-]+) ms.*predicted at ([0-9.]+)x it", note)
        if found:
            return float(found.group(1)) / 1e3, float(found.group(2))
    return None, None


def run(name: str, fraction: float, args) -> list[dict]:
    reference = MODELS[name]()
    captured = capture.capture(reference.concrete_fn)
    budget = int(fraction * measure.measure(captured, captured.graph_def, reference.batch,
                                            inter_op_threads=1).peak_bytes)
    expected = [float(reference.concrete_fn(*reference.batch)["loss"]) for _ in range(3)]
    options = {} if args.planner is None else dict(planner=args.planner)
    made = {"unmodified": (reference, None, captured, captured.graph_def)}
    failed = []
    for plan in args.plans:
        step = MODELS[name]()
        try:
            search = {} if args.search_default else dict(generations=args.generations, workers=1)
            fast = tfswap.optimize(step.concrete_fn, budget, **search,
                                   seed=0, inputs=step.batch,
                                   parameters=args.parameters, recompute=plan == "hybrid",
                                   device_spec=cpu_emulated(
                                       link_bytes_per_s=args.link_bandwidth), **options)
        except Exception as error:   # a row that says why, and the others go on
            failed.append(dict(model=name, fraction=fraction, plan=plan, budget_bytes=budget,
                               error=f"{type(error).__name__}: {error}"[:500], load=load()))
            continue
        made[plan] = (step, fast, fast.captured, rewrite.rewrite(
            fast.captured, fast.plan, fast.device, fast.host,
            emulated_link_bytes_per_s=args.link_bandwidth).graph_def)
    planned = [fast for _, fast, _, _ in made.values() if fast is not None]
    if args.chained and planned:
        # TF's order is the problem's schedule; the captured step is the plan's.
        fast = planned[0]
        step = MODELS[name]()
        made["chained"] = (step, None, fast.captured, rewrite.rewrite(
            fast.captured, Plan(schedule=fast.problem.schedule), fast.device,
            fast.host).graph_def)
    if args.checkpoint:
        from research import tf_peers

        step = MODELS[name]()
        fn, _ = tf_peers.checkpointed(step)
        checkpointed = capture.capture(fn)
        made["checkpoint"] = (step, None, checkpointed, checkpointed.graph_def)
    times = {plan: [] for plan in made}
    peaks = {plan: 0 for plan in made}
    for _ in range(args.rounds):
        for plan, (step, _, captured_, graph_def) in made.items():
            # Timed untraced, as users run it; the traced runs give the peak.
            m = measure.measure(captured_, graph_def, step.batch, runs=args.runs,
                                untraced_runs=args.runs)
            times[plan].append(m.untraced_step_time_s)
            peaks[plan] = max(peaks[plan], m.peak_bytes)
    if "checkpoint" in made:   # its peak at one inter-op thread, as the budget's
        step, _, captured_, graph_def = made["checkpoint"]
        peaks["checkpoint"] = measure.measure(captured_, graph_def, step.batch,
                                              inter_op_threads=1).peak_bytes
    ratios = [h / s for h, s in zip(times.get("hybrid", ()), times.get("swap-only", ()))]
    rows = []
    for plan, (step, fast, _, _) in made.items():
        vs = [t / u for t, u in zip(times[plan], times["unmodified"])]
        chained = [t / u for t, u in zip(times[plan], times.get("chained", ()))]
        row = dict(model=name, fraction=fraction, plan=plan, budget_bytes=budget,
                   measured_step_s=statistics.median(times[plan]),
                   step_s_rounds=" ".join(f"{t:.6f}" for t in times[plan]),
                   vs_unmodified_rounds=" ".join(f"{r:.3f}" for r in vs),
                   vs_unmodified_median=statistics.median(vs),
                   vs_chained_rounds=" ".join(f"{r:.3f}" for r in chained),
                   vs_chained_median=statistics.median(chained) if chained else None,
                   ratio_rounds=" ".join(f"{r:.3f}" for r in ratios) if plan == "hybrid" else "",
                   measured_peak_bytes=peaks[plan], within_budget=peaks[plan] <= budget,
                   load=load())
        if fast is not None:
            # measure ran copies of the variables: the step's own are untrained.
            losses = [float(fast(*step.batch)["loss"]) for _ in range(3)]
            kinds = [s.kind for s in fast.plan.swaps]
            prediction = fast.plan.prediction
            bound_s, vs_bound = bound_of(fast.notes)
            row.update(
                round_trips=kinds.count("round_trip"), recomputes=kinds.count("recompute"),
                swap_out_bytes=prediction.swap_out_bytes, swap_in_bytes=prediction.swap_in_bytes,
                predicted_peak_bytes=prediction.peak_bytes,
                optimize_measured_peak_bytes=fast.measured_peak_bytes,
                predicted_step_s=prediction.step_time_s, ideal_s=prediction.ideal_time_s,
                bound_s=bound_s, predicted_vs_bound=vs_bound, planner=fast.plan.planner,
                candidates="; ".join(c.describe() for c in fast.candidates),
                identical=losses == expected and all(
                    np.array_equal(a, b) for a, b in zip(state(reference), state(step))))
            if fast.relocation is not None:
                fast.restore_parameters()
            if args.problems:
                row["problem_file"] = save_problem(args.problems, name, fraction, plan, fast,
                                                   row)
        rows.append(row)
    return rows + failed


def save_problem(directory: str, name: str, fraction: float, plan: str, fast, row: dict) -> str:
    """The row's planning problem, with its plan and the measured row, as
    ``directory/<model>.<fraction>.<plan>.json.gz`` (:mod:`tfswap.core.problem_file`:
    ``benchmarks/replan.py`` plans it again): the profile a slow row was planned on.
    Its path."""
    from tfswap.core import problem_file

    saved = problem_file.SavedProblem(
        fast.problem, fast.spec, budget_bytes=fast.budget_bytes,
        planner_budget_bytes=fast.planner_budget_bytes, allocator=fast.allocator,
        plan=fast.plan, row=row)
    return str(problem_file.write(Path(directory) / f"{name}.{fraction:g}.{plan}.json.gz",
                                  saved))


def describe(row: dict) -> str:
    if row.get("error"):
        return (f"{row['model']:11s} {row['fraction']:.2f} {row['plan']:10s} budget "
                f"{row['budget_bytes']} B: FAILED {row['error']} [load {row['load']}]")
    ms = row["measured_step_s"] * 1e3
    text = (f"{row['model']:11s} {row['fraction']:.2f} {row['plan']:10s} budget "
            f"{row['budget_bytes']} B: measured {ms:.1f} ms, peak {row['measured_peak_bytes']} B "
            f"({'within' if row['within_budget'] else 'OVER'}), x unmodified by round "
            f"{row['vs_unmodified_rounds']}")
    if row.get("vs_chained_rounds"):
        text += f", x chained by round {row['vs_chained_rounds']}"
    if row.get("predicted_step_s") is not None:
        text += (f"; {row['planner']}: {row['round_trips']} round trips, {row['recomputes']} "
                 f"recomputes, {row['swap_out_bytes']} B out; predicted "
                 f"{row['predicted_step_s'] * 1e3:.1f} ms (bound "
                 f"{(row['bound_s'] or 0) * 1e3:.1f} ms, {row['predicted_vs_bound']}x), peak "
                 f"predicted {row['predicted_peak_bytes']} B, optimize measured "
                 f"{row['optimize_measured_peak_bytes']} B with instant copies; identical "
                 f"{row['identical']}" + (f"; hybrid/swap-only by round: {row['ratio_rounds']}"
                                          if row["ratio_rounds"] else "")
                 + (f"; planners: {row['candidates']}" if row["candidates"] else ""))
    return text + f" [load {row['load']}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,bert,resnet50")
    parser.add_argument("--fractions", "--fraction", default="0.6",
                        help="fractions of the unmodified step's measured peak, e.g. 0.6,0.4")
    parser.add_argument("--plans", default=",".join(PLANS),
                        help=f"optimize's plans, of {PLANS}")
    parser.add_argument("--checkpoint", action="store_true",
                        help="also time tf.recompute_grad around each block")
    parser.add_argument("--chained", action="store_true",
                        help="also time the unmodified step rewritten with no swap (its ops "
                             "chained in TF's order, as every plan's are)")
    parser.add_argument("--link-bandwidth", type=float, default=50e6)
    parser.add_argument("--parameters", default="device", choices=("device", "auto", "host"))
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--search-default", action="store_true",
                        help="search as optimize does by default (its search_time and "
                             "workers) instead of --generations on one thread")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--planner", default=None,
                        help="optimize's planner; not given: optimize's default (tfswap, the "
                             "fastest of them all); a registered one for an ablation, e.g. "
                             "tfswap.ga (the genetic search alone)")
    parser.add_argument("--out", default="benchmarks/out/hybrid.csv")
    parser.add_argument("--problems", default=None, metavar="DIR",
                        help="also write each planned row's problem, plan and measured row "
                             "here (tfswap.core.problem_file; benchmarks/replan.py)")
    args = parser.parse_args()
    args.plans = [p for p in args.plans.split(",") if p]
    if any(p not in PLANS for p in args.plans):
        parser.error(f"--plans: of {PLANS}, got {args.plans}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        for fraction in (float(f) for f in args.fractions.split(",")):
            for row in run(name, fraction, args):
                rows.append(row)
                print(describe(row), flush=True)
            with out.open("w", newline="") as f:   # after each model: a partial run keeps rows
                writer = csv.DictWriter(f, fieldnames=COLUMNS)
                writer.writeheader()
                writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
