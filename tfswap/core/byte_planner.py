"""A swap planner that holds the step's live bytes under a cap (for the shared arena).

SwapAdvisor's planner (:mod:`tfswap.core.planner`) evicts within a size
class: when an op needs an object of class ``c`` and none is free, the
buffer of class ``c`` used farthest ahead goes.  That is exact for the
paper's pool, where each class has memory of its own.  With the shared
layout (:mod:`tfswap.core.layout`) memory is one arena, and what has to fit
is the bytes in use at once, not the objects per class; evicting only
within a class then moves tensors that are needed soon while a larger one
of another class idles (ResNet-50 at batch 512 on a 16 GiB V100: 39 GB
moved by the class planner against 26.7 GB by Capuchin's choice, which
counts bytes).

This planner scans the schedule keeping the planned live bytes at every
position under ``cap_bytes``:

* When an op needs memory (an output, or a swap-in of an input) and the
  bytes at its position would pass the cap, it evicts, across all classes,
  the resident activation whose next use is farthest (Belady), skipping the
  ones whose swap-out and the incoming copy would not finish in ideal time
  before the op starts (the planner's recency rule) while others remain.
  The evicted buffer is copied out after its last use before the gap; the
  allocation waits for that copy (``in_wait_for`` / ``out_before``), and the
  evicted bytes count as taken until that allocation starts, since no other
  allocation waits for the copy (a run slower than the simulation then
  still never holds both).
* A swap-in starts as early as the bytes it takes are free at every
  position up to its reader (and after its own swap-out's op), or, with
  ``lookahead`` set, no earlier than the last op that ends, in ideal time,
  ``lookahead`` copy times before its reader starts.

* With ``recomputable`` ops (Capuchin's other choice, issue #30): a buffer
  whose value those ops make again for at most a share of its round trip's
  copy time (:data:`RECOMPUTE_SHARES`) is *dropped* instead (after its last
  use, no copy, no wait) before any buffer is copied out, the one used
  farthest ahead first or the one cheapest per byte first
  (:data:`DROP_ORDERS`), and its ops run again right before its next use
  (:func:`tfswap.core.recompute.value_chain`: through buffers the step no
  longer holds then, which the chain holds while that op runs).  What those
  ops read is brought back for them and counts as used there.  Segments
  (gradient checkpointing, Chen et al.'s sqrt(n)): what a dropped buffer's
  ops read may be dropped too.  A dropped buffer is made again at the first
  of its next use and the remakes that read it (:meth:`_ByteScan._segment`),
  with the chain worked out for that position, and then stays on the device
  for its own readers; so a segment is made again forward from what is on
  the device, right before the op that needs its last buffer, and read
  backward.  A drop is refused where a chain for such a position is None,
  where it would run at the next position, where two chains would make the
  same temporary for the same op (except where chains read checkpoints:
  there remakes before one op share what they make, as the simulator and the
  rewrite run them, and it counts once), where what the remakes at a position make,
  the parameters and that op's own buffers would pass the cap (found out
  later, the scan failed: BERT-style at 40% on a 50 MB/s link kept no
  recomputation), or, for a segment, where what the remakes at one position
  make would pass :data:`SEGMENT_SHARE` of the cap.  Checkpoints
  (:data:`CHECKPOINT_VARIANTS`): chains may read a value the step no longer
  holds where it is, instead of making it again; the scan then holds that
  buffer past its last reader until the last remake that reads it (``ext``),
  refuses a drop whose checkpoint is gone already, never drops a checkpoint
  itself, and tries a drop refused at one position again at the next that
  drops (the remakes planned since can make room for it; so do the
  :data:`RETRY_VARIANTS` of the chains without checkpoints).  This
  is where recomputation pays: the swap plan is made knowing what was
  dropped (ResNet-50 b512 on a 16 GiB V100: 0.91 of ideal, 0.83 without
  segments, against 0.41 for the same planner copying only; BERT-base b64 on
  the H100 bf16: 0.73, 0.38 without segments).

Parameters and optimizer state stay on the device (as in the baselines but
ODSwap); the small-tensor pool is reserved out of the budget first.  The
plan's pool is one size class per size with as many objects as the
simulation uses.

Which allocator realises such a plan is the open question this module
measures (research/studies/arena_gap.py; docs/lab-notes/results-2026-11.md,
"Why rows miss 0.8 of ideal"): with ``memory="live"`` a plan fits when its live bytes do,
the baselines' model, which needs an allocator that places every
allocation where the plan says; tfswap's pool allocator reuses objects of a
class last-in first-out, and with ``memory="shared"`` the cap is lowered
until the plan's shared arena (:func:`tfswap.core.layout.shared_layout`)
fits, which is what that allocator can run.

Example::

    from tfswap.core import byte_planner
    plan = byte_planner.plan(graph, 16 << 30, device_spec("v100-16g-pcie3"))
    plan.prediction.peak_bytes <= 16 << 30           # live bytes within the budget
"""

from __future__ import annotations

import heapq
import warnings
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from tfswap.core import layout, native
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec, check_planner_arguments
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Allocation, Plan, Prediction
from tfswap.core.infeasible import InfeasibleAllocation
from tfswap.core.planner import default_allocation, ideal_times
from tfswap.core.program import (START, InRec, OutRec, Program, RecomputeRec, _recompute_order,
                                 _schedule_lookup, canonical, chain_copies, from_plan,
                                 inputs_back, to_plan_swaps)
from tfswap.core.recompute import ChainIndex, value_chain
from tfswap.core.simulator import PlanError, SimResult, run_program, try_program_rows

UNLIMITED = 1 << 62
MEMORY_MODELS = ("live", "shared")
# A buffer is made again instead of moved where its ops take at most this
# share of its round trip's copy time.  Which share is best depends on the
# step (on the simulated V100 at 16 GiB: ResNet-50 b512 gains most at 0.1,
# BERT-base b64 at 0.5; on the H100 bf16 BERT-base b64 at 0.25: 0.758 of ideal
# against 0.741 with 0.1 and 0.5), so each is tried and the fastest plan kept.
RECOMPUTE_SHARES = (0.1, 0.25, 0.5)
# Which of the buffers cheaper to make again is dropped first when the cap is
# passed: the one used farthest ahead (Belady: the drop relieves the most
# positions), or the one whose ops take the least time per byte (Capuchin's
# ranking: where nothing has to cross the link, the recomputation's time is
# the whole cost; Inception-V3 b256 on the simulated H100 bf16 at 16 GiB:
# 0.974 of ideal against 0.957 farthest first).
DROP_ORDERS = ("farthest", "cheapest")
# The (share, drop order) pairs :func:`variants` scans (a third item, where
# given: the variant's segment share, else :data:`SEGMENT_SHARE`).  On the Fig. 6 rows
# (V100 16 GiB and H100 bf16, 25 rows, TF's order, 2026-11-27) the
# cheapest-first order never gave the fastest plan at a share above 0.1 where
# 0.1 did not give one as fast, so it is scanned at 0.1 alone.
RECOMPUTE_VARIANTS = ((0.1, "farthest"), (0.1, "cheapest"), (0.25, "farthest"),
                      (0.5, "farthest"))
