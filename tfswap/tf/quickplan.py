"""A plan without search: TF's observed order plus the peak-crossing swap heuristic.

This is the planner of last resort (and the demo's): measure the unmodified
step once on the emulated device, keep the order TensorFlow executed it in,
and swap the largest tensors live across the memory peak
(:func:`tfswap.core.heuristic.swap_across_peak`).

Example::

    quick = heuristic_plan(captured, inputs, swaps=3)
    quick.plan, quick.predicted_freed_bytes, quick.baseline.peak_bytes
"""

from __future__ import annotations

from dataclasses import dataclass

from tfswap.core import heuristic, liveness
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Plan, Prediction
from tfswap.tf import ir, measure
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
    graph = ir.to_dataflow_graph(captured)
    baseline = measure.measure(captured, captured.graph_def, inputs)
    schedule = observed_schedule(graph, baseline)
    chosen = heuristic.swap_across_peak(graph, schedule, swaps, lead=lead, keep=captured.fetches)
    before = liveness.peak(graph, schedule, keep=captured.fetches)
    after = liveness.peak(graph, schedule, chosen, keep=captured.fetches)
    plan = Plan(schedule=tuple(schedule), swaps=chosen, planner="heuristic.swap_across_peak",
                prediction=Prediction(peak_bytes=after + baseline.variable_bytes,
                                      swap_out_bytes=sum(s.bytes for s in chosen),
                                      swap_in_bytes=sum(s.bytes for s in chosen)))
    return QuickPlan(plan, graph, baseline, before - after)
