"""The size-class pool allocator (SwapAdvisor §4.1, §5.3) from Python.

A plan's memory allocation is a list of size classes (``class_bytes``, strictly
increasing) with a number of objects each (``class_count``), plus a small pool
for tensors below ``small_threshold_bytes``.  The C++ library
(``pool_core.{h,cc}``, ``pool_allocator.{h,cc}`` in the op library) reserves
one arena and carves it exactly that way:

* a request of ``s >= small_threshold_bytes`` bytes takes one object of the
  smallest class with ``class_bytes >= s``;
* each class hands out objects from a LIFO stack of free indices that starts as
  ``[n-1, ..., 1, 0]`` (the first allocation gets object 0); a free pushes;
* smaller requests go to the small pool: power-of-two blocks (at least 256
  bytes) from per-size free lists, carved from the reserved region.

These are the simulator's semantics, so :func:`replay` of the simulator's
allocation sequence must reproduce its object assignment and per-class peaks.
A class that runs out raises :class:`PoolExhausted` naming the class, the
request and the plan; nothing falls back to another allocator.

Three uses:

* :func:`replay` -- the allocator over host memory, driven by an event list.
* :func:`stress` -- many C++ threads allocating and freeing at random.
* :func:`install_gpu_allocator` -- makes TensorFlow use one plan's pool for a
  GPU.  Call it right after ``import tensorflow``, before anything creates a
  device; the plan must come from another process.
* :func:`install_gpu_arena` -- the one-process flow: the memory budget becomes
  the GPU's whole memory (a :class:`Arena`), and each plan ``tfswap.optimize``
  binds takes its pool from it while its step runs.  :meth:`Arena.host` is
  the same C++ arena over host memory, for tests and replays.

Example::

    from tfswap.ops import allocator
    alloc = allocator.PoolAllocation(class_bytes=(2 << 20, 8 << 20),
                                     class_count=(2, 1), small_pool_bytes=1 << 20,
                                     plan_id="demo")
    r = allocator.replay(alloc, [(True, "a", 3 << 20), (True, "b", 1 << 20),
                                 (False, "a", 0), (True, "c", 7 << 20)])
    r.assignments      # ((1, 0), (0, 0), (1, 0))
    r.per_class_peak   # (1, 1)
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import weakref
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

DEFAULT_SMALL_THRESHOLD_BYTES = 1 << 20
#: Objects start at multiples of this many bytes, so each object of a class
#: occupies ``class_bytes`` rounded up to it in the arena.
OBJECT_ALIGNMENT_BYTES = 256
#: ``Allocator::Name()`` of the pool in TensorFlow (checked by the SwapIn GPU kernel).
ALLOCATOR_NAME = "tfswap_pool"

_ERRLEN = 2048
_RC_OK, _RC_EXHAUSTED, _RC_BAD, _RC_BROKEN, _RC_TOO_LATE, _RC_TWICE = 0, 1, 2, 3, 4, 5


class PoolExhausted(MemoryError):
    """A size class (or the small pool) had no room for a request.

    ``class_index`` is None for the small pool or a request larger than every
    class; ``event_index`` is the failing event of a replay (None on a GPU).
    """

    def __init__(self, message: str, *, class_index: int | None, class_bytes: int | None,
                 requested_bytes: int, plan_id: str, event_index: int | None = None):
        super().__init__(message)
        self.class_index = class_index
        self.class_bytes = class_bytes
        self.requested_bytes = requested_bytes
        self.plan_id = plan_id
        self.event_index = event_index


class ArenaFull(MemoryError):
    """The budget arena had no free block for a request or for a plan's pool."""


class AllocatorInstallError(RuntimeError):
    """:func:`install_gpu_allocator` could not install the pool (the message says why)."""