# A segment (a dropped buffer whose remake reads another dropped buffer, made
# again first, at the same position) is dropped only while what the remakes at
# each position make, temporaries included, takes at most this share of the
# cap less the parameters (kept on the device): the segment is held there at
# once, and only what it makes for itself leaves after that op.
SEGMENT_SHARE = 0.25
# The (share, drop order, segment share) variants scanned again with chains
# that may read checkpoints (``value_chain``'s ``checkpoints``: a value the step
# no longer holds, kept on the device until the remake instead of made again).
# A segment's remakes may then make up to the whole cap (less the parameters)
# at one position: on the Transformer at 40% of its peak on a 50 MB/s link,
# 2.34x of ideal against 7.71x without checkpoints (8.19x before them), and
# 7.15x with checkpoints at SEGMENT_SHARE; BERT-style 13.7x against 14.9x.
# Their remakes before one op share what their chains make (``_ByteScan.shared``):
# BERT-style at 40% (a saved problem, 2026-11-28) 5.00x -> 3.12x of ideal, where
# a GELU's two 2 MiB halves were each remade through the temporaries of the
# other; every other saved zoo and GPU problem plans as before.  Every variant
# scanned so (a study) lost elsewhere: LSTM-4 at 60% 2.03x -> 3.27x, and the
# H200 Transformer at 40% found no plan within its budget.
CHECKPOINT_VARIANTS = ((0.1, "cheapest", 1.0),)
# The (share, drop order, segment share) variants scanned again, where the
# fastest plan of the others still copies, with drops that a segment refused
# at one position tried again at the next that drops (``retry``; the others
# keep a refused drop refused, which the checkpoint variants do not: there
# a later position's remakes can make room).  A drop refused because two of
# its segment's remakes would make the same temporary for one op, or because
# the op there had no room beside them, often passes a few positions on, once
# other drops have moved the remakes.  Saved zoo problems on a 50 MB/s link
# (2026-11-28): LSTM-4 at 60% 1.65x -> 1.26x of ideal (the first variant);
# BERT-style at 40% 4.04x -> 3.56x, 4.91x -> 4.34x, 4.99x -> 4.44x in three
# profiles (the second).  As replacements they lost elsewhere (BERT-base b64
# on the H100 bf16: 0.766 -> 0.742 of ideal), so they are scanned beside them.
RETRY_VARIANTS = ((0.25, "farthest", SEGMENT_SHARE), (0.1, "cheapest", 1.0))
# The (share, drop order, segment share) variants scanned again, where the
# fastest plan of the others still copies, with remakes before one op sharing
# what their chains make (``shared_temps``) though no chain reads a checkpoint:
# an LSTM cell's gates, each remade through the cell's MatMuls, Add, BiasAdd and
# Split, then pass the segment rule where as four chains they were refused.
# The zoo's LSTM-4 at 60% on a 50 MB/s link (a saved problem, 2026-11-28):
# 1.47x -> 1.25x of ideal; every other saved zoo and H200 problem plans as before.
# Scanned beside the others: as their replacement, in every variant, sharing
# lost elsewhere (see CHECKPOINT_VARIANTS).
SHARED_VARIANTS = ((0.5, "farthest", SEGMENT_SHARE),)


# Caps guessed from the arena's overhead before the shared arena's cap is
# bisected (see _plan_in).
GUESSES = 2


# Orders whose order-only data a compiled graph keeps (the byte planner scans
# TF's order and the search's best; a few more cost little).
_MEMO_ORDERS = 8


def _memo(cg: CompiledGraph, what: str, key, make):
    """``make()``, kept on ``cg`` for the last few keys: the planners call this
    module many times over one graph and a few orders."""
    return cg.memo("byte_planner." + what, key, make, keep=_MEMO_ORDERS)


def _order_key(order) -> bytes:
    return np.asarray(order, dtype=np.int32).tobytes()


class _Static:
    """What a scan of one order reads and never changes (see :class:`_ByteScan`)."""

    def __init__(self, cg: CompiledGraph, order: list[int]):
        n = len(order)
        self.istart, self.iend = ideal_times(cg, order)
        self.pers, self.kept = cg.buf_persistent.tolist(), cg.buf_kept.tolist()
        self.pinned = cg.buf_pinned.tolist()
        self.nbytes = cg.buf_bytes.tolist()
        in_ptr, ins = cg.op_in_ptr.tolist(), cg.op_in.tolist()
        out_ptr, outs = cg.op_out_ptr.tolist(), cg.op_out.tolist()
        self.reads = [ins[in_ptr[o]:in_ptr[o + 1]] for o in order]
        self.allocs = [outs[out_ptr[o]:out_ptr[o + 1]] for o in order]
        self.uses = [[] for _ in range(cg.n_buffers)]
        for k in range(n):
            for b in self.reads[k] + self.allocs[k]:
                if not self.uses[b] or self.uses[b][-1] != k:
                    self.uses[b].append(k)
        self.last = [u[-1] if u else -1 for u in self.uses]
        self.both = [self.reads[k] + self.allocs[k] for k in range(n)]
        # Moved or dropped when room is needed (neither persistent nor pinned).
        self.movable = [not p and not q for p, q in zip(self.pers, self.pinned)]
        # What position k releases if it is still resident then (each once).
        self.release = [list(dict.fromkeys(
            b for b in self.both[k]
            if not self.pers[b] and not self.kept[b] and self.last[b] == k)) for k in range(n)]
        self.start = [b for b in range(cg.n_buffers) if self.pers[b]]
        # The Program's order and resident buffers (one tuple for every scan).
        self.order_tuple, self.resident = tuple(order), tuple(self.start)
        self.start_bytes = sum(self.nbytes[b] for b in self.start)
        # What the op at each position holds whatever the scan does: the
        # parameters and its own buffers (a drop whose remakes would add more
        # there than the cap leaves is refused, not found out later).
        self.floor = np.asarray([self.start_bytes + sum(
            self.nbytes[b] for b in set(self.both[k]) if not self.pers[b]) for k in range(n)],
            dtype=np.int64)
        self._native = None

    def native_args(self) -> tuple:
        """The order's arrays for :func:`tfswap.core.native.byte_scan` (made once)."""
        if self._native is None:
            arrays = [*_flat(self.reads), *_flat(self.allocs), *_flat(self.release),
                      *_flat(self.uses), np.asarray(self.last, np.int32),
                      np.asarray(self.movable, np.int32), np.asarray(self.nbytes, np.int64),
                      np.asarray(self.istart, np.float64), np.asarray(self.iend, np.float64)]
            start = np.asarray(self.start or [0], np.int32)
            self._native = (arrays + [start], (len(self.reads), len(self.uses),
                                               *[a.ctypes.data for a in arrays],
                                               len(self.start), start.ctypes.data,
                                               int(self.start_bytes)))
        return self._native[1]


def _flat(lists) -> tuple[np.ndarray, np.ndarray]:
    """``lists`` as (offsets, values) int32 arrays (values never empty, for ctypes)."""
    ptr = np.zeros(len(lists) + 1, np.int32)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    return ptr, np.asarray([b for x in lists for b in x] or [0], np.int32)


def _chain_buffers(cg: CompiledGraph, ops, b: int, need: int,
                   last_use) -> tuple[set[int], list[int]]:
    """The buffers ``ops`` make when they make ``b`` again before position ``need``,
    and the others they read (ascending): a buffer the step still holds then
    (``last_use``: the order's, :func:`tfswap.core.program.last_uses`) is made in
    its fresh copy (:func:`tfswap.core.program.fresh_copies`)."""
    made = {int(x) for op in ops for x in cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]]}
    read = {int(x) for op in ops for x in cg.op_in[cg.op_in_ptr[op]:cg.op_in_ptr[op + 1]]}
    copies = chain_copies(cg, ops, b, need, last_use)
    if copies:
        made = {copies.get(x, x) for x in made}
        read = {copies.get(x, x) for x in read}
    return made, sorted(read - made)


