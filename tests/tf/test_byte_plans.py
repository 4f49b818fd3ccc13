"""Plans of the byte-cap planner (tfswap.core.byte_planner) rewritten and run on the
emulated device: the same training as the unmodified captured graph, bit for bit,
within the budget the plan was made for (60% of the traced peak).  Whether `optimize` picks such a plan depends on the step;
these tests run one whatever the search would pick."""

import numpy as np
import pytest

from tfswap import pipeline, zoo
from tfswap.core.devices import cpu_emulated
from tfswap.tf import measure, runtime

from .equality import run_steps

MODELS = {
    "cnn": lambda: zoo.cnn(batch=32, image=32),
    # Unrolled: swaps of its Unpack buffers are rewritten as copies of slices.
    "lstm": lambda: zoo.lstm(batch=16, steps=24, features=32, units=64, layers=4),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def planned(request):
    step = MODELS[request.param]()
    prepared = pipeline.prepare(step.concrete_fn, pipeline.Options.of(
        1.0, inputs=step.batch, profile="trace", device_spec=cpu_emulated()))
    prof = prepared.profile
    prepared = pipeline.with_budget(prepared, int(0.6 * prof.peak_bytes))
    made = pipeline.materialize(pipeline.plan(prepared, pipeline.first_attempt(prepared),
                                              planner="tfswap.bytes"))
    plan = made.planned.plan
    return (request.param, step, prepared.captured, prof, plan, made.rewritten,
            prepared.budget_bytes)


def test_the_plan_swaps_and_fits_its_arena_in_the_planner_budget(planned):
    _, _, _, prof, plan, rewritten, _ = planned
    assert plan.swaps and rewritten.swaps
    assert plan.allocation.shared
    assert plan.allocation.total_bytes <= plan.budget_bytes < prof.peak_bytes


def test_trains_bit_identically_to_the_unmodified_graph(planned):
    _, step, captured, _, _, rewritten, _ = planned
    variables = captured.variables
    initial = [v.numpy() for v in variables]
    plain = runtime.bind(captured, captured.graph_def)
    fast = runtime.bind(captured, rewritten.graph_def)
    ref_losses, ref_vars = run_steps(plain, variables, initial, step.batch)
    losses, got = run_steps(fast, variables, initial, step.batch)
    assert ref_losses == losses
    assert all(np.array_equal(a, b) for a, b in zip(ref_vars, got))


def test_the_rewritten_step_stays_within_the_budget(planned):
    name, step, captured, prof, plan, rewritten, budget = planned
    after = measure.measure(captured, rewritten.graph_def, step.batch).peak_bytes
    print(f"\n{name}: unmodified {prof.peak_bytes} B, budget {budget} B, byte plan {after} B "
          f"measured, {plan.prediction.peak_bytes} B simulated, {len(plan.swaps)} swaps")
    assert after <= budget
