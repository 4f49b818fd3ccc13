"""Planning time and plan quality of named planners on Fig. 6 rows, side by side.

Times are wall-clock and this process's CPU seconds (one thread: the CPU
time is the one to compare on a shared machine).  Each row is the problem ``optimize`` would plan (``research.paper_models.lowered``:
analytic op times for the spec), planned at the budget by each planner with the
same genetic-search settings (``--generations``, one thread, seed 0), one after
the other in this process.  Prints, per row and planner, the planning time, the
plan's ideal/predicted time (1.0 = ideal) and which planner's plan won.

``tfswap`` is the default planner (what ``optimize`` runs, the Fig. 6 column:
the fastest of the search, the byte-cap planner, TF's order and recomputation
alone); ``tfswap.ga`` with a shared pool is the genetic search alone, what
``optimize`` ran by default until 2026-11-27 (the reference of issue #40's
planning-time criterion).

    python benchmarks/planning_time.py --rows resnet50:512 --generations 20
    python benchmarks/planning_time.py --rows nasnet_mobile:512 inception_v3:512 --out t.csv
"""

from __future__ import annotations

import argparse
import csv
import inspect
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ beside tfswap/
from research.paper_models import lowered  # noqa: E402
from tfswap.core import planners, search  # noqa: E402
from tfswap.core.devices import device_spec  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=["resnet50:512"],
                        help="model:batch, as research.paper_models names them")
    parser.add_argument("--planners", nargs="+", default=[search.PLANNER_NAME, "tfswap"])
    parser.add_argument("--spec", default="v100-16g-pcie3")
    parser.add_argument("--budget-gb", type=float, default=16 * 2**30 / 1e9,
                        help="the device budget in GB (default 16 GiB)")
    parser.add_argument("--generations", type=int, default=20)
    parser.add_argument("--out", help="also write the rows to this CSV")
    args = parser.parse_args(argv)

    spec = device_spec(args.spec)
    budget = int(args.budget_gb * 1e9)
    config = search.SearchConfig(max_generations=args.generations, time_budget_s=None,
                                 workers=1, seed=0, pool_layout="shared")
    rows = []
    for row in args.rows:
        name, batch = row.split(":")
        problem = lowered(name, int(batch), args.spec)
        for planner in args.planners:
            # The genetic planners take the search's settings; the others have none.
            takes = inspect.signature(planners.get(planner)).parameters
            options = {"config": config} if "config" in takes else {}
            if "allocator" in takes:   # optimize's where TensorFlow's allocator serves
                options["allocator"] = "exact"
            started, cpu = time.perf_counter(), time.process_time()
            try:
                result = planners.run(planner, problem, budget, spec, **options)
            except (planners.Infeasible, planners.UnsupportedProblem) as err:
                print(f"{row:20s} {planner:12s} does not fit: {err}")
                continue
            seconds = time.perf_counter() - started
            cpu_seconds = time.process_time() - cpu
            p = result.plan.prediction
            rows.append(dict(row=row, planner=planner, seconds=round(seconds, 1),
                             cpu_seconds=round(cpu_seconds, 1),
                             of_ideal=round(p.ideal_time_s / p.step_time_s, 3),
                             plan_from=result.plan.planner, generations=args.generations,
                             candidates="; ".join(c.describe() for c in result.candidates)))
            print(f"{row:20s} {planner:12s} {seconds:7.1f} s ({cpu_seconds:.1f} s of CPU)  "
                  f"{rows[-1]['of_ideal']:.3f} of ideal"
                  f"  (plan from {result.plan.planner})", flush=True)
            if result.candidates:
                print(f"{'':20s} {rows[-1]['candidates']}", flush=True)
    if args.out and rows:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