def _static(cg: CompiledGraph, order) -> _Static:
    return _memo(cg, "static", _order_key(order),
                 lambda: _Static(cg, [int(o) for o in order]))


def _chains(cg: CompiledGraph, order: list[int], allowed: frozenset,
            scratch: bool = False, checkpoints: bool = False) -> "_Chains":
    """The :class:`_Chains` of ``order`` for ``allowed`` (its memo shared by every
    scan of that order: a chain depends on the order and the ops alone);
    ``scratch``: chains may run ops with planned scratch; ``checkpoints``: they
    may read values the step no longer holds (``value_chain``)."""
    return _memo(cg, "chains", (_order_key(order), allowed, scratch, checkpoints),
                 lambda: _Chains(cg, order, allowed, scratch, checkpoints))


def _with_scratch(cg: CompiledGraph, allowed: frozenset) -> bool:
    """Whether an op that may run again has scratch worth planning."""
    free = max(cg.small_threshold_bytes, 1)
    return any(cg.graph.ops[op].scratch_bytes >= free for op in allowed)


class _Chains:
    """The value chains of one order for the ops that may run again, each worked
    out once: every bisection round and every share asks for the same ones."""

    def __init__(self, cg: CompiledGraph, order, allowed: frozenset, scratch: bool = False,
                 checkpoints: bool = False):
        self.cg, self.allowed, self.scratch = cg, allowed, scratch
        self.checkpoints = checkpoints
        self.index = ChainIndex(cg, order)
        self.memo: dict[tuple[int, int, int], tuple[tuple[int, ...], float] | None] = {}
        self.at_memo: dict[tuple[int, int], tuple[tuple[int, ...], float] | None] = {}
        self.native_memo: dict[tuple[int, int], tuple | None] = {}
        # The last position each tensor is read at.
        at = self.index.position_of_op
        self.last_read = [max((at[c] for c in t.consumers if c in at), default=-1)
                          for t in cg.graph.tensors]

    def native_args(self, static: _Static) -> tuple:
        """The chains for :func:`tfswap.core.native.byte_scan`, each worked out once:
        (the chain id of each use slot, its time, the buffers each chain makes, the
        others it reads), and the ops of each chain id in ``self.chain_ops``.  A
        scan asks for the chain of a buffer at its next use, so one per slot of
        ``static.uses`` but a buffer's first.  One id per ops and buffers made
        (the same ops make a fresh copy at one position and not at another)."""
        got = self.__dict__.get("_native")
        if got is None:
            self.chain_ids, self.chain_ops = {}, []
            self._made_l, self._inp_l = [], []
            slot, times = [], []
            for b, u in enumerate(static.uses):
                for c, need in enumerate(u):
                    chain = self.at(b, need) if c and static.movable[b] else None
                    if chain is None:
                        slot.append(-1)
                        continue
                    cid, _, _ = self._chain_id(chain[0], b, need)
                    if cid == len(times):
                        times.append(chain[1])
                    slot.append(cid)
            arrays = (np.asarray(slot or [0], np.int32), np.asarray(times or [0.0], np.float64),
                      *_flat(self._made_l), *_flat(self._inp_l))
            got = self.__dict__["_native"] = arrays
        return got

    def _chain_id(self, ops, b: int, need: int) -> tuple[int, list[int], list[int]]:
        """The id of ``ops`` making ``b`` again before ``need`` (a new one: the next),
        the buffers it makes and the others it reads."""
        made, inputs = self.buffers(ops, b, need)
        made = sorted(made)
        key = (ops, tuple(made))
        cid = self.chain_ids.get(key)
        if cid is None:
            cid = self.chain_ids[key] = len(self.chain_ops)
            self.chain_ops.append(ops)
            self._made_l.append(made)
            self._inp_l.append(inputs)
        return cid, made, inputs

    def buffers(self, ops, b: int, need: int) -> tuple[set[int], list[int]]:
        """:func:`_chain_buffers` of ``ops`` making ``b`` again before ``need``."""
        return _chain_buffers(self.cg, ops, b, need, self.index.last_use)

    def native_at(self, b: int, need: int):
        """:meth:`at` for the native scan (after :meth:`native_args`): (chain id,
        time, the buffers it makes, the others it reads), or None; a chain the
        arrays do not hold gets the next id."""
        key = (b, need)
        answer = self.native_memo.get(key, self)
        if answer is self:   # the scans of every cap and share ask again
            got = self.at(b, need)
            answer = None
            if got is not None:
                cid, made, inputs = self._chain_id(got[0], b, need)
                answer = (cid, got[1], made, inputs)
            self.native_memo[key] = answer
        return answer

    def read_value(self, b: int, need: int) -> int | None:
        """The position that made the value of ``b`` the ops from ``need`` on read:
        the one member of ``b`` made before ``need`` that some op at or after
        ``need`` reads.  None where they read several (a value and a view of it
        made before the gap, or two slices of it: a remake gives its readers
        one value) or none.  A view made after the value, read only before the
        gap, is no part of it: making it again would leave the readers of the
        value without one (fuzz seed 7354: ``mul_1`` and ``Reshape`` remade for
        a ``MatMul`` that reads ``mul_1:0``)."""
        index = self.index
        read = [i for i in index.members[b]
                if index.made_at[i] < need and self.last_read[i] >= need]
        return index.made_at[read[0]] if len(read) == 1 else None

    def at(self, b: int, need: int) -> tuple[tuple[int, ...], float] | None:
        """:meth:`of` for the value of ``b`` the ops from ``need`` on read
        (:meth:`read_value`), or None where there is no one such value."""
        key = (b, need)
        got = self.at_memo.get(key, self)
        if got is self:
            upto = self.read_value(b, need)
            got = self.at_memo[key] = self.of(b, upto, need) if upto is not None else None
        return got

    def of(self, b: int, upto: int, need: int) -> tuple[tuple[int, ...], float] | None:
        """The ops that make ``b``'s value as of ``upto`` again before ``need``, and
        their time; None where none may (:func:`~tfswap.core.recompute.value_chain`)."""
        key = (b, upto, need)
        if key not in self.memo:
            ops = value_chain(self.cg, self.index, b, upto, need, self.allowed, self.scratch,
                              self.checkpoints)
            self.memo[key] = (ops, sum(float(self.cg.op_time[op]) for op in ops)) \
                if ops else None
        return self.memo[key]


