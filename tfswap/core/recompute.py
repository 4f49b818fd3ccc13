"""Recomputation in a plan: a tensor computed again instead of moved (after Capuchin §4).

A round trip costs the link both ways.  Where the step waits for the link,
running the tensor's producer again right before the reader that needs it
can cost less.  :func:`with_recomputes` takes a planner's plan and turns
round trips into recomputations one at a time, keeping each one the
simulator says makes the step faster while the plan's pool still holds it,
in two orders and the faster result kept (the largest estimated saving
first: the copy time both ways less the ops' time; and the most saving per
second of recomputation first, Capuchin's ranking): the device copy is dropped after the op the swap-out followed, and the
producer runs again on the compute stream right before the first reader of
what the swap-in brought back.

What may be recomputed is the problem's to say (``Problem.recomputable``:
the framework adapter names the ops that compute the same value when run
again on the same inputs).  A recomputed op reads its inputs where the plan
has them at that point: an input swapped out before and brought back only
later is brought back for the recomputation instead
(:func:`tfswap.core.program.inputs_back`), and one that is gone makes the
candidate fail (the simulator checks).  A value written in place by several
ops (a normalization's multiply and add, then a ReLU, all in one buffer) is
made again by all of them, in order.  An input the step no longer holds
then (attention scores, read only by their softmax; a normalization's
temporaries) is made again for the chain alone, through its own ops (at
most MAX_CHAIN_OPS in all): it takes memory while the chain runs, and the
simulator prices that.  A value whose buffer the step still holds but has
written over in place since (GELU's halves), and an output of a chain op the
step still holds (a normalization's other outputs), are made in the
buffer's fresh copy (``CompiledGraph.buf_fresh``), held while the chain runs:
reading the buffer itself would read the newer value.  The ops must make no
buffer the step still holds that has no fresh copy, and here no scratch worth
planning (the byte-cap planner also scans with chains that make it again:
:func:`value_chain`'s ``scratch``).

Example::

    hybrid = with_recomputes(problem, plan, spec, budget_bytes)
    [s for s in hybrid.swaps if s.kind == "recompute"]
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left

from tfswap.core import layout
from tfswap.core.devices import DeviceSpec
from tfswap.core.plan import Plan, Prediction
from tfswap.core.problem import Problem
from tfswap.core.program import (OutRec, Program, RecomputeRec, _recompute_order, last_uses,
                                 buffer_classes, canonical,
                                 from_plan, inputs_back, recompute_ops, to_plan_swaps)
from tfswap.core.simulator import PlanError, run_program, try_program, try_program_rows

# Round trips tried per plan and order: each try is one simulation (Python),
# and the estimate ranks well enough that later ones rarely pay.
MAX_TRIALS = 256


# Moves of a recomputation to another's position tried per plan (each one
# simulation, compiled): the zoo LSTM-4 at 60% had 61 such moves of its 129
# remakes, each tried alone and then kept one at a time.
MAX_SHARE_TRIALS = 256

# The least a move must save to be kept (seconds): far below any op's time
# (the profiles time ops in microseconds), far above the rounding of adding
# the same times in another order (the LSTM-4's moves that shared nothing
# came out 3.5e-18 s faster or slower).
MIN_SHARE_GAIN_S = 1e-9

# Times the share pass backs off its last move where the plan, its moves kept,
# no longer fits its shared pool's arena: each costs a simulation with events;
# past these the plan is kept as it was.
MAX_SHARE_BACKOFFS = 8


# Ops one recomputation may run again.  Each chain op through another buffer
# costs compute and holds that buffer while the chain runs; past a few the
# link usually wins, and the simulator judges every chain anyway.
MAX_CHAIN_OPS = 8


class ChainIndex:
    """What the chains of one order look up: each buffer's members (tensor ids),
    each tensor's position, the last position each buffer is used."""

    def __init__(self, cg, order):
        graph = self.graph = cg.graph
        self._read_at: dict[int, list[int]] = {}
        self.position_of_op = {int(op): k for k, op in enumerate(order)}
        self.tensor_of = {t.name: i for i, t in enumerate(graph.tensors)}
        self.members: dict[int, list[int]] = {}
        for i in range(len(graph.tensors)):
            b = int(cg.tensor_buffer[i])
            if b >= 0:
                self.members.setdefault(b, []).append(i)
        self.made_at = [self.position_of_op.get(t.producer, -1) for t in graph.tensors]
        self.last_use = last_uses(cg, order)

    def read_at(self, tensor: int) -> list[int]:
        """The positions of ``tensor``'s readers, ascending."""
        got = self._read_at.get(tensor)
        if got is None:
            at = self.position_of_op
            got = self._read_at[tensor] = sorted(at[c] for c in self.graph.tensors[tensor]
                                                 .consumers if c in at)
        return got

    def overwritten(self, b: int, tensor: int, before: int) -> bool:
        """Whether an op after ``tensor``'s producer and before position ``before``
        made another value in buffer ``b`` (in place, or a view)."""
        made = self.made_at[tensor]
        return any(made < self.made_at[j] < before for j in self.members[b] if j != tensor)

    def value_ops(self, cg, b: int, upto: int) -> list[int]:
        """The ops that make buffer ``b``'s value as of position ``upto``: its
        producer, then each op that wrote the buffer in place (or viewed it)."""
        return [cg.graph.tensors[i].producer for i in self.members[b]
                if 0 <= self.made_at[i] <= upto]


