"""Three-stream simulator of an augmented dataflow graph (SwapAdvisor Fig. 1).

Streams: compute runs the ops one at a time in schedule order; H2D runs the
swap-ins and D2H the swap-outs, each one copy at a time in the plan's stream
order (:mod:`tfswap.core.program`).  The link is duplex: a copy moves at its
direction's bandwidth, or at ``min(bandwidth, duplex / 2)`` while the other
direction is busy too (so a copy's rate changes when the other one starts or
ends).  A copy first holds its stream (and its direction of the link) for the
device's ``copy_latency_s``, then moves its bytes.  Every item starts as soon
as its stream is free and its dependencies are done:

* op: the swap-ins of its inputs, and the swap-outs that free the objects
  its outputs take (``Swap.out_before``);
* swap-in: its trigger op, the swap-outs that free its object, and, for a
  round trip, its own swap-out;
* swap-out: the op after which it is released (a drop takes no link time:
  it is done when that op is).

That is the planner's model (``copy_order="plan"``), for the time each copy
moves and for the pool's objects.  What TensorFlow's own allocator holds
(``SimResult.held_events``, with ``events=True``) differs in one point: a
SwapIn op allocates its output when it runs, once its trigger op, the
swap-outs it waits for and its input (its own swap-out, or a fetched
parameter's read) are done, which may be well before its copy reaches the
head of the plan's stream order (issue #44).  ``copy_order="ready"`` is how
TensorFlow runs the rewritten graph, for fidelity studies: each copy joins
its direction's queue when its swap op becomes ready (a swap-in then takes
its object), and its latency delays its completion, not the next copy
(:func:`simulate`).

A device whose copies run on the compute stream (``copies_on_compute``: the
emulated device with one executor thread) has one stream: one item at a
time, a ready swap-out, then a ready swap-in, before the next op, each
stream's items still in their order.

A recomputation (``Program.recomputes``, Capuchin's alternative to a swap)
runs the buffer's producer again on the compute stream right before the op
that needs it: that op starts the producer's time later, and the buffer
takes its object when the recomputation starts.  The producer's inputs must
be on the device then (an earlier recomputation before the same op may have made
it: ``Program.recomputes`` runs in its order), or be made by an earlier op of the same chain: such a
buffer (a chain through another buffer, e.g. attention scores made again to
make their softmax again) takes an object when the chain starts and gives it
back when the op the chain runs before ends.  Remakes before one op share
their work: an op an earlier chain there ran is not run again, and its
outputs are read where that run left them; a value an earlier chain made
there as its temporary that is a later chain's own is kept for its readers
instead of given back (moved from the buffer's fresh copy, where that run
made it there, to the buffer itself: the same bytes, one tensor in TF).

Memory is the plan's pool: a buffer takes an object of its size class from
a per-class LIFO stack of free object indices (initially ``[n-1, ..., 0]``,
so the first allocation gets object 0) when its op or swap-in starts, and
gives it back when its last reader ends (non-persistent buffers), or its
swap-out or drop is done.  At one instant, releases come before
allocations.  The allocation events are recorded so the pool allocator can
be replayed against them.  The ideal time (infinite memory, no swaps) is the
ops' times added in schedule order, which is what this code gives for an
empty plan.

Example::

    result = simulate(graph, plan, device_spec("v100-16g-pcie3"), events=True)
    result.step_time_s, result.ideal_time_s, result.peak_bytes, result.events[:3]
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from tfswap.core import liveness, native
from tfswap.core.allocation import default_allocation
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Allocation, Plan
from tfswap.core.program import (Program, _schedule_lookup, buffer_classes,
                                 copy_on_write_holds, from_plan, recompute_copies, recompute_ops)


class PlanError(RuntimeError):
    """The plan cannot run as given (a reader before its data, memory over the pool).

    A planner's own plans never raise it; a planner that judges feasibility by
    simulating turns it into :class:`~tfswap.core.infeasible.Infeasible` itself.
    """


class Deadlock(PlanError):
    """The plan waits for something that never happens; for replicas simulated
    together (:func:`simulate_replicas`), their plans wait for each other."""


@dataclass(frozen=True)
class SimEvent:
    """One item on one stream: ``stream`` is "compute", "h2d" or "d2h"; ``name`` is
    the op's name or the swapped tensor's; seconds from the start of the step."""
    stream: str
    name: str
    start_s: float
    end_s: float
    nbytes: int = 0


@dataclass(frozen=True)
class AllocationEvent:
    """A pool object taken (``is_alloc``) or given back, in simulated order.

    ``tensor``: the buffer's name (its root tensor, or "<op>:scratch");
    ``nbytes``: the buffer's size; ``size_class``/``object_index``: which
    object of the plan's allocation it occupies.
    """
    time_s: float
    is_alloc: bool
    tensor: str
    nbytes: int
    size_class: int
    object_index: int


@dataclass(frozen=True)
class SimResult:
    step_time_s: float
    ideal_time_s: float
    peak_bytes: int            # pool objects in use (at class size) + the small pool
    h2d_bytes: int
    d2h_bytes: int
    stall_s: float             # time the compute stream waited (last op end - op time)
    class_peak_objects: tuple[int, ...]
    events: tuple[SimEvent, ...] = ()
    allocation_events: tuple[AllocationEvent, ...] = ()
    # What TensorFlow's allocator holds (``events=True``, Python simulator): the
    # same takes and releases, but a swap-in takes its buffer when its SwapIn op
    # runs (its trigger op, the swap-outs it waits for and its input, its own
    # swap-out or a fetched parameter's read, done), which may be well before
    # its copy starts in the plan's stream order.
    held_events: tuple[AllocationEvent, ...] = ()


COPY_ORDERS = ("plan", "ready")


def run_program(cg: CompiledGraph, prog: Program, allocation: Allocation, spec: DeviceSpec,
                events: bool = False, moved: tuple | None = None,
                copy_order: str = "plan", issue_cost_s: float = 0.0,
                forwards: dict | None = None) -> SimResult:
    """Simulate ``prog`` (the reference simulator; the native one follows it).
    ``moved``: (bytes of each ``prog.outs`` record, of each ``prog.ins`` record)
    that the copies move, where they differ from their buffers' (see
    :func:`simulate`'s ``copy_bytes``); None: the buffers' bytes.
    ``copy_order``, ``issue_cost_s``: see :func:`simulate`.  ``forwards``: op id ->
    buffers of its inputs its kernel may write its output into (the held
    events only, :func:`held_peak_bytes`)."""
    _check_order(copy_order, issue_cost_s, spec)
    if not events and moved is None and copy_order == "plan":
        # The compiled port, which agrees to the bit (tests/core/test_native.py);
        # where it finds the program wrong, this one runs it to say how.
        fast = try_program(cg, prog, allocation, spec)
        if fast is not None:
            return fast
    buf_class = buffer_classes(cg, allocation).tolist()
    core = _simulate(cg, prog, buf_class, allocation, spec, events, moved,
                     copy_order == "ready", float(issue_cost_s), forwards=forwards)
    return SimResult(ideal_time_s=ideal_time(cg, prog.order), **core)


def try_program(cg: CompiledGraph, prog: Program, allocation: Allocation,
                spec: DeviceSpec, allocations: bool = False) -> SimResult | None:
    """:func:`run_program` with its defaults, or None where ``prog`` cannot run
    (where ``run_program`` raises :class:`PlanError`, not saying why): the
    planners' trial loops, which try many programs and keep those that run.
    ``allocations``: the result carries its ``allocation_events`` (as with
    ``events=True``, without the compute and copy events), what
    :func:`tfswap.core.layout.shared_layout` lays a pool out from."""
    got = try_program_rows(cg, prog, allocation, spec, allocations)
    if got is None:
        return None
    result, fast = got
    if not allocations:
        return result
    made = ()
    if allocations:
        names, sizes = cg.buf_names, cg.buf_bytes
        made = tuple(AllocationEvent(float(t), bool(take), names[b], int(sizes[b]), int(c),
                                     int(j))
                     for t, (take, b, c, j) in zip(fast.event_times.tolist(),
                                                   fast.event_rows.tolist()))
    return replace(result, allocation_events=made)


def try_program_rows(cg: CompiledGraph, prog: Program, allocation: Allocation,
                     spec: DeviceSpec, allocations: bool = False):
    """:func:`try_program` as (its result without ``allocation_events``, the compiled
    run, whose ``event_rows`` hold them as (take, buffer, class, object) rows with
    ``allocations``), or None: for a caller that reads the rows alone
    (:func:`tfswap.core.layout.shared_layout_rows`)."""
    # The buffers' classes, kept with the allocation for each compiled graph.
    classes = native.by_identity("classes", allocation, dict)
    got = classes.get(id(cg))
    if got is None or got[0] is not cg:
        got = classes[id(cg)] = (cg, buffer_classes(cg, allocation))
    buf_class = got[1]
    fast = native.simulate_program(cg, prog, allocation, spec, buf_class, events=allocations)
    if fast.status:
        return None
    return SimResult(step_time_s=fast.step_time_s, ideal_time_s=_ideal_time_of(cg, prog.order),
                     peak_bytes=fast.peak_bytes, h2d_bytes=fast.h2d_bytes,
                     d2h_bytes=fast.d2h_bytes, stall_s=fast.stall_s,
                     class_peak_objects=fast.class_peak_objects), fast


def _ideal_time_of(cg: CompiledGraph, order: tuple[int, ...]) -> float:
    """:func:`ideal_time`, kept on ``cg`` for the last few orders: the planners'
    trial loops simulate many programs of one order."""
    last = cg.cache("ideal_time_last")
    if last.get("order") is order:   # a trial loop's programs share the tuple
        return last["time"]
    key = order if isinstance(order, tuple) else tuple(int(o) for o in order)
    t = cg.memo("ideal_time", key, lambda: ideal_time(cg, key))
    if isinstance(order, tuple):
        last.update(order=order, time=t)
    return t


def _check_order(copy_order: str, issue_cost_s: float, spec: DeviceSpec) -> None:
    if copy_order not in COPY_ORDERS:
        raise ValueError(f"copy_order must be one of {COPY_ORDERS}, got {copy_order!r}")
    if not (issue_cost_s >= 0 and np.isfinite(issue_cost_s)):
        raise ValueError(f"issue_cost_s must be a finite number of seconds >= 0, got "
                         f"{issue_cost_s!r}")
    if issue_cost_s and copy_order != "ready":
        raise ValueError("issue_cost_s is a cost of issuing copies in the executor's order: "
                         "pass copy_order='ready' with it")
    if copy_order == "ready" and spec.copies_on_compute:
        raise ValueError("copy_order='ready' queues copies on their own streams; this "
                         "device runs them on the compute stream (copies_on_compute)")


def ideal_time(cg: CompiledGraph, order: Sequence[int]) -> float:
    """Step time with infinite memory and no swaps: the ops back to back.

    Added left to right, as the simulator advances its clock (and the native
    library its ideal time), so the three agree to the last bit.
    """
    t = 0.0
    for o in order:
        t = t + float(cg.op_time[o])
    return t


def _simulate(cg, prog, buf_class, allocation, spec, record, moved=None, ready_order=False,
              issue_cost_s=0.0, forwards=None):
    run = _device_run(cg, prog, buf_class, allocation, spec, record, moved, ready_order,
                      issue_cost_s, solo=True, forwards=forwards)
    try:
        next(run)
    except StopIteration as done:
        return done.value
    raise AssertionError("a device run alone yields nothing")


# The driver's message that ends a device's run (its generator returns its result).
_END = float("inf")


def _drive(runs, shared_link_bytes_per_s=None):
    """Run the devices' simulations (:func:`_device_run` generators) on one clock.

    Each round: a start pass on every device (again while any of them started
    something, so that members of a rendezvous the last one opened start at the
    same instant), then each device's next event under the link's shares (the
    copies moving in each direction on all devices at that moment), then every
    device advances to the earliest of them.  Returns each device's result."""
    for run in runs:
        next(run)
    while True:
        states = [run.send(None) for run in runs]
        while len(runs) > 1 and any(s[0] for s in states):
            states = [run.send(None) for run in runs]
        shares = (sum(s[1] for s in states), sum(s[2] for s in states))
        te = min(run.send(shares) for run in runs)
        if te == _END:
            break
        for run in runs:
            run.send(te)
    results = []
    for run in runs:
        try:
            run.send(_END)
        except StopIteration as done:
            results.append(done.value)
    return results