class _ByteScan:
    """One pass over the schedule under a byte cap (see the module docstring)."""

    def __init__(self, cg: CompiledGraph, order: np.ndarray, spec: DeviceSpec,
                 lookahead: float | None, margin_s: float, chains: _Chains | None = None,
                 share: float = RECOMPUTE_SHARES[0], drop_order: str = DROP_ORDERS[0],
                 segment_share: float = SEGMENT_SHARE, retry: bool | None = None,
                 shared_temps: bool | None = None):
        self.cg, self.order = cg, [int(o) for o in order]
        self.drop_order, self.segment_share = drop_order, segment_share
        # Recomputation (``chains``: None, none): a buffer whose value its ops
        # make again for at most ``share`` of its round trip is dropped and
        # made again instead of copied (see the module doc).
        self.chains = chains
        # Drops refused at one position tried again at the next (``retry``; None:
        # where chains read checkpoints, see :meth:`_drop_one`).
        self.retry = chains is not None and (chains.checkpoints if retry is None else retry)
        # Remakes before one op share what their chains make (``shared_temps``;
        # None: where chains read checkpoints, see :meth:`_segment`).
        self.shared = chains is not None and (chains.checkpoints if shared_temps is None
                                              else shared_temps)
        self.share_s_per_byte = share * (1.0 / spec.d2h_bytes_per_s + 1.0 / spec.h2d_bytes_per_s)
        self.n = n = len(self.order)
        self.never = 2 * n + 2
        self.h2d, self.d2h = spec.h2d_bytes_per_s, spec.d2h_bytes_per_s
        self.latency = float(spec.copy_latency_s)
        self.lookahead, self.margin = lookahead, float(margin_s)
        # What depends on the order alone, worked out once per order (every
        # bisection round, share and prefetch rule scans the same one); the scan
        # only reads it.
        static = _static(cg, self.order)
        self.istart, self.iend = static.istart, static.iend
        self.pers, self.kept = static.pers, static.kept
        # Never moved nor dropped: kept to the end, or not swappable (a variant, a
        # string, a handle); released after their last use like any other.
        self.pinned = static.pinned
        self.nbytes = static.nbytes
        self.reads, self.allocs = static.reads, static.allocs
        self.uses, self.last = static.uses, static.last
        self.both, self.movable, self.release = static.both, static.movable, static.release
        self.floor = static.floor

    def run(self, cap_bytes: int) -> Program:
        n, B = self.n, self.cg.n_buffers
        nb, pers = self.nbytes, self.pers
        # occ[k]: bytes planned on the device while the op at position k runs.
        self.occ = occ = np.zeros(n + 1, dtype=np.int64)
        self.cap = int(cap_bytes)
        self.resident = resident = [False] * B
        self.cursor = [0] * B
        self.version = [0] * B
        self.last_use = [-1] * B
        self.pending_out = [-1] * B
        self.last_out = [-1] * B
        self.stamp = [-1] * B
        self.heap = []   # (-next use, last use, buffer, version): the top is Belady's choice
        self.cheap = []  # the same, of buffers cheaper to make again than to move
        # Entries of ``cheap`` :meth:`_segment` refused at position ``refused_k``:
        # back in ``cheap`` at the next position that drops.
        self.refused, self.refused_k = [], -1
        self.chain_of = {}   # buffer -> the ops that make it again at its next use
        # Dropped buffer -> (its drop, the ops that make it again, the position they
        # run before): its next use, or the first remake that reads it, if earlier.
        self.remake: dict[int, tuple[int, tuple[int, ...], int]] = {}
        # Buffer -> the dropped buffers whose ops read it (a segment: a remake
        # that finds it dropped makes it again first, at its own position).
        self.readers: dict[int, set[int]] = {}
        # (temporary, the op it is made for) -> the remakes making it there.
        self.temps_for: Counter[tuple[int, int]] = Counter()
        # Where remakes share what they make (``shared``): (buffer, position) ->
        # the pending remakes there whose chains make it, counted in ``held`` once.
        self.made_at: Counter[tuple[int, int]] = Counter()
        self.temps_at: tuple[int, set[int]] = (-1, set())   # (k, temporaries in occ[k])
        # Checkpoints (chains that read a value the step no longer holds then,
        # ``value_chain``'s ``checkpoints``): buffer -> the last remake that reads
        # it (-1: none), held on the device until then; position -> the
        # checkpoints released there (each where its entry in ``ext`` still says).
        self.ext = [-1] * B
        self.ext_release: dict[int, list[int]] = {}
        self.held: dict[int, int] = {}   # position -> the bytes its pending remakes make
        self.outs, self.ins, self.op_waits, self.recs = [], [], [], []
        start = [b for b in range(B) if pers[b]]
        for b in start:
            resident[b] = True
        occ += sum(nb[b] for b in start)
        # What one position's remakes of a segment may make: a share of what the
        # cap leaves after the parameters.
        self.segment_bytes = int(self.segment_share * (self.cap - int(occ[0])))
        if occ[0] > self.cap:
            raise InfeasibleAllocation(
                f"parameters and optimizer state take {int(occ[0])} bytes, more than the cap "
                f"of {self.cap} (this planner keeps them on the device); raise the budget")
        stamp, use, version = self.stamp, self._use, self.version
        # occ is exact up to the position being planned (self.front); what a
        # change from some position on adds past it is self.lazy, added to each
        # next position as the scan reaches it (no slice per release).
        self.front, self.lazy = 0, 0
        for k in range(n):
            if k:
                occ[k] += self.lazy
                self.front = k
            both = self.both[k]
            for b in both:
                stamp[b] = k
            for b in self.reads[k]:
                if not resident[b]:
                    self._bring(b, k)
            for b in self.allocs[k]:
                if not resident[b]:
                    evicted = self._make_room(b, k)
                    self.op_waits += [(k, j) for j in evicted]
                    self._in_flight(evicted, k)
                    self._hold(b, k)
            for b in both:
                use(b, k)
            ext = self.ext
            for b in self.release[k]:
                if resident[b] and ext[b] <= k:
                    resident[b] = False
                    version[b] += 1
                    self.lazy -= nb[b]
            for b in self.ext_release.pop(k, ()):
                if resident[b] and ext[b] == k:
                    resident[b] = False
                    version[b] += 1
                    self.lazy -= nb[b]
        return inputs_back(self.cg, canonical(self.order, start, self.outs, self.ins,
                                              self.op_waits, self.recs))

    def _bring(self, b: int, k: int) -> None:
        """``b`` back on the device for the op at ``k``: made again if it was dropped,
        else copied in."""
        if b in self.remake:
            self._remake(b, k)
        else:
            self._swap_in(b, k)

    def _remake(self, b: int, k: int) -> None:
        """Run the ops that make ``b`` again right before the op at ``k``: their
        inputs brought back first (and kept there), then room for ``b`` and
        what the chain makes for itself, which it holds while that op runs."""
        j, ops, at = self.remake.pop(b)
        made, inputs = self._chain_buffers(ops, b, at)
        self._unmake(made, at)
        for x in inputs:
            self.readers[x].discard(b)
        if at != k:   # the drop rule makes every remake at its position; never here
            got = self.chains.at(b, k)
            ops = got[0] if got else ops
        resident = self.resident
        made, inputs = self._chain_buffers(ops, b, k)
        temps = sorted(made - {b})
        if self.shared:
            # A temporary an earlier remake before this op made (or a buffer one
            # made again, on the device now) is read where that one left it.
            if self.temps_at[0] != k:
                self.temps_at = (k, set())
            counted = self.temps_at[1]
            temps = [t for t in temps if t not in counted and not resident[t]]
            counted.update(temps)
        for x in inputs:
            self.stamp[x] = k
        for x in inputs:
            if not resident[x]:
                self._bring(x, k)
            # Read here: a later eviction or drop of it leaves after this op, not
            # after its last use by an op of the step.
            self.last_use[x] = max(self.last_use[x], k)
        nb = self.nbytes
        evicted = self._make_room(b, k, extra=sum(nb[t] for t in temps))
        self.op_waits += [(k, e) for e in evicted]
        self._in_flight(evicted, k)
        self.occ[k] += sum(nb[t] for t in temps)
        self._hold(b, k)
        self.recs.append(RecomputeRec(b, j, k, ops))

    def _next_use(self, b: int) -> int:
        u, c = self.uses[b], self.cursor[b]
        return u[c] if c < len(u) else self.never

    def _use(self, b: int, k: int) -> None:
        self.last_use[b] = k
        u = self.uses[b]
        c, n_u = self.cursor[b], len(u)
        while c < n_u and u[c] <= k:
            c += 1
        self.cursor[b] = c
        v = self.version[b] = self.version[b] + 1
        if self.movable[b] and self.last[b] != k:
            need = u[c] if c < n_u else self.never
            entry = (-need, k, b, v)
            heapq.heappush(self.heap, entry)
            chain = self.chains.at(b, need) if self.chains is not None else None
            if chain and chain[1] <= self.nbytes[b] * self.share_s_per_byte:
                self.chain_of[b] = chain[0]
                rank = chain[1] / self.nbytes[b] if self.drop_order == "cheapest" else 0.0
                heapq.heappush(self.cheap, (rank, entry))

    def _add_from(self, first: int, nbytes: int) -> None:
        """``nbytes`` more planned at every position from ``first`` on (at most one
        past the position being planned; see ``lazy`` in :meth:`run`)."""
        if first <= self.front:
            self.occ[first:self.front + 1] += nbytes
        self.lazy += nbytes

    def _hold(self, b: int, first: int) -> None:
        """``b`` is on the device from position ``first`` on."""
        self.resident[b] = True
        self.version[b] += 1
        self._add_from(first, self.nbytes[b])

    def _swap_in(self, b: int, k: int) -> None:
        nb = self.nbytes[b]
        evicted = self._make_room(b, k)
        prev = self.last_out[b]
        floor = max([self.outs[prev].out_after if prev >= 0 else START]
                    + [self.outs[j].out_after for j in evicted])
        if self.lookahead is not None:
            want = self.istart[k] - self.lookahead * (self.latency + nb / self.h2d)
            floor = max(floor, min(k - 1, bisect_right(self.iend, want) - 1))
        # The earliest trigger after which the bytes are free at every position to k.
        lo = floor + 1
        full = np.flatnonzero(self.occ[lo:k] + nb > self.cap)
        trigger = lo + int(full[-1]) if len(full) else floor
        self.ins.append(InRec(b, trigger, tuple(evicted), self.pending_out[b], k))
        self.pending_out[b] = -1
        self._in_flight(evicted, trigger + 1)
        self._hold(b, trigger + 1)

    def _in_flight(self, evicted: list[int], taken: int) -> None:
        """Count each evicted buffer again up to position ``taken``, where the allocation
        that waits for its copy-out takes its bytes: until then the copy may still run,
        and nothing else waits for it (so no other allocation may count on them)."""
        for j in evicted:
            o = self.outs[j]
            if taken > o.out_after + 1:
                self.occ[o.out_after + 1:taken] += self.nbytes[o.buf]

    def _make_room(self, incoming: int, k: int, extra: int = 0) -> list[int]:
        """Evict until ``incoming`` (and ``extra`` bytes) fit at position ``k``: the
        out records made (copies; a buffer cheaper to make again is dropped
        first, and the allocation needs no wait for it)."""
        occ, cap, nb = self.occ, self.cap, self.nbytes
        need = nb[incoming] + extra
        in_t = self.latency + nb[incoming] / self.h2d
        limit = self.istart[k] + self.margin
        evicted, put_back, recent = [], [], []
        while occ[k] + need > cap and self._drop_one(k):
            pass
        while occ[k] + need > cap:
            e = -1
            while self.heap:
                entry = heapq.heappop(self.heap)
                b = entry[2]
                if not self.resident[b] or self.version[b] != entry[3]:
                    continue          # stale: used or released since it was pushed
                if self.stamp[b] == k:
                    put_back.append(entry)
                elif self.iend[self.last_use[b]] + self.latency + nb[b] / self.d2h + in_t \
                        > limit:
                    recent.append(entry)  # evicting it would stall the op
                else:
                    e = b
                    break
            if e < 0 and recent:
                # Only recent ones are left: the one used farthest ahead.
                recent.sort()
                e = recent.pop(0)[2]
            if e < 0:
                op = self.cg.graph.ops[self.order[k]]
                raise InfeasibleAllocation(
                    f"op {op.name!r} needs {int(occ[k]) + need} bytes of pool buffers at once, "
                    f"more than the cap of {cap}; raise the budget")
            evicted.append(self._evict(e))
        for entry in put_back + recent:
            heapq.heappush(self.heap, entry)
        return evicted

    def _chain_buffers(self, ops, b: int, need: int) -> tuple[set[int], list[int]]:
        """The buffers ``ops`` make when they make ``b`` again before ``need``, and
        the others they read (:func:`_chain_buffers`)."""
        return self.chains.buffers(ops, b, need)

    def _drop_one(self, k: int) -> bool:
        """Drop the buffer cheaper to make again that comes first in the drop order
        (:data:`DROP_ORDERS`; not one the op at ``k`` uses, nor one :meth:`_segment`
        refuses, which is tried again at the next position that drops); False:
        none is left.  One the next op reads may go: it is made
        again right before that op, and the positions up to ``k`` are relieved
        (research/exact.py: a normalization and ReLU remade for the op right after
        the peak, where the rule "not needed right after" remade a convolution)."""
        if self.retry and self.refused_k < k:
            # Refused at an earlier position: tried again here, where the remakes
            # planned since (a segment's readers, what each position holds) can
            # differ (the Transformer at 40% on a 50 MB/s link: 8.19x -> 7.71x).
            # Where chains read checkpoints, and in RETRY_VARIANTS.
            for ranked in self.refused:
                heapq.heappush(self.cheap, ranked)
            self.refused.clear()
            self.refused_k = k
        skipped, dropped = [], False
        while self.cheap:
            ranked = heapq.heappop(self.cheap)
            entry = ranked[1]
            b = entry[2]
            if not self.resident[b] or self.version[b] != entry[3]:
                continue
            if self.stamp[b] == k or -entry[0] <= k:
                skipped.append(ranked)
                continue
            remakes = self._segment(b, -entry[0], self.chain_of[b], k)
            if remakes is None:
                if self.retry:
                    self.refused.append(ranked)
                continue
            q = self.last_use[b]
            self.resident[b] = False
            self.version[b] += 1
            self._add_from(q + 1, -self.nbytes[b])
            self.outs.append(OutRec(b, q, False))
            self.chain_of.pop(b)
            for x, (at, ops) in remakes.items():
                if x == b:
                    j = len(self.outs) - 1
                else:   # remade earlier than planned: for a remake that reads it
                    j, old, was = self.remake[x]
                    made, inputs = self._chain_buffers(old, x, was)
                    self._unmake(made, was)
                    self.temps_for.subtract((t, was) for t in made if t != x)
                    for i in inputs:
                        self.readers[i].discard(x)
                self.remake[x] = (j, ops, at)
            for x, (at, ops) in remakes.items():
                made, inputs = self._chain_buffers(ops, x, at)
                self._make(made, at)
                self.temps_for.update((t, at) for t in made if t != x)
                for i in inputs:
                    self.readers.setdefault(i, set()).add(x)
                    if self._checkpoint(i, at) and self.ext[i] < at:
                        self.ext[i] = at   # held until this remake has run
                        self.ext_release.setdefault(at, []).append(i)
            dropped = True
            break
        for entry in skipped:
            heapq.heappush(self.cheap, entry)
        return dropped

    def _checkpoint(self, i: int, at: int) -> bool:
        """Whether a remake at ``at`` reading ``i`` reads a checkpoint: a value the
        step no longer holds then (only chains with ``checkpoints`` read one)."""
        return 0 <= self.last[i] < at and self.movable[i]

    def _made_bytes(self, made) -> int:
        return sum(self.nbytes[t] for t in made)

    def _make(self, made, at: int) -> None:
        """A remake before position ``at`` makes ``made``: counted in ``held``
        (where remakes share what they make, each buffer once there)."""
        if not self.shared:
            self.held[at] = self.held.get(at, 0) + self._made_bytes(made)
            return
        new = 0
        for t in made:
            if not self.made_at[(t, at)]:
                new += self.nbytes[t]
            self.made_at[(t, at)] += 1
        self.held[at] = self.held.get(at, 0) + new

    def _unmake(self, made, at: int) -> None:
        """:meth:`_make` undone (the remake moved, or ran)."""
        if not self.shared:
            self.held[at] -= self._made_bytes(made)
            return
        for t in made:
            self.made_at[(t, at)] -= 1
            if not self.made_at[(t, at)]:
                del self.made_at[(t, at)]
                self.held[at] -= self.nbytes[t]

    def _segment(self, b: int, need: int, ops, k: int) -> dict | None:
        """The remakes dropping ``b`` at ``k`` sets (buffer -> (position, ops)), or None
        where it may not be dropped (:meth:`_segment_or_refusal`)."""
        return self._segment_or_refusal(b, need, ops, k)[0]

    def _segment_or_refusal(self, b: int, need: int, ops, k: int) -> tuple[dict | None, str]:
        """:meth:`_segment`'s remakes and "", or None and why the drop is refused
        (``research/studies/remat_diag.py`` reports these).

        ``b`` is made again at ``need`` (its next use) with ``ops``, or where a
        dropped buffer whose ops read it is made again first (:attr:`remake`),
        with its chain there.  A dropped buffer a remake reads is made again
        right before it, at its position (a segment: made forward from what is
        on the device, then read backward), with its chain there: each such
        one whose position moves earlier gets the chain of the new one, and so
        on through what that reads.  None where one of those chains is None,
        ``b``'s would run at ``k + 1`` or before, or two chains make the same
        temporary for the same op, unless remakes there share what they make
        (``shared``: the simulator runs an op that an earlier chain before the
        same op ran once, and the rewrite shares its copy; BERT-style at 40% of
        its peak on a 50 MB/s link, a GELU's 2 MiB halves each remade through
        the other's temporaries: 5.00x of ideal -> 3.12x)."""
        if self.ext[b] >= 0:
            return None, "a checkpoint a remake reads: held"
        at = min((self.remake[y][2] for y in self.readers.get(b, ())), default=need)
        if at < need:
            if at <= k + 1:
                return None, "a reader's remake at the next position"
            got = self.chains.at(b, at)
            if got is None:
                return None, "no chain at a reader's remake"
            if got[1] > self.nbytes[b] * self.share_s_per_byte:
                return None, "the chain at a reader's remake too slow"
            ops = got[0]
        remakes = {b: (at, ops)}
        todo = [b]
        while todo:
            y = todo.pop()
            at_y, ops_y = remakes[y]
            for x in self._chain_buffers(ops_y, y, at_y)[1]:
                if x == b:
                    return None, "a cycle through the segment"
                was = remakes[x][0] if x in remakes else \
                    self.remake[x][2] if x in self.remake else -1
                if was > at_y:
                    got = self.chains.at(x, at_y)
                    if got is None:
                        return None, "no chain for an input made earlier"
                    remakes[x] = (at_y, got[0])
                    todo.append(x)
        temps, freed = set(), set()
        held = {}   # position -> the bytes its remakes make, after this drop
        change = Counter()   # shared: (buffer, position) -> remakes making it there, more
        for x, (at_x, ops_x) in remakes.items():
            made, inputs = self._chain_buffers(ops_x, x, at_x)
            for i in inputs:
                # A checkpoint must still be on the device (or come back for a
                # reader of the step) to be held until the remake.
                if self._checkpoint(i, at_x) and max(self.last[i], self.ext[i]) < k:
                    return None, "a checkpoint it reads is gone"
            if self.shared:
                held.setdefault(at_x, self.held.get(at_x, 0))
                change.update((t, at_x) for t in made)
            else:
                for t in made:
                    if t != x:
                        if (t, at_x) in temps:
                            return None, "two of its chains make one temporary for an op"
                        temps.add((t, at_x))
                held[at_x] = held.get(at_x, self.held.get(at_x, 0)) + self._made_bytes(made)
            if x != b:
                was = self.remake[x][2]
                old = self._chain_buffers(self.remake[x][1], x, was)[0]
                if self.shared:
                    held.setdefault(was, self.held.get(was, 0))
                    change.subtract((t, was) for t in old)
                else:
                    freed.update((t, was) for t in old if t != x)
                    held[was] = held.get(was, self.held.get(was, 0)) - self._made_bytes(old)
        for (t, p), d in change.items():   # each buffer counted once at each position
            n = self.made_at[(t, p)]
            held[p] += self.nbytes[t] * ((n + d > 0) - (n > 0))
        if any(self.temps_for[t] and t not in freed for t in temps):
            return None, "another remake makes its temporary for that op"
        if any(v + self.floor[p] > self.cap for p, v in held.items()):
            # The op there could not get its own buffers beside the remakes'.
            return None, "an op with no room beside its remakes"
        if len(remakes) > 1 and any(v > self.segment_bytes for v in held.values()):
            # A segment: what one position makes again stays within its share.
            return None, "a segment past SEGMENT_SHARE"
        return remakes, ""

    def _evict(self, e: int) -> int:
        q = self.last_use[e]
        self.resident[e] = False
        self.version[e] += 1
        # Free after its last use for the allocation it is evicted for, which waits
        # for the copy-out; _in_flight counts it again up to where that one starts.
        self._add_from(q + 1, -self.nbytes[e])
        self.outs.append(OutRec(e, q, True))
        j = len(self.outs) - 1
        self.last_out[e] = j
        self.pending_out[e] = j if self._next_use(e) < self.never else -1
        return j


