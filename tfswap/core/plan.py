"""Plan: what to swap, when, and in which order the ops run.

A plan names ops and tensors of the captured graph by their GraphDef names
(tensor ``"op:0"``), so it is plain data: it can be written by hand, by a
baseline policy or by the genetic search, saved as versioned JSON and
applied later by :mod:`tfswap.tf.rewrite`.

Example::

    plan = Plan(
        schedule=("conv1", "relu1", "conv2", "loss", "grad_conv2", "grad_relu1"),
        swaps=(Swap(tensor="relu1:0", out_after="conv2", in_after="loss",
                    consumers=("grad_relu1",), bytes=4 << 20),),
    )
    plan.save("step.plan.json")
    assert Plan.load("step.plan.json") == plan

Version 2 adds what the swap planner (:mod:`tfswap.core.planner`) decides
besides round trips: the memory pool (:class:`Allocation`), the parameters
that stay on the device between steps (``resident_parameters``), and swaps of
other kinds (``Swap.kind``): a parameter fetched from its host home
("prefetch"), an updated parameter written back ("writeback"), and a device
copy discarded without a copy because the host copy is current ("drop").
Version-1 files still load (no allocation, no resident parameters).
Version 3 adds the kind "recompute" (Capuchin's recomputation, used by
:mod:`tfswap.core.baselines`): the device copy is discarded after
``out_after`` and the tensor's producer runs again just before its first
consumer; version-1 and -2 files still load.
Version 4 adds ``Allocation.object_offsets``: a shared pool layout, where
objects that are never in use at the same time may share memory
(:mod:`tfswap.core.layout`); older files still load (disjoint layout).
Version 5 adds ``host_variables``: the captured variables (by placeholder
name) that live in host memory when the plan runs, so that a saved plan
puts the user's variables where it was planned for (``tfswap.load_plan``);
older files have none listed.
Version 7 adds ``Swap.ops``: the ops a recomputation runs again (a tensor
written in place by several ops is recomputed by all of them); older files
have none (the producer alone).
Version 6 adds ``update_places``: where the update of each group of
host-homed variables runs (:class:`UpdatePlace`), so that a saved plan runs
its updates where it was planned to; older files have none (every update
computed on the device).
Version 8 adds ``tensorflow_version``: the version of the framework the step
was captured with, so that a plan is not applied under another (which may
optimise the step differently); older files have none (not checked).
Version 9 lets a recompute name ``in_after``: the recomputation runs right
after that op, earlier than its first consumer, to share the ops another
recomputation runs there; older files have none (each before its first
consumer).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PLAN_FORMAT_VERSION = 9
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9)
# Pool objects start at multiples of this (tfswap/ops/pool_core.h kObjectAlignment).
OBJECT_ALIGNMENT = 256
SWAP_KINDS = ("round_trip", "prefetch", "writeback", "drop", "recompute")
UPDATE_PLACES = ("device", "host", "pieces")


class PlanFormatError(ValueError):
    """A plan file that is not a tfswap plan, or of an unsupported version."""


@dataclass(frozen=True)
class Swap:
    """A move of a tensor between device and host memory.

    ``kind`` (default "round_trip"): one round trip of a tensor to host memory
    and back.  ``out_after``: the swap-out starts once this op has run
    (normally the tensor's last reader before the gap).  ``in_after``: the
    trigger, the swap-in starts once this op has run ("" for a swap-in that
    may start with the step).  ``in_wait_for``: ids of swaps whose swap-out
    must finish first (they free the memory this swap-in fills).
    ``consumers``: ops that read the swapped-in copy; any other reader keeps
    reading the original, so it must run before the gap.  ``out_before``: ops
    that must not start before this swap-out has finished (they allocate the
    memory it frees).

    Other kinds leave the fields that do not apply empty:
    "prefetch": a parameter copied in from its host home (no swap-out,
    ``out_after`` ""); "writeback": an updated parameter copied back to its
    host home and not needed again in the step (no swap-in, no consumers);
    "drop": a device copy whose host copy is current is discarded after
    ``out_after`` (nothing is copied; ``bytes`` is what it frees).
    "recompute": the device copy is discarded after ``out_after`` and the
    tensor's producer runs again right before the first of ``consumers``, or
    right after ``in_after`` where that is given (an earlier op, where it
    shares ops with another recomputation run there; "": the first
    consumer); nothing is copied, so ``in_wait_for`` stays empty;
    ``ops``, where given, are the ops run again in order (the producer, then
    the ops that wrote its buffer in place, the last one making ``tensor``).

    Example::

        Swap("w1:0", out_after="", in_after="", consumers=("conv1",),
             kind="prefetch", bytes=4 << 20)
    """

    tensor: str
    out_after: str
    in_after: str
    consumers: tuple[str, ...]
    in_wait_for: tuple[str, ...] = ()
    bytes: int = 0
    id: str = ""
    kind: str = "round_trip"
    out_before: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()   # a recompute: the ops run again, in order

    def __post_init__(self):
        if not self.id:
            object.__setattr__(self, "id", self.tensor)
        object.__setattr__(self, "consumers", tuple(self.consumers))
        object.__setattr__(self, "ops", tuple(self.ops))
        if self.ops and self.kind != "recompute":
            raise ValueError(f"{self.kind} of {self.tensor}: only a recompute runs ops again")
        object.__setattr__(self, "in_wait_for", tuple(self.in_wait_for))
        object.__setattr__(self, "out_before", tuple(self.out_before))
        if self.kind not in SWAP_KINDS:
            raise ValueError(f"swap of {self.tensor}: kind {self.kind!r} is not one of "
                             f"{SWAP_KINDS}")
        if self.bytes < 0:
            raise ValueError(f"swap of {self.tensor}: bytes must be >= 0, got {self.bytes}")
        if self.kind == "recompute":
            if not self.consumers or not self.out_after:
                raise ValueError(f"recompute of {self.tensor}: needs out_after (where the copy "
                                 "is discarded) and consumers (what reads the recomputed copy)")
            if self.in_wait_for:
                raise ValueError(f"recompute of {self.tensor}: nothing is copied in, so "
                                 "in_wait_for must be empty")
            return
        has_in = self.kind in ("round_trip", "prefetch")
        has_out = self.kind in ("round_trip", "writeback", "drop")
        if has_in and not self.consumers:
            raise ValueError(f"swap of {self.tensor}: no consumer reads the swapped-in copy; "
                             "a tensor that is not needed again should be freed, not swapped")
        if not has_in and (self.consumers or self.in_after or self.in_wait_for):
            raise ValueError(f"{self.kind} of {self.tensor}: has no swap-in, so consumers, "
                             "in_after and in_wait_for must be empty")
        if has_out and not self.out_after:
            raise ValueError(f"{self.kind} of {self.tensor}: out_after must name the op "
                             "after which the device copy is released")
        if not has_out and (self.out_after or self.out_before):
            raise ValueError(f"prefetch of {self.tensor}: has no swap-out, so out_after and "
                             "out_before must be empty")


@dataclass(frozen=True)
class Allocation:
    """A memory pool: size classes and how many objects each has (bytes).

    A pool tensor of ``s`` bytes takes one object of the smallest class whose
    size is >= ``s``.  Tensors smaller than ``small_threshold_bytes`` (and
    tensors of kind "small") live in a separate small-tensor pool of
    ``small_pool_bytes`` and are never swapped.  :mod:`tfswap.core.allocation`
    builds these from the paper's TS/CLS/CNT encoding.

    Layout: by default ("disjoint") every object has memory of its own, the
    classes one after another, so the pool is ``sum(count x size)``.
    ``object_offsets`` (one tuple per class, one offset per object, bytes
    from the start of the arena, multiples of 256) gives a *shared* layout:
    objects that the plan never holds at the same time may overlap, so the
    pool is the arena's extent, usually far less than the sum.  Only a plan's
    own simulation can say which objects may overlap; :mod:`tfswap.core.layout`
    computes the offsets from it, and the allocator refuses (loudly) to hand
    out an object whose memory another live object occupies.

    Example::

        Allocation(class_bytes=(1 << 20, 2 << 20), class_count=(8, 1))
        # 8 objects of 1 MiB and 1 of 2 MiB: 10 MiB of pool
        Allocation(class_bytes=(1 << 20, 2 << 20), class_count=(2, 1),
                   object_offsets=((0, 1 << 20), (0,)))
        # the 2 MiB object reuses the 1 MiB objects' memory: 2 MiB of pool
    """

    class_bytes: tuple[int, ...]
    class_count: tuple[int, ...]
    small_pool_bytes: int = 0
    small_threshold_bytes: int = 1 << 20
    object_offsets: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "class_bytes", tuple(int(b) for b in self.class_bytes))
        object.__setattr__(self, "class_count", tuple(int(c) for c in self.class_count))
        object.__setattr__(self, "object_offsets",
                           tuple(tuple(int(o) for o in c) for c in self.object_offsets))
        if self.object_offsets:
            if [len(c) for c in self.object_offsets] != list(self.class_count):
                raise ValueError("allocation: object_offsets must give one offset per "
                                 f"object of each class (counts {self.class_count}), got "
                                 f"{[len(c) for c in self.object_offsets]}")
            if any(o < 0 or o % OBJECT_ALIGNMENT for c in self.object_offsets for o in c):
                raise ValueError(f"allocation: object offsets must be >= 0 and multiples of "
                                 f"{OBJECT_ALIGNMENT} bytes")
        if len(self.class_bytes) != len(self.class_count):
            raise ValueError(f"allocation: {len(self.class_bytes)} class sizes but "
                             f"{len(self.class_count)} counts; give one count per class")
        if any(b <= 0 for b in self.class_bytes) or any(
                a >= b for a, b in zip(self.class_bytes, self.class_bytes[1:])):
            raise ValueError(f"allocation: class sizes must be positive and strictly "
                             f"increasing, got {self.class_bytes}")
        if any(c < 0 for c in self.class_count):
            raise ValueError(f"allocation: class counts must be >= 0, got {self.class_count}")
        if self.small_pool_bytes < 0 or self.small_threshold_bytes < 0:
            raise ValueError("allocation: small_pool_bytes and small_threshold_bytes "
                             "must be >= 0")

    @property
    def shared(self) -> bool:
        """True for a shared layout (objects placed by ``object_offsets``)."""
        return bool(self.object_offsets)

    @property
    def pool_bytes(self) -> int:
        """Bytes the size classes take, small pool excluded: objects x class size
        (disjoint layout), or the arena's extent (shared layout)."""
        if self.shared:
            return max((o + _aligned(b) for b, offs in zip(self.class_bytes, self.object_offsets)
                        for o in offs), default=0)
        return sum(b * c for b, c in zip(self.class_bytes, self.class_count))

    @property
    def total_bytes(self) -> int:
        return self.pool_bytes + self.small_pool_bytes


def _aligned(nbytes: int) -> int:
    return -(-int(nbytes) // OBJECT_ALIGNMENT) * OBJECT_ALIGNMENT


@dataclass(frozen=True)
class Prediction:
    """What the planner expects of the plan (bytes, seconds); None where unknown."""

    peak_bytes: int | None = None
    step_time_s: float | None = None
    ideal_time_s: float | None = None
    swap_out_bytes: int | None = None
    swap_in_bytes: int | None = None


@dataclass(frozen=True)
class UpdatePlace:
    """Where the update of a group of host-homed variables runs (a table and its
    optimizer slots, updated by one set of ops).

    ``variables``: the captured variables' placeholder names; ``place``:
    "device" (fetched, computed on the device, the result written back),
    "host" (computed on the host next to the variables; only the gradient's
    inputs travel) or "pieces" (on the device, ``pieces`` slices of rows one
    after another); ``why``: what decided it (the simulator's step times).
    """

    variables: tuple[str, ...]
    place: str
    pieces: int = 0
    why: str = ""

    def __post_init__(self):
        object.__setattr__(self, "variables", tuple(self.variables))
        if self.place not in UPDATE_PLACES:
            raise ValueError(f"place must be one of {UPDATE_PLACES}, got {self.place!r}")
        if (self.place == "pieces") != (self.pieces >= 2):
            raise ValueError(f"an update in pieces needs pieces >= 2 (and only then); got "
                             f"place {self.place!r}, pieces {self.pieces!r}")


@dataclass(frozen=True)
class Plan:
    schedule: tuple[str, ...]
    swaps: tuple[Swap, ...] = ()
    budget_bytes: int | None = None
    prediction: Prediction = field(default_factory=Prediction)
    graph_fingerprint: str = ""
    planner: str = "manual"
    allocation: Allocation | None = None
    resident_parameters: tuple[str, ...] = ()
    host_variables: tuple[str, ...] = ()   # captured variables in host memory between steps
    update_places: tuple[UpdatePlace, ...] = ()   # groups of them not updated on the device
    tensorflow_version: str = ""   # the framework the step was captured with ("": unknown)

    def __post_init__(self):
        object.__setattr__(self, "schedule", tuple(self.schedule))
        object.__setattr__(self, "update_places", tuple(self.update_places))
        object.__setattr__(self, "host_variables", tuple(self.host_variables))
        object.__setattr__(self, "swaps", tuple(self.swaps))
        object.__setattr__(self, "resident_parameters", tuple(self.resident_parameters))
        seen = set()
        for op in self.schedule:
            if op in seen:
                raise ValueError(f"op {op!r} appears twice in the schedule")
            seen.add(op)
        ids = [s.id for s in self.swaps]
        seen_ids: set[str] = set()
        dup = {i for i in ids if i in seen_ids or seen_ids.add(i)}
        if dup:
            raise ValueError(f"swap ids must be unique; repeated: {sorted(dup)} "
                             "(give repeated swaps of one tensor distinct ids)")
        for s in self.swaps:
            unknown = [w for w in s.in_wait_for if w not in seen_ids]
            if unknown:
                raise ValueError(f"swap {s.id!r} waits for unknown swaps {unknown}")

    @property
    def id(self) -> str:
        """A short content hash: names this plan in allocator errors and file names."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    @property
    def swapped_bytes(self) -> int:
        """Bytes of the tensors that move (a drop or recompute moves nothing; a round trip
        counts once)."""
        return sum(s.bytes for s in self.swaps if s.kind not in ("drop", "recompute"))

    def to_json(self) -> str:
        body = asdict(self)
        body["format_version"] = PLAN_FORMAT_VERSION
        body["kind"] = "tfswap.plan"
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            body = json.loads(text)
        except json.JSONDecodeError as err:
            raise PlanFormatError(f"not a tfswap plan (invalid JSON: {err}); "
                                  "re-create it with plan.save(path)") from err
        if not isinstance(body, dict) or body.get("kind") != "tfswap.plan":
            raise PlanFormatError("not a tfswap plan (missing kind 'tfswap.plan'); "
                                  "re-create it with plan.save(path)")
        version = body.pop("format_version", None)
        if version not in READABLE_VERSIONS:
            raise PlanFormatError(f"plan format version {version} is not supported by this "
                                  f"tfswap (reads versions {READABLE_VERSIONS}); re-plan")
        body.pop("kind")
        try:
            body["swaps"] = tuple(Swap(**s) for s in body.get("swaps", ()))
            body["prediction"] = Prediction(**body.get("prediction", {}))
            body["update_places"] = tuple(UpdatePlace(**u)
                                          for u in body.get("update_places", ()))
            if body.get("allocation") is not None:
                body["allocation"] = Allocation(**body["allocation"])
            return cls(**body)
        except (TypeError, ValueError) as err:
            raise PlanFormatError(f"corrupted tfswap plan: {err}; re-plan") from err

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    # Reports (summary, Chrome trace, memory plot) live in tfswap.report, which
    # depends on the core, never the reverse.
    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_json(Path(path).read_text())