def _device_run(cg, prog, buf_class, allocation, spec, record, moved=None, ready_order=False,
                issue_cost_s=0.0, shared_link_bytes_per_s=None, rendezvous=None, solo=False,
                fifo=None, me=0, forwards=None):
    """One device's simulation as a generator :func:`_drive` steps (see there);
    ``solo``: the only device, run to its end by one ``next`` (no messages: the
    planner's loops simulate this way, and each message costs).
    ``shared_link_bytes_per_s``: what every device's copies in one direction move
    together (None: the link is this device's); ``fifo``: the :class:`_FifoLink`
    they take in turn, else they share it evenly; ``rendezvous``: position ->
    :class:`_Rendezvous` of the ops that start only together with other devices';
    ``me``: this device's index, to the link (ties go to the lower) and to a rendezvous."""
    order = prog.order
    n = len(order)
    times = [float(cg.op_time[o]) for o in order]
    outs, ins = prog.outs, prog.ins
    bb = cg.buf_bytes.tolist()
    # Bytes each copy moves: its buffer's, unless ``moved`` says otherwise.
    out_moved = list(moved[0]) if moved else [bb[o.buf] for o in outs]
    in_moved = list(moved[1]) if moved else [bb[r.buf] for r in ins]
    # Copies each record makes (each pays the latency): 1 unless ``moved`` says.
    out_parts = list(moved[2]) if moved else [1] * len(outs)
    in_parts = list(moved[3]) if moved else [1] * len(ins)
    pers, kept = cg.buf_persistent.tolist(), cg.buf_kept.tolist()
    # Each position's read and allocated buffers, as Python lists (indexed often).
    in_ptr, op_in = cg.op_in_ptr.tolist(), cg.op_in.tolist()
    out_ptr, op_out = cg.op_out_ptr.tolist(), cg.op_out.tolist()
    reads = [op_in[in_ptr[o]:in_ptr[o + 1]] for o in order]
    allocs = [op_out[out_ptr[o]:out_ptr[o + 1]] for o in order]

    # Memory: LIFO stacks of free object indices per class.
    counts = allocation.class_count
    stack = [list(range(c - 1, -1, -1)) for c in counts]
    in_use = [0] * len(counts)
    peak_use = [0] * len(counts)
    used_bytes = 0
    peak = 0
    obj = {}
    arrived = {}
    alloc_events = []

    # What TensorFlow's allocator holds (``SimResult.held_events``): the pool's
    # takes and releases, except that a swap-in holds its buffer from when its
    # SwapIn op runs (:func:`held_take`), not from when its copy starts.  Rows
    # [time, take, buffer, class, object]; a swap-in's object is filled in when
    # its copy takes it.
    held_rows = []
    held_row_of = {}   # swap-in index -> its row until its copy starts, or its object

    # Buffers whose held copy a swap-in made (``fetched``), and those an op
    # wrote its output into (``forwarded``: their release is the output's).
    fetched, forwarded = set(), set()

    def take(b, t, held=True):
        nonlocal used_bytes, peak
        arrived[b] = False
        c = buf_class[b]
        if not stack[c]:
            raise PlanError(f"{cg.buf_names[b]!r} needs an object of size class {c} at "
                            f"t={t:.6g}s but all {counts[c]} are in use")
        obj[b] = stack[c].pop()
        in_use[c] += 1
        peak_use[c] = max(peak_use[c], in_use[c])
        used_bytes += allocation.class_bytes[c]
        peak = max(peak, used_bytes)
        if record:
            alloc_events.append(AllocationEvent(t, True, cg.buf_names[b], int(bb[b]), c, obj[b]))
            if held:
                held_rows.append([t, True, b, c, obj[b]])

    def give(b, t):
        nonlocal used_bytes
        arrived.pop(b)
        c = buf_class[b]
        stack[c].append(obj[b])
        in_use[c] -= 1
        used_bytes -= allocation.class_bytes[c]
        if record:
            alloc_events.append(AllocationEvent(t, False, cg.buf_names[b], int(bb[b]), c, obj[b]))
            fetched.discard(b)
            if b in forwarded:   # its bytes live on as the output they became
                forwarded.discard(b)
            else:
                held_rows.append([t, False, b, c, obj[b]])

    # What each position waits for, and what is released when it ends.
    need_of = [[] for _ in range(n)]
    for i, r in enumerate(ins):
        need_of[r.need].append(i)
    waits_of = [[] for _ in range(n)]
    for k, j in prog.op_waits:
        waits_of[k].append(j)
    drops_of = [[] for _ in range(n)]
    for j, o in enumerate(outs):
        if not o.copy:
            drops_of[o.out_after].append(j)
    d2h_list = [j for j, o in enumerate(outs) if o.copy]
    recs_of = [[] for _ in range(n)]
    chain = {}
    copies = dict(zip(prog.recomputes, recompute_copies(cg, order, prog.recomputes)))
    for r in prog.recomputes:
        recs_of[r.need].append(r)
        chain[r] = recompute_ops(cg, r)   # a buffer may be made again more than once
    recompute_s = 0.0
    temps_of = [[] for _ in range(n)]   # buffers a chain made only for itself
    last = [-1] * cg.n_buffers
    for k in range(n):
        for b in reads[k]:
            last[b] = k
        for b in allocs[k]:
            last[b] = k
    # A checkpoint (a value a recomputation reads after the step's last reader:
    # value_chain's ``checkpoints``) is held until that recomputation's op ends.
    held_for = [[] for _ in range(n)]
    for r in prog.recomputes:
        made = {r.buf}
        fresh = copies[r]
        for p in chain[r]:
            for b in op_in[in_ptr[p]:in_ptr[p + 1]]:
                b = fresh.get(b, b)
                if b not in made and 0 <= last[b] < r.need and not pers[b] and not kept[b]:
                    last[b] = r.need
                    held_for[r.need].append(b)
            made.update(fresh.get(b, b) for b in op_out[out_ptr[p]:out_ptr[p + 1]])

    op_done = [False] * n
    in_done = [False] * len(ins)
    out_fin = [False] * len(outs)

    def out_done(j):
        return out_fin[j] if outs[j].copy else op_done[outs[j].out_after]

    # When each swap-in's SwapIn op runs (plan order, with events): TensorFlow
    # runs it once its control inputs (the trigger op, the swap-outs it waits
    # for) and its input are done: its own swap-out's host copy, or for a
    # parameter fetched from its host home the variable's read, an op of the
    # schedule; it allocates its output then, whatever the link is still
    # moving (the plan's stream order only says when its bytes move).
    # ``unmet``: what each one still waits for; ``after_op``/``after_out``: the
    # swap-ins each op and swap-out lets go (once per mention).
    issuing = record and not ready_order
    unmet = [0] * len(ins)
    after_op = [[] for _ in range(n)] if issuing else []
    after_out = [[] for _ in range(len(outs))] if issuing else []
    issued_now = []
    if issuing:
        position = {int(o): k for k, o in enumerate(order)}
        for i, r in enumerate(ins):
            ops = [r.trigger] if r.trigger >= 0 else []
            if r.own_out < 0:   # the parameter's read (not an op's output in cg)
                read = position.get(cg.graph.tensor(cg.buf_names[r.buf]).producer, -1)
                if read >= 0:
                    ops.append(read)
            for k in ops:
                after_op[k].append(i)
            for j in r.waits + ((r.own_out,) if r.own_out >= 0 else ()):
                after_out[j].append(i)
            unmet[i] = len(ops) + len(r.waits) + (r.own_out >= 0)
            if not unmet[i]:
                issued_now.append(i)

    def let_go(waiting):
        for i in waiting:
            unmet[i] -= 1
            if not unmet[i]:
                issued_now.append(i)

    # A kernel that may write its output into an input's buffer (TF's
    # forward_input_or_allocate_output: elementwise ops, ``forwards``) does so
    # when it holds that buffer's only reference.  A variable's value never is
    # (the variable holds it), nor an activation another op reads later: the
    # profiled run showed which forwards happened (``alias_of``).  A swap-in's
    # copy read for the last time is (no SwapOut reads it after: a drop, or
    # its last reader): TF then allocates no output (ResNet-50 at 60% with
    # parameters="auto": Adam's Sub and the new value's AddV2 wrote into the
    # fetched 9 MiB moments, two buffers at the peak the model counted, 7%
    # over the measured, issue #44).  The pool still gives the output its object.
    def forwarded_into(k):
        into = {}
        outs_now = [b for b in allocs[k] if not pers[b]]
        for s_ in forwards.get(int(order[k]), ()):
            if s_ not in fetched or s_ in forwarded or kept[s_]:
                continue
            # Its copy's last reader: a fetched parameter dropped or written back
            # after this op (no SwapOut op reads it: the rewrite frees it after
            # its last reader), or an activation's copy no SwapOut reads next.
            leaves = [o for o in outs if o.buf == s_ and o.out_after == k]
            if (not pers[s_]) if leaves else (pers[s_] or last[s_] != k):
                continue
            for b in outs_now:
                if b not in into and bb[b] == bb[s_]:
                    into[b] = s_
                    forwarded.add(s_)
                    break
        return into

    def held_take(t):
        # The swap-ins whose SwapIn ops run now hold their buffers from now
        # (after the releases of this instant, as TF frees a finished op's
        # inputs before it runs the ops that op made ready).
        for i in issued_now:
            b = ins[i].buf
            fetched.add(b)
            row = [t, True, b, buf_class[b], -1]
            if i in held_row_of:   # its copy started first: the object it took
                row[4] = held_row_of.pop(i)
            else:
                held_row_of[i] = row
            held_rows.append(row)
        issued_now.clear()

    ev = []
    t = 0.0
    for b in prog.resident:
        take(b, t)
        arrived[b] = True
    held_take(t)
    kc, hi, di = 0, 0, 0           # next item of each stream
    c_run = h_run = d_run = False
    c_end = h_rem = d_rem = h_lat = d_lat = 0.0
    c_start = h_start = d_start = 0.0
    last_op_end = 0.0
    h2d_bytes = d2h_bytes = 0
    lat = float(spec.copy_latency_s)
    serial = spec.copies_on_compute
    h_cur = d_cur = -1             # the copy each link stream is moving
    # Issue order (``ready_order``): copies not yet issued, in plan order; each
    # direction's queue of issued copies; copies whose bytes have moved and
    # that complete a latency later (time, sequence, is swap-in, index).
    pend_in, pend_out = (list(range(len(ins))), list(d2h_list)) if ready_order else ([], [])
    h_q, d_q, completing = deque(), deque(), []
    asked = {}   # (is swap-in, index) -> when it joined its queue (a shared FIFO link's turn)
    tickets = itertools.count()
    # Compute time the issued swap ops owe the compute stream (``issue_cost_s``),
    # as of ``debt_t``: paid by the op that runs then, absorbed while it waits.
    debt, debt_t = 0.0, 0.0

    def charge(parts):
        nonlocal c_end, debt, debt_t
        cost = issue_cost_s * parts
        if c_run:
            c_end += cost
        else:
            debt, debt_t = max(0.0, debt - (t - debt_t)) + cost, t

    def start_op():
        nonlocal c_run, c_start, c_end, recompute_s, debt
        if c_run or kc >= n or not all(in_done[i] for i in need_of[kc]) or not all(
                out_done(j) for j in waits_of[kc]):
            return False
        if rendezvous and kc in rendezvous and not rendezvous[kc].arrive(me):
            return False
        extra = 0.0
        # Remakes before one op share their runs (``ran``: op -> the buffers its
        # run here made): an op an earlier chain here ran is not run again, its
        # outputs read where that run left them (``alias``: this chain's name
        # for one -> where it is).  Where that run made this chain's own value
        # as its temporary, the value is this chain's, kept for its readers:
        # in its own buffer where that run made it in the buffer's fresh copy.
        ran = {}
        for r in recs_of[kc]:
            again = r.buf in arrived
            if again and r.buf not in temps_of[kc]:
                raise PlanError(f"recompute of {cg.buf_names[r.buf]!r} while it is "
                                "still on the device")
            made = {r.buf}
            fresh = copies[r]
            alias = {}
            moved_in = False
            for p in chain[r]:
                named = [fresh.get(b, b) for b in op_out[out_ptr[p]:out_ptr[p + 1]]]
                prev = ran.get(p)
                if prev is not None:
                    for i, (was, b) in enumerate(zip(prev, named)):
                        if was == b:
                            continue
                        if b != r.buf:
                            alias[b] = was
                            continue
                        if was not in temps_of[kc]:
                            raise PlanError(f"recomputing {cg.buf_names[r.buf]!r} reads it "
                                            f"as {cg.buf_names[was]!r}, which another "
                                            "recomputation keeps")
                        temps_of[kc].remove(was)
                        give(was, t)
                        take(r.buf, t)
                        arrived[r.buf] = True
                        prev[i] = r.buf
                        moved_in = True
                    continue
                for b in op_in[in_ptr[p]:in_ptr[p + 1]]:
                    b = fresh.get(b, b)
                    b = alias.get(b, b)
                    if b not in made and not arrived.get(b, False):
                        raise PlanError(f"recomputing {cg.buf_names[r.buf]!r} before op "
                                        f"{cg.graph.ops[order[kc]].name!r} reads "
                                        f"{cg.buf_names[b]!r}, which is not on the device")
                # A chain through another buffer makes it again for the chain
                # alone: it holds memory until the op the chain runs before ends.
                for b in named:
                    if b not in made or (again and b == r.buf):
                        if b in arrived:
                            raise PlanError(f"recomputing {cg.buf_names[r.buf]!r} makes "
                                            f"{cg.buf_names[b]!r} again while it is on the device")
                        take(b, t)
                        arrived[b] = True
                        made.add(b)
                        temps_of[kc].append(b)
                ran[p] = named
                if record:
                    ev.append(SimEvent("compute", "recompute:" + cg.graph.ops[p].name,
                                       t + extra, t + extra + float(cg.op_time[p])))
                extra += float(cg.op_time[p])
            if again:
                temps_of[kc].remove(r.buf)
            elif not moved_in:
                take(r.buf, t)
                arrived[r.buf] = True
        recompute_s += extra
        for b in reads[kc]:
            if not arrived.get(b, False):
                raise PlanError(f"op {cg.graph.ops[order[kc]].name!r} reads "
                                f"{cg.buf_names[b]!r}, which is not on the device "
                                "(add a swap-in before it)")
        into = forwarded_into(kc) if issuing and forwards else {}
        for b in allocs[kc]:
            take(b, t, held=b not in into)
            arrived[b] = True
        owed = max(0.0, debt - (t - debt_t)) if debt else 0.0
        debt = 0.0
        c_run, c_start, c_end = True, t + extra, t + extra + times[kc] + owed
        return True

    def in_ready(r):
        return ((r.trigger < 0 or op_done[r.trigger]) and all(out_done(j) for j in r.waits)
                and (r.own_out < 0 or out_done(r.own_out)))

    def take_in(i):
        r = ins[i]
        if r.buf in arrived:
            raise PlanError(f"swap-in of {cg.buf_names[r.buf]!r} while it is "
                            "still on the device")
        take(r.buf, t, held=not issuing)
        if issuing:   # its held row (made when its SwapIn op ran) gets the object
            if i in held_row_of:
                held_row_of.pop(i)[4] = obj[r.buf]
            else:   # its op runs later (a parameter read the plan's copy did not wait for)
                held_row_of[i] = obj[r.buf]

    def issue():
        # A swap op runs (and a swap-in allocates its buffer) once its inputs
        # and control inputs are done, whatever the plan's order; its copy
        # joins its direction's queue then.  A swap-in whose class has no free
        # object waits for one (the plan's waits normally make room first).
        waiting = []
        for i in pend_in:
            if in_ready(ins[i]) and stack[buf_class[ins[i].buf]]:
                take_in(i)
                h_q.append(i)
                asked[(True, i)] = t
                charge(in_parts[i])
            else:
                waiting.append(i)
        issued = len(waiting) < len(pend_in)
        pend_in[:] = waiting
        waiting = []
        for j in pend_out:
            if op_done[outs[j].out_after]:
                d_q.append(j)
                asked[(False, j)] = t
                charge(out_parts[j])
            else:
                waiting.append(j)
        issued = issued or len(waiting) < len(pend_out)
        pend_out[:] = waiting
        return issued

    def start_in():
        nonlocal h_run, h_start, h_rem, h_lat, h2d_bytes, h_cur
        if ready_order:
            if h_run or not h_q:
                return False
            if fifo is not None and not fifo.take(0, me, asked[(True, h_q[0])]):
                return False
            h_cur = h_q.popleft()
        else:
            if h_run or hi >= len(ins) or not in_ready(ins[hi]):
                return False
            if fifo is not None and not fifo.take(0, me, t):
                return False
            take_in(hi)
            h_cur = hi
        # Issue order: the latency delays the copy's completion, not the link.
        h_run, h_start, h_rem = True, t, float(in_moved[h_cur])
        h_lat = 0.0 if ready_order else lat * in_parts[h_cur]
        h2d_bytes += int(in_moved[h_cur])
        return True

    def start_out():
        nonlocal d_run, d_start, d_rem, d_lat, d2h_bytes, d_cur
        if ready_order:
            if d_run or not d_q:
                return False
            if fifo is not None and not fifo.take(1, me, asked[(False, d_q[0])]):
                return False
            d_cur = d_q.popleft()
        else:
            if d_run or di >= len(d2h_list) or not op_done[outs[d2h_list[di]].out_after]:
                return False
            if fifo is not None and not fifo.take(1, me, t):
                return False
            d_cur = d2h_list[di]
        d_run, d_start, d_rem = True, t, float(out_moved[d_cur])
        d_lat = 0.0 if ready_order else lat * out_parts[d_cur]
        d2h_bytes += int(out_moved[d_cur])
        return True

    def finish_in(i, start, end):
        r = ins[i]
        if record:
            ev.append(SimEvent("h2d", cg.buf_names[r.buf], start, end, int(bb[r.buf])))
        arrived[r.buf] = True
        in_done[i] = True

    def finish_out(j, start, end):
        if record:
            ev.append(SimEvent("d2h", cg.buf_names[outs[j].buf], start, end,
                               int(bb[outs[j].buf])))
        give(outs[j].buf, end)
        out_fin[j] = True
        if issuing:
            let_go(after_out[j])

    # With copies on the compute stream one item runs at a time, a ready
    # copy before the next op (they become ready when the same op ends; the
    # copies first keeps each object's take and release where the three-stream
    # model has them).
    starters = (start_out, start_in, start_op) if serial else (start_op, start_in, start_out)
    if ready_order:
        starters = (issue,) + starters
    end_t = 0.0       # its last event (the clock goes on while other devices run)
    msg = None if solo else (yield)
    while True:
        while msg is None:   # a start pass
            any_started, started = False, True
            while started:
                started = False
                for start in starters:
                    if serial and (c_run or h_run or d_run):
                        break
                    if start():
                        started = any_started = True
            msg = (yield (any_started, h_run, d_run)) if not solo else ()
        rh = spec.h2d_bytes_per_s if not d_run else min(spec.h2d_bytes_per_s,
                                                        spec.duplex_bytes_per_s / 2)
        rd = spec.d2h_bytes_per_s if not h_run else min(spec.d2h_bytes_per_s,
                                                        spec.duplex_bytes_per_s / 2)
        if shared_link_bytes_per_s is not None:   # msg: copies moving each way, all devices
            if h_run:
                rh = min(rh, shared_link_bytes_per_s / (1 if fifo else msg[0]))
            if d_run:
                rd = min(rd, shared_link_bytes_per_s / (1 if fifo else msg[1]))
        # A copy holds its stream for its latency, then moves its bytes.
        th = t + h_lat + h_rem / rh if h_run else float("inf")
        td = t + d_lat + d_rem / rd if d_run else float("inf")
        te = min(c_end if c_run else float("inf"), th, td,
                 completing[0][0] if completing else float("inf"))
        if not (c_run or h_run or d_run or completing):
            te = _END
        own, te = te, ((yield te) if not solo else te)
        if te == _END:
            break
        if te == own:        # something of this device's ends now
            end_t = te
        dt = te - t
        if c_run and c_end == te:
            o = order[kc]
            if record:
                ev.append(SimEvent("compute", cg.graph.ops[o].name, c_start, te))
            op_done[kc] = True
            last_op_end = te
            for b in reads[kc] + allocs[kc]:
                if not pers[b] and not kept[b] and last[b] == kc:
                    give(b, te)
            for j in drops_of[kc]:
                give(outs[j].buf, te)
            for b in temps_of[kc]:
                give(b, te)
            for b in held_for[kc]:
                if last[b] == kc and b in arrived:
                    give(b, te)
            if issuing:
                let_go(after_op[kc])
                for j in drops_of[kc]:
                    let_go(after_out[j])
            c_run = False
            kc += 1
        if h_run:
            if th == te:
                if ready_order:
                    heapq.heappush(completing, (te + lat, next(tickets), True, h_cur, h_start))
                else:
                    finish_in(h_cur, h_start, te)
                h_run = False
                if fifo is not None:
                    fifo.give(0)
                hi += 1
            elif dt <= h_lat:
                h_lat -= dt
            else:
                h_rem -= rh * (dt - h_lat)
                h_lat = 0.0
        if d_run:
            if td == te:
                if ready_order:
                    heapq.heappush(completing, (te + lat, next(tickets), False, d_cur, d_start))
                else:
                    finish_out(d_cur, d_start, te)
                d_run = False
                if fifo is not None:
                    fifo.give(1)
                di += 1
            elif dt <= d_lat:
                d_lat -= dt
            else:
                d_rem -= rd * (dt - d_lat)
                d_lat = 0.0
        while completing and completing[0][0] <= te:
            _, _, is_in, idx, start = heapq.heappop(completing)
            (finish_in if is_in else finish_out)(idx, start, te)
        if issued_now:
            held_take(te)
        t = te
        msg = (yield None) if not solo else None
    if kc < n or hi < len(ins) or di < len(d2h_list):
        raise Deadlock("the plan deadlocks: some op or copy waits for something that never "
                       "happens (check in_after, in_wait_for and out_before)")
    busy = 0.0
    for x in times:  # left to right, as the native simulator adds (not math.fsum)
        busy += x
    busy += recompute_s  # recomputation is work, not waiting
    return dict(
        step_time_s=end_t, peak_bytes=peak + allocation.small_pool_bytes,
        h2d_bytes=h2d_bytes, d2h_bytes=d2h_bytes, stall_s=max(0.0, last_op_end - busy),
        class_peak_objects=tuple(peak_use), events=tuple(ev),
        allocation_events=tuple(alloc_events),
        held_events=tuple(AllocationEvent(float(t_), take_, cg.buf_names[b], int(bb[b]), c, j)
                          for t_, take_, b, c, j in held_rows))