def _scan(cg: CompiledGraph, order, spec: DeviceSpec, cap_bytes: int, lookahead,
          margin_s: float, chains: "_Chains | None", share: float, drop_order: str,
          reference: bool = False, segment_share: float = SEGMENT_SHARE,
          retry: bool | None = None, shared_temps: bool | None = None) -> Program:
    """One byte-cap scan's program: the compiled scan
    (:func:`tfswap.core.native.byte_scan`), or with ``reference`` the Python one
    (:class:`_ByteScan`), which it follows exactly (tests/core/test_byte_planner.py)."""
    if reference:
        return _ByteScan(cg, order, spec, lookahead, margin_s, chains, share,
                         drop_order, segment_share, retry, shared_temps).run(int(cap_bytes))
    static = _static(cg, order)
    cap = int(cap_bytes)
    if static.start_bytes > cap:
        raise InfeasibleAllocation(
            f"parameters and optimizer state take {static.start_bytes} bytes, more than the "
            f"cap of {cap} (this planner keeps them on the device); raise the budget")
    share_s_per_byte = share * (1.0 / spec.d2h_bytes_per_s + 1.0 / spec.h2d_bytes_per_s)
    got = native.byte_scan(static.native_args(), cap, spec, lookahead, margin_s,
                           chains.native_args(static) if chains is not None else None,
                           share_s_per_byte, drop_order == "cheapest",
                           chains.native_at if chains is not None else None,
                           int(segment_share * (cap - static.start_bytes)), static.floor,
                           retry=chains is not None and (chains.checkpoints if retry is None
                                                         else retry),
                           shared_temps=chains is not None and (
                               chains.checkpoints if shared_temps is None else shared_temps))
    if isinstance(got, tuple):
        k, need = got
        op = cg.graph.ops[int(order[k])]
        raise InfeasibleAllocation(
            f"op {op.name!r} needs {need} bytes of pool buffers at once, "
            f"more than the cap of {cap}; raise the budget")
    # The records come in stream order (what canonical makes of the reference's).
    outs = tuple([OutRec(b, a, bool(c)) for b, a, c in got.outs.tolist()])
    waits = got.waits.tolist()
    ins, w = [], 0
    for b, t, own, need, n_w in got.ins.tolist():
        ins.append(InRec(b, t, tuple(waits[w:w + n_w]), own, need))
        w += n_w
    op_waits = tuple([tuple(x) for x in got.op_waits.tolist()])
    recs = ()
    if len(got.recs):
        ops_of = chains.chain_ops
        recs = _recompute_order(static.order_tuple, [RecomputeRec(b, j, k, ops_of[c])
                                                     for b, j, k, c in got.recs.tolist()])
    return inputs_back(cg, Program(static.order_tuple, static.resident, outs, tuple(ins),
                                   op_waits, recs))


