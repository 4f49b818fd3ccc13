"""Fig. 6 before and after: which cells of two fig6.csv files move, and why.

A cell (model, batch, policy) moves when it fits in one run and not in the
other, when one is unsupported, or when its throughput relative to ideal
differs by more than ``--tol`` (default 0.005: a change the two-decimal
table shows).  The ideal row's peak (the table's "ideal GB") is compared too.

With ``--variants`` (CSVs ``research/studies/fig6_unpinned.py`` wrote), a moved cell
is attributed to the single change whose variant moves it: the "old" variant
must reproduce the old cell and the change's variant (``+pinned``, ``+keep``,
``+order``, ``+threshold``) the new one, both within ``--tol``; where the old
way no longer gives the old cell (a planner changed since the old run), that
is said.

    PYTHONPATH=. .venv/bin/python research/studies/fig6_diff.py benchmarks/out/fig6.csv \\
        benchmarks/out/fig6_problem/fig6.csv --variants benchmarks/out/fig6_problem/unpinned.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # research/ beside tfswap/
from research import paper_bench  # noqa: E402

CHANGES = ("+pinned", "+keep", "+order", "+threshold")


def cells(outcomes) -> dict:
    return {(o.model, o.batch, o.policy): o for o in outcomes}


def text(o) -> str:
    if o is None:
        return "-"
    if o.relative is None:
        return "n/a" if o.unsupported else "OOM"
    return f"{o.relative:.3f}"


def swapped(o) -> str:
    return "-" if o.swapped_bytes is None else f"{o.swapped_bytes / 1e9:.1f}"


def same(a, b, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    if a.relative is None or b.relative is None:
        return a.relative is b.relative and a.unsupported == b.unsupported
    return abs(a.relative - b.relative) <= tol


def read_variants(paths) -> dict:
    """variant -> {(model, batch, policy): Outcome} from fig6_unpinned CSVs."""
    out: dict = {}
    for path in paths:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            o = paper_bench.Outcome(
                r["model"], int(r["batch"]), r["policy"], int(r["budget_bytes"]),
                float(r["ideal_time_s"]), float(r["step_time_s"]) if r["step_time_s"] else None,
                int(r["peak_bytes"]) if r["peak_bytes"] else None,
                int(r["swapped_bytes"]) if r["swapped_bytes"] else None,
                float(r["plan_seconds"]), r["note"])
            out.setdefault(r["variant"], {})[(o.model, o.batch, o.policy)] = o
    return out


def cause(key, old, new, variants: dict, tol: float) -> str:
    """Which single change reproduces the move (see the module doc), or why none does."""
    base = variants.get("old", {}).get(key)
    if base is None:
        return ""
    if not same(base, old, tol):
        if same(base, new, tol):
            return f"the old way now gives {text(base)} too: the planner changed, not the problem"
        note = f"the old way now gives {text(base)}; "
    else:
        note = ""
    tried = [c for c in CHANGES if key in variants.get(c, {})]
    found = [c for c in tried if same(variants[c][key], new, tol)]
    if not tried:
        return note + ("no change tried" if note else "the old way reproduces the old cell")
    if found:
        return note + "cause " + " / ".join(found)
    return note + "no single change reproduces it (" + ", ".join(
        f"{c} {text(variants[c][key])}" for c in tried) + ")"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--variants", nargs="*", default=[], help="fig6_unpinned.py CSVs")
    ap.add_argument("--tol", type=float, default=0.005)
    args = ap.parse_args(argv)
    old, new = cells(paper_bench.read_csv(args.old)), cells(paper_bench.read_csv(args.new))
    variants = read_variants(args.variants)
    keys = [k for k in old if k in new]
    moved = [k for k in keys if not same(old[k], new[k], args.tol)]
    exact = sum(1 for k in keys if old[k].step_time_s == new[k].step_time_s)
    print(f"{len(keys)} cells in both: {len(keys) - len(moved)} within {args.tol}, "
          f"{len(moved)} move; {exact} with the same step time exactly"
          + (f"; {len(old) - len(keys)} only in the old run" if len(old) > len(keys) else "")
          + (f"; {len(new) - len(keys)} only in the new run" if len(new) > len(keys) else ""))
    for row in dict.fromkeys(k[:2] for k in keys):
        ideal_old, ideal_new = old.get(row + ("ideal",)), new.get(row + ("ideal",))
        here = [k for k in moved if k[:2] == row]
        peak = ""
        if ideal_old and ideal_new and ideal_old.peak_bytes != ideal_new.peak_bytes:
            peak = (f" (ideal GB {ideal_old.peak_bytes / 1e9:.2f} -> "
                    f"{ideal_new.peak_bytes / 1e9:.2f})")
        if not here:
            if peak:
                print(f"{row[0]} b{row[1]}: no cell moves{peak}")
            continue
        print(f"{row[0]} b{row[1]}{peak}:")
        for k in here:
            why = cause(k, old[k], new[k], variants, args.tol)
            print(f"  {k[2]:12s} {text(old[k]):>6s} -> {text(new[k]):>6s}  swapped GB "
                  f"{swapped(old[k]):>6s} -> {swapped(new[k]):>6s}"
                  + (f"   {why}" if why else ""))


if __name__ == "__main__":
    main()
