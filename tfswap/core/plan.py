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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PLAN_FORMAT_VERSION = 1


class PlanFormatError(ValueError):
    """A plan file that is not a tfswap plan, or of an unsupported version."""


@dataclass(frozen=True)
class Swap:
    """One round trip of a tensor to host memory and back.

    ``out_after``: the swap-out starts once this op has run (normally the
    tensor's last reader before the gap).  ``in_after``: the trigger, the
    swap-in starts once this op has run.  ``in_wait_for``: ids of swaps whose
    swap-out must finish first (they free the memory this swap-in fills).
    ``consumers``: ops that read the swapped-in copy; any other reader keeps
    reading the original, so it must run before the gap.
    """

    tensor: str
    out_after: str
    in_after: str
    consumers: tuple[str, ...]
    in_wait_for: tuple[str, ...] = ()
    bytes: int = 0
    id: str = ""

    def __post_init__(self):
        if not self.id:
            object.__setattr__(self, "id", self.tensor)
        object.__setattr__(self, "consumers", tuple(self.consumers))
        object.__setattr__(self, "in_wait_for", tuple(self.in_wait_for))
        if not self.consumers:
            raise ValueError(f"swap of {self.tensor}: no consumer reads the swapped-in copy; "
                             "a tensor that is not needed again should be freed, not swapped")
        if self.bytes < 0:
            raise ValueError(f"swap of {self.tensor}: bytes must be >= 0, got {self.bytes}")


@dataclass(frozen=True)
class Prediction:
    """What the planner expects of the plan (bytes, seconds); None where unknown."""

    peak_bytes: int | None = None
    step_time_s: float | None = None
    ideal_time_s: float | None = None
    swap_out_bytes: int | None = None
    swap_in_bytes: int | None = None


@dataclass(frozen=True)
class Plan:
    schedule: tuple[str, ...]
    swaps: tuple[Swap, ...] = ()
    budget_bytes: int | None = None
    prediction: Prediction = field(default_factory=Prediction)
    graph_fingerprint: str = ""
    planner: str = "manual"

    def __post_init__(self):
        object.__setattr__(self, "schedule", tuple(self.schedule))
        object.__setattr__(self, "swaps", tuple(self.swaps))
        seen = set()
        for op in self.schedule:
            if op in seen:
                raise ValueError(f"op {op!r} appears twice in the schedule")
            seen.add(op)
        ids = [s.id for s in self.swaps]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"swap ids must be unique; repeated: {sorted(dup)} "
                             "(give repeated swaps of one tensor distinct ids)")
        for s in self.swaps:
            unknown = [w for w in s.in_wait_for if w not in ids]
            if unknown:
                raise ValueError(f"swap {s.id!r} waits for unknown swaps {unknown}")

    @property
    def swapped_bytes(self) -> int:
        return sum(s.bytes for s in self.swaps)

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
        if version != PLAN_FORMAT_VERSION:
            raise PlanFormatError(f"plan format version {version} is not supported by this "
                                  f"tfswap (reads version {PLAN_FORMAT_VERSION}); re-plan")
        body.pop("kind")
        try:
            body["swaps"] = tuple(Swap(**s) for s in body.get("swaps", ()))
            body["prediction"] = Prediction(**body.get("prediction", {}))
            return cls(**body)
        except (TypeError, ValueError) as err:
            raise PlanFormatError(f"corrupted tfswap plan: {err}; re-plan") from err

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_json(Path(path).read_text())