@dataclass(frozen=True)
class PoolAllocation:
    """A plan's memory layout: size classes, object counts, small pool (bytes).

    ``object_offsets``: empty for the disjoint layout, else each object's
    offset in the arena, per class (the shared layout of
    :class:`tfswap.core.plan.Allocation`; the pool then refuses to hand out an
    object whose memory a live object holds).

    Example::

        PoolAllocation(class_bytes=(1 << 20, 4 << 20), class_count=(3, 2),
                       small_pool_bytes=8 << 20, plan_id="resnet-v100")
    """

    class_bytes: tuple[int, ...]
    class_count: tuple[int, ...]
    small_pool_bytes: int
    plan_id: str
    small_threshold_bytes: int = DEFAULT_SMALL_THRESHOLD_BYTES
    object_offsets: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "class_bytes", tuple(_as_int(b, "class_bytes")
                                                      for b in self.class_bytes))
        object.__setattr__(self, "class_count", tuple(_as_int(c, "class_count")
                                                      for c in self.class_count))
        if len(self.class_bytes) != len(self.class_count):
            raise ValueError(f"class_bytes has {len(self.class_bytes)} entries but class_count "
                             f"has {len(self.class_count)}; give one count per class")
        for i, b in enumerate(self.class_bytes):
            if b <= 0:
                raise ValueError(f"size class {i} has {b} bytes; class sizes must be > 0")
            if i and b <= self.class_bytes[i - 1]:
                raise ValueError(f"class_bytes must be strictly increasing; class {i} ({b} "
                                 f"bytes) follows class {i - 1} ({self.class_bytes[i - 1]} bytes)")
        for i, c in enumerate(self.class_count):
            if not 0 <= c < 2 ** 32:
                raise ValueError(f"size class {i} has {c} objects; counts must be in [0, 2^32)")
        _as_int(self.small_pool_bytes, "small_pool_bytes")
        if self.small_pool_bytes < 0:
            raise ValueError(f"small_pool_bytes must be >= 0, got {self.small_pool_bytes}")
        _as_int(self.small_threshold_bytes, "small_threshold_bytes")
        if self.small_threshold_bytes <= 0:
            raise ValueError("small_threshold_bytes must be > 0 (requests below it use the "
                             f"small pool), got {self.small_threshold_bytes}")
        if not isinstance(self.plan_id, str):
            raise TypeError(f"plan_id must be a str, got {type(self.plan_id).__name__}")
        object.__setattr__(self, "object_offsets", tuple(
            tuple(_as_int(o, "object_offsets") for o in c) for c in self.object_offsets))
        if self.object_offsets and [len(c) for c in self.object_offsets] != \
                list(self.class_count):
            raise ValueError("object_offsets must give one offset per object of each class "
                             f"(counts {self.class_count})")

    @property
    def class_total_bytes(self) -> int:
        """Bytes of all objects as the simulator counts them (no alignment padding)."""
        return sum(b * c for b, c in zip(self.class_bytes, self.class_count))

    def class_of(self, nbytes: int) -> int | None:
        """Index of the class a request of ``nbytes`` takes (None: small pool or too large)."""
        if nbytes < self.small_threshold_bytes:
            return None
        for i, b in enumerate(self.class_bytes):
            if b >= nbytes:
                return i
        return None


@dataclass(frozen=True)
class ClassStats:
    class_bytes: int
    count: int
    in_use: int        # objects
    peak_in_use: int   # objects
    num_allocs: int


@dataclass(frozen=True)
class SmallPoolStats:
    limit_bytes: int
    in_use_bytes: int           # block bytes (power-of-two rounded)
    peak_in_use_bytes: int
    requested_in_use_bytes: int
    carved_bytes: int           # blocks ever carved from the region
    num_allocs: int


