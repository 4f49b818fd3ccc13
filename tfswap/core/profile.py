"""Profile: what one step costs, per GraphDef node, whatever measured it.

Three profilers fill the same type (see :mod:`tfswap.tf.profile`): a traced
run of the whole step (``source="trace"``), each distinct op signature timed
alone (``"isolated"``) and the analytic roofline (``"analytic"``).  The IR
(:mod:`tfswap.tf.ir`) turns a GraphDef plus a Profile into the
:class:`~tfswap.core.graph.DataflowGraph` the planner works on.  Profiles are
plain data, saved as versioned JSON and loadable without TensorFlow.

Units: seconds and bytes.

Example::

    prof = Profile(source="analytic", device="v100-16g-pcie3", ops=(
        OpProfile("conv1", "Conv2D", time_s=1.2e-3, output_bytes=(4 << 20,)),
        OpProfile("relu1", "Relu", time_s=5e-5, output_bytes=(4 << 20,),
                  aliases=((0, 0),)),       # output 0 reuses input 0's buffer
    ))
    prof.save("step.profile.json")
    assert Profile.load("step.profile.json") == prof
    prof.op("relu1").time_s
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROFILE_FORMAT_VERSION = 1
SOURCES = ("trace", "isolated", "analytic")
# Where one op's figures came from; "analytic" inside a measured profile marks
# an op that could not be measured (it says so instead of inventing a number).
OP_SOURCES = SOURCES + ("fold",)


class ProfileFormatError(ValueError):
    """A profile file that is not a tfswap profile, or of an unsupported version."""


@dataclass(frozen=True)
class OpProfile:
    """Cost of one GraphDef node.

    ``time_s``: compute time on the profiled device.  ``output_bytes``: bytes of
    each output's buffer, by output index.  ``aliases``: ``(output, input)``
    index pairs where the output shares the input's buffer (TF forwarded the
    buffer in place, or the op is a view such as Reshape).  ``scratch_bytes``:
    kernel temporaries, live only while the op runs.  ``source``: which
    profiler produced the figures (one of ``OP_SOURCES``).
    """

    name: str
    type: str
    time_s: float = 0.0
    output_bytes: tuple[int, ...] = ()
    aliases: tuple[tuple[int, int], ...] = ()
    scratch_bytes: int = 0
    source: str = "analytic"

    def __post_init__(self):
        object.__setattr__(self, "output_bytes", tuple(int(b) for b in self.output_bytes))
        object.__setattr__(self, "aliases", tuple((int(o), int(i)) for o, i in self.aliases))
        if self.time_s < 0:
            raise ValueError(f"op {self.name!r}: time_s must be >= 0 seconds, got {self.time_s}")
        if self.scratch_bytes < 0 or any(b < 0 for b in self.output_bytes):
            raise ValueError(f"op {self.name!r}: byte counts must be >= 0")
        if self.source not in OP_SOURCES:
            raise ValueError(f"op {self.name!r}: source {self.source!r} is not one of {OP_SOURCES}")
        for out, inp in self.aliases:
            if out < 0 or inp < 0:
                raise ValueError(f"op {self.name!r}: alias indices must be >= 0, got {(out, inp)}")


@dataclass(frozen=True)
class Profile:
    """Per-node costs of one step on one device.

    ``device``: the DeviceSpec name (analytic) or the device string the step
    ran on.  ``executed_order``: node names in the order they started in the
    last traced run (trace
    profiles only; empty otherwise).  ``peak_bytes``: the measured device peak
    of that same run (trace only; 0 when not measured).  ``profiling_time_s``: wall
    time the profiler took.  ``runs`` / ``warmup``: traced runs whose median
    gives the times, and untimed runs before them.  ``time_scale``: the factor
    a trace profile's kernel times were multiplied by so that they add up to
    the untraced step's wall time (1.0: not calibrated).
    """

    source: str
    device: str
    ops: tuple[OpProfile, ...]
    executed_order: tuple[str, ...] = ()
    peak_bytes: int = 0
    runs: int = 0
    warmup: int = 0
    profiling_time_s: float = 0.0
    time_scale: float = 1.0
    _index: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"profile source {self.source!r} is not one of {SOURCES}")
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "executed_order", tuple(self.executed_order))
        index = {}
        for k, op in enumerate(self.ops):
            if op.name in index:
                raise ValueError(f"profile lists op {op.name!r} twice")
            index[op.name] = k
        object.__setattr__(self, "_index", index)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def op(self, name: str) -> OpProfile:
        try:
            return self.ops[self._index[name]]
        except KeyError:
            raise KeyError(f"the {self.source} profile has no op {name!r}; profile the same "
                           "captured graph the IR is built from") from None

    @property
    def total_time_s(self) -> float:
        return sum(op.time_s for op in self.ops)

    def to_json(self) -> str:
        body = asdict(self)
        body.pop("_index")
        body["format_version"] = PROFILE_FORMAT_VERSION
        body["kind"] = "tfswap.profile"
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        try:
            body = json.loads(text)
        except json.JSONDecodeError as err:
            raise ProfileFormatError(f"not a tfswap profile (invalid JSON: {err}); "
                                     "re-create it with profile.save(path)") from err
        if not isinstance(body, dict) or body.get("kind") != "tfswap.profile":
            raise ProfileFormatError("not a tfswap profile (missing kind 'tfswap.profile'); "
                                     "re-create it with profile.save(path)")
        version = body.pop("format_version", None)
        if version != PROFILE_FORMAT_VERSION:
            raise ProfileFormatError(
                f"profile format version {version} is not supported by this tfswap (reads "
                f"version {PROFILE_FORMAT_VERSION}); profile the step again")
        body.pop("kind")
        try:
            body["ops"] = tuple(OpProfile(**op) for op in body.get("ops", ()))
            return cls(**body)
        except (TypeError, ValueError) as err:
            raise ProfileFormatError(f"corrupted tfswap profile: {err}; profile again") from err

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        return cls.from_json(Path(path).read_text())
