"""The compiled planner + simulator: the genetic search's inner loop.

``pip install .`` builds ``planner_sim.cc`` next to this file; if that build
is missing or was made from other sources, :func:`library` compiles a copy
into ``~/.cache/tfswap/core-<hash>/`` with g++ (a second or two, once).
The library is plain C++ called through ctypes; it follows the reference
planner (:mod:`tfswap.core.planner`) and simulator exactly.

Example::

    cg = CompiledGraph.build(graph)
    ev = evaluate(cg, cg.order_of(None), allocation, spec)
    ev.step_time_s, ev.peak_bytes
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfswap.core.native.build import NativeLibrary
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec
from tfswap.core.plan import Allocation
from tfswap.core.program import (InRec, OutRec, Program, buffer_classes,
                                 recompute_copies, recompute_ops)

# The byte scan's question to Python for a chain the per-slot arrays do not hold
# (planner_sim.cc's ChainAtFn): (buffer, position, time out, buffers out) -> id.
CHAIN_AT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int32))


def _configure(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    lib.tfswap_plan_simulate.restype = ctypes.c_int
    lib.tfswap_plan_simulate.argtypes = (
        [ctypes.c_int, p, ctypes.c_int] + [p] * 10 + [p, p, ctypes.c_int, p, p, ctypes.c_int64]
        + [ctypes.c_double] * 4 + [ctypes.c_int, ctypes.c_double, ctypes.c_int]
        + [p, p, p, ctypes.c_int64, p, p, p, p])
    lib.tfswap_simulate_program.restype = ctypes.c_int
    lib.tfswap_simulate_program.argtypes = (
        [ctypes.c_int, p, ctypes.c_int] + [p] * 10 + [p, p, ctypes.c_int, p, p, ctypes.c_int64]
        + [ctypes.c_double] * 4 + [ctypes.c_int]
        + [ctypes.c_int, p, ctypes.c_int, p, ctypes.c_int, p, p, p, ctypes.c_int, p,
           ctypes.c_int, p, p, p, p, p] + [p, p, p, ctypes.c_int64, p, p])

    lib.tfswap_place_objects.restype = ctypes.c_int
    lib.tfswap_place_objects.argtypes = [ctypes.c_int] + [p] * 6
    lib.tfswap_byte_scan.restype = ctypes.c_int
    lib.tfswap_byte_scan.argtypes = (
        [ctypes.c_int] * 2 + [p] * 13 + [ctypes.c_int, p, ctypes.c_int64]
        + [ctypes.c_double] * 3 + [ctypes.c_int] + [ctypes.c_double] * 2 + [ctypes.c_int64]
        + [ctypes.c_int] + [p] * 6 + [ctypes.c_double, ctypes.c_int, ctypes.c_int, CHAIN_AT,
                                      ctypes.c_int64, p, ctypes.c_int, ctypes.c_int, p, p])
    lib.tfswap_byte_scan_fetch.restype = ctypes.c_int
    lib.tfswap_byte_scan_fetch.argtypes = [p] * 5


_LIBRARY = NativeLibrary(Path(__file__).resolve().parent / "planner_sim.cc",
                         "tfswap.core.native._planner_sim", "core", "libtfswap_core.so",
                         _configure)


def library() -> ctypes.CDLL:
    """Load (once) the native library, compiling it into the cache if needed."""
    return _LIBRARY.load()


@dataclass(frozen=True)
class Evaluation:
    """What one (schedule, allocation) gives; ``feasible`` False: some op cannot
    get its objects (then the time is infinite)."""
    feasible: bool
    step_time_s: float
    ideal_time_s: float
    stall_s: float
    peak_bytes: int
    h2d_bytes: int
    d2h_bytes: int
    n_swap_outs: int
    n_swap_ins: int
    passes: int
    class_peak_objects: tuple[int, ...] = ()
    program: Program | None = None


def _ptr(a: np.ndarray):
    return a.ctypes.data


_ARGS_LOCK = threading.Lock()


def _graph_args(cg: CompiledGraph):
    # Under a lock: evaluation threads share ``cg``, and a second thread's
    # cache entry replacing the first would free the arrays whose pointers the
    # first is about to pass to C.
    with _ARGS_LOCK:
        return _cached_graph_args(cg)


def _cached_graph_args(cg: CompiledGraph):
    cached = cg.__dict__.get("_native_args")
    if cached is None:
        arrays = [np.ascontiguousarray(a) for a in (
            cg.op_time, cg.buf_bytes, cg.buf_persistent, cg.buf_pinned, cg.buf_modified,
            cg.buf_kept, cg.op_in_ptr, cg.op_in, cg.op_in_write, cg.op_out_ptr, cg.op_out)]
        args = (cg.n_ops, _ptr(arrays[0]), cg.n_buffers, *[_ptr(a) for a in arrays[1:]])
        cached = (arrays, args)  # the arrays keep the pointers valid
        object.__setattr__(cg, "_native_args", cached)
    return cached[1]


@dataclass(frozen=True)
class ProgramRun:
    """:func:`simulate_program`'s result: ``status`` 0, or the reference's error kind
    (2: a pool object missing, 3: a deadlock, 4: a copy or read of a buffer that is
    not where the program says); the measures are valid where it is 0."""
    status: int
    step_time_s: float = 0.0
    stall_s: float = 0.0
    peak_bytes: int = 0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    class_peak_objects: tuple[int, ...] = ()
    # With events: the pool's allocations in order, times and (take, buffer,
    # class, object) rows.
    event_times: np.ndarray | None = None
    event_rows: np.ndarray | None = None


def _i32(values, width: int = 1) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values, dtype=np.int32).reshape(-1, width)
                                if len(values) else np.zeros((0, width), np.int32))


_IDENTITY: dict = {}
_IDENTITY_LOCK = threading.Lock()


def by_identity(what: str, obj, make):
    """``make()``, kept as ``what`` of ``obj`` for the last few ``obj`` by identity
    (``obj`` is held, so its id is not reused while kept): for what the
    planners' trial loops pass again and again, the same tuple or allocation,
    where hashing costs more than the cache saves.  Callers only read it."""
    key = (what, id(obj))
    got = _IDENTITY.get(key)
    if got is not None and got[0] is obj:
        return got[1]
    value = make()
    with _IDENTITY_LOCK:
        if len(_IDENTITY) >= 64:
            _IDENTITY.pop(next(iter(_IDENTITY)))
        _IDENTITY[key] = (obj, value)
    return value


_ORDERS: dict = {}   # order tuple -> its int32 array (read only), the last few
_LAST_ORDER: list = [(None, None)]


def _order_array(order) -> np.ndarray:
    """``order`` (a Program's tuple) as an int32 array, kept for the last few orders:
    the planners simulate many programs of one order, and converting it costs
    more than hashing it."""
    last = _LAST_ORDER[0]    # one tuple: read whole, whatever another thread does
    if last[0] is order:        # the same tuple: a trial loop's programs share it
        return last[1]
    got = _ORDERS.get(order) if isinstance(order, tuple) else None
    if got is None:
        got = np.ascontiguousarray(order, dtype=np.int32)
        if isinstance(order, tuple):
            got.flags.writeable = False
            if len(_ORDERS) >= 4:
                _ORDERS.pop(next(iter(_ORDERS)), None)
            _ORDERS[order] = got
    if isinstance(order, tuple):
        _LAST_ORDER[0] = (order, got)
    return got


def simulate_program(cg: CompiledGraph, prog: Program, allocation: Allocation,
                     spec: DeviceSpec, buf_class: np.ndarray,
                     events: bool = False) -> ProgramRun:
    """Simulate ``prog`` as :func:`tfswap.core.simulator.run_program` does with its
    defaults (one device, copies in plan order), recomputations included;
    ``buf_class``: the buffers' size classes under ``allocation``; ``events``:
    also return the pool's allocation events (what a shared layout is made from)."""
    lib = library()
    order = _order_array(prog.order)
    buf_class = np.ascontiguousarray(buf_class, dtype=np.int32)
    counts, sizes = by_identity("pool", allocation, lambda: (
        np.asarray(allocation.class_count, dtype=np.int64),
        np.asarray(allocation.class_bytes, dtype=np.int64)))
    resident = by_identity("i32", prog.resident, lambda: _i32(prog.resident))
    # Flat lists made into arrays at once (a list of tuples costs numpy twice as much).
    flat = []
    for o in prog.outs:
        flat += (o.buf, o.out_after, o.copy)
    outs = np.array(flat, np.int32).reshape(-1, 3)
    flat, wait_ptr, waits = [], [0], []
    for r in prog.ins:
        flat += (r.buf, r.trigger, r.own_out, r.need)
        waits += r.waits
        wait_ptr.append(len(waits))
    ins = np.array(flat, np.int32).reshape(-1, 4)
    wait_ptr = np.array(wait_ptr, np.int32)
    waits = np.array(waits or [0], np.int32)
    op_waits = by_identity("i32x2", prog.op_waits, lambda: _i32(prog.op_waits, 2))
    chains = [recompute_ops(cg, r) for r in prog.recomputes]
    recs = _i32([(r.buf, r.need) for r in prog.recomputes], 2)
    rec_ptr = np.ascontiguousarray(np.concatenate(
        [[0], np.cumsum([len(c) for c in chains], dtype=np.int64)]).astype(np.int32))
    rec_ops = _i32([op for c in chains for op in c])
    copies = recompute_copies(cg, prog.order, prog.recomputes)
    rec_fresh_ptr = np.ascontiguousarray(np.concatenate(
        [[0], np.cumsum([len(c) for c in copies], dtype=np.int64)]).astype(np.int32))
    rec_fresh = _i32([x for c in copies for pair in sorted(c.items()) for x in pair])
    metrics = np.zeros(2, dtype=np.float64)
    ints = np.zeros(4, dtype=np.int64)
    class_peak = np.zeros(max(1, len(counts)), dtype=np.int64)
    cap = 0
    if events:   # each take is given back at most once
        chain_outs = sum(int(cg.op_out_ptr[op + 1] - cg.op_out_ptr[op]) for c in chains for op in c)
        cap = 2 * (len(resident) + len(cg.op_out) + len(ins) + len(recs) + chain_outs) + 2
    event_t = np.zeros(max(cap, 1), dtype=np.float64)
    event_rec = np.zeros((max(cap, 1), 4), dtype=np.int32)
    status = lib.tfswap_simulate_program(
        *_graph_args(cg), _ptr(order), _ptr(buf_class), len(counts), _ptr(counts), _ptr(sizes),
        allocation.small_pool_bytes, spec.h2d_bytes_per_s, spec.d2h_bytes_per_s,
        spec.duplex_bytes_per_s, float(spec.copy_latency_s), int(spec.copies_on_compute),
        len(resident), _ptr(resident), len(outs), _ptr(outs), len(ins), _ptr(ins),
        _ptr(wait_ptr), _ptr(waits), len(op_waits), _ptr(op_waits), len(recs), _ptr(recs),
        _ptr(rec_ptr), _ptr(rec_ops), _ptr(rec_fresh_ptr), _ptr(rec_fresh), _ptr(metrics),
        _ptr(ints), _ptr(class_peak),
        cap, _ptr(event_t), _ptr(event_rec))
    if status == 5:
        raise RuntimeError(f"the compiled simulation made {int(ints[3])} allocation events, "
                           f"more than the {cap} it was given room for (a tfswap bug)")
    if status:
        return ProgramRun(int(status))
    n = int(ints[3])
    return ProgramRun(0, float(metrics[0]), float(metrics[1]), int(ints[0]), int(ints[1]),
                      int(ints[2]), tuple(int(x) for x in class_peak[:len(counts)]),
                      event_t[:n] if events else None, event_rec[:n] if events else None)


def evaluate(cg: CompiledGraph, order: np.ndarray, allocation: Allocation, spec: DeviceSpec, *,
             recency_margin_s: float = 0.0, params_start_on_host: bool = False,
             detail: bool = False, buf_class: np.ndarray | None = None) -> Evaluation:
    """Plan and simulate ``order`` under ``allocation`` (the GA's fitness).

    ``order``: op ids in schedule order (``cg.order_of(names)``; not checked
    here, for speed).  ``detail``: also return the planned Program.
    ``buf_class``: the buffers' size classes if already known.
    """
    lib = library()
    order = np.ascontiguousarray(order, dtype=np.int32)
    if len(order) != cg.n_ops:
        raise ValueError(f"order has {len(order)} ops, the graph {cg.n_ops}")
    if buf_class is None:
        buf_class = buffer_classes(cg, allocation)
    buf_class = np.ascontiguousarray(buf_class, dtype=np.int32)
    counts = np.asarray(allocation.class_count, dtype=np.int64)
    sizes = np.asarray(allocation.class_bytes, dtype=np.int64)
    metrics = np.zeros(3, dtype=np.float64)
    ints = np.zeros(8, dtype=np.int64)
    class_peak = np.zeros(max(1, len(counts)), dtype=np.int64)
    cap = 0
    d_out = d_in = d_wait = d_res = None
    if detail:
        cap = 2 * (len(cg.op_in) + len(cg.op_out) + cg.n_buffers) + 1
        d_out = np.zeros(3 * cap, np.int32)
        d_in = np.zeros(5 * cap, np.int32)
        d_wait = np.zeros(2 * cap, np.int32)
        d_res = np.zeros(max(1, cg.n_buffers), np.int32)
    status = lib.tfswap_plan_simulate(
        *_graph_args(cg), _ptr(order), _ptr(buf_class), len(counts), _ptr(counts), _ptr(sizes),
        allocation.small_pool_bytes, spec.h2d_bytes_per_s, spec.d2h_bytes_per_s,
        spec.duplex_bytes_per_s, float(spec.copy_latency_s), int(spec.copies_on_compute),
        float(recency_margin_s), int(params_start_on_host),
        _ptr(metrics), _ptr(ints), _ptr(class_peak), cap,
        *[None if a is None else _ptr(a) for a in (d_out, d_in, d_wait, d_res)])
    if status == 1:
        inf = float("inf")
        return Evaluation(False, inf, inf, inf, 0, 0, 0, 0, 0, 0)
    if status != 0:
        what = {2: "takes more pool objects than the allocation has",
                3: "deadlocks",
                4: "copies a buffer in while it is on the device, or runs an op before "
                   "its input is there"}.get(status, f"fails with status {status}")
        raise RuntimeError(f"the native planner made a plan that {what} (a planner bug); "
                           "please report it with the graph")
    program = None
    if detail:
        no, ni, nw, nr = (int(x) for x in ints[3:7])
        outs = tuple(OutRec(int(b), int(a), bool(c)) for b, a, c in d_out[:3 * no].reshape(-1, 3))
        ins = tuple(InRec(int(b), int(t), () if w < 0 else (int(w),), int(o), int(n))
                    for b, t, w, o, n in d_in[:5 * ni].reshape(-1, 5))
        waits = tuple((int(k), int(j)) for k, j in d_wait[:2 * nw].reshape(-1, 2))
        program = Program(tuple(int(o) for o in order), tuple(int(b) for b in d_res[:nr]),
                          outs, ins, waits)
    return Evaluation(True, float(metrics[0]), float(metrics[1]), float(metrics[2]),
                      int(ints[0]), int(ints[1]), int(ints[2]), int(ints[3]), int(ints[4]),
                      int(ints[7]), tuple(int(x) for x in class_peak[:len(counts)]), program)


def place_objects(iv_ptr: np.ndarray, iv_start: np.ndarray, iv_end: np.ndarray,
                  order: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The shared layout's offsets (:func:`tfswap.core.layout._place`'s packing):
    object ``r``'s busy intervals are ``iv_start/iv_end[iv_ptr[r]:iv_ptr[r+1]]``;
    objects placed in ``order``, each ``size[r]`` (aligned) bytes."""
    n = len(order)
    iv_ptr = np.ascontiguousarray(iv_ptr, dtype=np.int32)
    iv_start = np.ascontiguousarray(iv_start, dtype=np.int64)
    iv_end = np.ascontiguousarray(iv_end, dtype=np.int64)
    order = np.ascontiguousarray(order, dtype=np.int32)
    size = np.ascontiguousarray(size, dtype=np.int64)
    offset = np.zeros(max(n, 1), dtype=np.int64)
    library().tfswap_place_objects(n, _ptr(iv_ptr), _ptr(iv_start), _ptr(iv_end), _ptr(order),
                                   _ptr(size), _ptr(offset))
    return offset[:n]


@dataclass(frozen=True)
class ByteScanRecords:
    """:func:`byte_scan`'s records, unsorted, as the reference scan makes them:
    ``outs`` [n, 3] (buffer, out_after, copy), ``ins`` [n, 5] (buffer, trigger,
    own out, need, how many waits), ``waits`` (each in's in turn), ``op_waits``
    [n, 2], ``recs`` [n, 4] (buffer, drop, need, chain id)."""
    outs: np.ndarray
    ins: np.ndarray
    waits: np.ndarray
    op_waits: np.ndarray
    recs: np.ndarray


def byte_scan(order_args: tuple, cap: int, spec: DeviceSpec, lookahead, margin_s: float,
              chain_args: tuple | None, share_s_per_byte: float, cheapest: bool,
              chain_at=None, segment_bytes: int = 0, floor=None, retry: bool = False,
              shared_temps: bool = False):
    """One byte-cap scan (:class:`tfswap.core.byte_planner._ByteScan`, compiled):
    its :class:`ByteScanRecords`, or ``(position, bytes)`` where an op cannot get
    its bytes under ``cap``.  ``order_args``: the order's arrays
    (``byte_planner._Static.native_args``); ``chain_args``: the chains'
    (``byte_planner._Chains.native_args``) or None; ``chain_at``: with them,
    ``(buffer, position) -> (chain id, time, made, inputs) or None`` for the
    chains a segment asks for (ids from ``len`` of the arrays' chains on);
    ``segment_bytes``: ``_ByteScan.segment_bytes``; ``floor``: ``_Static.floor``
    (int64 per position; None: no drop is refused for it); ``retry``:
    ``_ByteScan.retry``; ``shared_temps``: ``_ByteScan.shared``."""
    lib = library()
    fail = np.zeros(2, dtype=np.int64)
    sizes = np.zeros(5, dtype=np.int64)
    callback = CHAIN_AT(0)
    n_chains = 0
    if chain_args is None:
        chain_args = (0, None, None, None, None, None, None)
    else:
        n_chains = len(chain_args[2]) - 1   # made_ptr
        chain_args = (1,) + tuple(_ptr(a) for a in chain_args)
        if chain_at is not None:
            def answer(b, need, time, out):
                got = chain_at(b, need)
                if got is None:
                    return -1
                cid, t, made, inputs = got
                time[0] = t
                flat = [len(made), *made, len(inputs), *inputs]
                for i, x in enumerate(flat):
                    out[i] = x
                return cid

            callback = CHAIN_AT(answer)
    status = lib.tfswap_byte_scan(
        *order_args, float(spec.h2d_bytes_per_s), float(spec.d2h_bytes_per_s),
        float(spec.copy_latency_s), int(lookahead is not None),
        float(lookahead) if lookahead is not None else 0.0, float(margin_s), int(cap),
        *chain_args, float(share_s_per_byte), int(cheapest), n_chains, callback,
        int(segment_bytes), _ptr(floor) if floor is not None else None, int(retry),
        int(shared_temps), _ptr(fail), _ptr(sizes))
    if status:
        return int(fail[0]), int(fail[1])
    n_out, n_in, n_wait, n_opw, n_rec = (int(x) for x in sizes)
    outs = np.zeros((n_out, 3), np.int32)
    ins = np.zeros((n_in, 5), np.int32)
    waits = np.zeros(max(n_wait, 1), np.int32)
    op_waits = np.zeros((n_opw, 2), np.int32)
    recs = np.zeros((n_rec, 4), np.int32)
    if lib.tfswap_byte_scan_fetch(_ptr(outs), _ptr(ins), _ptr(waits), _ptr(op_waits),
                                  _ptr(recs)):
        raise RuntimeError("the byte scan's records are gone (a tfswap bug)")
    return ByteScanRecords(outs, ins, waits[:n_wait], op_waits, recs)
