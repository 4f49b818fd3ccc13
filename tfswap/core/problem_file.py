"""A planning problem as a file: stable, compressed, versioned (issue #41).

A :class:`SavedProblem` is what a measured run leaves for a machine without
its device to plan again: the :class:`~tfswap.core.problem.Problem` (the
lowered step with that device's profile), the device's figures, the budget
the user gave and the one the planner got, the plan that ran, and the
measured row (any JSON values: peaks, times, whether it trained the same).
:func:`write` stores it as gzip-compressed JSON, column headers beside rows
of values, floats written exactly (``repr``), so a problem read back plans
and simulates to the same numbers; :func:`read` refuses, with what to do, a
file that is not one or was written by a newer format.  No pickle: a file
outlives the classes of the tfswap that wrote it.

Example::

    write("benchmarks/problems/h200.resnet50.0.6.json.gz",
          SavedProblem(problem, spec, budget_bytes=8 << 30, planner_budget_bytes=7 << 30))
    saved = read("benchmarks/problems/h200.resnet50.0.6.json.gz")
    planners.run("tfswap", saved.problem, saved.planner_budget_bytes, saved.spec)
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.plan import Plan, PlanFormatError
from tfswap.core.problem import Problem

KIND = "tfswap.problem"
FORMAT_VERSION = 1
# The fields written per op and per tensor, in column order.  Producers and
# consumers are left out: DataflowGraph.build links them again from the names.
OP_FIELDS = ("name", "type", "inputs", "control_inputs", "outputs", "device", "time_s",
             "scratch_bytes", "phase")
TENSOR_FIELDS = ("name", "nbytes", "dtype", "shape", "swappable", "kind", "alias_of")
# Fields stored as tuples (JSON has lists only).
_TUPLES = frozenset({"inputs", "control_inputs", "outputs", "shape"})


class ProblemFileError(ValueError):
    """A file that is not a saved planning problem this tfswap reads."""


@dataclass(frozen=True)
class SavedProblem:
    """One planning problem and what surrounds it.

    ``budget_bytes``: the memory budget the user gave; ``planner_budget_bytes``:
    what the planner was given of it (less the device bytes the plan does not
    see and the safety margin); ``allocator``: what served the step's memory
    (:data:`tfswap.core.best_of.ALLOCATORS`), as the default planner is told;
    ``plan``: the plan that ran, where one did; ``row``: what was measured
    (JSON values, e.g. ``measured_peak_bytes``, ``measured_step_s``,
    ``unmodified_step_s``)."""

    problem: Problem
    spec: DeviceSpec
    budget_bytes: int
    planner_budget_bytes: int
    allocator: str = "exact"
    plan: Plan | None = None
    row: dict = field(default_factory=dict)


def _columns(items, names) -> list[list]:
    rows = [[_plain(getattr(item, n)) for n in names] for item in items]
    for item, row in zip(items, rows):
        if any(v is None for v in row):   # a time or size that is not a number
            raise ValueError(f"{type(item).__name__.lower()} {item.name!r}: a field is not "
                             "a finite number; it cannot be saved")
    return rows


def _rows(cls, names, values) -> list:
    out = []
    for row in values:
        if len(row) != len(names):
            raise ProblemFileError(f"one {cls.__name__.lower()} row has {len(row)} values "
                                   f"for {len(names)} columns")
        out.append(cls(**{n: tuple(v) if n in _TUPLES else v for n, v in zip(names, row)}))
    return out


def _plain(value):
    """``value`` in JSON's types: NumPy scalars as Python's, every float that is not
    finite as None (JSON has no NaN)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()   # a NumPy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_json(saved: SavedProblem) -> str:
    """``saved`` as the JSON text :func:`write` compresses."""
    problem = saved.problem
    body = {
        "kind": KIND, "format_version": FORMAT_VERSION,
        "op_fields": list(OP_FIELDS), "ops": _columns(problem.graph.ops, OP_FIELDS),
        "tensor_fields": list(TENSOR_FIELDS),
        "tensors": _columns(problem.graph.tensors, TENSOR_FIELDS),
        "keep": list(problem.keep), "schedule": list(problem.schedule),
        "small_threshold_bytes": problem.small_threshold_bytes,
        "params_start_on_host": problem.params_start_on_host,
        "recomputable": sorted(problem.recomputable),
        "spec": json.loads(saved.spec.to_json()),
        "budget_bytes": int(saved.budget_bytes),
        "planner_budget_bytes": int(saved.planner_budget_bytes),
        "allocator": saved.allocator,
        "plan": json.loads(saved.plan.to_json()) if saved.plan is not None else None,
        "row": _plain(saved.row),
    }
    return json.dumps(body, separators=(",", ":"), allow_nan=False)


