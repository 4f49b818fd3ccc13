"""A plan without search: TF's observed order plus the peak-crossing swap heuristic.

This is the planner of last resort (and the demo's): measure the unmodified
step once on the emulated device, keep the order TensorFlow executed it in,
and swap the largest tensors live across the memory peak
(:func:`research.heuristic.swap_across_peak`).

Example::

    quick = heuristic_plan(captured, inputs, swaps=3)
    quick.plan, quick.predicted_freed_bytes, quick.baseline.peak_bytes
"""

from __future__ import annotations

from dataclasses import dataclass

from tfswap.core import liveness
from research import heuristic
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Plan, Prediction
from tfswap.tf import ir, measure, profile
from tfswap.tf.capture import CapturedFunction


@dataclass(frozen=True)
class QuickPlan:
    plan: Plan
    graph: DataflowGraph
    baseline: measure.Measurement       # the unmodified step, measured
    predicted_freed_bytes: int          # liveness peak without swaps minus with them


def observed_schedule(graph: DataflowGraph, baseline: measure.Measurement) -> list[str]:
    """The order TF executed the step in, completed with the ops it fused away."""
    return [graph.ops[i].name for i in graph.order_following(list(baseline.executed_ops))]


def heuristic_plan(captured: CapturedFunction, inputs, swaps: int = 3, lead: int = 2) -> QuickPlan:
    # The trace runs one op at a time, so TF's executed order (the schedule) is
    # the same every run and so is the plan (with two threads both varied).
    low = ir.lower(captured, profile.trace(captured, inputs, runs=1, warmup=1))
    graph, schedule = low.graph, low.schedule()
    baseline = measure.measure(captured, captured.graph_def, inputs, inter_op_threads=1)
    keep = tuple(low.fetches) + tuple(low.assigned)
    chosen = heuristic.swap_across_peak(graph, schedule, swaps, lead=lead, keep=keep)
    before = liveness.peak(graph, schedule, keep=keep, resident=low.resident)
    after = liveness.peak(graph, schedule, chosen, keep=keep, resident=low.resident)
    plan = Plan(schedule=tuple(schedule), swaps=chosen, planner="heuristic.swap_across_peak",
                prediction=Prediction(peak_bytes=after + baseline.variable_bytes,
                                      swap_out_bytes=sum(s.bytes for s in chosen),
                                      swap_in_bytes=sum(s.bytes for s in chosen)))
    return QuickPlan(plan, graph, baseline, before - after)