def live_peak_bytes(result: SimResult, small_pool_bytes: int = 0) -> int:
    """Peak of the bytes the pool's buffers really hold (their own sizes, not
    their classes') plus ``small_pool_bytes``: what an allocator without size
    classes (TF's on the emulated device) would have in use, each swap-in from
    when its SwapIn op runs (``SimResult.held_events``).  Needs a result
    simulated with ``events=True``.
    """
    live = peak = 0
    for e in _held_events(result, "live_peak_bytes"):   # time order, releases first
        live += e.nbytes if e.is_alloc else -e.nbytes
        peak = max(peak, live)
    return peak + int(small_pool_bytes)


def _held_events(result: SimResult, who: str) -> tuple[AllocationEvent, ...]:
    if not result.held_events and not result.events:
        raise ValueError(f"{who} needs the held allocation events: simulate with events=True "
                         "(the Python simulator; tfswap.core.simulator.simulate)")
    return result.held_events


def live_peak_bytes_timed(result: SimResult, cg: CompiledGraph, schedule: Sequence[str],
                          unheld: Sequence[str] = ()) -> int:
    """Like :func:`live_peak_bytes`, with the small-tensor pool's buffers live
    when they are, not at their peak throughout: a small buffer is live from
    the start of the op that makes it to the end of its last reader (position
    intervals, as :meth:`CompiledGraph.small_pool_peak` counts them; persistent
    ones always), added to the pool buffers' live bytes at the same instant.
    :func:`live_peak_bytes` adds the small pool's peak to the pool's, which is
    what a reserved small pool holds (the pool allocator) but over-counts what
    TF's allocator holds when the two peaks fall at different times (the
    unrolled LSTM, whose 4 KiB states make 40% of its peak, by ~0.5 MB).
    Needs a result simulated with ``events=True`` (a step whose buffers are all
    small has no allocation events, but its ops' events).  ``unheld``: buffers
    (root tensor names) whose own allocation is not the device's
    (:func:`held_peak_bytes`); their swap-ins are."""
    held = _without_first_holds(_held_events(result, "live_peak_bytes_timed"), unheld)
    order = cg.order_of(schedule)
    n = len(order)
    small_live = cg.small_live_bytes(order, frozenset(unheld))
    # Op k runs from its compute event's start; position at time t: the last
    # op started at or before t.
    name_pos = {cg.graph.ops[int(o)].name: k for k, o in enumerate(order)}
    starts = np.full(n, np.inf)
    for e in result.events:
        if e.stream == "compute" and e.name in name_pos:
            starts[name_pos[e.name]] = min(starts[name_pos[e.name]], e.start_s)
    starts = np.minimum.accumulate(starts[::-1])[::-1]   # monotone, for searchsorted
    live = peak = 0
    for e in held:   # time order, releases first
        live += e.nbytes if e.is_alloc else -e.nbytes
        k = max(0, int(np.searchsorted(starts, e.time_s, side="right")) - 1)
        peak = max(peak, live + int(small_live[k]))
    return int(max(peak, small_live.max(initial=0)))