@dataclass(frozen=True)
class PoolStats:
    """Exact counters of one pool (bytes; objects where named)."""

    bytes_limit: int            # arena: classes (aligned) + small pool + page padding
    bytes_in_use: int           # class_bytes of held objects + small blocks
    peak_bytes_in_use: int
    num_allocs: int
    largest_alloc_size: int
    classes: tuple[ClassStats, ...]
    small: SmallPoolStats


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did.

    ``assignments[k]`` is ``(class_index, object_index)`` for the k-th
    allocation event, or None when it went to the small pool.
    """

    assignments: tuple[tuple[int, int] | None, ...]
    per_class_peak: tuple[int, ...]   # objects
    small_pool_peak: int              # bytes
    stats: PoolStats


def as_allocation(plan_or_allocation) -> PoolAllocation:
    """A :class:`PoolAllocation` from itself, or from an object that has one.

    Accepts a PoolAllocation, an object with an ``allocation`` attribute (a
    plan), or any object with ``class_bytes``, ``class_count``,
    ``small_pool_bytes`` and ``plan_id`` (and optionally
    ``small_threshold_bytes``).
    """
    obj = plan_or_allocation
    if isinstance(obj, PoolAllocation):
        return obj
    inner = getattr(obj, "allocation", None)
    if inner is not None and inner is not obj:
        if not hasattr(inner, "plan_id") and hasattr(obj, "id"):  # a tfswap Plan
            return PoolAllocation(
                class_bytes=tuple(inner.class_bytes), class_count=tuple(inner.class_count),
                small_pool_bytes=inner.small_pool_bytes, plan_id=str(obj.id),
                small_threshold_bytes=inner.small_threshold_bytes,
                object_offsets=tuple(getattr(inner, "object_offsets", ())))
        return as_allocation(inner)
    fields = ("class_bytes", "class_count", "small_pool_bytes", "plan_id")
    if all(hasattr(obj, f) for f in fields):
        return PoolAllocation(
            class_bytes=tuple(obj.class_bytes), class_count=tuple(obj.class_count),
            small_pool_bytes=obj.small_pool_bytes, plan_id=obj.plan_id,
            small_threshold_bytes=getattr(obj, "small_threshold_bytes",
                                          DEFAULT_SMALL_THRESHOLD_BYTES),
            object_offsets=tuple(getattr(obj, "object_offsets", ())))
    raise TypeError(f"cannot read a pool allocation from {type(obj).__name__}: pass a "
                    "PoolAllocation (class_bytes, class_count, small_pool_bytes, plan_id) "
                    "or a plan that has one as .allocation")


def replay(allocation, events: Iterable[Sequence]) -> ReplayResult:
    """Run the pool over host memory on ``events`` and report what it did.

    ``events`` is an ordered sequence of ``(is_alloc, handle, nbytes)``:
    ``is_alloc`` true allocates ``nbytes`` under ``handle`` (any hashable),
    false frees what ``handle`` holds (``nbytes`` ignored).  Raises
    :class:`PoolExhausted` when a class or the small pool runs out, and
    ``ValueError`` for an event that makes no sense (a handle allocated twice,
    freed without an allocation).
    """
    alloc = as_allocation(allocation)
    is_alloc, handles, nbytes = _encode_events(events)
    lib = _clib()
    pool = _create(lib, alloc)
    try:
        n = len(is_alloc)
        out_cls = np.zeros(n, dtype=np.int32)
        out_obj = np.zeros(n, dtype=np.int64)
        failed_at = ctypes.c_int64(-1)
        info = np.zeros(3, dtype=np.int64)
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = lib.tfswap_pool_replay(pool, n, _ptr(is_alloc), _ptr(handles), _ptr(nbytes),
                                    _ptr(out_cls), _ptr(out_obj), ctypes.byref(failed_at),
                                    _ptr(info), err, _ERRLEN)
        message = err.value.decode()
        if rc == _RC_EXHAUSTED:
            cls = int(info[0])
            raise PoolExhausted(message + f" (replay event {failed_at.value})",
                                class_index=cls if cls >= 0 else None,
                                class_bytes=int(info[1]) if cls >= 0 else None,
                                requested_bytes=int(info[2]), plan_id=alloc.plan_id,
                                event_index=failed_at.value)
        if rc != _RC_OK:
            raise ValueError(message)
        stats = _stats(lib, pool, len(alloc.class_bytes))
    finally:
        lib.tfswap_pool_destroy(pool)
    allocs = is_alloc.astype(bool)
    assignments = tuple((c, o) if c >= 0 else None
                        for c, o in zip(out_cls[allocs].tolist(), out_obj[allocs].tolist()))
    return ReplayResult(assignments=assignments,
                        per_class_peak=tuple(c.peak_in_use for c in stats.classes),
                        small_pool_peak=stats.small.peak_in_use_bytes, stats=stats)


def stress(allocation, *, threads: int = 8, ops_per_thread: int = 20000,
           seed: int = 0) -> tuple[int, PoolStats]:
    """Hammer a host pool from ``threads`` C++ threads; return (allocations made, stats).

    Each thread allocates random sizes (mapping to random classes or the small
    pool) and frees its own allocations at random, stamping every buffer and
    checking the stamp before freeing.  Raises ``RuntimeError`` on corruption or
    inconsistent statistics.
    """
    alloc = as_allocation(allocation)
    if threads <= 0 or ops_per_thread < 0:
        raise ValueError("threads must be > 0 and ops_per_thread >= 0")
    lib = _clib()
    pool = _create(lib, alloc)
    try:
        done = ctypes.c_uint64(0)
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = lib.tfswap_pool_stress(pool, threads, ops_per_thread, seed, ctypes.byref(done),
                                    err, _ERRLEN)
        if rc != _RC_OK:
            raise RuntimeError(f"pool stress test failed: {err.value.decode()}")
        return done.value, _stats(lib, pool, len(alloc.class_bytes))
    finally:
        lib.tfswap_pool_destroy(pool)


def install_gpu_allocator(plan_or_allocation, *, device_index: int = 0) -> PoolAllocation:
    """Make TensorFlow allocate GPU ``device_index``'s memory from the plan's pool.

    Call it right after ``import tensorflow`` and before anything creates a
    device (running an op, ``tf.config.list_logical_devices``, building a
    model)::

        import tensorflow as tf
        from tfswap.ops import allocator
        allocator.install_gpu_allocator(plan)   # plan.allocation, or a PoolAllocation
        ...                                     # now build and run the step

    The pool's arena is reserved when TensorFlow creates the device.  Raises
    :class:`AllocatorInstallError` when devices already exist (fix the import
    order), when this TensorFlow has no GPU support or sees no GPU
    ``device_index``, or when a pool is already installed in this process.
    """
    alloc = as_allocation(plan_or_allocation)
    _check_can_install(device_index)
    _install(alloc, device_index)
    return alloc


def gpu_pool_stats() -> PoolStats | None:
    """Statistics of the installed GPU pool; None before a device created it.

    Raises :class:`AllocatorInstallError` if no pool was installed, or if
    creating it failed (the message says why).
    """
    lib = _clib()
    capacity = 64
    while True:
        totals = np.zeros(5, dtype=np.uint64)
        per_class = np.zeros(5 * capacity, dtype=np.uint64)
        small = np.zeros(6, dtype=np.uint64)
        n = ctypes.c_int32(capacity)
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = lib.tfswap_gpu_pool_stats(_ptr(totals), _ptr(per_class), _ptr(small),
                                       ctypes.byref(n), err, _ERRLEN)
        if rc != _RC_BROKEN:
            break
        capacity = n.value  # more classes than rows: ask again with room for all
    if rc == 2:
        raise AllocatorInstallError("no plan's pool is installed in this process; call "
                                    "install_gpu_allocator first (for the budget arena of "
                                    "install_gpu_arena: gpu_arena().stats())")
    if rc == 1:
        if err.value:
            raise AllocatorInstallError(err.value.decode())
        return None
    return _unpack_stats(totals, per_class, small, n.value)


def _check_can_install(device_index, what: str = "install_gpu_allocator") -> None:
    if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
        raise ValueError(f"device_index must be an int >= 0, got {device_index!r}")
    import tensorflow as tf
    from tensorflow.python.eager import context

    if context.context()._initialized:
        raise AllocatorInstallError(_too_late(what))
    if not tf.test.is_built_with_gpu_support():
        raise AllocatorInstallError(
            f"this TensorFlow ({tf.__version__}) is built without GPU support (a "
            "tensorflow-cpu wheel?), so there is no GPU allocator to replace; install "
            "tensorflow[and-cuda] on a machine with a GPU. Nothing was installed.")
    gpus = tf.config.list_physical_devices("GPU")  # lists, creates no device
    if device_index >= len(gpus):
        raise AllocatorInstallError(
            f"TensorFlow sees {len(gpus)} GPU(s), so there is no GPU {device_index}; check "
            "CUDA_VISIBLE_DEVICES and the driver (nvidia-smi). Nothing was installed.")


def _too_late(what: str) -> str:
    return (f"{what} was called after TensorFlow created its devices, so the "
            "device allocator is already chosen. Call it right after `import tensorflow`, "
            "before any op runs or any model is built (move it to the top of your script, or "
            "start a new process). Nothing was installed.")


def _install(alloc: PoolAllocation, device_index: int) -> None:
    lib = _clib()
    cb, cc = _class_arrays(alloc)
    offsets = _offset_array(alloc)
    err = ctypes.create_string_buffer(_ERRLEN)
    rc = lib.tfswap_install_gpu_pool(len(alloc.class_bytes), _ptr(cb), _ptr(cc),
                                     alloc.small_pool_bytes, alloc.small_threshold_bytes,
                                     alloc.plan_id.encode(), _ptr_or_null(offsets), device_index,
                                     err, _ERRLEN)
    _install_outcome(rc, err, "install_gpu_allocator")


def _install_outcome(rc: int, err, what: str) -> None:
    if rc == _RC_TOO_LATE:
        raise AllocatorInstallError(_too_late(what))
    if rc == _RC_TWICE:
        raise AllocatorInstallError(err.value.decode() + "; a process has one device "
                                    "allocator: start a new process for another. Nothing "
                                    "was installed.")
    if rc != _RC_OK:
        raise ValueError(err.value.decode())


# ---------------------------------------------------------------- the budget arena


@dataclass(frozen=True)
class Placement:
    """Where a host arena put a request: ``offset`` from the arena's start;
    ``layout`` the plan's layout that served it (None: the free ranges);
    ``size_class`` (None: the small pool or the free ranges) and ``object_index``
    within the layout."""

    offset: int
    layout: int | None
    size_class: int | None
    object_index: int | None


@dataclass(frozen=True)
class ArenaStats:
    """Counters of a budget arena (bytes)."""

    arena_bytes: int
    bytes_in_use: int        # free-range allocations + plans' objects and blocks in use
    peak_bytes_in_use: int   # since creation or clear_peak()
    general_in_use: int      # allocations outside any plan (variables, inputs)
    carved_bytes: int        # held by plans' pools
    largest_free_bytes: int
    num_allocs: int
    strays: int              # requests the active plan's pool could not serve
    stray_bytes: int
    largest_alloc_size: int
    active_layout: int | None
    last_stray: str          # why the last stray left the plan's pool ("" if none)


@dataclass(frozen=True)
class LayoutStats:
    """Where a plan's pool sits in the arena and, while carved, its counters."""

    carved: bool
    offset: int
    nbytes: int
    pool: PoolStats | None