def value_chain(cg, index: ChainIndex, b: int, upto: int, need: int,
                allowed=None, scratch: bool = False,
                checkpoints: bool = False) -> tuple[int, ...] | None:
    """The ops, in order, that make buffer ``b``'s value as of position ``upto``
    again right before position ``need``: ``b``'s own (:meth:`ChainIndex.value_ops`)
    and, where one reads a value the step no longer holds at ``need``, that
    value's, for the chain alone: in its own buffer where the step no longer
    holds that, else in the buffer's fresh copy (``cg.buf_fresh``: a value since
    written over in place; likewise a sibling output of an op of the chain that
    the step still holds, :func:`tfswap.core.program.fresh_copies`).  None where
    the chain is longer than MAX_CHAIN_OPS, an op of it is not in ``allowed``
    (op ids; None: any), makes a buffer the step holds that has no fresh copy,
    reads both a buffer's value on the device and the older one it makes again,
    or, unless ``scratch``, has scratch worth planning (with ``scratch`` that is
    made again too, held like the chain's other buffers while it runs).

    ``checkpoints``: a value the step no longer holds at ``need`` is read where
    it is instead of made again, when it is its buffer's only value (no view,
    nothing written in place) and may be moved: a *checkpoint*, which the plan
    then holds past its last reader in the step until the chain has run
    (gradient checkpointing's trade, Chen et al.; the byte-cap planner's scan
    counts it, :meth:`tfswap.core.byte_planner._ByteScan._segment`, and the
    simulator keeps it for the chain, :func:`tfswap.core.program.checkpoint_reads`).
    TensorFlow keeps it too: the chain's copies read the tensor itself."""
    graph = cg.graph
    ops = set(index.value_ops(cg, b, upto))
    if not ops:
        return None
    todo = list(ops)
    fresh = cg.buf_fresh
    while todo:
        op = todo.pop()
        for name in graph.ops[op].inputs:
            i = index.tensor_of.get(name)
            x = int(cg.tensor_buffer[i]) if i is not None else -1
            if x < 0 or x == b or graph.tensors[i].producer in ops:
                continue
            if cg.buf_persistent[x] or cg.buf_kept[x]:
                continue
            # On the device then (or brought back for it: inputs_back) and still
            # holding this value: read there.  TF writes in place only into a value
            # nothing else will read, so a value since written over is made again,
            # in a fresh copy (reading the buffer would read the newer value).
            if index.last_use[x] >= need and not index.overwritten(x, i, need):
                continue
            if index.last_use[x] >= need and fresh[x] < 0:
                return None
            if checkpoints and index.last_use[x] < need and len(index.members[x]) == 1 \
                    and not cg.buf_pinned[x]:
                continue
            more = [p for p in index.value_ops(cg, x, index.made_at[i]) if p not in ops]
            ops.update(more)
            todo += more
            if len(ops) > MAX_CHAIN_OPS:
                return None
    scratch_free = max(cg.small_threshold_bytes, 1)
    made = set()
    for op in ops:
        if allowed is not None and op not in allowed:
            return None
        if not scratch and graph.ops[op].scratch_bytes >= scratch_free:
            return None
        for x in cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]]:
            x = int(x)
            made.add(x)
            if x != b and index.last_use[x] >= need and fresh[x] < 0:
                return None   # held then, and no copy to make it in
    for op in ops:   # a buffer made again is read only as made again
        for name in graph.ops[op].inputs:
            i = index.tensor_of.get(name)
            x = int(cg.tensor_buffer[i]) if i is not None else -1
            if x >= 0 and x in made and graph.tensors[i].producer not in ops:
                return None
    return tuple(sorted(ops, key=lambda op: index.position_of_op[op]))