def _without_first_holds(events, unheld: Sequence[str]):
    """``events`` less each ``unheld`` buffer's first take and the release that
    ends it: the buffer its producer made, not a swap-in's copy (a swap-in
    takes the buffer again only after its swap-out released it)."""
    if not unheld:
        return events
    pending = set(unheld)   # first take not seen yet
    holding = set()         # first take seen, its release not yet
    kept = []
    for e in events:
        if e.tensor in pending and e.is_alloc:
            pending.discard(e.tensor)
            holding.add(e.tensor)
            continue
        if e.tensor in holding and not e.is_alloc:
            holding.discard(e.tensor)
            continue
        kept.append(e)
    return tuple(kept)


def held_peak_bytes(graph: DataflowGraph, plan: Plan, spec: DeviceSpec, *,
                    keep: Sequence[str] = (), compiled: CompiledGraph | None = None,
                    unheld: Sequence[str] = (), forwards: dict | None = None) -> int:
    """The most bytes ``plan``'s step holds on the device at once where each
    buffer takes its own bytes: what an allocator that sizes each allocation
    to its tensor holds (TensorFlow's own, on the emulated device and on a GPU
    without tfswap's pool allocator).

    ``SimResult.peak_bytes`` is what the plan's pool takes instead: every
    buffer an object of its size class, and the small-tensor pool at its own
    peak throughout.  A search's pool may put a buffer in a class far larger
    than it (ResNet-50's host-homed 2.25 MiB and 4 MiB kernels fetched into
    9 MiB objects, a Transformer's 256 KiB activations into 521.5 KiB ones),
    which TensorFlow's allocator never holds: predicted as the pool's peak,
    those steps measured 19% and 24% below their prediction (issue #44).
    Here the same simulation counts the buffers at their sizes and the small
    ones while they live (:func:`live_peak_bytes_timed`).

    A swap-in is held from when TensorFlow runs its SwapIn op
    (``SimResult.held_events``), not from when the pool takes its object: the
    op allocates its output as soon as its trigger op and the swap-outs it
    waits for (its control inputs) and its input (its own swap-out, or a
    fetched parameter's read) are done, while its copy may wait on the link
    behind copies the plan's stream order puts first.  Counted from the
    copies' starts, swap-ins triggered well before the link reached them were
    missing from the peak (issue #44: ResNet-50 with its variables in host
    memory at 30%, the optimizer slots fetched with the step, measured 9% over
    that prediction; random fuzz steps up to 4.7%).  When the data arrives, and
    so the step's timing, is the plan's as simulated.  So the held peak may
    exceed the pool's (``SimResult.peak_bytes``) where an early swap-in meets
    the peak.  Arguments as :func:`simulate`'s.

    ``unheld``: tensors (buffer roots, pool or small) whose own buffer the
    device's allocator never gives during the step, though the plan keeps
    room for it: on the emulated device, the step's arguments, which the
    caller made before the step and which the device reads where they lie
    (a feed shares the host's buffer), so its measured peak does not count
    them (the CNN's 48 KiB batch, read again by the first convolution's
    filter gradient at the end of the backward pass, made its predictions 6-8%
    over the measured, issue #44).  A swap-in of one is the device's: counted.

    ``forwards``: op name -> its input tensors whose buffer its kernel writes
    its output into when it holds the only reference (TensorFlow's
    elementwise kernels).  A swap-in's copy read for the last time by such an
    op becomes that op's output: no new buffer (``run_program``).

    A remake that reads a variable after the update that waits for its reader
    (:func:`tfswap.core.program.copy_on_write_holds`) holds the variable's bytes
    once more, from the update's start to the end of the op the remake runs
    before: TensorFlow keeps the value read for it, and the update writes a copy.

    Example::

        held_peak_bytes(graph, plan, spec)   # bytes; the plan's prediction on the emulated device
    """
    cg = compiled or CompiledGraph.build(
        graph, plan.allocation.small_threshold_bytes if plan.allocation else 1 << 20, keep)
    result = simulate(graph, plan, spec, events=True, keep=keep, compiled=cg, forwards=forwards)
    roots = tuple(dict.fromkeys(liveness.buffer_root(graph, t) for t in unheld))
    return live_peak_bytes_timed(_with_copy_on_write(result, cg, plan), cg, plan.schedule, roots)


