"""tfswap.optimize on ResNet-50, a BERT-style encoder and a 4-layer unrolled LSTM.

    .venv/bin/python benchmarks/optimize_models.py [--fractions 0.5,0.3] [--generations 30]

On the emulated device (CPU:0 plays the device, CPU:1 the host), for each model
and each budget (a fraction of the unmodified step's measured device peak):
plan with the genetic search, run the rewritten step, and print the measured
peak against the budget, whether 3 training steps give the same losses and
weights as the user's function, and the simulated step time of the GA's plan
against the best single heuristic plan (the planner on TF's default order with
one size class per distinct size).  Where a budget is below the step's minimum
working set, the smallest budget tfswap reports feasible is used instead and
printed next to the reason.
"""

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfswap.tf import emulate  # noqa: E402

emulate.setup()

import tfswap  # noqa: E402
from tfswap import zoo  # noqa: E402
from tfswap.core.budget import BudgetError  # noqa: E402
from tfswap.tf import capture, measure  # noqa: E402
from tests.tf.equality import RTOL, run_steps, worst_relative_difference  # noqa: E402

# Sizes that run in seconds per step on a 2-core CPU.
MODELS = {
    "resnet50": lambda: zoo.resnet50(batch=8, image=64),
    "bert": lambda: zoo.bert(batch=4, seq=64, dim=128, layers=2),
    "lstm4": lambda: zoo.lstm(batch=16, steps=24, features=32, units=64, layers=4),
}
_SMALLEST = re.compile(r"smallest budget that can work is about (\d+) bytes")


def optimize_at(step, budget: int, generations: int):
    """(optimized function, budget used, why it differs from the one asked for)."""
    try:
        return tfswap.optimize(step.concrete_fn, budget, generations=generations, seed=0,
                               workers=1, inputs=step.batch), budget, ""
    except BudgetError as err:
        found = _SMALLEST.search(str(err))
        if found is None:
            raise
        smallest = int(found.group(1))
        why = f"below the minimum working set; smallest feasible {smallest} B"
        return tfswap.optimize(step.concrete_fn, smallest, generations=generations, seed=0,
                               workers=1, inputs=step.batch), smallest, why


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fractions", default="0.5,0.3")
    parser.add_argument("--generations", type=int, default=30)
    args = parser.parse_args()
    print("| model | budget asked | budget used | unmodified peak (B) | rewritten peak (B) "
          "| swaps | same training (worst rel. diff) | GA sim (ms) | heuristic sim (ms) "
          "| plan+verify (s) | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        step = MODELS[name]()
        captured = capture.capture(step.concrete_fn)
        base = measure.measure(captured, captured.graph_def, step.batch, inter_op_threads=1)
        for fraction in (float(f) for f in args.fractions.split(",")):
            asked = int(fraction * base.peak_bytes)
            t0 = time.perf_counter()
            fast, used, why = optimize_at(step, asked, args.generations)
            seconds = time.perf_counter() - t0
            after = measure.measure(fast.captured, fast.graph_def, step.batch)
            variables = fast.captured.variables
            initial = [v.numpy() for v in variables]
            ref_losses, ref_vars = run_steps(step.concrete_fn, variables, initial, step.batch)
            losses, got_vars = run_steps(fast, variables, initial, step.batch)
            for v, x in zip(variables, initial):
                v.assign(x)
            worst, _ = worst_relative_difference(ref_vars, got_vars, variables)
            same = worst <= RTOL and all(abs(a - b) <= RTOL * max(1.0, abs(a))
                                         for a, b in zip(ref_losses, losses))
            s = fast.search
            ga = fast.plan.prediction.step_time_s
            heur = s.heuristic_time_s if s is not None else ga
            ok = after.peak_bytes <= used
            print(f"| {name} | {fraction:.0%} ({asked}) | {used} | {base.peak_bytes} "
                  f"| {after.peak_bytes}{'' if ok else ' OVER'} | {len(fast.plan.swaps)} "
                  f"| {'yes' if same else 'NO'} ({worst:.1e}) | {ga * 1e3:.2f} "
                  f"| {heur * 1e3:.2f} | {seconds:.1f} | {why} |", flush=True)


if __name__ == "__main__":
    main()
