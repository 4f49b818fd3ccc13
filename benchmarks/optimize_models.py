"""tfswap.optimize on ResNet-50, a BERT-style encoder and a 4-layer unrolled LSTM.

    .venv/bin/python benchmarks/optimize_models.py [--fractions 0.5,0.3] [--generations 30]
        [--variables device|host]

``--variables host`` creates each model and its optimizer under
``tf.device(host)`` (parameters and Adam state in host memory, fetched by the
plan); the budget is still the fraction of the peak of the step with its
variables on the device.

On the emulated device (CPU:0 plays the device, CPU:1 the host), for each model
and each budget (a fraction of the unmodified step's measured device peak):
plan with the genetic search, run the rewritten step, and print the measured
peak against the budget; after 3 training steps, how far losses and weights
are from (a) the captured graph run unmodified by the same runtime (the rewrite
adds swaps and control edges only, so this should be 0) and (b) the user's
function, next to that function's own sensitivity (its result on inputs
perturbed by 1e-7 relative: ResNet-50's gradients move by ~2% under that, so
no float32 rewrite can match it closer); and the simulated step time of the GA's plan
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
import numpy as np  # noqa: E402

from tfswap.tf import capture, measure, runtime  # noqa: E402
from tests.tf.equality import run_steps, worst_relative_difference  # noqa: E402

# Sizes that run in seconds per step on a 2-core CPU, with activations making
# most of the peak when the variables are on the device.
MODELS = {
    "resnet50": lambda **k: zoo.resnet50(batch=32, image=128, **k),
    "bert": lambda **k: zoo.bert(batch=16, seq=128, dim=128, layers=2, **k),
    "lstm4": lambda **k: zoo.lstm(batch=16, steps=24, features=32, units=64, layers=4, **k),
}
_SMALLEST = re.compile(r"smallest budget that can work is about (\d+) bytes")


def optimize_at(step, budget: int, generations: int):
    """(optimized function, budget used, why it differs from the one asked for).

    Variables stay where the model was built (``parameters="device"``): the
    comparisons run the captured graph on the same variables.
    """
    try:
        return tfswap.optimize(step.concrete_fn, budget, generations=generations, seed=0,
                               workers=1, inputs=step.batch, parameters="device"), budget, ""
    except BudgetError as err:
        found = _SMALLEST.search(str(err))
        if found is None:
            raise
        smallest = int(found.group(1))
        why = f"below the minimum working set; smallest feasible {smallest} B"
        return tfswap.optimize(step.concrete_fn, smallest, generations=generations, seed=0,
                               workers=1, inputs=step.batch, parameters="device"), smallest, why


def distance(reference, candidate, variables, batch) -> float:
    """Worst of the losses' and the variables' relative differences after 3 steps."""
    initial = [v.numpy() for v in variables]
    ref_losses, ref_vars = run_steps(reference, variables, initial, batch)
    losses, got_vars = run_steps(candidate, variables, initial, batch)
    for v, x in zip(variables, initial):
        v.assign(x)
    worst, _ = worst_relative_difference(ref_vars, got_vars, variables)
    return max([worst] + [abs(a - b) / max(1.0, abs(a)) for a, b in zip(ref_losses, losses)])


def sensitivity(step, variables) -> float:
    """How far the user's own function moves when its float inputs move by 1e-7."""
    rng = np.random.default_rng(1)
    nudged = tuple((x * (1 + 1e-7 * rng.standard_normal(x.shape))).astype(x.dtype)
                   if np.issubdtype(x.dtype, np.floating) else x for x in step.batch)
    if all(a is b for a, b in zip(nudged, step.batch)):
        return 0.0   # integer inputs only (token ids): nothing to nudge
    return distance(lambda *a: step.concrete_fn(*step.batch),
                    lambda *a: step.concrete_fn(*nudged), variables, step.batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fractions", default="0.5,0.3")
    parser.add_argument("--generations", type=int, default=30)
    parser.add_argument("--variables", choices=("device", "host"), default="device",
                        help="where the models' variables live (default: the device)")
    args = parser.parse_args()
    print("| model | budget asked | budget used | unmodified peak (B) | rewritten peak (B) "
          "| swaps | diff vs captured graph | diff vs user fn / its sensitivity "
          "| GA sim (ms) | heuristic sim (ms) | plan+verify (s) | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        step = MODELS[name]()
        captured = capture.capture(step.concrete_fn)
        base = measure.measure(captured, captured.graph_def, step.batch, inter_op_threads=1)
        if args.variables == "host":
            step = MODELS[name](variables_on=emulate.HOST)
            captured = capture.capture(step.concrete_fn)
        unmodified = runtime.bind(captured, captured.graph_def)
        noise = sensitivity(step, captured.variables)
        for fraction in (float(f) for f in args.fractions.split(",")):
            asked = int(fraction * base.peak_bytes)
            t0 = time.perf_counter()
            try:
                fast, used, why = optimize_at(step, asked, args.generations)
            except (BudgetError, RuntimeError) as err:
                print(f"| {name} | {fraction:.0%} ({asked}) | - | {base.peak_bytes} | - | - | - "
                      f"| - | - | - | - | {err} |", flush=True)
                continue
            seconds = time.perf_counter() - t0
            after = measure.measure(fast.captured, fast.graph_def, step.batch)
            variables = fast.captured.variables
            exact = distance(unmodified, fast, variables, step.batch)
            user = distance(step.concrete_fn, fast, variables, step.batch)
            s = fast.search
            ga = fast.plan.prediction.step_time_s
            heur = s.heuristic_time_s if s is not None else ga
            over = "" if after.peak_bytes <= used else " OVER"
            print(f"| {name}{' (host)' if args.variables == 'host' else ''} "
                  f"| {fraction:.0%} ({asked}) | {used} | {base.peak_bytes} "
                  f"| {after.peak_bytes}{over} | {len(fast.plan.swaps)} | {exact:.1e} "
                  f"| {user:.1e} / {noise:.1e} | {ga * 1e3:.2f} | {heur * 1e3:.2f} "
                  f"| {seconds:.1f} | {why} |", flush=True)


if __name__ == "__main__":
    main()
