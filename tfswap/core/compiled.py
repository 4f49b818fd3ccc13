"""CompiledGraph: a DataflowGraph as flat arrays of buffers, for the planner.

The planner and the simulator work on *buffers*, not tensors: a tensor with
``alias_of`` shares the buffer of the tensor it names (bytes counted once,
live until the last reader of any alias), and an op's ``scratch_bytes`` is a
buffer of its own that lives while the op runs.  Buffers of kind "small" or
below the small threshold go to the small-tensor pool and are not planned.
Building the arrays is done once per graph; every evaluation of a schedule
and allocation reuses them (this is what the genetic search's inner loop
needs, and what the native library reads through ctypes).

Uses of a buffer: the ops that read it (inputs, or outputs that alias it)
and, for a non-persistent buffer, the op that allocates it.  Parameters and
optimizer state ("persistent" buffers) exist before and after the step: the
op that produces them in the graph (a variable read) does not allocate them,
and an op of phase "update" that reads them modifies them.

Example::

    cg = CompiledGraph.build(graph)
    cg.n_buffers, cg.ts            # pool buffers, distinct pool sizes (TS)
    order = cg.order_of(schedule)  # op ids in schedule order (int32 array)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tfswap.core.graph import DataflowGraph

PERSISTENT_KINDS = ("parameter", "optimizer_state")


@dataclass(frozen=True, eq=False)
class CompiledGraph:
    graph: DataflowGraph
    small_threshold_bytes: int
    keep: tuple[str, ...]
    op_time: np.ndarray          # float64 [n_ops], seconds
    buf_names: tuple[str, ...]   # root tensor name, or "<op>:scratch"
    buf_bytes: np.ndarray        # int64 [B]
    buf_size_index: np.ndarray   # int32 [B], index into ts
    ts: tuple[int, ...]          # sorted distinct pool sizes (the paper's TS)
    buf_persistent: np.ndarray   # int8 [B]
    buf_pinned: np.ndarray       # int8 [B]: never swapped (not swappable, or kept)
    buf_modified: np.ndarray     # int8 [B]: persistent and written by an update op
    buf_kept: np.ndarray         # int8 [B]: live to the end of the step
    op_in_ptr: np.ndarray        # int32 [n_ops+1], CSR into op_in
    op_in: np.ndarray            # int32: buffers an op reads
    op_in_write: np.ndarray      # int8: the op modifies that (persistent) buffer
    op_out_ptr: np.ndarray       # int32 [n_ops+1], CSR into op_out
    op_out: np.ndarray           # int32: buffers an op allocates
    tensor_buffer: np.ndarray    # int32 [n_tensors]: pool buffer, or -1 (small pool)
    small_bytes: np.ndarray      # int64 [S]: small-pool buffers
    small_persistent: np.ndarray  # int8 [S]
    small_first_op: np.ndarray   # int32 [S]: allocating op (-1 for persistent)
    small_use_ptr: np.ndarray    # int32 [S+1], CSR into small_use
    small_use: np.ndarray        # int32: ops that read a small buffer
    # int32 [B]: the buffer a recomputation makes this one's value in where the
    # step still holds this one then (its own value since written over in
    # place, or a sibling output of a multi-output op the chain runs): a fresh
    # copy "<name>:again" of the same size, which no op of the step uses; -1: none.
    buf_fresh: np.ndarray = None
    # int32 [S]: each small-pool buffer's root tensor (an index into graph.tensors).
    small_root: np.ndarray = None

    def __getstate__(self) -> dict:
        # Caches kept beside the fields (the native planner's arguments) hold
        # addresses of this process's arrays: pickled, they would point at
        # nothing in the process that loads them (a GPU row's saved problem
        # searched again here crashed in tfswap_plan_simulate).
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict) -> None:
        # Problems saved before __getstate__ existed carry the cache too.
        self.__dict__.update({k: v for k, v in state.items() if not k.startswith("_")})
        if self.__dict__.get("buf_fresh") is None:   # saved before fresh copies existed
            self.__dict__["buf_fresh"] = np.full(len(self.buf_bytes), -1, dtype=np.int32)
        self.__dict__.setdefault("small_root", None)   # saved before small roots were kept

    @property
    def n_ops(self) -> int:
        return len(self.op_time)

    @property
    def n_buffers(self) -> int:
        return len(self.buf_bytes)

    @classmethod
    def build(cls, graph: DataflowGraph, small_threshold_bytes: int = 1 << 20,
              keep: Sequence[str] = ()) -> "CompiledGraph":
        """Flatten ``graph``.  ``keep``: tensors live to the end of the step (fetches)."""
        if small_threshold_bytes < 0:
            raise ValueError(f"small_threshold_bytes must be >= 0, got {small_threshold_bytes}")
        tensors = graph.tensors
        index = {t.name: i for i, t in enumerate(tensors)}
        for name in keep:
            if name not in index:
                raise ValueError(f"keep names unknown tensor {name!r}")

        root = list(range(len(tensors)))
        for i, t in enumerate(tensors):
            seen = {i}
            r = i
            while tensors[r].alias_of:
                if tensors[r].alias_of not in index:
                    raise ValueError(f"tensor {tensors[r].name!r} aliases unknown tensor "
                                     f"{tensors[r].alias_of!r}")
                r = index[tensors[r].alias_of]
                if r in seen:
                    raise ValueError(f"alias cycle through tensor {t.name!r}")
                seen.add(r)
            root[i] = r
        members: dict[int, list[int]] = {}
        for i, r in enumerate(root):
            members.setdefault(r, []).append(i)

        kept_t = {index[k] for k in keep}
        update_op = [op.phase == "update" for op in graph.ops]
        buf_of_root: dict[int, int] = {}
        names, nbytes, persistent, pinned, modified, kept = [], [], [], [], [], []
        small_of_root: dict[int, int] = {}
        s_bytes, s_pers, s_first, s_root = [], [], [], []
        for r in sorted(members):
            group = members[r]
            t = tensors[r]
            size = max(tensors[m].nbytes for m in group)
            is_pers = t.kind in PERSISTENT_KINDS
            if t.kind == "small" or size < small_threshold_bytes or size == 0:
                small_of_root[r] = len(s_bytes)
                s_bytes.append(size)
                s_pers.append(is_pers)
                s_first.append(-1 if is_pers else t.producer)
                s_root.append(r)
                continue
            buf_of_root[r] = len(names)
            names.append(t.name)
            nbytes.append(size)
            persistent.append(is_pers)
            is_kept = any(m in kept_t for m in group)
            kept.append(is_kept)
            pinned.append(is_kept or not all(tensors[m].swappable for m in group))
            writes = any(update_op[c] for m in group for c in tensors[m].consumers) or any(
                update_op[tensors[m].producer] for m in group if m != r)
            modified.append(is_pers and writes)

        op_in, op_in_ptr, op_in_write = [], [0], []
        op_out, op_out_ptr = [], [0]
        scratch_names, scratch_bytes_list = [], []
        small_uses: list[list[int]] = [[] for _ in s_bytes]
        n_pool_tensor_bufs = len(names)
        for k, op in enumerate(graph.ops):
            reads = []
            for name in op.inputs:
                r = root[index[name]]
                if r in buf_of_root:
                    reads.append(buf_of_root[r])
                else:
                    small_uses[small_of_root[r]].append(k)
            allocs = []
            for name in op.outputs:
                i = index[name]
                r = root[i]
                if r in buf_of_root:
                    b = buf_of_root[r]
                    if i != r:            # a view of another buffer: a read
                        reads.append(b)
                    elif not persistent[b]:
                        allocs.append(b)
            reads = list(dict.fromkeys(b for b in reads if b not in allocs))
            if op.scratch_bytes >= max(small_threshold_bytes, 1):
                allocs.append(n_pool_tensor_bufs + len(scratch_names))
                scratch_names.append(f"{op.name}:scratch")
                scratch_bytes_list.append(op.scratch_bytes)
            op_in.extend(reads)
            op_in_write.extend(bool(update_op[k] and persistent[b]) for b in reads)
            op_in_ptr.append(len(op_in))
            op_out.extend(allocs)
            op_out_ptr.append(len(op_out))
        names.extend(scratch_names)
        nbytes.extend(scratch_bytes_list)
        for lst in (persistent, modified, kept):
            lst.extend([False] * len(scratch_names))
        pinned.extend([True] * len(scratch_names))  # scratch is in use while it lives
        # A fresh copy for each buffer a recomputation may have to make while the
        # step holds it: one written in place (several members), or one of
        # several an op makes (a normalization's other outputs).
        producer, outputs_of = {}, [0] * len(graph.ops)
        for k in range(len(graph.ops)):
            for b in op_out[op_out_ptr[k]:op_out_ptr[k + 1]]:
                if b < n_pool_tensor_bufs:   # not its scratch
                    producer[b] = k
                    outputs_of[k] += 1
        fresh = [-1] * len(names)
        for r, b in buf_of_root.items():
            if persistent[b] or tensors[r].kind in PERSISTENT_KINDS:
                continue
            k = producer.get(b)
            if len(members[r]) > 1 or (k is not None and outputs_of[k] > 1):
                fresh[b] = len(names)
                fresh.append(-1)
                names.append(f"{names[b]}:again")
                nbytes.append(nbytes[b])
                for lst in (persistent, modified, kept):
                    lst.append(False)
                pinned.append(True)   # in use while the chain that makes it runs

        buf_bytes = np.asarray(nbytes, dtype=np.int64)
        ts = tuple(int(s) for s in np.unique(buf_bytes))
        size_index = np.searchsorted(np.asarray(ts, dtype=np.int64), buf_bytes).astype(np.int32)
        tensor_buffer = np.full(len(tensors), -1, dtype=np.int32)
        for i, r in enumerate(root):
            if r in buf_of_root:
                tensor_buffer[i] = buf_of_root[r]
        use_ptr = np.zeros(len(s_bytes) + 1, dtype=np.int32)
        use_ptr[1:] = np.cumsum([len(u) for u in small_uses]) if small_uses else []
        i8 = lambda xs: np.asarray(xs, dtype=np.int8)  # noqa: E731
        i32 = lambda xs: np.asarray(xs, dtype=np.int32)  # noqa: E731
        return cls(
            graph=graph, small_threshold_bytes=int(small_threshold_bytes), keep=tuple(keep),
            op_time=np.asarray([op.time_s for op in graph.ops], dtype=np.float64),
            buf_names=tuple(names), buf_bytes=buf_bytes, buf_size_index=size_index, ts=ts,
            buf_persistent=i8(persistent), buf_pinned=i8(pinned), buf_modified=i8(modified),
            buf_kept=i8(kept), op_in_ptr=i32(op_in_ptr), op_in=i32(op_in),
            op_in_write=i8(op_in_write), op_out_ptr=i32(op_out_ptr), op_out=i32(op_out),
            tensor_buffer=tensor_buffer, small_bytes=np.asarray(s_bytes, dtype=np.int64),
            small_persistent=i8(s_pers), small_first_op=i32(s_first), small_use_ptr=use_ptr,
            small_use=i32([k for u in small_uses for k in u]), buf_fresh=i32(fresh),
            small_root=i32(s_root))

    def order_of(self, schedule: Sequence[str] | None) -> np.ndarray:
        """Op ids in schedule order; None means the graph's topological order.

        Raises ValueError if the schedule is not a topological order of all ops.
        """
        g = self.graph
        if schedule is None:
            return np.asarray(g.topological_order(), dtype=np.int32)
        try:
            order = [g.op_id(name) for name in schedule]
        except KeyError as err:
            raise ValueError(f"schedule names unknown op {err.args[0]!r}") from None
        if not g.is_topological(order):
            raise ValueError("the schedule is not a topological order of the graph's ops "
                             "(each op must come after its inputs' producers and control inputs)")
        return np.asarray(order, dtype=np.int32)

    def positions(self, order: np.ndarray) -> np.ndarray:
        pos = np.empty(self.n_ops, dtype=np.int64)
        pos[order] = np.arange(len(order))
        return pos

    def buffer_intervals(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and last schedule position each pool buffer is live without swapping
        (persistent buffers: the whole step)."""
        n = len(order)
        pos = self.positions(order)
        first = np.full(self.n_buffers, n, dtype=np.int64)
        last = np.full(self.n_buffers, -1, dtype=np.int64)
        op_of_in = np.repeat(np.arange(self.n_ops), np.diff(self.op_in_ptr))
        op_of_out = np.repeat(np.arange(self.n_ops), np.diff(self.op_out_ptr))
        for ops, bufs in ((op_of_in, self.op_in), (op_of_out, self.op_out)):
            np.minimum.at(first, bufs, pos[ops])
            np.maximum.at(last, bufs, pos[ops])
        pers = self.buf_persistent.astype(bool)
        first[pers] = 0
        last[pers | self.buf_kept.astype(bool)] = n - 1
        unused = last < 0
        first[unused], last[unused] = 0, -1
        return first, last

    def class_demand(self, order: np.ndarray, buf_class: np.ndarray, n_classes: int) -> np.ndarray:
        """Most objects of each class live at once if nothing is swapped."""
        first, last = self.buffer_intervals(order)
        live = last >= first
        cls, f, l = buf_class[live], first[live], last[live]
        keys = np.concatenate([cls * (len(order) + 1) + f, cls * (len(order) + 1) + l + 1])
        delta = np.concatenate([np.ones(len(f), np.int64), -np.ones(len(f), np.int64)])
        sort = np.lexsort((delta, keys))  # at one position, ends (-1) before starts
        keys, delta = keys[sort], delta[sort]
        running = np.cumsum(delta)
        out = np.zeros(n_classes, dtype=np.int64)
        if len(keys):
            np.maximum.at(out, keys // (len(order) + 1), running)
        return out

    def _op_class_counts(self, buf_class: np.ndarray, n_classes: int):
        """(op, class, objects) for every class an op uses: the keys of op_class_need."""
        ops = np.concatenate([np.repeat(np.arange(self.n_ops), np.diff(self.op_in_ptr)),
                              np.repeat(np.arange(self.n_ops), np.diff(self.op_out_ptr))])
        bufs = np.concatenate([self.op_in, self.op_out]).astype(np.int64)
        if not len(bufs):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        keys, counts = np.unique(ops * n_classes + buf_class[bufs], return_counts=True)
        return keys // n_classes, keys % n_classes, counts

    def pinned_per_class(self, buf_class: np.ndarray, n_classes: int) -> np.ndarray:
        """Objects of each class held for the whole step by pinned persistent buffers."""
        pinned_pers = (self.buf_pinned & self.buf_persistent).astype(bool)
        return np.bincount(buf_class[pinned_pers], minlength=n_classes)[:n_classes]

    def op_class_need(self, buf_class: np.ndarray, n_classes: int) -> np.ndarray:
        """Most objects of each class one op uses at once (plus pinned persistent ones)."""
        _, cls, counts = self._op_class_counts(buf_class, n_classes)
        need = np.zeros(n_classes, dtype=np.int64)
        np.maximum.at(need, cls, counts)
        return need + self.pinned_per_class(buf_class, n_classes)

    def op_size_usage(self) -> np.ndarray:
        """Objects of each distinct size (column, index into ts) each op uses at once.

        Dense int32 [ops that use pool buffers, len(ts)]: the input of
        :func:`tfswap.core.allocation.fitting_classes`.
        """
        ops, sizes, counts = self._op_class_counts(self.buf_size_index.astype(np.int64),
                                                   len(self.ts))
        rows, row_of = np.unique(ops, return_inverse=True)
        usage = np.zeros((len(rows), len(self.ts)), dtype=np.int32)
        usage[row_of, sizes] = counts
        return usage

    def cache(self, what: str) -> dict:
        """A dict kept on this graph for data derived from it under ``what`` (the
        planners ask for the same per-order arrays many times); callers only read
        what they find there."""
        caches = self.__dict__.get("_caches")
        if caches is None:
            caches = {}
            object.__setattr__(self, "_caches", caches)
        return caches.setdefault(what, {})

    def memo(self, what: str, key, make, keep: int | None = 8):
        """``make()``, kept under ``(what, key)`` (:meth:`cache`); with ``keep``, for
        the last ``keep`` keys only (per-order data of the few orders a planner
        works on)."""
        entries = self.cache(what)
        if key in entries:
            return entries[key]
        value = make()
        if keep is not None and len(entries) >= keep:
            entries.pop(next(iter(entries)))
        entries[key] = value
        return value

    def op_working_set(self) -> np.ndarray:
        """Bytes of the pool buffers each op needs on the device at once -- inputs,
        outputs and scratch -- not counting pinned parameters (on the device anyway).

        int64 [n_ops]; no plan can run an op in less (plus the pinned
        parameters and the small-tensor pool).
        """
        pinned_pers = (self.buf_pinned & self.buf_persistent).astype(bool)
        out = np.zeros(self.n_ops, dtype=np.int64)
        for ptr, bufs in ((self.op_in_ptr, self.op_in), (self.op_out_ptr, self.op_out)):
            ops = np.repeat(np.arange(self.n_ops), np.diff(ptr))
            nbytes = np.where(pinned_pers[bufs], 0, self.buf_bytes[bufs]) if len(bufs) else bufs
            np.add.at(out, ops, nbytes)
        return out

    def small_live_bytes(self, order: np.ndarray, unheld=frozenset()) -> np.ndarray:
        """Small-pool bytes live at each position of ``order`` (persistent: always;
        others from their allocating op to their last use).  ``unheld``: root
        tensor names of small buffers not counted (memory the device's allocator
        never gives them: :func:`tfswap.core.simulator.held_peak_bytes`)."""
        n = len(order)
        pos = self.positions(order)
        delta = np.zeros(n + 1, dtype=np.int64)
        skip = set()
        if unheld:
            if self.small_root is None:
                raise ValueError("this CompiledGraph was saved before small buffers kept their "
                                 "root tensors: build it again to leave buffers out")
            names = [t.name for t in self.graph.tensors]
            skip = {s for s, r in enumerate(self.small_root.tolist()) if names[r] in unheld}
        for s in range(len(self.small_bytes)):
            if s in skip:
                continue
            uses = self.small_use[self.small_use_ptr[s]:self.small_use_ptr[s + 1]]
            if self.small_persistent[s]:
                a, b = 0, n - 1
            else:
                a = pos[self.small_first_op[s]]
                b = max([a] + [int(pos[u]) for u in uses])
            delta[a] += self.small_bytes[s]
            delta[b + 1] -= self.small_bytes[s]
        return np.cumsum(delta)[:n]

    def small_pool_peak(self, order: np.ndarray) -> int:
        """Most small-pool bytes live at once under ``order`` (persistent: always)."""
        if not len(self.small_bytes) or not len(order):
            return 0
        return int(self.small_live_bytes(order).max())
