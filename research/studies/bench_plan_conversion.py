"""Time of turning one (schedule, allocation) into a Plan, by stage.

For layered training-step graphs (default 10k, 20k and 40k ops) at a third of
the no-swap memory need, in the graph's own order with the default
allocation: the reference planner (``build_program``), the native planner +
simulator, the reference simulator (``run_program``), the conversion to
named swaps (``to_plan_swaps``), the whole ``plan_swaps``, and ``simulate``
of the finished Plan.  Best of three rounds of thread CPU time.

    python research/studies/bench_plan_conversion.py [--fraction 0.333] [--sizes 10000 20000 40000]
"""

from __future__ import annotations

import argparse
import time

import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # research/ beside tfswap/
from tfswap.core import native
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import device_spec
from tfswap.core.planner import build_program, default_allocation, plan_swaps
from tfswap.core.program import to_plan_swaps
from tfswap.core.simulator import run_program, simulate
from research.synthetic import layered_training_step


def best_seconds(fn, rounds: int = 3):
    best, out = float("inf"), None
    for _ in range(rounds):
        t0 = time.thread_time()
        out = fn()
        best = min(best, time.thread_time() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=1 / 3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 20000, 40000])
    args = ap.parse_args()
    spec = device_spec("v100-16g-pcie3")
    print(f"{'ops':>7} {'swaps':>7} {'build_program':>14} {'native':>8} {'run_program':>12} "
          f"{'to_plan_swaps':>14} {'plan_swaps':>11} {'simulate':>9}   (seconds)")
    for n in args.sizes:
        g = layered_training_step(n)
        cg = CompiledGraph.build(g)
        order = cg.order_of(None)
        budget = int(default_allocation(cg, order, 1 << 62).total_bytes * args.fraction)
        alloc = default_allocation(cg, order, budget)
        t_build, prog = best_seconds(lambda: build_program(cg, order, alloc, spec))
        t_native, _ = best_seconds(lambda: native.evaluate(cg, order, alloc, spec, detail=True))
        t_run, _ = best_seconds(lambda: run_program(cg, prog, alloc, spec))
        t_conv, _ = best_seconds(lambda: to_plan_swaps(cg, prog))
        t_plan, plan = best_seconds(lambda: plan_swaps(g, budget, spec, compiled=cg))
        t_sim, _ = best_seconds(lambda: simulate(g, plan, spec, compiled=cg))
        print(f"{n:>7} {len(plan.swaps):>7} {t_build:>14.3f} {t_native:>8.3f} {t_run:>12.3f} "
              f"{t_conv:>14.3f} {t_plan:>11.3f} {t_sim:>9.3f}")


if __name__ == "__main__":
    main()