def _chain(cg, prog, r, index: ChainIndex, leaves=None) -> tuple[int, ...] | None:
    """The ops that make again, right before swap-in ``r``'s reader, the value
    the readers after it read of its buffer (:func:`value_chain`); None where
    those readers read more than one value of the buffer.  ``leaves``: each
    buffer's ``out_after`` positions in ``prog``, ascending (:func:`_leaves`)."""
    b = r.buf
    if leaves is None:
        leaves = _leaves(prog)
    after = leaves.get(b, ())
    x = bisect_left(after, r.need)
    # The readers up to the next time it leaves (that op included), or to the end.
    hi = after[x] + 1 if x < len(after) else len(prog.order)
    read_at = index.read_at
    read = []
    for i in index.members[b]:
        if index.made_at[i] < r.need:
            at = read_at(i)
            y = bisect_left(at, r.need)
            if y < len(at) and at[y] < hi:
                read.append(i)
    if len(read) != 1:
        return None
    return value_chain(cg, index, b, index.made_at[read[0]], r.need)


def _leaves(prog) -> dict[int, list[int]]:
    """Each buffer's ``out_after`` positions in ``prog``, ascending."""
    leaves: dict[int, list[int]] = {}
    for o in prog.outs:
        leaves.setdefault(o.buf, []).append(o.out_after)
    for v in leaves.values():
        v.sort()
    return leaves


def chain_index(cg, order) -> ChainIndex:
    """``ChainIndex(cg, order)``, kept on ``cg`` for the last few orders (the
    planners ask for the same one or two many times); callers only read it."""
    key = tuple(int(o) for o in order)
    return cg.memo("chain_index", key, lambda: ChainIndex(cg, key))


def candidates(problem: Problem, prog, spec: DeviceSpec) -> list[tuple[float, int, tuple]]:
    """(estimated saving in seconds, index into ``prog.ins``, the ops to run again)
    of every round trip whose value can be made again, the largest saving first."""
    cg = problem.compiled
    allowed = problem.recomputable
    index = chain_index(cg, prog.order)
    leaves = _leaves(prog)
    found = []
    for i, r in enumerate(prog.ins):
        if r.own_out < 0 or not prog.outs[r.own_out].copy or cg.buf_persistent[r.buf]:
            continue
        reader = prog.order[r.need]
        if r.buf not in cg.op_in[cg.op_in_ptr[reader]:cg.op_in_ptr[reader + 1]]:
            # Brought back early for another recomputation's ops (inputs_back).  A
            # plan makes a value again right before its own reader, so made again it
            # would come too late for those ops.
            continue
        ops = _chain(cg, prog, r, index, leaves)
        if not ops or any(cg.graph.ops[op].name not in allowed for op in ops):
            continue
        nbytes = int(cg.buf_bytes[r.buf])
        saving = spec.copy_time_s(nbytes, "d2h") + spec.copy_time_s(nbytes, "h2d") \
            - sum(float(cg.op_time[op]) for op in ops)
        if saving > 0:
            found.append((saving, i, ops))
    return sorted(found, key=lambda e: (-e[0], e[1]))


