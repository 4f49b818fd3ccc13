"""Fig. 6 rows planned the old way and one change at a time toward the shared Problem.

Before issue #21, ``benchmarks/paper_fig6.py`` planned each model's lowered graph
with the fetches as the only kept tensors, the graph's topological order, a
1 MiB small-tensor threshold, and parameters and Adam slots as swappable as
activations.  Now ``research.paper_models.lowered`` returns the
:class:`~tfswap.core.problem.Problem` ``tfswap.optimize`` plans: device
variables (parameters and optimizer slots) pinned, keep = fetches + assigned
values, TensorFlow's order, the default threshold.  For each ``model:batch``
this script lowers the step once (a child process, cached under ``--cache``)
and runs ``research.paper_bench.compare`` on each variant (``--variants``):

    old         the old problem (reproduces benchmarks/out/fig6.csv)
    +pinned     the old problem with the device variables pinned
    +keep       ... with keep = fetches + assigned
    +order      ... in TensorFlow's order
    +threshold  ... at the default threshold (the same as old when it is 1 MiB)
    new         all four: the shared Problem (reproduces the new run)
    host        the new problem, variables not pinned but starting the step in
                host memory (params_start_on_host; the baselines cannot plan it)

It prints each variant's cells and the bytes of pinned parameters and
optimizer state, and writes a CSV (the columns of paper_bench's plus
``variant``).  Example:

    PYTHONPATH=. .venv/bin/python research/studies/fig6_unpinned.py resnet50:256 \\
        --variants old +pinned new --generations 100
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import pickle
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # research/ beside tfswap/
from research import paper_bench  # noqa: E402
from tfswap.core.devices import device_spec  # noqa: E402
from tfswap.core.problem import DEFAULT_SMALL_BYTES, Problem  # noqa: E402

VARIANTS = ("old", "+pinned", "+keep", "+order", "+threshold", "new", "host")


def build(name: str, batch: int, spec: str, out: str) -> None:
    """In this process: lower the step as ``optimize`` does and pickle what the
    variants need (the unpinned graph, fetches, assigned, resident, TF's order,
    the default threshold)."""
    from research import paper_models
    from tfswap import pipeline
    from tfswap.tf import lower as tf_lower
    from tfswap.tf import capture, profile

    captured = capture.capture(paper_models.concrete_function(name, batch))
    dev = device_spec(spec)
    step = tf_lower.lower_default(captured, profile.analytic(captured, dev), dev)
    low = step.lowered
    with open(out, "wb") as f:
        pickle.dump((low.graph, tuple(low.fetches), tuple(low.assigned), tuple(low.resident),
                     step.problem.schedule, step.problem.small_threshold_bytes), f,
                    protocol=pickle.HIGHEST_PROTOCOL)


def lowering(name: str, batch: int, spec: str, cache: Path):
    path = cache / f"{name}-b{batch}-{spec}-lowering.pkl"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        subprocess.run([sys.executable, __file__, "--build", name, str(batch), spec, str(path)],
                       check=True, env=env)
    with open(path, "rb") as f:
        return pickle.load(f)


def problem(variant: str, graph, fetches, assigned, resident, schedule, small) -> Problem:
    """The problem of ``variant`` (see the module doc)."""
    from tfswap.pipeline import pin_parameters

    new = variant in ("new", "host")
    return Problem.of(
        pin_parameters(graph, resident) if variant in ("new", "+pinned") else graph,
        keep=fetches + assigned if new or variant == "+keep" else fetches,
        schedule=schedule if new or variant == "+order" else None,
        small_threshold_bytes=small if new or variant == "+threshold" else DEFAULT_SMALL_BYTES,
        params_start_on_host=variant == "host")


def pinned_state_bytes(p: Problem) -> int:
    """Bytes of parameters and optimizer state the problem keeps on the device."""
    cg = p.compiled
    return int(cg.buf_bytes[(cg.buf_pinned & cg.buf_persistent).astype(bool)].sum())


def main(argv=None) -> None:
    if argv is None and sys.argv[1:2] == ["--build"]:
        return build(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", help="model:batch, e.g. resnet50:256")
    ap.add_argument("--variants", nargs="+", default=["old", "+pinned", "new"], choices=VARIANTS)
    ap.add_argument("--policies", nargs="+", default=list(paper_bench.POLICIES),
                    choices=list(paper_bench.POLICIES))
    ap.add_argument("--spec", default="v100-16g-pcie3")
    ap.add_argument("--generations", type=int, default=100)
    ap.add_argument("--cache", default=".bench_cache")
    ap.add_argument("--out", default="benchmarks/out/fig6_problem/unpinned.csv")
    args = ap.parse_args(argv)
    dev = device_spec(args.spec)
    fields = ["variant"] + list(paper_bench.Outcome.__dataclass_fields__) + \
        ["samples_per_s", "relative"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in args.rows:
            model, batch = row.split(":")
            parts = lowering(model, int(batch), args.spec, Path(args.cache))
            for variant in args.variants:
                p = problem(variant, *parts)
                rows = paper_bench.compare(p, model, int(batch), dev.memory_bytes, dev,
                                           generations=args.generations,
                                           policies=args.policies)
                print(f"{model} b{batch} {variant} (pinned state {pinned_state_bytes(p) / 1e9:.2f}"
                      f" GB, threshold {p.small_threshold_bytes} B): " +
                      ", ".join(paper_bench.progress_cell(o) for o in rows), flush=True)
                for o in rows:
                    w.writerow({"variant": variant, **dataclasses.asdict(o),
                                "samples_per_s": o.samples_per_s, "relative": o.relative})
                f.flush()


if __name__ == "__main__":
    main()