def _check_lookahead(lookahead) -> None:
    if lookahead is not None and not lookahead >= 0:
        raise ValueError(f"lookahead must be None or >= 0 (copy times), got {lookahead!r}")


def build_program(cg: CompiledGraph, order: np.ndarray, spec: DeviceSpec, cap_bytes: int, *,
                  lookahead: float | None = None, recency_margin_s: float = 0.0,
                  recompute=frozenset(), recompute_share: float = RECOMPUTE_SHARES[0],
                  drop_order: str = DROP_ORDERS[0], reference: bool = False,
                  checkpoints: bool = False, segment_share: float = SEGMENT_SHARE,
                  retry: bool | None = None, shared_temps: bool | None = None) -> Program:
    """The swap program for ``order`` with at most ``cap_bytes`` of pool buffers
    planned at any position (module docstring).  Raises
    :class:`~tfswap.core.planner.InfeasibleAllocation` when an op's own buffers or
    the parameters do not fit.  ``recompute``: op ids that may run again;
    ``recompute_share``: a buffer whose ops take at most this share of its
    round trip's copy time is dropped and made again instead of copied, in
    ``drop_order`` (one of :data:`DROP_ORDERS`).  ``checkpoints``: chains may
    read checkpoints (values the step no longer holds, held until the remake:
    :func:`~tfswap.core.recompute.value_chain`); ``segment_share``: what the
    remakes at one position of a segment may make, of the cap less the
    parameters (:data:`SEGMENT_SHARE`); ``retry``: a drop refused at one position
    is tried again at the next that drops (None: where chains read checkpoints;
    :data:`RETRY_VARIANTS`); ``shared_temps``: remakes before one op share what
    their chains make, as the simulator and the rewrite run them, instead of
    refusing a drop whose chain makes what another there makes (None: where
    chains read checkpoints).  ``reference``: scan in Python (what the compiled
    scan is tested against).

    Example::

        prog = build_program(cg, cg.order_of(None), spec, 8 << 30)
    """
    if not isinstance(cap_bytes, (int, np.integer)) or cap_bytes <= 0:
        raise ValueError(f"cap_bytes must be an int > 0 (bytes), got {cap_bytes!r}")
    _check_lookahead(lookahead)
    if not recompute_share > 0:
        raise ValueError(f"recompute_share must be > 0 (of a round trip's copy time), got "
                         f"{recompute_share!r}")
    if drop_order not in DROP_ORDERS:
        raise ValueError(f"drop_order must be one of {DROP_ORDERS}, got {drop_order!r}")
    chains = _chains(cg, [int(o) for o in order], frozenset(recompute),
                     checkpoints=checkpoints) if recompute else None
    return _scan(cg, order, spec, int(cap_bytes), lookahead, recency_margin_s, chains,
                 recompute_share, drop_order, reference, segment_share, retry, shared_temps)