class Arena:
    """The budget arena: one reservation of the memory budget, shared by the
    allocations outside any plan and by the pools of the plans bound to it.

    Outside a plan a request is served best-fit from the free ranges (freed
    neighbours coalesce).  :meth:`add_layout` registers a plan's pool; the
    first :meth:`activate` carves it from the free ranges, and while it is
    active requests go to it with the simulator's semantics (size classes,
    LIFO objects, shared offsets).  A request the pool cannot serve is served
    from the free ranges and counted in ``stats().strays``; one neither can
    serve raises :class:`ArenaFull` (on a GPU: the op fails out of memory).

    :meth:`host` makes one over host memory (tests, replays);
    :func:`gpu_arena` returns the one a GPU allocates from after
    :func:`install_gpu_arena`.

    Example::

        arena = Arena.host(64 << 20)
        weights = arena.allocate(8 << 20)          # outside any plan
        step = arena.add_layout(PoolAllocation(class_bytes=(4 << 20,), class_count=(2,),
                                               small_pool_bytes=1 << 20, plan_id="p"))
        with arena.active(step):
            a = arena.allocate(3 << 20)            # class 0, object 0 of the plan's pool
            arena.free(a.offset)
        arena.stats().carved_bytes                 # the pool stays carved for the next step
    """

    def __init__(self, handle, *, owned: bool, what: str):
        self._handle = handle
        self._owned = owned
        self._what = what
        self._lib = _clib()

    @classmethod
    def host(cls, arena_bytes: int) -> "Arena":
        """An arena of ``arena_bytes`` over host memory."""
        nbytes = _as_int(arena_bytes, "arena_bytes")
        lib = _clib()
        out = ctypes.c_void_p()
        err = ctypes.create_string_buffer(_ERRLEN)
        if lib.tfswap_arena_create(nbytes if nbytes > 0 else 0, ctypes.byref(out), err,
                                   _ERRLEN) != _RC_OK:
            raise ValueError(err.value.decode())
        return cls(out, owned=True, what="host arena")

    def close(self) -> None:
        """Give a host arena's memory back (a GPU arena lives as long as the device)."""
        if self._owned and self._handle is not None:
            self._lib.tfswap_arena_destroy(self._handle)
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def _h(self):
        if self._handle is None:
            raise ValueError(f"this {self._what} is closed")
        return self._handle

    def add_layout(self, plan_or_allocation) -> int:
        """Register a plan's pool (not carved until activated); returns its id."""
        alloc = as_allocation(plan_or_allocation)
        cb, cc = _class_arrays(alloc)
        offsets = _offset_array(alloc)
        out = ctypes.c_int32(-1)
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = self._lib.tfswap_arena_add_layout(
            self._h(), len(alloc.class_bytes), _ptr(cb), _ptr(cc), alloc.small_pool_bytes,
            alloc.small_threshold_bytes, alloc.plan_id.encode(), _ptr_or_null(offsets),
            ctypes.byref(out), err, _ERRLEN)
        if rc != _RC_OK:
            raise ValueError(err.value.decode())
        return out.value

    def activate(self, layout: int) -> None:
        """Let layout ``layout`` serve requests, carving its pool first if need be.

        Raises :class:`ArenaFull` when no free block holds the pool (nothing
        changes then), ``ValueError`` for an unknown layout.
        """
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = self._lib.tfswap_arena_activate(self._h(), int(layout), err, _ERRLEN)
        if rc == _RC_EXHAUSTED:
            raise ArenaFull(err.value.decode())
        if rc != _RC_OK:
            raise ValueError(err.value.decode())

    def deactivate(self) -> None:
        self._lib.tfswap_arena_deactivate(self._h())

    def binding(self, plan_or_allocation):
        """Register a plan's pool and return what makes it serve a block of code:
        a zero-argument callable giving ``active(layout)``.  The layout is
        removed when the returned callable is garbage-collected (a bound step
        that is no longer used), if none of its objects is in use then."""
        layout = self.add_layout(plan_or_allocation)

        def scope():
            return self.active(layout)

        weakref.finalize(scope, _forget_layout, self, layout)
        return scope

    @contextlib.contextmanager
    def active(self, layout: int):
        """Layout ``layout`` serves the requests made inside the block."""
        self.activate(layout)
        try:
            yield self
        finally:
            self.deactivate()

    def remove_layout(self, layout: int) -> None:
        """Forget a layout and give its block back; ``ValueError`` while it holds tensors."""
        err = ctypes.create_string_buffer(_ERRLEN)
        if self._lib.tfswap_arena_remove_layout(self._h(), int(layout), err, _ERRLEN) != _RC_OK:
            raise ValueError(err.value.decode())

    def allocate(self, nbytes: int) -> Placement:
        """Allocate ``nbytes`` (host arenas only); raises :class:`ArenaFull`."""
        self._host_only("allocate")
        out = np.zeros(4, dtype=np.int64)
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = self._lib.tfswap_arena_allocate(self._h(), _as_int(nbytes, "nbytes"), _ptr(out),
                                             err, _ERRLEN)
        if rc != _RC_OK:
            raise ArenaFull(err.value.decode())
        offset, layout, cls, obj = (int(v) for v in out)
        if layout < 0:
            return Placement(offset, None, None, None)
        return Placement(offset, layout, cls if cls >= 0 else None, obj if cls >= 0 else None)

    def free(self, offset: int) -> None:
        """Free the allocation at ``offset`` (host arenas only)."""
        self._host_only("free")
        err = ctypes.create_string_buffer(_ERRLEN)
        if self._lib.tfswap_arena_free(self._h(), _as_int(offset, "offset"), err,
                                       _ERRLEN) != _RC_OK:
            raise ValueError(err.value.decode())

    def _host_only(self, what: str) -> None:
        if not self._owned:
            raise ValueError(f"{what} is for host arenas: TensorFlow allocates from a GPU's")

    def stats(self) -> ArenaStats:
        out = np.zeros(11, dtype=np.int64)
        err = ctypes.create_string_buffer(_ERRLEN)
        self._lib.tfswap_arena_stats(self._h(), _ptr(out), err, _ERRLEN)
        v = [int(x) for x in out]
        return ArenaStats(*v[:10], active_layout=v[10] if v[10] >= 0 else None,
                          last_stray=err.value.decode())

    def layout_stats(self, layout: int) -> LayoutStats:
        capacity = 64
        while True:
            place = np.zeros(3, dtype=np.uint64)
            totals = np.zeros(5, dtype=np.uint64)
            per_class = np.zeros(5 * capacity, dtype=np.uint64)
            small = np.zeros(6, dtype=np.uint64)
            n = self._lib.tfswap_arena_layout_stats(self._h(), int(layout), _ptr(place),
                                                    _ptr(totals), _ptr(per_class), capacity,
                                                    _ptr(small))
            if n >= -1:
                break
            capacity = -2 - n
        if n == -1:
            raise ValueError(f"this arena has no layout {layout!r}")
        carved, offset, nbytes = (int(v) for v in place)
        pool = _unpack_stats(totals, per_class, small, n) if carved else None
        return LayoutStats(bool(carved), offset, nbytes, pool)

    def stress(self, layout: int, *, threads: int = 8, ops_per_thread: int = 20000,
               seed: int = 0) -> int:
        """Hammer a host arena from ``threads`` C++ threads while another one
        activates and deactivates ``layout`` at random; return the allocations
        made.  Raises ``RuntimeError`` on corruption or inconsistent counters."""
        self._host_only("stress")
        if threads <= 0 or ops_per_thread < 0:
            raise ValueError("threads must be > 0 and ops_per_thread >= 0")
        done = ctypes.c_uint64(0)
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = self._lib.tfswap_arena_stress(self._h(), int(layout), threads, ops_per_thread,
                                           seed, ctypes.byref(done), err, _ERRLEN)
        if rc != _RC_OK:
            raise RuntimeError(f"arena stress test failed: {err.value.decode()}")
        return done.value

    def clear_peak(self) -> None:
        """Start a new peak from what is in use now."""
        self._lib.tfswap_arena_clear_peak(self._h())

    def check(self) -> None:
        """Raise ``RuntimeError`` if the arena's bookkeeping is inconsistent."""
        err = ctypes.create_string_buffer(_ERRLEN)
        if self._lib.tfswap_arena_check(self._h(), err, _ERRLEN) != _RC_OK:
            raise RuntimeError(f"budget arena inconsistent: {err.value.decode()}")