def from_json(text: str) -> SavedProblem:
    """The :class:`SavedProblem` in ``text`` (:func:`to_json`'s)."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProblemFileError(f"not a saved tfswap problem (invalid JSON: {err})") from err
    if not isinstance(body, dict) or body.get("kind") != KIND:
        raise ProblemFileError(f"not a saved tfswap problem (no kind {KIND!r}); write one "
                               "with tfswap.core.problem_file.write")
    version = body.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or \
            not 1 <= version <= FORMAT_VERSION:
        raise ProblemFileError(f"problem format version {version!r} is not one this tfswap "
                               f"reads (1 to {FORMAT_VERSION}); read it with the tfswap "
                               "that wrote it, or a newer one")
    try:
        ops = _rows(Op, body["op_fields"], body["ops"])
        tensors = _rows(Tensor, body["tensor_fields"], body["tensors"])
        problem = Problem.of(DataflowGraph.build(ops, tensors), keep=body["keep"],
                             schedule=body["schedule"],
                             small_threshold_bytes=body["small_threshold_bytes"],
                             params_start_on_host=body["params_start_on_host"],
                             recomputable=body["recomputable"])
        unknown = set(body["spec"]) - {f.name for f in fields(DeviceSpec)}
        if unknown:
            raise ProblemFileError(f"the device's figures name fields this tfswap does not "
                                   f"know ({sorted(unknown)}); read it with the tfswap that "
                                   "wrote it, or a newer one")
        spec = DeviceSpec(**body["spec"])
        plan = Plan.from_json(json.dumps(body["plan"])) if body["plan"] is not None else None
        return SavedProblem(problem, spec, int(body["budget_bytes"]),
                            int(body["planner_budget_bytes"]), body["allocator"], plan,
                            dict(body["row"]))
    except (KeyError, TypeError, ValueError, AttributeError, PlanFormatError) as err:
        if isinstance(err, ProblemFileError):
            raise
        raise ProblemFileError(f"a corrupted saved problem ({type(err).__name__}: {err}); "
                               "save it again from its run") from err


def write(path: str | Path, saved: SavedProblem) -> Path:
    """Write ``saved`` to ``path`` (gzip-compressed JSON, the same bytes for the same
    problem: no time stamp in the gzip header); its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(to_json(saved).encode(), compresslevel=9, mtime=0))
    return path


def read(path: str | Path) -> SavedProblem:
    """The problem :func:`write` stored at ``path``; :class:`ProblemFileError` where
    the file is not one this tfswap reads."""
    raw = Path(path).read_bytes()
    try:
        text = gzip.decompress(raw).decode()
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise ProblemFileError(f"{path}: not a saved tfswap problem (not gzip-compressed "
                               f"JSON: {err})") from err
    try:
        return from_json(text)
    except ProblemFileError as err:
        raise ProblemFileError(f"{path}: {err}") from err


__all__ = ["FORMAT_VERSION", "ProblemFileError", "SavedProblem", "from_json", "read",
           "to_json", "write"]
