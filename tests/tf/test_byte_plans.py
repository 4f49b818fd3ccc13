"""Plans of the byte-cap planner (tfswap.core.byte_planner) rewritten and run on the
emulated device: the same training as the unmodified captured graph, bit for bit,
within the budget the plan was made for.  Whether `optimize` picks such a plan depends
on the step; these tests run one whatever the search would pick.

The problem is fixed by the graph, not by the traced run: the plan keeps a depth-first
schedule (:func:`depth_first_schedule`) and the budget is 60% of that schedule's peak.
TF's executed order is no such thing.  With one inter-op thread the executor still
chooses, per kernel, between running it inline and queueing it, partly by a running
estimate of the kernel's cycles kept per session, so the order, and with it the traced
peak, change from session to session: the unrolled LSTM below traced 10.3 to 13.4 MB in
one process, while the planner's smallest arena for it is about 6 MB (the 2.7 MB
small-tensor pool and 1.5 MB of parameters it keeps on the device, and AddN's 24
gradients) in each order tried.  60% of a 10.3 MB run was below that (issue #22)."""

import dataclasses

import numpy as np
import pytest

from tfswap import pipeline, zoo
from tfswap import options as options_mod
from tfswap.tf import lower as tf_lower
from tfswap.core.devices import cpu_emulated
from tfswap.tf import runtime

from .equality import run_steps

MODELS = {
    "cnn": lambda: zoo.cnn(batch=32, image=32),
    # Unrolled: swaps of its Unpack buffers are rewritten as copies of slices.
    "lstm": lambda: zoo.lstm(batch=16, steps=24, features=32, units=64, layers=4),
}
FRACTION = 0.6


def depth_first_schedule(graph) -> list[str]:
    """Kahn's order taking the op made ready last first (ties: op index).

    Deterministic for a graph, and TF-like: the LSTM's peak in it is the one most of its
    traced runs had (13.4 MB); the lowered graph's min-index order's is 7.1 MB."""
    n = len(graph.ops)
    waiting = [0] * n
    successors = [[] for _ in range(n)]
    for i in range(n):
        for p in sorted(graph.predecessors(i)):
            waiting[i] += 1
            successors[p].append(i)
    ready = [i for i in range(n) if not waiting[i]]
    order = []
    while ready:
        i = ready.pop()
        order.append(i)
        for s in successors[i]:
            waiting[s] -= 1
            if not waiting[s]:
                ready.append(s)
    return [graph.ops[i].name for i in order]


def in_schedule(prepared: pipeline.Prepared) -> pipeline.Prepared:
    """``prepared`` planned in the depth-first schedule at FRACTION of that schedule's peak
    (the model's); the profile gives sizes and times.  The small-tensor threshold follows
    the schedule's peak, as optimize's follows the traced one."""
    captured, prof, spec = prepared.captured, prepared.profile, prepared.spec
    step = prepared.step
    peak = step.lowered.predicted_peak(depth_first_schedule(step.problem.graph))
    if tf_lower.small_threshold(peak) != step.small:
        step = tf_lower.lower(captured, prof, spec, tf_lower.small_threshold(peak))
    schedule = tuple(depth_first_schedule(step.problem.graph))
    step = dataclasses.replace(step, problem=dataclasses.replace(step.problem,
                                                                 schedule=schedule))
    peak = step.lowered.predicted_peak(schedule)
    return pipeline.with_budget(dataclasses.replace(prepared, step=step), int(FRACTION * peak))


def byte_plan(prepared: pipeline.Prepared) -> pipeline.Planned:
    """The byte-cap planner's plan of ``prepared``, in the shared arena."""
    return pipeline.plan(prepared, pipeline.first_attempt(prepared), planner="tfswap.bytes")


@pytest.fixture(scope="module", params=sorted(MODELS))
def planned(request):
    step = MODELS[request.param]()
    prepared = in_schedule(pipeline.prepare(step.concrete_fn, options_mod.Options.of(
        1.0, inputs=step.batch, profile="trace", device_spec=cpu_emulated())))
    made = pipeline.materialize(byte_plan(prepared))
    return request.param, step, prepared, made


def test_the_plan_swaps_and_fits_its_arena_in_the_planner_budget(planned):
    _, _, prepared, made = planned
    plan, attempt = made.planned.plan, made.planned.attempt
    assert plan.swaps and made.rewritten.swaps
    assert plan.allocation.shared
    assert plan.allocation.total_bytes <= attempt.planner_budget < prepared.budget_bytes
    assert plan.schedule == prepared.step.problem.schedule


def test_the_problem_does_not_depend_on_tfs_executed_order(planned):
    """A profile of another one-thread run of the step, here in the lowered graph's
    min-index order (for the LSTM a valid order whose peak, 7.1 MB, is about half the
    depth-first one's), still gives a plan.  Planned in that order at 60% of its peak,
    as this file did with the traced order, the LSTM's problem is infeasible.  What the
    problem still takes from the run are the in-place forwards TF made in it (the
    LSTM's schedule peak moved by at most 0.8% between sessions)."""
    _, _, prepared, _ = planned
    lowered = prepared.step.lowered
    order = lowered.schedule(())
    other = dataclasses.replace(lowered.profile, executed_order=tuple(order),
                                peak_bytes=lowered.predicted_peak(order))
    again = dataclasses.replace(prepared, profile=other, step=tf_lower.lower_default(
        prepared.captured, other, prepared.spec))
    plan = byte_plan(in_schedule(again)).plan
    assert plan.swaps and plan.allocation.total_bytes <= plan.budget_bytes


def test_trains_bit_identically_to_the_unmodified_graph(planned):
    _, step, prepared, made = planned
    captured, rewritten = prepared.captured, made.rewritten
    variables = captured.variables
    initial = [v.numpy() for v in variables]
    plain = runtime.bind(captured, captured.graph_def)
    fast = runtime.bind(captured, rewritten.graph_def)
    ref_losses, ref_vars = run_steps(plain, variables, initial, step.batch)
    losses, got = run_steps(fast, variables, initial, step.batch)
    assert ref_losses == losses
    assert all(np.array_equal(a, b) for a, b in zip(ref_vars, got))


def test_the_rewritten_step_stays_within_the_budget(planned):
    name, step, prepared, made = planned
    plan, budget = made.planned.plan, prepared.budget_bytes
    after = pipeline.verify(made).measured_peak_bytes
    print(f"\n{name}: budget {budget} B, byte plan {after} B measured, "
          f"{plan.prediction.peak_bytes} B simulated, {len(plan.swaps)} swaps")
    assert after <= budget
