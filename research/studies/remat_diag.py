"""Why the byte-cap scan copies a buffer instead of dropping it (issue #40).

Runs the reference scan (:class:`tfswap.core.byte_planner._ByteScan`) of every
recomputing variant the default planner scans (exact allocator: live memory),
finds the variant and cap whose plan it kept, and attributes each copied-out
buffer's bytes to the refusal that kept it from being dropped: no chain at its
next use (and why :func:`tfswap.core.recompute.value_chain` gave none), its
chain too slow for the share, or a :meth:`_ByteScan._segment` refusal.

    PYTHONPATH=. python research/studies/remat_diag.py /tmp/diag/transformer_0.4.pkl
"""

from __future__ import annotations

import collections
import pickle
import sys

from tfswap.core import byte_planner as BP, recompute as R
from tfswap.core.program import from_plan


def why_no_chain(cg, index, b, need, allowed, scratch, last_read):
    """Why ``_Chains.at(b, need)`` is None (value_chain's refusals, named)."""
    g = cg.graph
    read = [i for i in index.members[b] if index.made_at[i] < need and last_read[i] >= need]
    if len(read) != 1:
        return f"reads {len(read)} values of the buffer"
    upto = index.made_at[read[0]]
    ops = set(index.value_ops(cg, b, upto))
    todo, fresh = list(ops), cg.buf_fresh
    while todo:
        op = todo.pop()
        for nm in g.ops[op].inputs:
            i = index.tensor_of.get(nm)
            x = int(cg.tensor_buffer[i]) if i is not None else -1
            if x < 0 or x == b or g.tensors[i].producer in ops:
                continue
            if cg.buf_persistent[x] or cg.buf_kept[x]:
                continue
            if index.last_use[x] >= need and not index.overwritten(x, i, need):
                continue
            if index.last_use[x] >= need and fresh[x] < 0:
                return "input held+overwritten, no fresh copy"
            more = [p for p in index.value_ops(cg, x, index.made_at[i]) if p not in ops]
            ops.update(more)
            todo += more
    free = max(cg.small_threshold_bytes, 1)
    for op in ops:
        if allowed is not None and op not in allowed:
            return f"op type {g.ops[op].type} not recomputable"
    for op in ops:
        if not scratch and g.ops[op].scratch_bytes >= free:
            return f"op type {g.ops[op].type} has planned scratch"
    made = set()
    for op in ops:
        for x in cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]]:
            x = int(x)
            made.add(x)
            if x != b and index.last_use[x] >= need and fresh[x] < 0:
                return "chain op makes a held buffer with no fresh copy"
    if len(ops) > R.MAX_CHAIN_OPS:
        return f"chain longer than MAX_CHAIN_OPS={R.MAX_CHAIN_OPS}"
    return "mixed read (reads a buffer it makes again)"


class DiagScan(BP._ByteScan):
    """The reference scan, recording why each drop was refused."""

    def run(self, cap):
        self.why = {}
        self.copied = []   # (buffer, position, reason)
        return super().run(cap)

    def _evict(self, e):
        self.copied.append((e, self.front, self._reason(e)))
        return super()._evict(e)

    def _reason(self, e):
        need = self._next_use(e)
        if need >= self.never:
            return "no next use"
        ch = self.chains.at(e, need)
        if ch is None:
            c = self.chains
            return "no chain: " + why_no_chain(self.cg, c.index, e, need, c.allowed,
                                               c.scratch, c.last_read)
        rt = self.nbytes[e] * self.share_s_per_byte
        if ch[1] > rt:
            return "chain slower than share of round trip"
        return self.why.get(e, "in cheap heap, not reached (stamp==k?)")

    def _segment(self, b, need, ops, k):
        got, why = self._segment_or_refusal(b, need, ops, k)
        if got is None:
            self.why[b] = "segment: " + why
        return got


def chosen_variant(problem, budget, spec):
    """The default planner's plan (exact allocator) and, where the byte-cap planner
    made it, the variant (cap, lookahead, chains, share, drop order, order) whose
    scan it came from and that scan's plan."""
    from tfswap.core import planners
    from tfswap.core.search_config import SearchConfig
    seen = {}
    orig_scan, orig_with = BP._scan, planners.with_recomputes
    polished = {}

    def scan(cg, order, spec_, cap, lookahead, margin, chains, share, drop, reference=False,
             segment_share=BP.SEGMENT_SHARE, retry=None):
        prog = orig_scan(cg, order, spec_, cap, lookahead, margin, chains, share, drop, reference,
                         segment_share, retry)
        seen[prog] = (cap, lookahead, chains, share, drop, [int(o) for o in order], segment_share)
        return prog

    def with_recomputes(problem_, plan, *a, **kw):
        got = orig_with(problem_, plan, *a, **kw)
        polished[(got.schedule, got.swaps)] = plan
        return got

    BP._scan, planners.with_recomputes = scan, with_recomputes
    try:
        final = planners.run("tfswap", problem, budget, spec, allocator="exact", config=SearchConfig(
            max_generations=5, seed=0, workers=1)).plan
    finally:
        BP._scan, planners.with_recomputes = orig_scan, orig_with
    # The kept plan came from a polished scan, or from a scan as it was.
    raw = polished.get((final.schedule, final.swaps), final)
    cg = problem.compiled
    prog = from_plan(cg, raw.schedule, raw.swaps, raw.resident_parameters)
    got = seen.get(prog)
    if got is None:   # read back differs: match by the outs
        for p, v in seen.items():
            if p.outs == prog.outs:
                got = v
    return final, raw, got


def main(path):
    d = pickle.load(open(path, "rb"))
    problem, budget, spec = d["problem"], d["budget"], d["spec"]
    cg = problem.compiled
    final, raw, var = chosen_variant(problem, budget, spec)
    pr = final.prediction
    print(f"{path}: kept plan {pr.step_time_s / pr.ideal_time_s:.2f}x ideal, "
          f"scan plan {raw.prediction.step_time_s / raw.prediction.ideal_time_s:.2f}x; "
          f"out {pr.swap_out_bytes / 1e6:.2f} MB")
    if var is None:
        print("  the kept plan has no recomputing variant behind it (swaps alone)")
        return
    cap, lookahead, chains, share, drop, order, segment_share = var
    print(f"  variant: cap {cap} (budget {budget}), lookahead {lookahead}, share {share}, "
          f"{drop}, scratch chains {chains.scratch if chains else None}")
    if chains is None:
        names = set(problem.recomputable)
        allowed = frozenset(i for i, op in enumerate(cg.graph.ops) if op.name in names)
        chains = BP._chains(cg, order, allowed)
    print(f"  order: {'TF' if order == [int(o) for o in cg.order_of(problem.schedule)] else 'searched'}")
    scan = DiagScan(cg, order, spec, lookahead, 0.0, chains, share, drop, segment_share)
    scan.run(cap)
    by = collections.Counter()
    n = collections.Counter()
    for b, k, why in scan.copied:
        by[why] += scan.nbytes[b]
        n[why] += 1
    tot = sum(by.values())
    print(f"  copied out by the scan: {tot / 1e6:.2f} MB in {len(scan.copied)} evictions; "
          f"dropped {sum(1 for o in scan.outs if not o.copy)}")
    for why, v in by.most_common():
        print(f"    {v / 1e6:7.2f} MB {n[why]:4d}x  {why}")
    big = sorted(scan.copied, key=lambda e: -scan.nbytes[e[0]])[:8]
    for b, k, why in big:
        print(f"      {scan.nbytes[b]:>9} {cg.buf_names[b][:70]:70s} @{k}: {why}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
