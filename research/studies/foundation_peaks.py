"""Measured device peak and step time of the built-in steps, unmodified vs the
peak-crossing heuristic plan, on the emulated device.

    .venv/bin/python research/studies/foundation_peaks.py [--swaps 3] [--runs 5]
"""

import argparse

import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # research/ beside tfswap/
from tfswap.tf import emulate

emulate.setup()

from tfswap import zoo  # noqa: E402
from tfswap.tf import capture, measure, rewrite  # noqa: E402
from research import quickplan  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--swaps", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print("| model | unmodified peak (B) | with swaps (B) | freed (B) | predicted (B) "
          "| step unmodified (ms) | step with swaps (ms) |")
    print("|---|---|---|---|---|---|---|")
    for name, build in (("cnn b32", lambda: zoo.cnn(batch=32, blocks=10)),
                        ("cnn b64", lambda: zoo.cnn(batch=64, blocks=10)),
                        ("transformer b8", lambda: zoo.transformer(batch=8))):
        step = build()
        captured = capture.capture(step.concrete_fn)
        quick = quickplan.heuristic_plan(captured, step.batch, swaps=args.swaps)
        rw = rewrite.rewrite(captured, quick.plan, emulate.DEVICE, emulate.HOST)
        after = measure.measure(captured, rw.graph_def, step.batch, runs=args.runs)
        before = quick.baseline
        print(f"| {name} | {before.peak_bytes} | {after.peak_bytes} | "
              f"{before.peak_bytes - after.peak_bytes} | {quick.predicted_freed_bytes} | "
              f"{before.step_time_s * 1e3:.1f} | {after.step_time_s * 1e3:.1f} |")


if __name__ == "__main__":
    main()