def _forget_layout(arena: "Arena", layout: int) -> None:
    if arena._handle is not None:
        try:
            arena.remove_layout(layout)
        except ValueError:  # its tensors are still alive: it stays registered
            pass


def install_gpu_arena(memory_budget, *, device_index: int = 0) -> int:
    """Make GPU ``device_index`` allocate everything from an arena of ``memory_budget``.

    The one-process flow of the pool allocator.  Call it right after ``import
    tensorflow``, before anything creates a device; from then on the device
    never holds more than the budget (a request beyond it fails out of
    memory), and each plan ``tfswap.optimize`` binds on that device takes its
    pool from the arena while its step runs::

        import tensorflow as tf
        import tfswap
        from tfswap.ops import allocator
        allocator.install_gpu_arena("12GiB")
        model = ...                                    # variables: in the arena
        step = tfswap.optimize(train_step.get_concrete_function(...),
                               memory_budget="12GiB")  # binds the plan's pool
        step(x, y)                                     # runs inside it
        allocator.gpu_arena().stats()                  # strays, peak, carved bytes

    ``memory_budget``: bytes, or a string with a unit ("12GiB").  Returns the
    arena's bytes.  Raises :class:`AllocatorInstallError` as
    :func:`install_gpu_allocator` does (too late, no GPU, installed twice).
    """
    from tfswap.core.budget import parse_budget

    nbytes = parse_budget(memory_budget)
    _check_can_install(device_index, "install_gpu_arena")
    err = ctypes.create_string_buffer(_ERRLEN)
    rc = _clib().tfswap_install_gpu_arena(nbytes, device_index, err, _ERRLEN)
    _install_outcome(rc, err, "install_gpu_arena")
    global _arena_device_index
    _arena_device_index = device_index
    return nbytes


