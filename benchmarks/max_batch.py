"""Capuchin Table 2's question: the largest batch each policy trains in 16 GB at no
more than 2x the ideal step time (simulated, analytic V100 profile).

Batches double from ``--start``; a policy is dropped at the first batch it fails.

    PYTHONPATH=. python benchmarks/max_batch.py --models resnet50 bert_base rnn_8_2k
"""

from __future__ import annotations

import argparse

import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ beside tfswap/
from research import paper_bench, paper_models


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet50", "bert_base", "rnn_8_2k"],
                    choices=list(paper_models.PAPER_BATCHES))
    ap.add_argument("--spec", default="v100-16g-pcie3")
    ap.add_argument("--slowdown", type=float, default=2.0)
    ap.add_argument("--start", type=int, default=32)
    ap.add_argument("--limit", type=int, default=4096)
    ap.add_argument("--generations", type=int, default=100)
    ap.add_argument("--memory", default="live", choices=["live", "pool"])
    ap.add_argument("--cache", default=".bench_cache")
    args = ap.parse_args(argv)
    table = {}
    for model in args.models:
        table[model] = paper_bench.max_batch(
            model, spec=args.spec, slowdown=args.slowdown, start=args.start, limit=args.limit,
            generations=args.generations, cache_dir=args.cache, memory=args.memory,
            progress=lambda line: print(line, flush=True))
    policies = [p for p in paper_bench.POLICIES if p != "ideal"]
    print("| model | " + " | ".join(policies) + " |")
    print("|" + "---|" * (len(policies) + 1))
    for model, best in table.items():
        print(f"| {model} | " + " | ".join(str(best[p]) if best[p] else f"< {args.start}"
                                          for p in policies) + " |")


if __name__ == "__main__":
    main()
