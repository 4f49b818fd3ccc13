"""The captured step lowered to what the planners see: a :class:`Lowered`
(the TF adapter's ``LoweredGraph`` from :func:`tfswap.tf.ir.lower` and the
framework-free :class:`~tfswap.core.problem.Problem`), at a small-tensor
threshold, with the device variables pinned and the host's work priced; and
the planner's share of a budget.

Example::

    step = lower_default(captured, profile, spec)
    usable, outside = planner_budget(budget, step.lowered, safety_margin=0.05)
    planners.run("tfswap", step.problem, usable, spec)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tfswap.core import liveness, planners
from tfswap.core.budget import BudgetError
from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Plan
from tfswap.core.problem import Problem
from tfswap.tf import ir

SMALLEST_SMALL_BYTES = 4 << 10   # the default small-tensor threshold's floor


@dataclass(frozen=True)
class Lowered:
    """The captured step lowered at one small-tensor threshold: the TF adapter's
    ``LoweredGraph`` and the :class:`Problem` the planners see."""

    lowered: Any
    problem: Problem
    unconstrained: Plan   # TF's order, no memory limit

    @property
    def small(self) -> int:
        return self.problem.small_threshold_bytes



def lower_default(captured, prof, spec: DeviceSpec, recompute: bool = True) -> Lowered:
    """The step lowered at the default small-tensor threshold (:func:`small_threshold`
    of the step's no-swap peak).

    From the step, not the budget: a budget-dependent threshold would make
    the smallest feasible budget a BudgetError names infeasible again when
    passed back (other tensors become small).  Without a measured peak
    (analytic, isolated profiles), the unconstrained plan's.
    """
    step = lower(captured, prof, spec, small_threshold(prof.peak_bytes or 0), recompute)
    if not prof.peak_bytes:
        wanted = small_threshold(step.unconstrained.prediction.peak_bytes)
        if wanted != step.small:
            step = lower(captured, prof, spec, wanted, recompute)
    return step


def lower_at(captured, prof, spec: DeviceSpec, small: int | None,
             recompute: bool = True) -> Lowered:
    """:func:`lower` at ``small`` bytes, or :func:`lower_default` where ``small`` is
    None (``Options.small_tensor_bytes``' default)."""
    if small is None:
        return lower_default(captured, prof, spec, recompute)
    return lower(captured, prof, spec, small, recompute)


def lower(captured, prof, spec: DeviceSpec, small: int, recompute: bool = True) -> Lowered:
    """The captured step as the planners see it, with tensors under ``small`` bytes
    in the small pool.  Every plan here has ``params_start_on_host``: TensorFlow
    keeps no device copy of a host variable between steps.  ``recompute``: the
    planners may recompute the ops that can run again
    (:mod:`tfswap.tf.recomputable`); False: swaps only."""
    lowered = ir.lower(captured, prof, small_bytes=small)
    problem = Problem.of(planning_graph(lowered, spec),
                         keep=tuple(lowered.fetches) + tuple(lowered.assigned),
                         schedule=lowered.schedule(), small_threshold_bytes=small,
                         params_start_on_host=True,
                         recomputable=lowered.recomputable if recompute else ())
    unconstrained = planners.run("tfswap.order", problem, 1 << 62, spec).plan
    return Lowered(lowered, problem, unconstrained)


def planning_graph(lowered, spec: DeviceSpec) -> DataflowGraph:
    """The lowered step as the planners see it: device variables pinned
    (:func:`pin_parameters`), the work placed on the host at the host's speed
    (:func:`price_host_work`), and each update of a host-homed variable charged
    the copy of what it reads from the device (:func:`price_writebacks`)."""
    return price_writebacks(price_host_work(pin_parameters(lowered.graph, lowered.resident),
                                            lowered.host_ops, spec),
                            lowered.writebacks, spec)


def price_host_work(graph: DataflowGraph, host_ops: dict, spec: DeviceSpec) -> DataflowGraph:
    """Each op computing on the host (``host_ops``: op -> bytes it reads and writes)
    at least as long as the host's memory takes to move those bytes
    (``spec.host_memory_bandwidth_bytes_per_s``; None: the profiled time holds,
    as on the emulated device, whose host is the same CPU)."""
    bandwidth = spec.host_memory_bandwidth_bytes_per_s
    if not host_ops or bandwidth is None:
        return graph
    ops = [dataclasses.replace(op, outputs=(), time_s=max(op.time_s, host_ops[op.name] / bandwidth))
           if op.name in host_ops else dataclasses.replace(op, outputs=()) for op in graph.ops]
    return DataflowGraph.build(ops, [dataclasses.replace(t, producer=-1, consumers=())
                                     for t in graph.tensors])


def price_writebacks(graph: DataflowGraph, writebacks: dict, spec: DeviceSpec) -> DataflowGraph:
    """Add to each update of a host-homed variable the device-to-host copy of the
    values it reads (``writebacks``: op -> bytes).

    The update runs on the host, in the schedule's control chain, after its
    values' swap-outs (:mod:`tfswap.tf.rewrite`), so the next op waits for the
    copy: charging it to the update is what runs when the copy has not
    finished by then, and an upper bound when it has.
    """
    if not writebacks:
        return graph
    ops = [dataclasses.replace(op, outputs=(), time_s=op.time_s + spec.copy_time_s(
        writebacks[op.name], "d2h")) if op.name in writebacks else
        dataclasses.replace(op, outputs=()) for op in graph.ops]
    return DataflowGraph.build(ops, [dataclasses.replace(t, producer=-1, consumers=())
                                     for t in graph.tensors])


def pin_parameters(graph: DataflowGraph, resident) -> DataflowGraph:
    """Mark the device variables' value tensors (``resident``) unswappable.

    A variable the user created on the device stays there.  One created in
    host memory (under ``tf.device(host)``) is read on the host; each read is
    a parameter the plan fetches before its first use on the device.
    """
    pinned = set(resident)
    tensors = [dataclasses.replace(t, swappable=False, kind=_variable_kind(graph, t))
               if t.name in pinned else t for t in graph.tensors]
    return DataflowGraph.build(
        [dataclasses.replace(op, outputs=()) for op in graph.ops],
        [dataclasses.replace(t, producer=-1, consumers=()) for t in tensors])


def _variable_kind(graph: DataflowGraph, tensor) -> str:
    """A device variable's value is the variable's buffer, held all step, however
    small: ``kinds.classify`` calls a value below the small threshold "small",
    which the small pool counts only from its read to its last reader, while
    TensorFlow holds every device variable for the whole step (measured peaks
    add them all).  BERT-style's 556 KiB of biases, norms and their Adam
    moments were counted only while read, so its predictions came out 3%
    under the measured (issue #44).  Kept "parameter" (read in the forward
    pass) or "optimizer_state" (read only by the update), the small pool
    counts it throughout (``CompiledGraph.small_persistent``)."""
    if tensor.kind != "small":
        return tensor.kind
    forward = tensor.producer < 0 or graph.ops[tensor.producer].phase == "forward"
    return "parameter" if forward else "optimizer_state"


def small_threshold(step_peak_bytes: int) -> int:
    """Default small-tensor threshold: 1/1024 of the step's no-swap peak, 4 KiB to 1 MiB."""
    return int(min(1 << 20, max(SMALLEST_SMALL_BYTES, step_peak_bytes // 1024)))


def planner_budget(budget: int, lowered, safety_margin: float) -> tuple[int, int]:
    """Bytes the planner may use, and the device bytes it does not see.

    Variables that the step never reads are not in the graph but live on the
    device; the planner sees every variable the step reads (as resident
    buffers).
    """
    roots = {liveness.buffer_root(lowered.graph, t) for t in lowered.resident}
    seen = sum(lowered.graph.tensor(t).nbytes for t in roots)
    outside = max(0, lowered.variable_bytes - seen)
    usable = int(budget * (1.0 - safety_margin)) - outside
    if usable <= 0:
        raise BudgetError(f"memory_budget of {budget} bytes does not even hold the step's "
                          f"variables ({lowered.variable_bytes} bytes); raise it")
    return usable, outside


__all__ = ["Lowered", "SMALLEST_SMALL_BYTES", "lower", "lower_at", "lower_default",
           "pin_parameters", "planner_budget", "planning_graph", "price_host_work",
           "price_writebacks", "small_threshold"]