_arena_device_index: int | None = None   # the GPU install_gpu_arena chose


def gpu_arena() -> Arena | None:
    """The GPU's budget arena; None before TensorFlow created the device.

    Raises :class:`AllocatorInstallError` if :func:`install_gpu_arena` was not
    called in this process, or if creating the arena failed (the message says why).
    """
    handle = ctypes.c_void_p()
    err = ctypes.create_string_buffer(_ERRLEN)
    rc = _clib().tfswap_gpu_arena(ctypes.byref(handle), err, _ERRLEN)
    if rc == 2:
        raise AllocatorInstallError("no tfswap budget arena is installed in this process; "
                                    "call install_gpu_arena right after `import tensorflow`")
    if rc == 1:
        if err.value:
            raise AllocatorInstallError(err.value.decode())
        return None
    return Arena(handle, owned=False, what="GPU arena")


def installed_gpu_arena(device: str | None = None) -> Arena | None:
    """The GPU's budget arena if one is installed and the device exists, else None.

    ``device``: a TensorFlow device name ("/GPU:0", "/job:localhost/.../GPU:1");
    None also when the arena is on another GPU.
    """
    if _arena_device_index is None:
        return None
    if device is not None:
        from tfswap.tf.gpu import physical_index

        try:
            if physical_index(device) != _arena_device_index:
                return None
        except ValueError:   # not a GPU
            return None
    try:
        return gpu_arena()
    except AllocatorInstallError:
        return None


