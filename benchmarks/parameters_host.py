"""Issue #20 on the emulated device: steps whose parameters do not fit the budget.

    .venv/bin/python benchmarks/parameters_host.py [--models bert,resnet50,mlp]
        [--fraction 0.25] [--generations 5] [--out benchmarks/out/parameters_host.csv]

For each model, built twice from one seed: the first trains 3 steps with its
own (unmodified) function, its variables on the device; the second is
planned by ``tfswap.optimize`` with nothing but the budget (``parameters``
left at "auto"): ``--fraction`` of the first's measured device peak, or for
the MLP half of its parameters plus Adam state.  Printed per model: how many
variable bytes moved to host memory, the measured peak against the budget,
the plan's prediction, what a step moves, whether 3 steps give the same
losses, ``model.get_weights()`` and optimizer state bit for bit, and the
planning seconds.
"""

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfswap.tf import emulate  # noqa: E402

emulate.setup()

import numpy as np  # noqa: E402

import tfswap  # noqa: E402
from tfswap import zoo  # noqa: E402
from tfswap.tf import capture, measure  # noqa: E402

MODELS = {"bert": zoo.bert, "resnet50": zoo.resnet50, "mlp": zoo.mlp}
COLUMNS = ("model", "budget_bytes", "device_homed_peak_bytes", "parameter_and_state_bytes",
           "moved_bytes", "measured_peak_bytes", "predicted_peak_bytes", "predicted_step_s",
           "ideal_step_s", "fetched_bytes", "written_back_bytes", "identical", "plan_s")


def nbytes(variable) -> int:
    return int(np.prod(variable.shape)) * variable.value.dtype.size


def state(step) -> list:
    return [v.numpy() for v in list(step.model.weights) + list(step.optimizer.variables)]


def run(name: str, fraction: float, generations: int) -> dict:
    reference, step = MODELS[name](), MODELS[name]()
    captured = capture.capture(reference.concrete_fn)
    peak = measure.measure(captured, captured.graph_def, reference.batch,
                           inter_op_threads=1).peak_bytes
    parameters = sum(nbytes(v) for v in step.model.trainable_variables)
    budget = 3 * parameters // 2 if name == "mlp" else int(fraction * peak)
    start = time.perf_counter()
    fast = tfswap.optimize(step.concrete_fn, budget, generations=generations, seed=0,
                           workers=1, inputs=step.batch)
    plan_s = time.perf_counter() - start
    same = [float(fast(*step.batch)["loss"]) for _ in range(3)] == \
        [float(reference.concrete_fn(*reference.batch)["loss"]) for _ in range(3)]
    same = same and all(np.array_equal(a, b) for a, b in zip(state(reference), state(step)))
    prediction = fast.plan.prediction
    return dict(
        model=name, budget_bytes=budget, device_homed_peak_bytes=peak,
        parameter_and_state_bytes=sum(nbytes(v) for v in list(step.model.weights)
                                      + list(step.optimizer.variables)),
        moved_bytes=fast.relocation.nbytes if fast.relocation else 0,
        measured_peak_bytes=fast.measured_peak_bytes, predicted_peak_bytes=prediction.peak_bytes,
        predicted_step_s=prediction.step_time_s, ideal_step_s=prediction.ideal_time_s,
        fetched_bytes=sum(s.bytes for s in fast.plan.swaps if s.kind == "prefetch"),
        written_back_bytes=sum(fast.lowered.writebacks.values()), identical=same,
        plan_s=round(plan_s, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,resnet50,mlp")
    parser.add_argument("--fraction", type=float, default=0.25)
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/parameters_host.csv"))
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        rows.append(run(name, args.fraction, args.generations))
        print(rows[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
