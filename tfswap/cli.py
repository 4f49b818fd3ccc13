"""Command line: ``tfswap demo`` and ``tfswap bench`` (or ``python -m tfswap.cli ...``).

``tfswap bench`` runs SwapAdvisor's Fig. 6 comparison (:mod:`tfswap.paper_bench`):
every baseline policy and tfswap's search on the paper's models, simulated
on an analytic device profile; it writes a CSV, a Markdown table and a chart.

The demo trains a built-in Keras CNN for three steps on the emulated device
(CPU:0 plays the accelerator, CPU:1 the host), once unmodified and once with
a swap plan, checks that both give the same losses and weights, and prints
the device memory each one needed.
"""

from __future__ import annotations

import argparse
import sys


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.2f} MiB"


def demo(batch: int, swaps: int) -> int:
    import numpy as np

    from tfswap.tf import emulate

    emulate.setup()
    from tfswap import zoo
    from tfswap.tf import capture, measure, quickplan, rewrite, runtime

    step = zoo.cnn(batch=batch)
    captured = capture.capture(step.concrete_fn)
    print(f"model: Keras CNN (10x Conv/BN/ReLU, Dense), Adam, batch {batch}, "
          f"{len(captured.graph_def.node)} graph nodes")
    quick = quickplan.heuristic_plan(captured, step.batch, swaps=swaps)
    rewritten = rewrite.rewrite(captured, quick.plan, emulate.DEVICE, emulate.HOST)
    print(f"plan: {len(quick.plan.swaps)} swaps ({quick.plan.planner}), "
          f"predicted to free {_mib(quick.predicted_freed_bytes)} at the peak")
    for s in quick.plan.swaps:
        print(f"  {s.tensor:60s} {_mib(s.bytes):>10s}  out after {s.out_after}, in after {s.in_after}")

    fn = runtime.bind(captured, rewritten.graph_def)
    reference = step.concrete_fn  # the user's own function, run by TensorFlow as usual
    variables = captured.variables
    initial = [v.numpy() for v in variables]
    results = []
    for f in (reference, fn):
        for v, x in zip(variables, initial):
            v.assign(x)
        losses = [float(f(*step.batch)["loss"]) for _ in range(3)]
        results.append((losses, [v.numpy() for v in variables]))
    same = results[0][0] == results[1][0] and all(
        np.array_equal(a, b) for a, b in zip(results[0][1], results[1][1]))
    print(f"3 training steps: losses {results[1][0]} -- "
          f"{'bit-identical to' if same else 'DIFFERENT from'} the unmodified tf.function")

    after = measure.measure(captured, rewritten.graph_def, step.batch)
    before = quick.baseline
    saved = before.peak_bytes - after.peak_bytes
    print(f"device peak (measured on emulated device): unmodified {_mib(before.peak_bytes)}, "
          f"with swaps {_mib(after.peak_bytes)}, saved {_mib(saved)} "
          f"({100 * saved / before.peak_bytes:.1f}%)")
    print(f"step time: unmodified {before.step_time_s * 1e3:.1f} ms, "
          f"with swaps {after.step_time_s * 1e3:.1f} ms (CPU emulation; not a GPU figure)")
    return 0 if same and saved > 0 else 1


def _add_bench(sub) -> None:
    from tfswap.paper_models import PAPER_BATCHES

    b = sub.add_parser("bench", help="compare tfswap with the baseline policies on the "
                                     "paper's models (simulated, analytic device profile)")
    b.add_argument("--models", nargs="+", default=list(PAPER_BATCHES), choices=list(PAPER_BATCHES))
    b.add_argument("--spec", default="v100-16g-pcie3", help="device preset (default V100 16 GB)")
    b.add_argument("--generations", type=int, default=100, help="GA generations per row")
    b.add_argument("--out", default="tfswap-bench", help="folder for fig6.csv/.md/.png")


def bench(args) -> int:
    from tfswap import paper_bench

    if args.generations < 0:
        raise SystemExit("--generations must be >= 0")
    paper_bench.fig6(args.models, spec=args.spec, generations=args.generations,
                     out_dir=args.out, progress=lambda line: print(line, flush=True))
    print(f"written: {args.out}/fig6.csv, fig6.md, fig6.png")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="tfswap",
        description="Plan tensor swapping for TensorFlow steps that need more memory "
                    "than the accelerator has.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="swap a built-in Keras CNN on the emulated device and "
                                    "print the memory saved")
    d.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    d.add_argument("--swaps", type=int, default=3, help="tensors to swap (default 3)")
    _add_bench(sub)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench(args)
    if args.command == "demo":
        if args.batch < 1 or args.swaps < 1:
            parser.error("--batch and --swaps must be >= 1")
        return demo(args.batch, args.swaps)
    return 2


if __name__ == "__main__":
    sys.exit(main())