def _with_copy_on_write(result: SimResult, cg: CompiledGraph, plan: Plan) -> SimResult:
    """``result`` with its held events joined by the copies TensorFlow makes of
    variables a remake reads after their update (:func:`copy_on_write_holds`)."""
    if not any(s.kind == "recompute" for s in plan.swaps):
        return result   # no remake: nothing to read after an update
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    holds = copy_on_write_holds(cg, prog)
    if not holds:
        return result
    start, end = {}, {}
    for e in result.events:
        if e.stream == "compute":
            start.setdefault(e.name, e.start_s)
            end[e.name] = e.end_s
    names = [cg.graph.ops[int(op)].name for op in prog.order]
    extra = []
    for x, first, last in holds:
        name = f"{cg.buf_names[x]} (copy on write)"
        nbytes = int(cg.buf_bytes[x])
        extra += [AllocationEvent(start[names[first]], True, name, nbytes, -1, -1),
                  AllocationEvent(end[names[last]], False, name, nbytes, -1, -1)]
    # Time order, releases first at one instant (a stable sort keeps the rest's order).
    held = sorted(result.held_events + tuple(extra), key=lambda e: (e.time_s, e.is_alloc))
    return replace(result, held_events=tuple(held))


def simulate(graph: DataflowGraph, plan: Plan, spec: DeviceSpec, *, events: bool = False,
             keep: Sequence[str] = (), allocation: Allocation | None = None,
             compiled: CompiledGraph | None = None,
             copy_bytes: dict[str, int] | None = None,
             copy_parts: dict[str, int] | None = None,
             copy_order: str = "plan", issue_cost_s: float = 0.0,
             forwards: dict | None = None) -> SimResult:
    """Simulate ``plan`` on ``graph``.

    ``copy_bytes``: swap id -> bytes its copies move, where that is not the
    swapped buffer's size.  The planner moves buffers, but the rewrite moves the
    values the readers after the gap read (``tfswap.api._tensor_swaps``): only
    the slices read of an Unpack's or Split's buffer, or each value a buffer
    held in turn when TF forwarded it in place.  Memory is still the buffer's.
    ``copy_parts``: swap id -> how many copies the rewrite makes of it each way
    (one per value moved), each paying the device's ``copy_latency_s``; 1
    where not given.  Python simulator only (what fidelity studies use); the
    planner's native simulator prices one copy of the buffer.

    ``copy_order``: "plan" (the planner's model, what the native simulator
    does): each direction's copies run in the plan's stream order, a copy
    that is not ready holding up the ones after it, and a copy's latency
    holds its stream.  "ready" (how TensorFlow runs the rewritten graph): a
    swap op runs once its inputs and control inputs are done, a swap-in then
    allocates its buffer, and its copy joins its direction's queue, so copies
    run in the order they became ready (ties in plan order), on a GPU's copy
    stream as on the emulated link; the latency delays the copy's completion,
    not the next copy (the emulated link reserves the bytes when the op runs
    and completes it from a timer).  A split swap's parts are issued together.
    ``issue_cost_s`` (with "ready"): the compute time each copy the rewrite
    makes (``copy_parts``) costs when it is issued: on the emulated device the
    swap op's CPU work (dispatch, allocation, memcpy, completion) runs on the
    cores the compute runs on (``benchmarks/link_latency.py --overhead``
    measures it).  The op running then ends that much later; a compute stream
    waiting for a copy absorbs it.  Python simulator only.

    The pool is ``plan.allocation`` (or ``allocation``).  A version-1 plan has
    neither an allocation nor resident parameters: it is simulated with every
    parameter on the device and a pool of one class per size with as many
    objects as are live at once without swapping.
    Raises :class:`PlanError` if the plan cannot run as given.
    """

    cg, prog, allocation, moved = _program(graph, plan, keep, allocation, compiled, copy_bytes,
                                           copy_parts)
    return run_program(cg, prog, allocation, spec, events=events, moved=moved,
                       copy_order=copy_order, issue_cost_s=issue_cost_s,
                       forwards=_forward_buffers(graph, cg, forwards))


