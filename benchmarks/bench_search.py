"""Convergence of the genetic search: best simulated step time against search time.

One search runs for ``--minutes`` (default 10) at a budget of one third of the
graph's no-swap memory need (the "ideal footprint is 3x the device memory"
setting); the curve is printed at checkpoints, then the best at
``--compare`` minutes (default 3) against the final best, which is the
"within 2% of the 10-minute result in 3 minutes" check.

Graphs: ``--model synthetic`` (``layered_training_step(--ops)``, no
TensorFlow needed), or ``resnet50`` / ``lstm`` with analytic profiles for
the device when ``tfswap.tf.profile.analytic`` exists (``--batch`` sets the
batch; the budget is still a third of the no-swap need).

    python -m benchmarks.bench_search --model synthetic --ops 10000 --minutes 10
    python -m benchmarks.bench_search --minutes 1 --compare 0.3   # a quick look
"""

from __future__ import annotations

import argparse
import sys
import time

from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ beside tfswap/
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import device_spec
from tfswap.core.planner import default_allocation
from tfswap.core.search import SearchConfig, plan
from research.synthetic import layered_training_step


def real_graph(model: str, batch: int | None, spec):
    """ResNet50 / LSTM lowered with analytic op times for ``spec`` (no kernel runs).

    Needs TensorFlow and the profile branch's ``tfswap.tf.profile.analytic``
    and ``tfswap.tf.ir.lower``; returns (graph, fetches to keep, label).
    """
    try:
        from tfswap import zoo
        from tfswap.tf import capture, ir, profile
    except ImportError as err:
        sys.exit(f"--model {model} needs TensorFlow and tfswap.tf.profile ({err}); "
                 "use --model synthetic")
    if not hasattr(profile, "analytic") or not hasattr(ir, "lower"):
        sys.exit("this tfswap has no analytic profiles yet (tfswap.tf.profile.analytic, "
                 "tfswap.tf.ir.lower); use --model synthetic")
    if model == "resnet50":
        step = zoo.resnet50(batch=batch or 64, image=224, classes=1000)
    else:
        step = zoo.lstm(batch=batch or 64, steps=64, features=512, units=1024, layers=2)
    captured = capture.capture(step.concrete_fn)
    lowered = ir.lower(captured, profile.analytic(captured, spec))
    return lowered.graph, tuple(lowered.fetches), f"{model} batch {batch or 64}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic", choices=["synthetic", "resnet50", "lstm"])
    ap.add_argument("--ops", type=int, default=10_000, help="synthetic graph size")
    ap.add_argument("--batch", type=int, default=None, help="batch of a real model")
    ap.add_argument("--spec", default="v100-16g-pcie3")
    ap.add_argument("--fraction", type=float, default=1 / 3,
                    help="budget as a fraction of the no-swap need (default 1/3)")
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the search")
    ap.add_argument("--compare", type=float, default=3.0,
                    help="minutes at which the best is compared with the final best")
    ap.add_argument("--workers", type=int, default=None, help="default: all cores")
    ap.add_argument("--population", type=int, default=SearchConfig.population_size)
    ap.add_argument("--crossovers", type=int, default=SearchConfig.crossovers_per_generation)
    ap.add_argument("--mutation", type=float, default=SearchConfig.mutation_probability)
    ap.add_argument("--temperature", type=float, default=SearchConfig.selection_temperature)
    ap.add_argument("--mode", default="joint", choices=["joint", "schedule", "allocation"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    spec = device_spec(args.spec)
    keep = ()
    if args.model == "synthetic":
        graph = layered_training_step(args.ops, seed=0)
        label = f"synthetic layered step, {len(graph.ops)} ops"
    else:
        graph, keep, label = real_graph(args.model, args.batch, spec)
        label += f", {len(graph.ops)} ops"
    cg = CompiledGraph.build(graph, keep=keep)
    need = default_allocation(cg, cg.order_of(None), 1 << 62).total_bytes
    budget = int(need * args.fraction)
    cfg = SearchConfig(population_size=args.population,
                       crossovers_per_generation=args.crossovers,
                       mutation_probability=args.mutation,
                       selection_temperature=args.temperature, mode=args.mode,
                       time_budget_s=args.minutes * 60, seed=args.seed, workers=args.workers,
                       progress=False)
    print(f"{label}; spec {spec.name}; no-swap need {need / 2**30:.2f} GiB, budget "
          f"{budget / 2**30:.2f} GiB ({args.fraction:.3g}); {cfg}")
    t0 = time.monotonic()
    res = plan(graph, budget, spec, config=cfg, keep=keep, compiled=cg)
    wall = time.monotonic() - t0
    ideal = res.best_evaluation.ideal_time_s
    print(f"heuristic (TF order, one class per size): {res.heuristic_time_s:.6f} s; "
          f"ideal (no memory limit): {ideal:.6f} s")
    print(f"{'elapsed s':>9} {'gen':>5} {'sims':>7} {'best s':>10} {'mean s':>10} "
          f"{'worst s':>10} {'best/ideal':>10}")
    marks = sorted({5, 10, 20, 30, 60, 90, 120, 180, 240, 300, 420, 600,
                    args.compare * 60, args.minutes * 60})
    shown = set()
    for h in res.history:
        due = [m for m in marks if m not in shown and h.elapsed_s >= m]
        if h is res.history[0] or due or h is res.history[-1]:
            shown.update(due)
            print(f"{h.elapsed_s:9.1f} {h.generation:5d} {h.evaluations:7d} "
                  f"{h.best_time_s:10.6f} {h.mean_time_s:10.6f} {h.worst_time_s:10.6f} "
                  f"{h.best_time_s / ideal:10.4f}")
    at = [h.best_time_s for h in res.history if h.elapsed_s <= args.compare * 60]
    early = min(at) if at else res.history[0].best_time_s
    final = res.plan.prediction.step_time_s
    print(f"best after {args.compare:g} min: {early:.6f} s; after {wall / 60:.2f} min: "
          f"{final:.6f} s; gap {(early / final - 1) * 100:.2f}% "
          f"({'within' if early <= final * 1.02 else 'NOT within'} 2%); "
          f"vs heuristic {(1 - final / res.heuristic_time_s) * 100:.1f}% faster; "
          f"{res.generations} generations, {res.evaluations} simulations, "
          f"stopped by {res.stopped_because}")


if __name__ == "__main__":
    main()