def _recomputed(cg, prog, chosen: dict, in_order: bool = False):
    """``prog`` with the round trips ``chosen`` (index into ``prog.ins`` -> the ops
    to run again) made recomputations: their swap-outs become drops, their
    swap-ins go.  ``in_order``: ``prog`` is in stream order
    (:func:`_in_stream_order`)."""
    dropped = {prog.ins[i].own_out for i in chosen}
    added = [RecomputeRec(prog.ins[i].buf, prog.ins[i].own_out, prog.ins[i].need, ops)
             for i, ops in chosen.items()]
    recs = list(prog.recomputes) + added
    # The swap-outs a copy waited for made its room; the remake takes that room
    # before the same op, so the op waits for them instead (the rewrite gives the
    # op's waits to the remake's copies).  Without a waiter TensorFlow may run
    # such a swap-out late: fuzz seed 7180 held a 256 KiB buffer past the remake
    # it had been evicted for, 15% over the predicted peak and 3% over its budget.
    op_waits = tuple(sorted(set(prog.op_waits) | {
        (prog.ins[i].need, w) for i in chosen for w in prog.ins[i].waits}))
    if in_order:
        # What canonical would do, without its work: the records are in stream
        # order already and a drop keeps its out's place, so no index changes;
        # and prog's own recomputations have their inputs back already.
        outs = list(prog.outs)
        for j in dropped:
            o = outs[j]
            outs[j] = OutRec(o.buf, o.out_after, False)
        ins = tuple(r for i, r in enumerate(prog.ins) if i not in chosen)
        return inputs_back(cg, Program(prog.order, prog.resident, tuple(outs), ins,
                                       op_waits, _recompute_order(prog.order, recs)),
                           only=_recompute_order(prog.order, added))
    outs = [OutRec(o.buf, o.out_after, False) if j in dropped else o
            for j, o in enumerate(prog.outs)]
    ins = [r for i, r in enumerate(prog.ins) if i not in chosen]
    return inputs_back(cg, canonical(prog.order, prog.resident, outs, ins, op_waits, recs))


def _in_stream_order(prog) -> bool:
    """Whether ``prog`` is as :func:`~tfswap.core.program.canonical` leaves it, so
    :func:`_recomputed` may skip that."""
    keys = [(o.out_after, o.buf) for o in prog.outs]
    in_keys = [(r.need, r.buf) for r in prog.ins]
    return (keys == sorted(keys) and in_keys == sorted(in_keys)
            and all(list(r.waits) == sorted(r.waits) for r in prog.ins)
            and list(prog.op_waits) == sorted(prog.op_waits)
            and list(prog.resident) == sorted(prog.resident)
            and all(isinstance(r.ops, tuple) for r in prog.recomputes))


def _greedy(cg, prog, allocation, spec, order, base, in_order=False):
    """Take the candidates in ``order`` one at a time, each kept if the simulated
    step gets faster: (chosen, its simulation)."""
    chosen, best = {}, base
    for _, i, ops in order:
        trial = _recomputed(cg, prog, {**chosen, i: ops}, in_order)
        if {(r.buf, r.need) for r in trial.recomputes} - {(r.buf, r.need) for r in prog.recomputes} \
                - {(prog.ins[j].buf, prog.ins[j].need) for j in (*chosen, i)}:
            # Its ops read a buffer a recomputation makes only later: inputs_back
            # would make that one here instead (a segment), with ops for its own reader.
            continue
        result = try_program(cg, trial, allocation, spec)
        if result is None:   # an input away at that point, or no free object then
            continue
        if result.step_time_s < best.step_time_s:
            chosen[i] = ops
            best = result
    return chosen, best


def with_recomputes(problem: Problem, plan: Plan, spec: DeviceSpec, budget_bytes: int, *,
                    max_trials: int = MAX_TRIALS,
                    max_share_trials: int = MAX_SHARE_TRIALS) -> Plan:
    """``plan`` with the round trips that are cheaper to compute again made
    recomputations (see the module doc), then its recomputations moved to share
    ops with others (:func:`shared_remakes`, up to ``max_share_trials``
    simulations; 0: not); ``plan`` itself where nothing changes.

    ``budget_bytes``: what the plan's pool may take; a shared pool is laid out
    again for the new busy times and the change is dropped if it grows past it.
    """
    got = _round_trips_recomputed(problem, plan, spec, budget_bytes, max_trials)
    if max_share_trials <= 0:
        return got
    return shared_remakes(problem, got, spec, budget_bytes, max_trials=max_share_trials)