def _forward_buffers(graph: DataflowGraph, cg: CompiledGraph, forwards) -> dict | None:
    """``forwards`` (op name -> input tensor names its kernel may write its
    output into) as op id -> pool buffers."""
    if not forwards:
        return None
    by_op = {}
    for op, inputs in forwards.items():
        bufs = tuple(int(cg.tensor_buffer[graph.tensor_id(t)]) for t in inputs)
        bufs = tuple(b for b in bufs if b >= 0)
        if bufs:
            by_op[graph.op_id(op)] = bufs
    return by_op


def _program(graph, plan, keep, allocation, compiled, copy_bytes, copy_parts):
    """What :func:`simulate` runs: (compiled graph, program, pool, bytes moved)."""
    allocation = allocation or plan.allocation
    v1 = plan.allocation is None and not plan.resident_parameters
    thr = allocation.small_threshold_bytes if allocation else 1 << 20
    cg = compiled or CompiledGraph.build(graph, thr, keep)
    order = _schedule_lookup(cg, plan.schedule)[0]   # cg.order_of, kept for from_plan
    if allocation is None:
        allocation = default_allocation(cg, order, budget_bytes=np.iinfo(np.int64).max)
    swaps, copy_bytes, copy_parts = _whole_buffers(cg, plan.swaps, copy_bytes, copy_parts)
    prog = from_plan(cg, plan.schedule, swaps, None if v1 else plan.resident_parameters)
    moved = None
    if copy_bytes or copy_parts:
        copy_bytes, copy_parts = copy_bytes or {}, copy_parts or {}
        pos = {cg.graph.ops[o].name: k for k, o in enumerate(order)}
        tbuf = {t.name: int(cg.tensor_buffer[i]) for i, t in enumerate(cg.graph.tensors)}
        bb = cg.buf_bytes
        out_b, in_b = {}, {}
        for sw in swaps:
            b = tbuf[sw.tensor]
            what = (int(copy_bytes.get(sw.id, bb[b])), int(copy_parts.get(sw.id, 1)))
            if sw.kind == "round_trip":
                out_b[(b, pos[sw.out_after])] = what
            if sw.kind in ("round_trip", "prefetch"):
                in_b[(b, min(pos[c] for c in sw.consumers))] = what
        outs_w = [out_b.get((o.buf, o.out_after), (int(bb[o.buf]), 1)) for o in prog.outs]
        ins_w = [in_b.get((r.buf, r.need), (int(bb[r.buf]), 1)) for r in prog.ins]
        moved = ([w[0] for w in outs_w], [w[0] for w in ins_w],
                 [w[1] for w in outs_w], [w[1] for w in ins_w])
    return cg, prog, allocation, moved