def _unlimited_pool(cg, order) -> Allocation:
    """One class per size, with an object for every buffer of the class: a scan's
    remakes hold buffers beside what TF's order holds at once (a chain's scratch
    beside its reader's own), so the objects TF's order uses at once are not
    enough; the plan keeps those its simulation used."""
    pool = default_allocation(cg, order, UNLIMITED)
    per_class = np.bincount(cg.buf_size_index, minlength=len(pool.class_count))
    return replace(pool, class_count=tuple(max(int(a), int(b))
                                           for a, b in zip(pool.class_count, per_class)))


def _simulated(cg, order, prog, spec, shared: bool) -> tuple[SimResult, Allocation]:
    """The program's simulation and the pool it used (shared: laid out)."""
    pool = _memo(cg, "pool", _order_key(order), lambda: _unlimited_pool(cg, order))
    got = try_program_rows(cg, prog, pool, spec, allocations=shared)
    if got is None:   # the reference says why
        result = run_program(cg, prog, pool, spec, events=shared)
        used = replace(pool, class_count=result.class_peak_objects)
        return result, (layout.shared_layout(result, pool) if shared else used)
    result, run = got
    used = replace(pool, class_count=result.class_peak_objects)
    return result, (layout.shared_layout_rows(run.event_rows, result.class_peak_objects, pool)
                    if shared else used)


def plan(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
         schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
         compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
         memory: str = "live", lookahead: float | None = None, rounds: int = 12,
         recomputable=()) -> Plan:
    """Plan ``graph`` in ``schedule`` (default: TF's order) under a byte cap: the
    fastest of :func:`variants`.

    ``memory="live"``: the cap is the budget less the small pool, and the plan
    fits when its simulated live bytes do (the baselines' model).  ``"shared"``:
    the cap is bisected (to ``rounds`` halvings' precision) towards the largest
    whose plan's shared arena plus small pool fits, the fastest plan of the caps
    tried that fit is kept, and it carries that layout.

    ``recomputable``: names of the ops that may run again; with some, the plan
    also drops and makes again the buffers cheaper to make again than to move
    (module doc), and of the plans with and without that the faster is kept.

    Example::

        plan(graph, 16 << 30, spec).prediction.step_time_s
        plan(graph, 16 << 30, spec, memory="shared").allocation.total_bytes
    """
    return min(variants(graph, budget_bytes, spec, schedule=schedule, keep=keep,
                        compiled=compiled, small_threshold_bytes=small_threshold_bytes,
                        memory=memory, lookahead=lookahead, rounds=rounds,
                        recomputable=recomputable),
               key=lambda p: p.prediction.step_time_s)


