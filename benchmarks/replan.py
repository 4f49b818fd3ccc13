"""Plan saved planning problems again, on a machine without their device (issue #41).

    python benchmarks/replan.py benchmarks/problems/*.json.gz
        [--planners tfswap,tfswap.ga,tfswap.bytes,tfswap.order,tfswap.recompute]
        [--generations 20] [--out replan.csv] [--scale-to-unmodified]

Each file is a row of ``benchmarks/gpu_validate.py`` (``--problems``): the step as
lowered and profiled on the device it ran on, that device's figures, the budget the
planner got, the plan that ran and what was measured
(:mod:`tfswap.core.problem_file`).  Each planner named plans it again here with
``--generations`` generations, one thread, seed 0, told what must fit as
``optimize`` was (the saved allocator); a line per planner gives its predicted step
against the profile's ideal and its predicted peak against the planner's budget,
and a line per file what ran on the device (the saved plan's prediction, the
measured step and peak, the unmodified step).  A planner that beats the saved plan
here is a change worth measuring on the device.  ``--scale-to-unmodified`` plans each
problem with its op times scaled to add up to the measured unmodified step
(:func:`scaled_to_unmodified`), the saved plan's prediction then on that profile.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import inspect
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PLANNERS = ("tfswap", "tfswap.ga", "tfswap.bytes", "tfswap.order", "tfswap.recompute")
COLUMNS = ("file", "model", "fraction", "planner", "predicted_step_s", "ideal_s", "vs_ideal",
           "predicted_peak_bytes", "planner_budget_bytes", "plan_s", "time_scale",
           "saved_predicted_step_s",
           "measured_step_s", "unmodified_step_s", "measured_peak_bytes", "error")


def options_for(name: str, saved, generations: int) -> dict:
    """The keyword arguments planner ``name`` takes: the search's settings and what
    must fit (the allocator ``optimize`` had, where the planner takes one)."""
    from tfswap.core import planners
    from tfswap.core.search_config import SearchConfig

    takes = inspect.signature(planners.get(name)).parameters
    options = {}
    if "layout" in takes and saved.plan is not None and saved.plan.allocation is not None:
        # Where TensorFlow's allocator serves the step ("exact", "guarded") optimize
        # plans in the shared layout, though a plan made to the bytes held ("exact")
        # lays out no shared arena: read from its allocation, the byte-cap planner
        # would be left out of the default's contest.
        shared = saved.allocator != "pool" or saved.plan.allocation.shared
        options["layout"] = "shared" if shared else "disjoint"
    if "config" in takes:
        options["config"] = SearchConfig(max_generations=generations, time_budget_s=None,
                                         workers=1, seed=0)
    if "allocator" in takes:
        options["allocator"] = saved.allocator
    return options


def scaled_to_unmodified(saved):
    """(``saved`` with every op's time scaled by one factor so that they add up to
    the measured unmodified step, the factor): what a trace calibrated as the step
    runs describes, for problems saved on a GPU before 730bba7, whose profiles were
    calibrated with one executor thread (1.16-1.77x the unmodified step on the H200)."""
    from tfswap.core.problem import Problem

    problem = saved.problem
    unmodified = saved.row.get("unmodified_step_s")
    total = sum(op.time_s for op in problem.graph.ops)
    if not unmodified or total <= 0:
        raise ValueError(f"{saved.row.get('model', 'this problem')}: no measured unmodified "
                         "step to scale its profile to")
    factor = unmodified / total
    graph = dataclasses.replace(problem.graph, ops=tuple(
        dataclasses.replace(op, time_s=op.time_s * factor) for op in problem.graph.ops))
    scaled = Problem.of(graph, keep=problem.keep, schedule=problem.schedule,
                        small_threshold_bytes=problem.small_threshold_bytes,
                        params_start_on_host=problem.params_start_on_host,
                        recomputable=problem.recomputable)
    return dataclasses.replace(saved, problem=scaled), factor


def rows_of(path: Path, planner_names, generations: int, scale: bool = False) -> list[dict]:
    """One row per planner for the saved problem at ``path`` (``scale``: its op times
    first scaled to the measured unmodified step, :func:`scaled_to_unmodified`)."""
    from tfswap.core import planners, problem_file, simulator
    from tfswap.core.infeasible import Infeasible, UnsupportedProblem

    saved = problem_file.read(path)
    factor = 1.0
    saved_step = saved.plan.prediction.step_time_s if saved.plan else None
    if scale:
        saved, factor = scaled_to_unmodified(saved)
        ran_plan = saved.plan
        if ran_plan is not None and saved.allocator != "pool":
            # TensorFlow's allocator served it: no pool object to wait for (the pool,
            # timed anew, may not even fit).
            ran_plan = dataclasses.replace(ran_plan, allocation=None)
        try:   # the plan that ran, on the scaled profile
            saved_step = simulator.simulate(saved.problem.graph, ran_plan, saved.spec,
                                            keep=saved.problem.keep,
                                            compiled=saved.problem.compiled).step_time_s \
                if ran_plan else None
        except simulator.PlanError:   # its pool, timed anew, no longer fits
            saved_step = None
    ran = saved.row
    common = dict(file=path.name, model=ran.get("model", ""), fraction=ran.get("fraction", ""),
                  planner_budget_bytes=saved.planner_budget_bytes, time_scale=factor,
                  saved_predicted_step_s=saved_step,
                  measured_step_s=ran.get("measured_step_s"),
                  unmodified_step_s=ran.get("unmodified_step_s"),
                  measured_peak_bytes=ran.get("measured_peak_bytes"))
    rows = []
    for name in planner_names:
        row = dict(common, planner=name)
        start = time.process_time()
        try:
            plan = planners.run(name, saved.problem, saved.planner_budget_bytes, saved.spec,
                                **options_for(name, saved, generations)).plan
        except UnsupportedProblem as err:   # e.g. parameters in host memory, for tfswap.bytes
            row["error"] = f"cannot plan this step: {err}"[:300]
        except Infeasible as err:
            row["error"] = f"does not fit: {err}"[:300]
        else:
            p = plan.prediction
            row.update(predicted_step_s=p.step_time_s, ideal_s=p.ideal_time_s,
                       vs_ideal=p.step_time_s / p.ideal_time_s if p.ideal_time_s else None,
                       predicted_peak_bytes=p.peak_bytes)
        row["plan_s"] = time.process_time() - start
        rows.append(row)
    return rows


def _ms(seconds) -> str:
    return f"{seconds * 1e3:.3g} ms" if isinstance(seconds, (int, float)) else "-"


def describe(rows: list[dict]) -> str:
    first = rows[0]
    scaled = f", op times x{first['time_scale']:.3f}" if first["time_scale"] != 1.0 else ""
    lines = [f"{first['file']}: {first['model']} at {first['fraction']}, planner budget "
             f"{first['planner_budget_bytes']} B{scaled}; ran: predicted "
             f"{_ms(first['saved_predicted_step_s'])}, measured {_ms(first['measured_step_s'])}"
             f" (unmodified {_ms(first['unmodified_step_s'])}), peak "
             f"{first['measured_peak_bytes'] if first['measured_peak_bytes'] is not None else '-'} B"]
    for row in rows:
        if row.get("error"):
            lines.append(f"  {row['planner']:<18} {row['error']}")
        else:
            lines.append(f"  {row['planner']:<18} {_ms(row['predicted_step_s']):>10}  "
                         f"{row['vs_ideal'] or 0:.3f}x ideal  peak {row['predicted_peak_bytes']} B  "
                         f"({row['plan_s']:.1f} s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="saved problems (.json.gz)")
    parser.add_argument("--planners", default=",".join(PLANNERS),
                        help="comma-separated registered planners")
    parser.add_argument("--generations", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--scale-to-unmodified", action="store_true",
                        help="first scale each problem's op times to its measured unmodified "
                             "step (GPU problems saved before 730bba7)")
    args = parser.parse_args(argv)
    from tfswap.core import planners

    names = [n for n in args.planners.split(",") if n]
    if not names:
        parser.error("--planners names no planner")
    unknown = [n for n in names if n not in planners.PLANNERS]
    if unknown:
        parser.error(f"unknown planner(s) {unknown}; registered: {sorted(planners.PLANNERS)}")
    if args.generations < 1:
        parser.error("--generations must be >= 1")
    from tfswap.core.problem_file import ProblemFileError

    rows = []
    for path in args.files:
        try:
            got = rows_of(path, names, args.generations, args.scale_to_unmodified)
        except (OSError, ProblemFileError, ValueError) as err:
            print(f"replan.py: {err}", file=sys.stderr)
            return 2
        print(describe(got), flush=True)
        rows += got
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