def _whole_buffers(cg, swaps, copy_bytes, copy_parts):
    """``swaps`` with the round trips of one buffer that leave and come back
    together (the values a finished plan moves separately: the slices an Unpack
    made of it, ``tfswap.tf.tensor_swaps``) as the one buffer swap the planner
    planned, its readers all of theirs; ``copy_bytes`` and ``copy_parts`` (given
    per part) added up onto it.  (swaps, copy_bytes, copy_parts)."""
    tbuf = {t.name: int(cg.tensor_buffer[i]) for i, t in enumerate(cg.graph.tensors)}
    groups: dict[tuple, list] = {}
    for sw in swaps:
        if sw.kind == "round_trip" and tbuf.get(sw.tensor, -1) >= 0:
            groups.setdefault((tbuf[sw.tensor], sw.out_after, sw.in_after), []).append(sw)
    parts = [g for g in groups.values() if len(g) > 1]
    if not parts:
        return swaps, copy_bytes, copy_parts
    copy_bytes, copy_parts = dict(copy_bytes or {}), dict(copy_parts or {})
    whole_of, merged = {}, {}
    # A part's readers that a later trip of the buffer brings it back for
    # (tensor_swaps sends them the part's copy, which that trip leaves from)
    # are that trip's.
    read_in = {}
    for sw in swaps:
        if sw.kind == "round_trip" and tbuf.get(sw.tensor, -1) >= 0:
            for c in sw.consumers:
                read_in.setdefault((tbuf[sw.tensor], c), set()).add(
                    (sw.out_after, sw.in_after))
    for group in parts:
        first = group[0]
        whole_of.update({sw.id: first.id for sw in group})
        key = (first.out_after, first.in_after)
        own = [c for sw in group for c in sw.consumers
               if read_in.get((tbuf[first.tensor], c), {key}) == {key}]
        merged[first.id] = replace(first, consumers=tuple(dict.fromkeys(
            own or [c for sw in group for c in sw.consumers])), in_wait_for=tuple(dict.fromkeys(
                w for sw in group for w in sw.in_wait_for)))
        if any(sw.id in copy_bytes for sw in group):
            copy_bytes[first.id] = sum(copy_bytes.get(sw.id, sw.bytes) for sw in group)
        copy_parts[first.id] = sum(copy_parts.get(sw.id, 1) for sw in group)
    whole = []
    for sw in swaps:
        if sw.id in whole_of:
            if whole_of[sw.id] != sw.id:
                continue
            sw = merged[sw.id]
        whole.append(replace(sw, in_wait_for=tuple(dict.fromkeys(
            whole_of.get(w, w) for w in sw.in_wait_for))))
    return tuple(whole), copy_bytes, copy_parts