def _round_trips_recomputed(problem: Problem, plan: Plan, spec: DeviceSpec, budget_bytes: int,
                            max_trials: int) -> Plan:
    """The first half of :func:`with_recomputes`: round trips made recomputations."""
    if not problem.recomputable or plan.allocation is None or not plan.swaps:
        return plan
    cg = problem.compiled
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    found = candidates(problem, prog, spec)[:max_trials]
    if not found:
        return plan
    base = run_program(cg, prog, plan.allocation, spec)
    in_order = _in_stream_order(prog)
    # Two greedy passes, keeping the faster: the largest saving first, and the
    # cheapest recomputation for what it saves first (Capuchin's ranking).  An
    # expensive one taken early can bring inputs back that crowd out several
    # cheap ones, and the other way round.
    time_of = {i: sum(float(cg.op_time[op]) for op in ops) for _, i, ops in found}
    by_ratio = sorted(found, key=lambda e: (-e[0] / (time_of[e[1]] + 1e-9), e[1]))
    chosen, best = {}, base
    for order in (found, by_ratio):
        picked, result = _greedy(cg, prog, plan.allocation, spec, order, base, in_order)
        if result.step_time_s < best.step_time_s:
            chosen, best = picked, result
    allocation = plan.allocation
    while chosen:
        final = _recomputed(cg, prog, chosen, in_order)
        if not allocation.shared:
            break
        # Busy times moved, so the shared pool is laid out again; where it grows
        # past the budget, the last recomputations taken go first.
        # The compiled simulation's allocation events are the reference's
        # (tests/core/test_native.py); the reference runs where it cannot say.
        got = try_program_rows(cg, final, plan.allocation, spec, allocations=True)
        if got is None:
            result = run_program(cg, final, plan.allocation, spec, events=True)
            allocation = layout.shared_layout(result, plan.allocation)
        else:
            allocation = layout.shared_layout_rows(got[1].event_rows,
                                                   got[0].class_peak_objects, plan.allocation)
        if allocation.total_bytes <= budget_bytes:
            buffer_classes(cg, allocation)   # the classes still hold every buffer
            best = run_program(cg, final, allocation, spec)
            break
        del chosen[next(reversed(chosen))]
        allocation = plan.allocation
    if not chosen or best.step_time_s >= base.step_time_s:
        return plan
    swaps, resident = to_plan_swaps(cg, final)
    back = from_plan(cg, plan.schedule, swaps, resident)
    if back != final:
        # What runs is the swaps read back, which can differ from the program
        # chosen (a recomputation's inputs brought back another way): it must
        # run in the pool as well (an LSTM's gates remade through their Split:
        # read back, the chain remade a MatMul output the step still held).
        try:
            best = run_program(cg, back, allocation, spec, events=allocation.shared)
        except PlanError:
            return plan
        if allocation.shared and layout.conflicts(best, allocation):
            return plan
        if best.step_time_s >= base.step_time_s:
            return plan
    return dataclasses.replace(
        plan, swaps=swaps, resident_parameters=resident, allocation=allocation,
        prediction=Prediction(peak_bytes=best.peak_bytes, step_time_s=best.step_time_s,
                              ideal_time_s=best.ideal_time_s, swap_out_bytes=best.d2h_bytes,
                              swap_in_bytes=best.h2d_bytes))


def share_moves(cg, prog) -> list[tuple[int, int]]:
    """(index into ``prog.recomputes``, an earlier position) for each recomputation
    that may run before the op at that position instead, to share ops with a
    recomputation run there: one whose ops overlap its own, its copy dropped
    before then, and every value its ops read that they do not make already
    made by then (made later, a remake would read the value the buffer held
    before, or wait for it in TensorFlow).  Nearest position first, for each
    recomputation in stream order."""
    recs = prog.recomputes
    if len(recs) < 2:
        return []
    index = chain_index(cg, prog.order)
    graph = cg.graph
    chains = [recompute_ops(cg, r) for r in recs]
    by_op: dict[int, list[int]] = {}
    for i, ops in enumerate(chains):
        for op in ops:
            by_op.setdefault(op, []).append(i)
    moves = []
    for i, r in enumerate(recs):
        ops = set(chains[i])
        # The latest position a value its ops read (and do not make) is made at.
        ready = -1
        for op in ops:
            for name in graph.ops[op].inputs:
                t = index.tensor_of.get(name)
                if t is not None and graph.tensors[t].producer not in ops:
                    ready = max(ready, index.made_at[t])
        dropped = prog.outs[r.drop].out_after
        needs = {recs[j].need for op in ops for j in by_op[op]
                 if dropped < recs[j].need < r.need and recs[j].need > ready}
        moves += [(i, need) for need in sorted(needs, reverse=True)]
    return moves


def _moved(cg, prog, moves: dict) -> Program:
    """``prog`` with recomputation ``i`` made before the op at ``moves[i]``, the
    inputs of each brought back for it (:func:`inputs_back`)."""
    recs = [RecomputeRec(r.buf, r.drop, moves[i], r.ops) if i in moves else r
            for i, r in enumerate(prog.recomputes)]
    return inputs_back(cg, Program(prog.order, prog.resident, prog.outs, prog.ins,
                                   prog.op_waits, _recompute_order(prog.order, recs)))


