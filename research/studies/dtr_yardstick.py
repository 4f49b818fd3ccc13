"""A yardstick for recomputation under a tight budget: a DTR-style simulation.

Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021) runs the step in
its profiled order and, when an allocation would pass the budget, evicts the
resident value with the least ``cost / (bytes * staleness)``; an evicted value
that is read again is made again on the spot, recursively through whatever of
its inputs is gone too.  Nothing is copied.  What it spends in remakes is a
yardstick for a planner that may only recompute (and on a 50 MB/s link a copy
of 1 MB costs 40 ms both ways, more than most steps' compute).

The model here is the compiled graph's (:class:`tfswap.core.compiled.CompiledGraph`):

* room: the budget less the parameters (persistent buffers, kept on the
  device) and the small-tensor pool's peak (as the byte-cap planner reserves);
* storage is per pool buffer; a buffer's value changes when an op writes it
  in place (or views it), and reading it means reading its current value; a
  remake of a buffer runs every op that made its value (its producer, then
  the in-place writers), the ops of :func:`tfswap.core.recompute.ChainIndex.value_ops`;
* an input of a remake whose buffer was written over since (or freed) is
  made again in a temporary (freed after the remake), or in its own buffer
  when the remake wants its current value;
* a value may be evicted only where every op that made it may run again
  (``problem.recomputable``, or with ``--any`` every op but a placeholder:
  an optimistic bound); a buffer a non-recomputable op made, which some
  remake may need later, stays until its last such use (found statically,
  over-approximated);
* a buffer is freed after its last use in the order, an op's scratch
  is held while it runs (remakes included).

Reported: the remakes' compute time over the step's (the overhead), the
number of remade ops, and whether the room sufficed at all.

    PYTHONPATH=. python research/studies/dtr_yardstick.py /tmp/diag/transformer_0.4.pkl [--any]
"""

from __future__ import annotations

import argparse
import pickle
import sys

from tfswap.core.recompute import ChainIndex


class Infeasible(Exception):
    pass


