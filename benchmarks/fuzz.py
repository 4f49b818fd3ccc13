"""Fuzz tfswap.optimize on random TensorFlow steps (issue #9 part 3).

    PYTHONPATH=. .venv/bin/python benchmarks/fuzz.py --graphs 500 --seed 0

Graph k is ``research.fuzz.random_step(seed + k)``; each is optimised at a
random budget between the smallest feasible one (named by a BudgetError) and
its measured unmodified peak, then must measure at most the budget and train
bit for bit like the step without swaps (:func:`research.fuzz.check`).
Prints one line per graph that did not pass, then a summary: graphs tried,
passed, skipped (already fitting / infeasible, with reasons), refused, and
failures with the seed to reproduce (``--graphs 1 --seed S``; with
``--profiles DIR`` each seed's traced profile, unmodified peak and device
figures are kept there and read again, so a rerun of a seed draws the same
budget and makes the same plans).  Exit status 1 if any graph failed.  Runs on
the emulated device.
"""

import argparse
import collections
import statistics
import sys
import time
import warnings

from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ beside tfswap/
from tfswap.tf import emulate

emulate.setup()

from research import fuzz  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", type=int, default=50, help="how many random graphs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first graph")
    parser.add_argument("--max-ops", type=int, default=12, help="drawn ops per graph, at most")
    parser.add_argument("--generations", type=int, default=2, help="GA generations per plan")
    parser.add_argument("--verbose", action="store_true", help="a line for every graph")
    parser.add_argument("--planner", default="tfswap",
                        help="optimize's planner: tfswap (the default, the fastest of them "
                             "all) or a registered one for an ablation, e.g. tfswap.ga (the "
                             "genetic search alone)")
    parser.add_argument("--profiles", type=Path, default=None,
                        help="a directory keeping each seed's profile, unmodified peak and "
                             "device figures, read again by later runs: the same plans "
                             "for a seed")
    parser.add_argument("--verify-rounds", type=int, default=3,
                        help="optimize's verify_rounds (0: the plan as the model predicts it)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    counts = collections.Counter()
    reasons = collections.Counter()
    failures, outcomes = [], []
    started = time.perf_counter()
    for seed in range(args.seed, args.seed + args.graphs):
        outcome = fuzz.check(seed, max_ops=args.max_ops, generations=args.generations,
                             planner=args.planner, verify_rounds=args.verify_rounds,
                             profiles=args.profiles)
        counts[outcome.status] += 1
        outcomes.append(outcome)
        if outcome.status in ("fits", "infeasible"):
            reasons[(outcome.status, outcome.detail.split(" B")[0].rstrip("0123456789 "))] += 1
        if outcome.status == "failed":
            failures.append(outcome)
        if args.verbose or outcome.status in ("failed", "refused", "order-sensitive"):
            print(f"seed {seed}: {outcome.status}: {outcome.detail}", flush=True)
    elapsed = time.perf_counter() - started
    print(f"\n{args.graphs} graphs (seeds {args.seed}..{args.seed + args.graphs - 1}, "
          f"max_ops {args.max_ops}, generations {args.generations}, planner "
          f"{args.planner}, verify_rounds {args.verify_rounds}) in {elapsed:.0f} s")
    for status in fuzz.STATUSES:
        print(f"  {status:15s} {counts[status]}")
    for (status, reason), n in sorted(reasons.items()):
        print(f"    {status}: {n} x {reason}")
    # The memory model against the measured peak, over the plans that swapped.
    ratios = sorted(o.predicted_peak_bytes / o.measured_peak_bytes for o in outcomes
                    if o.swaps and o.predicted_peak_bytes and o.measured_peak_bytes)
    if ratios:
        print(f"  predicted / measured peak over {len(ratios)} plans: median "
              f"{statistics.median(ratios):.3f}, min {ratios[0]:.3f}, max {ratios[-1]:.3f}")
    if failures:
        print("failures (reproduce with --graphs 1 --seed S"
              + (f" --profiles {args.profiles}):" if args.profiles else "; --profiles DIR "
                 "keeps what makes a seed's plans repeat):"))
        for outcome in failures:
            print(f"  seed {outcome.seed}: {outcome.detail.splitlines()[-1][:300]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
