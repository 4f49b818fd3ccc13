"""tfswap.optimize on a BERT-style encoder and a 4-layer LSTM (issue #5).

At 50% of the unmodified step's measured device peak with the variables on the
device, and at 30% with the model and optimizer created in host memory (the
plan fetches every parameter before its use).  The budget is always a fraction
of the peak of the step with its variables on the device.  ResNet-50 at the
same questions is in ``benchmarks/optimize_models.py`` (too slow for the suite
on 2 cores).
"""

import numpy as np
import pytest

import tfswap
from tfswap import zoo
from tfswap.tf import capture, emulate, measure, runtime
from tests.tf.equality import run_steps, worst_relative_difference

MODELS = {
    "bert": lambda **k: zoo.bert(batch=16, seq=128, dim=128, layers=2, **k),
    "lstm4": lambda **k: zoo.lstm(batch=16, steps=24, features=32, units=64, layers=4, **k),
}
CASES = [(name, 0.5, "device") for name in sorted(MODELS)] + \
        [(name, 0.3, "host") for name in sorted(MODELS)]
# The captured graph run by tfswap's runtime (Grappler already applied, so it
# adds no fusion of its own) and TF's own execution of the function fuse some
# kernels differently: float32 results differ in the last bits (1.4e-6 seen on
# BERT with no swap at all).  Against the captured graph the rewrite must be exact.
USER_RTOL = 1e-5


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]:.0%}-{c[2]}")
def optimized(request):
    name, fraction, home = request.param
    on_device = MODELS[name]()
    reference = capture.capture(on_device.concrete_fn)
    baseline = measure.measure(reference, reference.graph_def, on_device.batch,
                               inter_op_threads=1)
    budget = int(fraction * baseline.peak_bytes)
    step = on_device if home == "device" else MODELS[name](variables_on=emulate.HOST)
    captured = reference if home == "device" else capture.capture(step.concrete_fn)
    # Variables stay where they were built: the comparisons below run the
    # captured graph on the same variables (tests/tf/test_homes.py moves them).
    fast = tfswap.optimize(step.concrete_fn, budget, generations=20, seed=0, workers=1,
                           inputs=step.batch, parameters="device")
    return f"{name} {fraction:.0%} variables on the {home}", step, captured, baseline, \
        budget, fast


def test_measured_peak_is_within_the_budget(optimized):
    name, step, _, baseline, budget, fast = optimized
    after = measure.measure(fast.captured, fast.graph_def, step.batch)
    print(f"\n{name}: unmodified {baseline.peak_bytes} B, budget {budget} B, "
          f"rewritten {after.peak_bytes} B, {len(fast.plan.swaps)} swaps, {fast.plan.planner}")
    assert fast.plan.swaps
    assert after.peak_bytes <= budget


def test_trains_exactly_like_the_captured_graph_and_like_the_users_function(optimized):
    name, step, captured, _, _, fast = optimized
    variables = fast.captured.variables
    initial = [v.numpy() for v in variables]
    unmodified = runtime.bind(captured, captured.graph_def)
    results = [run_steps(fn, variables, initial, step.batch)
               for fn in (unmodified, fast, step.concrete_fn)]
    for v, x in zip(variables, initial):
        v.assign(x)
    (plain_losses, plain_vars), (losses, got), (user_losses, user_vars) = results
    assert losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(plain_vars, got))
    np.testing.assert_allclose(losses, user_losses, rtol=USER_RTOL)
    worst, var = worst_relative_difference(user_vars, got, variables)
    assert worst <= USER_RTOL, f"{var} differs by {worst:.3g} of its scale"


def test_the_plan_is_no_slower_than_the_single_heuristic_plan_nor_any_planners(optimized):
    _, _, _, _, _, fast = optimized
    time_s = fast.plan.prediction.step_time_s
    planned = [c.step_time_s for c in fast.candidates if c.step_time_s is not None]
    assert planned and time_s == min(planned)
    assert [c.planner for c in fast.candidates if c.chosen] == [fast.plan.planner]
    # Where the search found a pool, its first individual is the heuristic plan
    # (TF's order, the default pool); where it found none (on some traces no
    # size-class pool fits the LSTM at 50%), the candidates say so and another
    # planner's plan serves.
    if fast.search is not None:
        assert time_s <= fast.search.heuristic_time_s * (1 + 1e-9)
    else:
        ga = next(c for c in fast.candidates if c.planner == "tfswap.ga")
        assert ga.step_time_s is None and ga.why_not


def test_host_homed_parameters_are_fetched_and_stay_in_host_memory(optimized):
    name, _, captured, _, _, fast = optimized
    prefetches = [s for s in fast.plan.swaps if s.kind == "prefetch"]
    if "host" in name:
        assert len(captured.host_homed) == len(captured.variables)
        assert prefetches and not fast.plan.resident_parameters
        assert all(v.device.endswith("CPU:1") for v in captured.variables)
        assert fast.lowered.variable_bytes == 0
    else:
        assert not captured.host_homed and not prefetches
