"""Where tfswap's Fig. 6 rows lose to the Capuchin-style baseline, and why.

For each model and batch (analytic ``v100-16g-pcie3`` profile, 16 GiB budget,
TF's order, all simulated) it prints, as throughput relative to ideal:

* ``capuchin`` and ``capuchin, no recompute``: is recomputation its edge?
* the live bytes of the Capuchin-style plan and the shared arena tfswap's
  allocator would need to run it (``tfswap.core.layout.shared_layout``);
* the byte-cap planner (``tfswap.core.byte_planner``) judged like the
  baselines (live bytes fit) and held to the shared arena (what tfswap runs);
* for the byte planner's plan at ``--cap`` of the budget: its live bytes and
  the smallest arena any of several object orders packs it into;
* a bound no swapping plan in TF's order beats (``--bound``): at the end of
  the forward pass the live bytes beyond the budget must be off the device,
  so the forward takes at least their copy-out time (less what parameters,
  dropped for free, cover) and the rest at least their copy-in time (the
  same at every position; the worst one is the bound).

Command (RESULTS.md, "Why tfswap loses rows"):

    PYTHONPATH=. .venv/bin/python research/studies/arena_gap.py resnet50:512 inception_v3:512 \\
        nasnet_mobile:512
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from research import paper_models
from tfswap.core.infeasible import Infeasible
from tfswap.core import baselines, byte_planner, layout, simulator
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import device_spec
from tfswap.core.plan import OBJECT_ALIGNMENT

ORDERS = ("size", "size x busy time", "first busy", "busy time")


def best_packing(result, pool) -> int:
    """The smallest arena among object orders (first fit, as layout.shared_layout)."""
    busy = layout.object_busy(result)
    keys = sorted(busy)
    starts = np.unique(np.array([s for iv in busy.values() for s, _ in iv], np.int64))
    rows = np.zeros((len(keys), len(starts)), dtype=bool)
    for i, key in enumerate(keys):
        for s, e in busy[key]:
            rows[i, np.searchsorted(starts, s):np.searchsorted(starts, e)] = True
    size = np.array([-(-pool.class_bytes[c] // OBJECT_ALIGNMENT) * OBJECT_ALIGNMENT
                     for c, _ in keys], np.int64)
    packed = np.packbits(rows, axis=1)
    clash = np.array([np.any(packed & packed[i], axis=1) for i in range(len(keys))])
    span = rows.sum(axis=1)
    first = rows.argmax(axis=1)
    n = range(len(keys))
    orders = {"size": sorted(n, key=lambda i: (-size[i], i)),
              "size x busy time": sorted(n, key=lambda i: (-size[i] * span[i], i)),
              "first busy": sorted(n, key=lambda i: (first[i], -size[i])),
              "busy time": sorted(n, key=lambda i: (-span[i], -size[i]))}
    best = None
    for name in ORDERS:
        lo = np.zeros(len(keys), np.int64)
        hi = np.zeros(len(keys), np.int64)
        placed = np.zeros(len(keys), bool)
        for r in orders[name]:
            off = 0
            for a, b in sorted(zip(lo[placed & clash[r]].tolist(), hi[placed & clash[r]].tolist())):
                if off + size[r] <= a:
                    break
                off = max(off, b)
            lo[r], hi[r], placed[r] = off, off + size[r], True
        best = int(hi.max()) if best is None else min(best, int(hi.max()))
    return best


def link_bound(cg, order, spec, budget: int) -> float:
    """Throughput relative to ideal that no plan in ``order`` exceeds (module doc).

    At every position ``k`` the bytes live there without swapping, less the
    budget, must be off the device: each was produced before ``k`` and is read
    after it, so the ops before ``k`` take at least their copy-out time (less
    the parameters, which may be dropped for free) and the ops after ``k`` at
    least their copy-in time.  The bound is the worst position's.
    """
    n = len(order)
    times = cg.op_time[order]
    first, last = cg.buffer_intervals(order)
    delta = np.zeros(n + 1, np.int64)
    np.add.at(delta, first[last >= first], cg.buf_bytes[last >= first])
    np.add.at(delta, last[last >= first], -cg.buf_bytes[last >= first])
    live = np.cumsum(delta)[:n] + cg.small_pool_peak(order)   # live across k -> k + 1
    excess = np.maximum(0, live - budget).astype(np.float64)
    params = float(cg.buf_bytes[cg.buf_persistent.astype(bool)].sum())
    before = np.cumsum(times)
    after = before[-1] - before
    step = np.maximum(before, np.maximum(0.0, excess - params) / spec.d2h_bytes_per_s) + \
        np.maximum(after, excess / spec.h2d_bytes_per_s)
    return float(before[-1] / step.max())


def row(model: str, batch: int, spec_name: str, cap: float, cache: str) -> str:
    spec = device_spec(spec_name)
    budget = spec.memory_bytes
    problem = paper_models.lowered(model, batch, spec_name, cache)
    graph, keep, cg = problem.graph, problem.keep, problem.compiled
    ideal = baselines.ideal(graph, budget, spec, keep=keep, compiled=cg).prediction.step_time_s
    cells = [f"{model} b{batch}"]
    for recompute in (True, False):
        try:
            p = baselines.capuchin(graph, budget, spec, keep=keep, compiled=cg, recompute=recompute)
            cells.append(f"{ideal / p.prediction.step_time_s:.3f}")
        except Infeasible:
            cells.append("OOM")
            p = None
        if recompute and p is not None:
            sim = simulator.simulate(graph, p, spec, keep=keep, compiled=cg, events=True)
            arena = layout.shared_layout(sim, p.allocation).total_bytes
            cap_row = f"{sim.peak_bytes / 1e9:.2f} / {arena / 1e9:.2f}"
    cells.append(cap_row if cells[1] != "OOM" else "-")
    for memory in ("live", "shared"):
        try:
            p = byte_planner.plan(graph, budget, spec, compiled=cg, memory=memory)
            cells.append(f"{ideal / p.prediction.step_time_s:.3f}")
        except Infeasible as err:
            cells.append(f"({str(err)[:40]})")
    order = cg.order_of(None)
    prog = byte_planner.build_program(cg, order, spec,
                                      int((budget - cg.small_pool_peak(order)) * cap))
    pool = byte_planner.default_allocation(cg, order, byte_planner.UNLIMITED)
    sim = simulator.run_program(cg, prog, pool, spec, events=True)
    packed = best_packing(sim, pool) + pool.small_pool_bytes
    cells.append(f"{sim.peak_bytes / 1e9:.2f} / {packed / 1e9:.2f}")
    cells.append(f"{link_bound(cg, order, spec, budget):.3f}")
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", nargs="+", help="model:batch, e.g. resnet50:512")
    ap.add_argument("--spec", default="v100-16g-pcie3")
    ap.add_argument("--cap", type=float, default=0.95,
                    help="fraction of the budget for the packing column")
    ap.add_argument("--cache", default=".bench_cache")
    args = ap.parse_args(argv)
    print(f"| row | capuchin | capuchin, no recompute | capuchin live / shared arena (GB) | "
          f"byte planner, live | byte planner, shared arena | byte plan at {args.cap:.0%}: "
          "live / best packed arena (GB) | bound from the link |")
    print("|---|---|---|---|---|---|---|---|")
    for item in args.rows:
        model, batch = item.split(":")
        print(row(model, int(batch), args.spec, args.cap, args.cache), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
