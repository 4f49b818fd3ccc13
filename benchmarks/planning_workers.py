"""How long planning the demo's CNN takes with 1 and 2 evaluation threads (issue #22).

The step is the one ``tfswap demo`` plans (``zoo.cnn(batch=32)``, 60% of its
measured peak, 20 generations per pool size, seed 0).  Each repeat times the
whole ``tfswap.optimize`` call (profile, search, rewrite, verification) and,
separately, the search alone (``pipeline.plan`` on one prepared step), with
``workers=1`` and ``workers=2`` alternating, each first in every other repeat,
so that the machine's load and the order fall on both alike.  The search alone plans one prepared step, so its plan must be
the same whatever the worker count (the search is seeded and evaluation is
pure): the script checks it.  (Each ``optimize`` call profiles the step
again, and TF's executed order varies between sessions, so whole calls need
not give one plan; the script checks each measured within the budget.)

Example::

    python benchmarks/planning_workers.py --repeats 5
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfswap.tf import emulate  # noqa: E402

emulate.setup()

import tfswap  # noqa: E402
from tfswap import pipeline, zoo  # noqa: E402
from tfswap import options as options_mod
from tfswap.tf import capture, measure  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--generations", type=int, default=20)
    ap.add_argument("--fraction", type=float, default=0.6)
    args = ap.parse_args(argv)

    step = zoo.cnn(batch=32)
    captured = capture.capture(step.concrete_fn)
    peak = measure.measure(captured, captured.graph_def, step.batch, inter_op_threads=1).peak_bytes
    budget = int(args.fraction * peak)
    options = dict(generations=args.generations, seed=0, inputs=step.batch)
    prepared = pipeline.prepare(step.concrete_fn, options_mod.Options.of(budget, **options))
    attempt = pipeline.first_attempt(prepared)

    whole = {1: [], 2: []}
    search = {1: [], 2: []}
    plans = {1: set(), 2: set()}
    for repeat in range(args.repeats):
        # ABBA: each worker count goes first as often, so that what the first call of
        # a pair pays (or leaves behind: caches, garbage) falls on both alike.
        for workers in ((1, 2) if repeat % 2 == 0 else (2, 1)):
            t0 = time.perf_counter()
            fast = tfswap.optimize(step.concrete_fn, budget, workers=workers, **options)
            whole[workers].append(time.perf_counter() - t0)
            assert fast.measured_peak_bytes <= budget, fast.report()
            p = dataclasses.replace(prepared, options=options_mod.Options.of(
                budget, workers=workers, **options))
            t0 = time.perf_counter()
            plans[workers].add(pipeline.plan(p, attempt).plan.id)
            search[workers].append(time.perf_counter() - t0)

    print(f"demo CNN b32, budget {budget} B ({args.fraction:.0%} of {peak} B), "
          f"{args.generations} generations per pool size, {args.repeats} repeats, ABBA order")
    print("| workers | optimize median s (min-max) | search alone median s (min-max) |")
    print("|---|---|---|")
    for w in (1, 2):
        print(f"| {w} | {statistics.median(whole[w]):.2f} ({min(whole[w]):.2f}-"
              f"{max(whole[w]):.2f}) | {statistics.median(search[w]):.2f} "
              f"({min(search[w]):.2f}-{max(search[w]):.2f}) |")
    same = plans[1] == plans[2] and len(plans[1]) == 1
    print(f"search alone, same plan with 1 and 2 workers: {same} "
          f"({sorted(plans[1] | plans[2])})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
