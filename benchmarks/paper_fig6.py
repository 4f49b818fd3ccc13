"""SwapAdvisor Fig. 6: every policy's simulated throughput relative to ideal.

For each model at its batch sizes (research.paper_models.PAPER_BATCHES), on the
analytic profile of ``--spec`` (default v100-16g-pcie3) with the device's
memory as the budget: ideal, no-swap, ODSwap, vDNN, TFLMS-style,
Capuchin-style and tfswap's genetic search (``--generations``, default 100,
one worker, seed 0).  Writes fig6.csv, fig6.md and fig6.png to ``--out``.

    PYTHONPATH=. python benchmarks/paper_fig6.py --out benchmarks/out
    PYTHONPATH=. python benchmarks/paper_fig6.py --models rnn_8_2k --generations 20
"""

from __future__ import annotations

import argparse

import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ beside tfswap/
from research import paper_bench, paper_models


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(paper_models.PAPER_BATCHES),
                    choices=list(paper_models.PAPER_BATCHES))
    ap.add_argument("--spec", default="v100-16g-pcie3")
    ap.add_argument("--budget-gb", type=float, default=None,
                    help="device memory budget in GB (1e9 bytes); default: the device's")
    ap.add_argument("--generations", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--memory", default="live", choices=["live", "pool"],
                    help="how the baselines' fit is judged (see tfswap.core.baselines)")
    ap.add_argument("--policies", nargs="+", default=list(paper_bench.POLICIES),
                    choices=list(paper_bench.POLICIES), help="default: all (ideal first)")
    ap.add_argument("--out", default="benchmarks/out")
    ap.add_argument("--cache", default=".bench_cache")
    ap.add_argument("--redraw", action="store_true",
                    help="only redraw fig6.md and fig6.png from the CSV in --out")
    args = ap.parse_args(argv)
    if args.redraw:
        rows = paper_bench.read_csv(f"{args.out}/fig6.csv")
        open(f"{args.out}/fig6.md", "w").write(paper_bench.markdown(rows) + "\n")
        paper_bench.bar_chart(rows, f"{args.out}/fig6.png")
        print(open(f"{args.out}/fig6.md").read())
        return
    budget = int(args.budget_gb * 1e9) if args.budget_gb else None
    paper_bench.fig6(args.models, spec=args.spec, budget_bytes=budget,
                     generations=args.generations, workers=args.workers, out_dir=args.out,
                     cache_dir=args.cache, memory=args.memory, policies=args.policies,
                     progress=lambda line: print(line, flush=True))
    print(open(f"{args.out}/fig6.md").read())


if __name__ == "__main__":
    main()
