"""Evaluations per second of the planner + simulator (the GA's inner loop).

For layered training-step graphs of 1k, 10k and 50k ops, at 60% of the
no-swap memory need, it times the native evaluation (plan two passes +
simulate) on one thread and, for 1k ops, the reference Python.  Timings are
the best of several rounds of thread CPU time, so other processes on the
machine disturb them less.

    python -m benchmarks.bench_simulator [--fraction 0.6] [--sizes 1000 10000 50000]
"""

from __future__ import annotations

import argparse
import time

import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ beside tfswap/
from tfswap.core import native
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import device_spec
from tfswap.core.planner import build_program, default_allocation
from tfswap.core.program import buffer_classes
from tfswap.core.simulator import run_program
from research.synthetic import layered_training_step


def best_seconds(fn, rounds: int = 5, calls: int = 10) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - t0) / calls)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.6,
                    help="budget as a fraction of the no-swap need (default 0.6)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    ap.add_argument("--spec", default="v100-16g-pcie3")
    args = ap.parse_args()
    spec = device_spec(args.spec)
    print(f"{'ops':>7} {'buffers':>8} {'swaps':>6} {'passes':>6} {'step/ideal':>10} "
          f"{'ms/eval':>8} {'eval/s':>8}  (native, budget {args.fraction:.0%} of no-swap)")
    for n in args.sizes:
        g = layered_training_step(n, seed=0)
        cg = CompiledGraph.build(g)
        order = cg.order_of(None)
        full = default_allocation(cg, order, 1 << 62)
        alloc = default_allocation(cg, order, int(full.total_bytes * args.fraction))
        bc = buffer_classes(cg, alloc)
        ev = native.evaluate(cg, order, alloc, spec, buf_class=bc)
        s = best_seconds(lambda: native.evaluate(cg, order, alloc, spec, buf_class=bc),
                         calls=max(2, 20000 // n))
        print(f"{n:>7} {cg.n_buffers:>8} {ev.n_swap_outs + ev.n_swap_ins:>6} {ev.passes:>6} "
              f"{ev.step_time_s / ev.ideal_time_s:>10.2f} {s * 1e3:>8.2f} {1 / s:>8.0f}")
        if n <= 1000:
            ref = best_seconds(lambda: run_program(
                cg, build_program(cg, order, alloc, spec), alloc, spec), rounds=2, calls=1)
            print(f"{'':>7} reference Python: {ref * 1e3:.0f} ms/eval ({ref / s:.0f}x slower)")


if __name__ == "__main__":
    main()