_clib_lock = threading.Lock()
_clib_handle = None


def _clib():
    global _clib_handle
    with _clib_lock:
        if _clib_handle is None:
            from . import library_path

            lib = ctypes.CDLL(str(library_path()))
            p, u64, i32, i64 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
            cp, sz = ctypes.c_char_p, ctypes.c_size_t
            sig = {
                "tfswap_pool_create": (ctypes.c_int, [i32, p, p, u64, u64, cp, p, p, cp, sz]),
                "tfswap_pool_destroy": (None, [p]),
                "tfswap_pool_replay": (ctypes.c_int, [p, i64, p, p, p, p, p, p, p, cp, sz]),
                "tfswap_pool_stats": (i32, [p, p, p, p]),
                "tfswap_pool_check": (ctypes.c_int, [p, cp, sz]),
                "tfswap_pool_stress": (ctypes.c_int, [p, i32, i64, u64, p, cp, sz]),
                "tfswap_install_gpu_pool": (ctypes.c_int,
                                            [i32, p, p, u64, u64, cp, p, i32, cp, sz]),
                "tfswap_gpu_pool_stats": (ctypes.c_int, [p, p, p, p, cp, sz]),
                "tfswap_tf_pool_selftest": (ctypes.c_int, [i32, p, p, u64, u64, cp, i32, p, p,
                                                           p, p, cp, sz]),
                "tfswap_testonly_create_tf_gpu_process_state": (None, []),
                "tfswap_arena_create": (ctypes.c_int, [u64, p, cp, sz]),
                "tfswap_arena_destroy": (None, [p]),
                "tfswap_arena_add_layout": (ctypes.c_int, [p, i32, p, p, u64, u64, cp, p, p,
                                                           cp, sz]),
                "tfswap_arena_activate": (ctypes.c_int, [p, i32, cp, sz]),
                "tfswap_arena_deactivate": (None, [p]),
                "tfswap_arena_remove_layout": (ctypes.c_int, [p, i32, cp, sz]),
                "tfswap_arena_allocate": (ctypes.c_int, [p, u64, p, cp, sz]),
                "tfswap_arena_free": (ctypes.c_int, [p, u64, cp, sz]),
                "tfswap_arena_stats": (None, [p, p, cp, sz]),
                "tfswap_arena_layout_stats": (i32, [p, i32, p, p, p, i32, p]),
                "tfswap_arena_clear_peak": (None, [p]),
                "tfswap_arena_check": (ctypes.c_int, [p, cp, sz]),
                "tfswap_arena_stress": (ctypes.c_int, [p, i32, i32, i64, u64, p, cp, sz]),
                "tfswap_install_gpu_arena": (ctypes.c_int, [u64, i32, cp, sz]),
                "tfswap_gpu_arena": (ctypes.c_int, [p, cp, sz]),
            }
            for name, (res, args) in sig.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            _clib_handle = lib
        return _clib_handle