@dataclass(frozen=True)
class Replica:
    """One device's part of a replicated step, for :func:`simulate_replicas`:
    its lowered graph and plan, and what :func:`simulate` takes with them."""
    graph: DataflowGraph
    plan: Plan
    keep: Sequence[str] = ()
    compiled: CompiledGraph | None = None
    copy_bytes: dict[str, int] | None = None
    copy_parts: dict[str, int] | None = None


@dataclass(frozen=True)
class ReplicatedResult:
    """:func:`simulate_replicas`' result: the step ends when its last device does."""
    step_time_s: float
    devices: tuple[SimResult, ...]   # one per replica, in order, on the shared clock


class _Rendezvous:
    """Ops of several devices that start together (the members of a collective):
    each member's op starts once every member's is ready."""

    __slots__ = ("size", "arrived")

    def __init__(self, size: int):
        self.size, self.arrived = size, set()

    def arrive(self, who) -> bool:
        self.arrived.add(who)
        return len(self.arrived) >= self.size


class _FifoLink:
    """A link each direction of which (0: host to device, 1: back) moves one copy
    at a time, whichever device's asked first (ties: the lower device)."""

    __slots__ = ("owner", "waiting")

    def __init__(self):
        self.owner = [None, None]
        self.waiting = ({}, {})

    def take(self, direction: int, who: int, since: float) -> bool:
        waiting = self.waiting[direction]
        waiting.setdefault(who, since)
        if self.owner[direction] is not None or \
                min(waiting, key=lambda w: (waiting[w], w)) != who:
            return False
        self.owner[direction] = who
        del waiting[who]
        return True

    def give(self, direction: int) -> None:
        self.owner[direction] = None


def simulate_replicas(replicas: Sequence[Replica], spec: DeviceSpec, *,
                      rendezvous: Sequence[Sequence[str]] = (), events: bool = False,
                      copy_order: str = "plan", issue_cost_s: float = 0.0) -> ReplicatedResult:
    """Simulate the devices of a replicated step (one plan each) on one clock.

    Each device runs its plan as :func:`simulate` would, on its own streams,
    with two couplings.  The host's link: where ``spec.shared_link_bytes_per_s``
    is set, the copies of all devices in one direction share it as
    ``spec.shared_link_order`` says: "fair", those moving at one moment at an
    even share each (and at most their own device's rate), so a copy speeds up
    when another device's ends; "fifo", one at a time in the order they asked
    for it (the emulated link).  None: each device's link is its own.  The
    collectives: each group of ``rendezvous`` names one op per replica (in
    order), and none of them starts before all of them can (an all-reduce's
    members wait for each other).  ``spec`` is one device's, not its share
    (:meth:`DeviceSpec.shared_by` prices a plan made alone for the sharing; this
    is the sharing itself).

    Example::

        both = simulate_replicas([Replica(g0, plan0), Replica(g1, plan1)], spec,
                                 rendezvous=[("CollectiveReduceV2", "CollectiveReduceV2_1")])
        both.step_time_s, [d.peak_bytes for d in both.devices]
    """
    if not replicas:
        raise ValueError("simulate_replicas needs at least one replica")
    _check_order(copy_order, issue_cost_s, spec)
    setups = [_program(r.graph, r.plan, r.keep, None, r.compiled, r.copy_bytes, r.copy_parts)
              for r in replicas]
    at = [dict() for _ in replicas]   # each device's position -> its rendezvous
    for group in rendezvous:
        if len(group) != len(replicas):
            raise ValueError(f"a rendezvous names one op per replica ({len(replicas)}), got "
                             f"{list(group)}")
        meeting = _Rendezvous(len(replicas))
        for k, ((cg, prog, _, _), name) in enumerate(zip(setups, group)):
            positions = [i for i, o in enumerate(prog.order) if cg.graph.ops[o].name == name]
            if not positions:
                raise ValueError(f"the rendezvous op {name!r} is not among replica {k}'s "
                                 "scheduled ops")
            at[k][positions[0]] = meeting
    shared = spec.shared_link_bytes_per_s if len(replicas) > 1 else None
    fifo = _FifoLink() if shared is not None and spec.shared_link_order == "fifo" else None
    runs = [_device_run(cg, prog, buffer_classes(cg, alloc).tolist(), alloc, spec, events,
                        moved, copy_order == "ready", float(issue_cost_s),
                        shared_link_bytes_per_s=shared, rendezvous=at[k], fifo=fifo, me=k)
            for k, (cg, prog, alloc, moved) in enumerate(setups)]
    results = tuple(SimResult(ideal_time_s=ideal_time(cg, prog.order), **core)
                    for (cg, prog, _, _), core in zip(setups, _drive(runs)))
    return ReplicatedResult(max(r.step_time_s for r in results), results)