class DTR:
    def __init__(self, problem, budget, any_op=False, room=None):
        cg = self.cg = problem.compiled
        g = self.g = cg.graph
        order = self.order = [int(o) for o in cg.order_of(problem.schedule)]
        self.ix = ChainIndex(cg, order)
        self.nb = [int(x) for x in cg.buf_bytes]
        self.pers = cg.buf_persistent.astype(bool).tolist()
        self.kept = cg.buf_kept.astype(bool).tolist()
        self.pinned = cg.buf_pinned.astype(bool).tolist()
        start = sum(n for n, p in zip(self.nb, self.pers) if p)
        self.room = room if room is not None else \
            int(budget) - start - int(cg.small_pool_peak(cg.order_of(problem.schedule)))
        names = problem.recomputable
        self.rec = [(op.type != "Placeholder") if any_op else (op.name in names)
                    for op in g.ops]
        self.time = [float(t) for t in cg.op_time]
        self.scratch = {}
        n_pool = len(g.tensors)
        for op in range(cg.n_ops):
            for b in cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]]:
                if cg.buf_names[int(b)].endswith(":scratch"):
                    self.scratch[op] = self.nb[int(b)]
        del n_pool
        # Members of each buffer, by the position that made them.
        ix = self.ix
        self.members = {b: sorted(m, key=lambda i: ix.made_at[i]) for b, m in ix.members.items()}
        self.version_of = {}
        for b, m in self.members.items():
            for v, i in enumerate(m):
                self.version_of[i] = v
        # Tensors each op reads (pool buffers only), outputs it makes.
        self.op_reads = []
        for op in range(cg.n_ops):
            got = []
            for name in g.ops[op].inputs:
                i = ix.tensor_of.get(name)
                if i is None:
                    continue
                b = int(cg.tensor_buffer[i])
                if b >= 0 and not self.pers[b]:
                    got.append((b, i))
            self.op_reads.append(got)
        self.op_makes = [[] for _ in range(cg.n_ops)]
        for i, t in enumerate(g.tensors):
            b = int(cg.tensor_buffer[i])
            if b >= 0 and not self.pers[b] and isinstance(t.producer, int):
                self.op_makes[t.producer].append((b, i))
        self.last = ix.last_use

    # -- the ops that make buffer b's value at version v, all recomputable?
    def value_ops(self, b, v):
        return [self.g.tensors[i].producer for i in self.members[b][:v + 1]]

    def remakeable(self, b, v):
        return all(self.rec[op] for op in self.value_ops(b, v))

    def run(self):
        n = len(self.order)
        self.resident = {}          # buffer -> version held
        self.used = 0
        self.clock = 0.0
        self.access = {}
        self.overhead = 0.0
        self.remade_ops = 0
        self.peak = 0
        cur = {}                    # buffer -> its current version in the order
        self.cur = cur
        # Buffers a remake may need after their last use that cannot be made
        # again themselves: kept to the last position any buffer reading them
        # (transitively, through recomputable ops) is used.
        ext = list(self.last)
        for _ in range(4):
            for op in reversed(self.order):
                for b, _i in self.op_makes[op]:
                    for x, _j in self.op_reads[op]:
                        if x != b and ext[b] > ext[x]:
                            ext[x] = ext[b]
        self.ext = ext
        frees = [[] for _ in range(n + 1)]
        for b in range(self.cg.n_buffers):
            if self.pers[b] or b not in self.members:
                continue
            if self.remakeable(b, len(self.members[b]) - 1):
                at = self.last[b]
            else:
                at = max(self.last[b], ext[b])
            if at >= 0 and not self.kept[b]:
                frees[min(at, n - 1)].append(b)
        for k, op in enumerate(self.order):
            locks = set()
            temps = []
            for b, i in self.op_reads[op]:
                self.ensure(b, self.version_of[i], locks, temps)
            self.run_op(op, locks, temps, original=True)
            for t in temps:
                self.free_temp(t)
            for b in frees[k]:
                if b in self.resident:
                    self.used -= self.nb[b]
                    del self.resident[b]
        return self

    def alloc(self, nbytes, locks):
        while self.used + nbytes > self.room:
            victim, best = None, None
            memo = {}
            for b, v in self.resident.items():
                if b in locks or self.kept[b] or self.pinned[b]:
                    continue
                if not self.remakeable(b, v):
                    continue
                cost = self.remake_cost(b, v, memo) + 1e-9
                stale = self.clock - self.access.get(b, 0.0) + 1e-9
                h = cost / (self.nb[b] * stale)
                if best is None or h < best:
                    victim, best = b, h
            if victim is None:
                raise Infeasible(f"needs {self.used + nbytes} bytes at once, room {self.room}")
            self.used -= self.nb[victim]
            del self.resident[victim]
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def remake_cost(self, b, v, memo, depth=0):
        """What making ``b`` at ``v`` again costs now: its ops and, recursively, the
        inputs gone from the device (DTR's evicted neighbourhood, e*)."""
        key = (b, v)
        got = memo.get(key)
        if got is None:
            memo[key] = 0.0   # a cycle counts once
            got = 0.0
            for op in self.value_ops(b, v):
                got += self.time[op]
                if depth < 30:
                    for x, i in self.op_reads[op]:
                        if x != b and self.resident.get(x) != self.version_of[i]:
                            got += self.remake_cost(x, self.version_of[i], memo, depth + 1)
            memo[key] = got
        return got

    def ensure(self, b, v, locks, temps, depth=0):
        """``b`` at version ``v`` on the device (locked); made again if not."""
        if self.resident.get(b) == v:
            locks.add(b)
            self.access[b] = self.clock
            return b
        if depth > 200:
            raise Infeasible("remake recursion too deep")
        ops = self.value_ops(b, v)
        if not all(self.rec[op] for op in ops):
            raise Infeasible(f"{self.cg.buf_names[b]} v{v} gone, made by an op that may not "
                             "run again")
        in_place = b not in self.resident and self.cur.get(b, -1) == v
        sub_temps = []
        before = set(locks)
        for op in ops:
            for x, i in self.op_reads[op]:
                if x == b:
                    continue
                self.ensure(x, self.version_of[i], locks, sub_temps, depth + 1)
        locks_all = locks
        key = b if in_place else ("tmp", b, v, len(temps))
        self.alloc(self.nb[b], locks_all)
        for op in ops:
            sc = self.scratch.get(op, 0)
            if sc:
                self.alloc(sc, locks_all | {b})
            self.clock += self.time[op]
            self.overhead += self.time[op]
            self.remade_ops += 1
            if sc:
                self.used -= sc
        for t in sub_temps:
            self.free_temp(t)
        # The inputs locked for this remake alone are evictable again.
        locks.intersection_update(before)
        if in_place:
            self.resident[b] = v
            self.access[b] = self.clock
            locks.add(b)
        else:
            temps.append((key, self.nb[b]))
        return key

    def free_temp(self, t):
        self.used -= t[1]

    def run_op(self, op, locks, temps, original):
        made = {}
        for b, i in self.op_makes[op]:
            made[b] = max(made.get(b, -1), self.version_of[i])
        new = [b for b in made if b not in self.resident]
        need = sum(self.nb[b] for b in new) + self.scratch.get(op, 0)
        self.alloc(need, locks | set(made))
        self.clock += self.time[op]
        for b, v in made.items():
            self.resident[b] = v
            self.cur[b] = v
            self.access[b] = self.clock
        self.used -= self.scratch.get(op, 0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pickles", nargs="+")
    ap.add_argument("--any", action="store_true",
                    help="every op but placeholders may run again (optimistic)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="room times this (e.g. 0.9: what margin the yardstick leaves)")
    a = ap.parse_args(argv)
    for path in a.pickles:
        d = pickle.load(open(path, "rb"))
        p, budget = d["problem"], d["budget"]
        sim = DTR(p, budget, any_op=a.any)
        sim.room = int(sim.room * a.scale)
        base = sum(sim.time[op] for op in sim.order)
        name = path.rsplit("/", 1)[-1]
        try:
            sim.run()
            print(f"{name:22s} room {sim.room / 1e6:7.2f} MB  compute {base * 1e3:8.2f} ms  "
                  f"remakes {sim.overhead * 1e3:8.2f} ms ({sim.remade_ops} ops)  "
                  f"step/ideal {1 + sim.overhead / base:.3f}", flush=True)
        except Infeasible as err:
            print(f"{name:22s} room {sim.room / 1e6:7.2f} MB  infeasible: {err}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