def _as_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be integers (bytes or counts), got {value!r}")
    return int(value)


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _class_arrays(alloc: PoolAllocation):
    return (np.array(alloc.class_bytes, dtype=np.uint64),
            np.array(alloc.class_count, dtype=np.uint64))


def _offset_array(alloc: PoolAllocation) -> np.ndarray | None:
    """The shared layout's offsets, class after class; None for the disjoint layout."""
    if not alloc.object_offsets:
        return None
    return np.array([o for c in alloc.object_offsets for o in c], dtype=np.uint64)


def _ptr_or_null(a: np.ndarray | None):
    return None if a is None else _ptr(a)


def _create(lib, alloc: PoolAllocation):
    cb, cc = _class_arrays(alloc)
    offsets = _offset_array(alloc)
    out = ctypes.c_void_p()
    err = ctypes.create_string_buffer(_ERRLEN)
    rc = lib.tfswap_pool_create(len(alloc.class_bytes), _ptr(cb), _ptr(cc),
                                alloc.small_pool_bytes, alloc.small_threshold_bytes,
                                alloc.plan_id.encode(), _ptr_or_null(offsets), ctypes.byref(out),
                                err, _ERRLEN)
    if rc != _RC_OK:
        raise ValueError(err.value.decode())
    return out


def _encode_events(events):
    is_alloc, handles, nbytes = [], [], []
    ids: dict = {}
    for k, ev in enumerate(events):
        try:
            a, h, b = ev
        except (TypeError, ValueError):
            raise ValueError(f"event {k} is {ev!r}; events are (is_alloc, handle, nbytes)") from None
        is_alloc.append(1 if a else 0)
        handles.append(ids.setdefault(h, len(ids)))
        b = _as_int(b, f"event {k}: nbytes")
        if b < 0:
            raise ValueError(f"event {k}: nbytes must be >= 0, got {b}")
        nbytes.append(b if a else 0)
    return (np.array(is_alloc, dtype=np.uint8), np.array(handles, dtype=np.int64),
            np.array(nbytes, dtype=np.uint64))


def _stats(lib, pool, n_classes: int) -> PoolStats:
    totals = np.zeros(5, dtype=np.uint64)
    per_class = np.zeros(5 * max(n_classes, 1), dtype=np.uint64)
    small = np.zeros(6, dtype=np.uint64)
    lib.tfswap_pool_stats(pool, _ptr(totals), _ptr(per_class), _ptr(small))
    return _unpack_stats(totals, per_class, small, n_classes)


def _unpack_stats(totals, per_class, small, n_classes: int) -> PoolStats:
    t = [int(x) for x in totals]
    rows = per_class[:5 * n_classes].reshape(n_classes, 5) if n_classes else []
    return PoolStats(bytes_limit=t[0], bytes_in_use=t[1], peak_bytes_in_use=t[2],
                     num_allocs=t[3], largest_alloc_size=t[4],
                     classes=tuple(ClassStats(*(int(x) for x in r)) for r in rows),
                     small=SmallPoolStats(*(int(x) for x in small)))