def variants(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
             schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
             compiled: CompiledGraph | None = None, small_threshold_bytes: int = 1 << 20,
             memory: str = "live", lookahead: float | None = None, rounds: int = 12,
             recomputable=(), swaps_alone: bool = True,
             checkpoints: bool | str = True) -> list[Plan]:
    """Every plan :func:`plan` chooses from (arguments as there): without
    recomputation (unless ``swaps_alone`` is False and ``recomputable`` names
    ops), and with it at each of :data:`RECOMPUTE_VARIANTS` when ``recomputable``
    names ops (twice where one of them has planned scratch: with chains that
    run such ops and without), where the fastest of those still copies at each
    of :data:`RETRY_VARIANTS` and :data:`SHARED_VARIANTS` too (as often), and,
    with ``checkpoints`` and where the fastest of those still copies, at each
    of :data:`CHECKPOINT_VARIANTS` with chains that read checkpoints (and run
    ops with planned scratch where some have it); ``checkpoints="only"``: those
    alone, whatever the others plan.  For a caller that improves each further
    before choosing (the shared search's recomputation pass).  Raises
    :class:`~tfswap.core.infeasible.InfeasibleAllocation` when none fits.

    Example::

        fastest = min(variants(graph, 16 << 30, spec, recomputable=ops),
                      key=lambda p: p.prediction.step_time_s)
    """
    check_planner_arguments(budget_bytes, spec)
    _check_lookahead(lookahead)
    if memory not in MEMORY_MODELS:
        raise ValueError(f"memory must be one of {MEMORY_MODELS}, got {memory!r}")
    if compiled is not None and compiled.graph is not graph:
        raise ValueError("compiled was built from another graph; pass "
                         "CompiledGraph.build(graph, ...) of this graph")
    cg = compiled or CompiledGraph.build(graph, small_threshold_bytes, keep)
    order = _schedule_lookup(cg, schedule)[0]   # cg.order_of(schedule), kept
    room = int(budget_bytes) - cg.small_pool_peak(order)
    if room <= 0:
        raise InfeasibleAllocation(f"small tensors alone need {budget_bytes - room} bytes, more "
                                   f"than the budget of {budget_bytes}; raise the budget")

    names = set(recomputable)
    allowed = frozenset(i for i, op in enumerate(graph.ops) if op.name in names)
    chains = _chains(cg, [int(o) for o in order], allowed) if allowed else None
    # Chains through ops with planned scratch (an Einsum's) are scanned as
    # variants of their own: on the Transformer at 60% on a 50 MB/s link they
    # remake the attention scores (3.07x -> 1.22x of ideal), on BERT-style at
    # 40% the scan without them plans faster (22.9x against 27.0x).
    wide = _chains(cg, [int(o) for o in order], allowed, scratch=True) \
        if allowed and _with_scratch(cg, allowed) else None
    plans, refused = [], None
    # The variants' scans often make the same program (a recomputing one that
    # dropped nothing at some cap): each program is simulated once.
    simulated = {}
    tries = []   # (chains, share, drop order, segment share, retry, shared temporaries)
    if checkpoints != "only":
        if swaps_alone or not chains:
            tries.append((None, 1.0, DROP_ORDERS[0], SEGMENT_SHARE, None, None))
        tries += [(c, share, drop_order, SEGMENT_SHARE, None, None) for c in (chains, wide) if c
                  for share, drop_order in RECOMPUTE_VARIANTS]

    def scan(tried) -> None:
        nonlocal refused
        choice, share, drop_order, segment_share, retry, shared_temps = tried
        try:
            plans.append(_plan_in(graph, cg, order, room, budget_bytes, spec, choice, share,
                                  memory=memory, lookahead=lookahead, rounds=rounds,
                                  drop_order=drop_order, simulated=simulated,
                                  segment_share=segment_share, retry=retry,
                                  shared_temps=shared_temps))
        except InfeasibleAllocation as err:
            refused = err
        except PlanError as err:   # the scan planned what the simulator cannot run
            warnings.warn(f"byte planner: a plan with recomputation (share {share}) was "
                          f"rejected by the simulator ({err}); kept the others. This is a "
                          "planner bug: please report it with the graph", RuntimeWarning,
                          stacklevel=3)

    for tried in tries:
        scan(tried)

    def copies() -> bool:
        return not plans or bool(min(plans, key=lambda p: p.prediction.step_time_s)
                                 .prediction.swap_out_bytes)

    if checkpoints != "only" and (RETRY_VARIANTS or SHARED_VARIANTS) and copies():
        for c in (chains, wide):
            for share, drop_order, segment_share in (RETRY_VARIANTS if c else ()):
                scan((c, share, drop_order, segment_share, True, None))
            for share, drop_order, segment_share in (SHARED_VARIANTS if c else ()):
                scan((c, share, drop_order, segment_share, None, True))
    # Checkpoints where the fastest plan so far still copies (a plan that moves
    # nothing has no copy for them to save; their chains cost planning time).
    if allowed and (checkpoints == "only" or checkpoints and copies()):
        held = _chains(cg, [int(o) for o in order], allowed, scratch=wide is not None,
                       checkpoints=True)
        for share, drop_order, segment_share in CHECKPOINT_VARIANTS:
            scan((held, share, drop_order, segment_share, None, None))
    if not plans:
        raise refused or InfeasibleAllocation("no variant to scan")
    return plans


def _plan_in(graph, cg, order, room, budget_bytes, spec, chains, share, *, memory, lookahead,
             rounds, drop_order=DROP_ORDERS[0], simulated=None, segment_share=SEGMENT_SHARE,
             retry=None, shared_temps=None):
    """The plan of one variant; ``simulated``: program -> (result, pool) of the
    programs simulated already (filled in)."""
    simulated = {} if simulated is None else simulated

    def attempt(cap):
        prog = _scan(cg, order, spec, int(cap), lookahead, 0.0, chains, share, drop_order,
                     segment_share=segment_share, retry=retry, shared_temps=shared_temps)
        got = simulated.get(prog)
        if got is None:
            got = simulated[prog] = _simulated(cg, order, prog, spec, memory == "shared")
        return (prog,) + got

    # What must fit the budget: the plan's shared arena, or its simulated live
    # bytes (the scan plans by positions, the simulation runs in time: swap-ins
    # in flight and a chain's temporaries can pass the cap between positions).
    def need(got) -> int:
        return got[2].total_bytes if memory == "shared" else got[1].peak_bytes

    best = attempt(room)
    if need(best) > budget_bytes:
        # The overhead over the cap changes little from one cap to the next, so
        # the cap that overhead leaves within the budget is tried first (twice
        # at most, each guess from the last one): the bisection then starts from
        # a bracket a few percent of ``room`` wide and reaches the precision of
        # ``rounds`` halvings of all of it in fewer scans.  Of the caps that
        # fit, the fastest plan is kept, not the largest cap's: a lower cap can
        # drop what the larger one moved (the Transformer at 60% on a 50 MB/s
        # link: 1.22x of ideal against 3.18x).
        arena, guesses = need(best), GUESSES
        lo, hi, best = 0, room, None
        precision = max(room >> rounds, 1)
        for _ in range(rounds + GUESSES):
            if hi - lo <= precision:
                break
            if guesses and arena > budget_bytes:
                guesses -= 1
                cap = min(max(hi * budget_bytes // arena, lo + 1), hi - 1)
            else:
                guesses, cap = 0, (lo + hi) // 2
            try:
                got = attempt(cap)
            except InfeasibleAllocation:
                lo, guesses = cap, 0
                continue
            arena = need(got)
            if arena <= budget_bytes:
                lo, guesses = cap, 0
                if best is None or got[1].step_time_s < best[1].step_time_s:
                    best = got
            else:
                hi = cap
        if best is None:
            raise InfeasibleAllocation(f"no cap gives a plan ({memory} memory) within the "
                                       f"budget of {budget_bytes} bytes; raise the budget")
    prog, result, pool = best
    swaps, resident = to_plan_swaps(cg, prog)
    names = _memo(cg, "names", _order_key(order),
                  lambda: tuple(graph.ops[int(o)].name for o in order))
    back = from_plan(cg, names, swaps, resident)
    if back != prog:
        # What the plan runs is its swaps read back, which can differ from the
        # scan's records (a remake's inputs brought back another way): its pool
        # and prediction come from that (test_native's hypothesis example 432455:
        # the scanned program's objects were one short for the one read back).
        result, pool = _simulated(cg, order, back, spec, memory == "shared")
        if (pool.total_bytes if memory == "shared" else result.peak_bytes) > budget_bytes:
            raise InfeasibleAllocation(f"the plan read back from its swaps needs more than "
                                       f"the budget of {budget_bytes} bytes")
    return Plan(schedule=names, swaps=swaps,
                budget_bytes=int(budget_bytes), allocation=pool, resident_parameters=resident,
                planner=f"bytes.{memory}", prediction=Prediction(
                    peak_bytes=result.peak_bytes, step_time_s=result.step_time_s,
                    ideal_time_s=result.ideal_time_s, swap_out_bytes=result.d2h_bytes,
                    swap_in_bytes=result.h2d_bytes))
