"""Issue #30: per Fig. 6 row, the bound no swap-or-recompute plan beats, beside tfswap.

    PYTHONPATH=. python research/studies/fig6_bound.py --fig6 benchmarks/out/fig6_hybrid/fig6.csv \
        [--models resnet50 ...] [--spec v100-16g-pcie3] [--max-rows 240]
        [--out benchmarks/out/fig6_bound.csv]

For each row of ``--fig6`` (a paper_fig6.py CSV) below ``--below`` of ideal for
the "tfswap" policy, the LP bound of :mod:`research.hybrid_bound` in
TensorFlow's order on the same problem (analytic profile, device variables
pinned) and budget: the throughput relative to ideal that no plan in that
order exceeds, the recomputation and link time its optimum spends, and
tfswap's (hybrid) and tfswap.swaps' relative throughput from the CSV.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from research import paper_bench, paper_models  # noqa: E402
from research.hybrid_bound import NoPlanFits, step_time_bound  # noqa: E402
from tfswap.core.devices import device_spec  # noqa: E402

COLUMNS = ("model", "batch", "budget_bytes", "ideal_s", "bound_s", "bound_relative",
           "bound_recompute_s", "bound_d2h_s", "bound_h2d_s", "tfswap_relative",
           "swaps_relative", "tfswap_of_bound", "lp_rows", "lp_gaps", "lp_seconds")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fig6", required=True, help="a paper_fig6.py CSV")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--spec", default="v100-16g-pcie3")
    ap.add_argument("--below", type=float, default=0.8,
                    help="rows where tfswap is below this fraction of ideal")
    ap.add_argument("--max-rows", type=int, default=None,
                    help="positions the LP constrains (fewer: faster, a lower bound still)")
    ap.add_argument("--cache", default=".bench_cache")
    ap.add_argument("--out", default="benchmarks/out/fig6_bound.csv")
    args = ap.parse_args(argv)
    spec = device_spec(args.spec)
    by_row: dict[tuple[str, int], dict] = {}
    for o in paper_bench.read_csv(Path(args.fig6)):
        by_row.setdefault((o.model, o.batch), {})[o.policy] = o
    rows = []
    for (model, batch), policies in by_row.items():
        hybrid, swaps = policies.get("tfswap"), policies.get("tfswap.swaps")
        if args.models and model not in args.models or hybrid is None \
                or hybrid.relative is None or hybrid.relative >= args.below:
            continue
        problem = paper_models.lowered(model, batch, args.spec, args.cache)
        t0 = time.monotonic()
        try:
            b = step_time_bound(problem, hybrid.budget_bytes, spec,
                                **({"max_rows": args.max_rows} if args.max_rows else {}))
        except NoPlanFits as err:
            print(f"{model} b{batch}: {err}", flush=True)
            continue
        row = dict(model=model, batch=batch, budget_bytes=hybrid.budget_bytes,
                   ideal_s=b.ideal_s, bound_s=b.time_s, bound_relative=b.relative,
                   bound_recompute_s=b.recompute_s, bound_d2h_s=b.d2h_s, bound_h2d_s=b.h2d_s,
                   tfswap_relative=hybrid.relative,
                   swaps_relative=swaps.relative if swaps else None,
                   tfswap_of_bound=hybrid.relative / b.relative, lp_rows=b.rows,
                   lp_gaps=b.gaps, lp_seconds=time.monotonic() - t0)
        rows.append(row)
        print(f"{model} b{batch}: bound {b.relative:.3f} of ideal (recompute "
              f"{b.recompute_s:.3f} s, out {b.d2h_s:.3f} s, in {b.h2d_s:.3f} s), tfswap "
              f"{hybrid.relative:.3f} = {row['tfswap_of_bound']:.3f} of the bound", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
