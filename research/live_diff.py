"""What the memory model misses on a device, node by node (issue #44).

    python -m research.live_diff benchmarks/out/gpu_validate_h200.jsonl [--problems DIR]
        [--top 12] [--min-bytes 1048576]

``benchmarks/gpu_validate.py`` writes, per row, what one traced run of the
unmodified step held at its step stats' peak, by the node that allocated it
(``profile_live_at_peak``), and the node whose allocation reached that peak
(``profile_live_peak_node``); the row's planning problem holds the profile and
TF's order.  Here the model's live set at that node's position in TF's order
(each buffer from its producer to its last reader, the op's scratch while it
runs; parameters and optimizer state, which the step stats do not allocate,
left out) is set beside it: per node the bytes the run held and the bytes the
model holds, the nodes the model misses first.  On the H200 (2026-11-28) the
model was 0.955-0.98 of the step stats' peak of ResNet-50 and BERT-style
before any plan; on the emulated device about 1.0.

Leads, not verdicts: the run's order may differ from the saved TF order by a
few ops, and a buffer an op wrote in place is its producer's in the model but
may be another node's allocation in the run (an allocator that reused a freed
buffer's address reads as an in-place write to the profile).

The rewritten step's figures (``stats_live_at_peak``) are listed beside them;
the rewritten graph's own nodes (swap ops, remade ops) have no place in TF's
order, so they are listed, not compared.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SKIPPED_KINDS = ("parameter", "optimizer_state")


def model_live_at(graph, schedule, position: int) -> dict[str, int]:
    """Producer node -> the bytes the model holds live while the op at
    ``position`` of ``schedule`` runs (no swaps)."""
    from tfswap.core import liveness

    pos = {name: k for k, name in enumerate(schedule)}
    held = defaultdict(int)
    for i, op in enumerate(graph.ops):
        if op.scratch_bytes and pos[op.name] == position:
            held[op.name] += op.scratch_bytes
    for root, members in liveness.buffers(graph).items():
        tensors = [graph.tensors[m] for m in members]
        if any(t.kind in SKIPPED_KINDS for t in tensors):
            continue
        start = min(pos[graph.ops[t.producer].name] for t in tensors)
        end = max([pos[graph.ops[c].name] for t in tensors for c in t.consumers] + [start])
        if start <= position <= end:
            held[graph.ops[graph.tensor(root).producer].name] += max(t.nbytes for t in tensors)
    return dict(held)


def diff_row(row: dict, saved, top: int, min_bytes: int) -> list[str]:
    """Lines saying where the model's live set and the run's differ at the run's peak."""
    problem = saved.problem
    node = row.get("profile_live_peak_node", "")
    ran = row.get("profile_live_at_peak", {})
    lines = [f"{row['model']} {row['fraction']}: the unmodified step held "
             f"{row.get('profile_live_peak_bytes', 0) / 2**20:.1f} MiB at its peak "
             f"(reached by {node or '?'})"]
    if node not in problem.schedule:
        return lines + [f"  {node!r} is not in TF's order of the saved problem: not compared"]
    model = model_live_at(problem.graph, problem.schedule, problem.schedule.index(node))
    lines.append(f"  the model holds {sum(model.values()) / 2**20:.1f} MiB there "
                 f"(listed nodes of the run: {sum(ran.values()) / 2**20:.1f} MiB, the rest "
                 f"{row.get('profile_live_small_bytes', 0) / 2**20:.1f} MiB)")
    gaps = sorted(((ran.get(n, 0) - model.get(n, 0), n) for n in set(ran) | set(model)),
                  key=lambda g: -abs(g[0]))
    for gap, name in [g for g in gaps if abs(g[0]) >= min_bytes][:top]:
        lines.append(f"  {'run' if gap > 0 else 'model'} +{abs(gap) / 2**20:7.2f} MiB  {name} "
                     f"(run {ran.get(name, 0) / 2**20:.2f}, model {model.get(name, 0) / 2**20:.2f})")
    rewritten = row.get("stats_live_at_peak", {})
    if rewritten:
        lines.append(f"  the rewritten step held {row.get('stats_live_peak_bytes', 0) / 2**20:.1f} "
                     f"MiB at its peak (reached by {row.get('stats_live_peak_node', '?')}); "
                     f"predicted {row.get('predicted_peak_bytes', 0) / 2**20:.1f}; largest:")
        for name, nbytes in list(rewritten.items())[:top]:
            lines.append(f"    {nbytes / 2**20:7.2f} MiB  {name}")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jsonl", type=Path)
    parser.add_argument("--problems", type=Path, default=None,
                        help="where the rows' problem files are (default: as the rows name "
                             "them, else benchmarks/problems/)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--min-bytes", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    from tfswap.core import problem_file

    root = Path(__file__).resolve().parents[1]
    for line in args.jsonl.read_text().splitlines():
        row = json.loads(line)
        if "profile_live_at_peak" not in row or not row.get("problem_file"):
            print(f"{row.get('model')} {row.get('fraction')}: no live set at the peak in this "
                  "row (gpu_validate.py before 2026-11-28)")
            continue
        named = Path(row["problem_file"])
        folder = args.problems or (named.parent if named.exists() else root / "benchmarks/problems")
        saved = problem_file.read(folder / named.name)
        print("\n".join(diff_row(row, saved, args.top, args.min_bytes)))


if __name__ == "__main__":
    main()