def shared_remakes(problem: Problem, plan: Plan, spec: DeviceSpec, budget_bytes: int, *,
                   max_trials: int = MAX_SHARE_TRIALS) -> Plan:
    """``plan`` with recomputations moved earlier, each to run before the op another
    recomputation runs before whose ops overlap its own (:func:`share_moves`), where
    the simulated step gets faster: remakes before one op run the ops they share
    once (an LSTM cell's four gates, each remade through the cell's MatMuls, Add,
    BiasAdd and Split, at positions a few ops apart).  A moved recomputation holds
    its value from there, which the simulation prices.

    Each move is simulated alone, then the ones that helped are kept one at a
    time, the largest gain first, each while the step still gets faster (at most
    ``max_trials`` simulations in all).  A shared pool is laid out again and must
    stay within ``budget_bytes``; the last moves go first where it does not (at
    most MAX_SHARE_BACKOFFS times).  The bytes the step holds at once are the
    caller's to check where they must fit (:func:`tfswap.core.best_of.byte_planned`
    keeps the plan as it was beside this one): a simulation with events each,
    they tripled the default planner's time on BERT-base b64 (H100 bf16, Fig. 6).
    ``plan`` itself where no move helps."""
    if plan.allocation is None or max_trials <= 0 or \
            sum(s.kind == "recompute" for s in plan.swaps) < 2:
        return plan
    cg = problem.compiled
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    moves = share_moves(cg, prog)
    if not moves:
        return plan
    base = try_program(cg, prog, plan.allocation, spec)
    if base is None:   # not what this pass can judge: leave it as it is
        return plan
    trials = 0
    gains = []
    for i, need in moves:
        if trials >= max_trials:
            break
        trials += 1
        result = try_program(cg, _moved(cg, prog, {i: need}), plan.allocation, spec)
        if result is not None and result.step_time_s < base.step_time_s - MIN_SHARE_GAIN_S:
            gains.append((base.step_time_s - result.step_time_s, i, need))
    gains.sort(key=lambda e: (-e[0], e[1], e[2]))
    chosen: dict[int, int] = {}
    best = base
    for _, i, need in gains:
        if trials >= max_trials:
            break
        if i in chosen:
            continue
        trials += 1
        result = try_program(cg, _moved(cg, prog, {**chosen, i: need}), plan.allocation, spec)
        if result is not None and result.step_time_s < best.step_time_s - MIN_SHARE_GAIN_S:
            chosen[i] = need
            best = result
    for _ in range(MAX_SHARE_BACKOFFS):
        if not chosen:
            return plan
        final = _moved(cg, prog, chosen)
        allocation = plan.allocation
        fits = True
        if allocation.shared:
            # Busy times moved: the pool is laid out again (as with_recomputes does).
            got = try_program_rows(cg, final, plan.allocation, spec, allocations=True)
            if got is None:
                fits = False
            else:
                allocation = layout.shared_layout_rows(got[1].event_rows,
                                                       got[0].class_peak_objects,
                                                       plan.allocation)
                fits = allocation.total_bytes <= budget_bytes
        if fits:
            swaps, resident = to_plan_swaps(cg, final)
            back = from_plan(cg, plan.schedule, swaps, resident)
            try:
                best = run_program(cg, back, allocation, spec, events=allocation.shared)
            except PlanError:
                return plan
            if best.step_time_s >= base.step_time_s - MIN_SHARE_GAIN_S or (
                    allocation.shared and layout.conflicts(best, allocation)):
                return plan
            return dataclasses.replace(
                plan, swaps=swaps, resident_parameters=resident, allocation=allocation,
                prediction=Prediction(peak_bytes=best.peak_bytes, step_time_s=best.step_time_s,
                                      ideal_time_s=best.ideal_time_s,
                                      swap_out_bytes=best.d2h_bytes,
                                      swap_in_bytes=best.h2d_bytes))
        del chosen[next(reversed(chosen))]
    return plan


__all__ = ["MAX_CHAIN_OPS", "MAX_SHARE_BACKOFFS", "MAX_SHARE_TRIALS", "MAX_TRIALS",
           "MIN_SHARE_GAIN_S", "ChainIndex", "candidates", "chain_index", "share_moves",
           "shared_remakes", "value_chain", "with_recomputes"]
