"""Parameters in host memory (SwapAdvisor's parameter swapping, DESIGN.md "Parameters").

A model and optimizer created under ``tf.device(host)`` keep their variables
in host memory between steps: reads and updates run on the host, and the
plan fetches each value read before its use on the device.  Every check here
compares against the unmodified step (the captured graph run by tfswap's
runtime, and the user's own function).
"""

import dataclasses

import numpy as np
import pytest

import tfswap
from tfswap import zoo
from tfswap.core.budget import BudgetError
from tfswap.core.plan import Plan, Swap
from tfswap.tf import capture, emulate, ir, measure, rewrite, runtime
from tests.tf.equality import run_steps, worst_relative_difference

HOST_SUFFIX = "CPU:1"


@pytest.fixture(scope="module")
def steps():
    """The default small BERT (parameters and Adam state are most of its peak),
    once with its variables on the device and once in host memory, and 30% of
    the device-homed step's measured peak."""
    on_device = zoo.bert()
    reference = capture.capture(on_device.concrete_fn)
    peak = measure.measure(reference, reference.graph_def, on_device.batch,
                           inter_op_threads=1).peak_bytes
    on_host = zoo.bert(variables_on=emulate.HOST)
    return on_device, reference, on_host, capture.capture(on_host.concrete_fn), int(0.3 * peak)


@pytest.fixture(scope="module")
def optimized(steps):
    _, _, on_host, _, budget = steps
    return tfswap.optimize(on_host.concrete_fn, budget, generations=5, seed=0, workers=1,
                           inputs=on_host.batch)


def test_capture_marks_host_variables_and_runs_their_reads_and_updates_there(steps):
    _, reference, _, captured, _ = steps
    assert reference.host_homed == ()
    assert len(captured.host_homed) == len(captured.variables) > 0
    handles = {name.partition(":")[0] for name in captured.host_homed}
    users = [n for n in captured.graph_def.node
             if any(i.partition(":")[0] in handles for i in n.input)]
    assert {n.op for n in users} >= {"ReadVariableOp", "AssignAddVariableOp"}
    assert all(n.device.endswith(HOST_SUFFIX) for n in users)


def test_each_read_of_a_host_variable_is_a_parameter_of_its_own(steps):
    _, reference, _, captured, _ = steps
    device_homed, host_homed = ir.lower(reference), ir.lower(captured)
    assert device_homed.resident and device_homed.variable_bytes > 0
    assert host_homed.resident == () and host_homed.variable_bytes == 0
    reads = [op for op in host_homed.graph.ops if op.type == "ReadVariableOp"]
    values = [host_homed.graph.tensor(f"{op.name}:0") for op in reads]
    # A read after an update holds the new value: no read shares another's buffer.
    assert all(not t.alias_of for t in values)
    assert {t.kind for t in values if t.kind != "small"} <= {"parameter", "optimizer_state"}


def test_on_the_device_the_parameters_alone_exceed_the_budget(steps):
    on_device, _, _, _, budget = steps
    with pytest.raises(BudgetError, match="parameters that stay on the device take"):
        tfswap.optimize(on_device.concrete_fn, budget, generations=2, workers=1,
                        inputs=on_device.batch, parameters="device")


def test_in_host_memory_the_step_fits_and_trains_exactly(steps, optimized):
    _, _, on_host, captured, budget = steps
    after = measure.measure(captured, optimized.graph_def, on_host.batch)
    assert after.variable_bytes == 0 and after.peak_bytes <= budget
    assert any(s.kind == "prefetch" for s in optimized.plan.swaps)
    variables = captured.variables
    initial = [v.numpy() for v in variables]
    results = []
    for fn in (runtime.bind(captured, captured.graph_def), optimized, on_host.concrete_fn):
        results.append(run_steps(fn, variables, initial, on_host.batch))
        for v, x in zip(variables, initial):
            v.assign(x)
    (plain_losses, plain_vars), (losses, got), (user_losses, user_vars) = results
    assert losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(plain_vars, got))
    np.testing.assert_allclose(losses, user_losses, rtol=1e-5)


def test_keras_sees_the_updates_and_the_variables_stay_in_host_memory(steps, optimized):
    on_device, _, on_host, _, _ = steps
    device_start = on_device.model.get_weights()
    host_start = on_host.model.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(device_start, host_start))
    for _ in range(2):
        on_device.concrete_fn(*on_device.batch)
        optimized(*on_host.batch)
    # Same seed, same data: the host-homed model trained by the optimized step
    # holds what the device-homed one trained by its own function holds.
    worst, name = worst_relative_difference(on_device.model.get_weights(),
                                            on_host.model.get_weights())
    assert worst <= 1e-5, f"weight {name} differs by {worst:.3g} of its scale"
    assert not all(np.array_equal(a, b) for a, b in zip(host_start,
                                                          on_host.model.get_weights()))
    assert all(v.value.device.endswith(HOST_SUFFIX) for v in on_host.model.weights)
    on_device.model.set_weights(device_start)
    on_host.model.set_weights(host_start)


def test_a_plan_that_skips_fetching_a_host_read_is_refused(optimized):
    captured = optimized.captured   # with the updates made on the device, as planned
    prefetch = max((s for s in optimized.plan.swaps if s.kind == "prefetch"),
                   key=lambda s: s.bytes)
    removed = {s.id for s in optimized.plan.swaps if s.tensor == prefetch.tensor}
    plan = dataclasses.replace(optimized.plan, swaps=tuple(
        dataclasses.replace(s, in_wait_for=tuple(w for w in s.in_wait_for if w not in removed))
        for s in optimized.plan.swaps if s.id not in removed))
    with pytest.raises(rewrite.RewriteError, match="without a swap-in"):
        rewrite.rewrite(captured, plan, emulate.DEVICE, emulate.HOST)


def test_a_prefetch_of_a_device_variable_is_refused(steps):
    _, reference, _, _, _ = steps
    read = next(n for n in reference.graph_def.node if n.op == "ReadVariableOp")
    reader = next(n.name for n in reference.graph_def.node if read.name in
                  [i.partition(":")[0] for i in n.input])
    plan = Plan(schedule=(), swaps=(Swap(f"{read.name}:0", out_after="", in_after="",
                                         consumers=(reader,), kind="prefetch"),))
    with pytest.raises(rewrite.RewriteError, match="not a read of a host-homed variable"):
        rewrite.rewrite(reference, plan, emulate.DEVICE, emulate.HOST)


def test_a_host_variable_read_inside_a_loop_is_refused_at_capture():
    step = zoo.lstm(batch=2, steps=3, features=4, units=8, layers=1, unroll=False,
                    variables_on=emulate.HOST)
    with pytest.raises(capture.CaptureError, match="function body"):
        capture.capture(step.concrete_fn)


def test_keras_fit_with_the_callback_trains_a_host_homed_model_like_plain_fit():
    import keras
    import tensorflow as tf

    def build(where):
        with tf.device(where):
            model = zoo.bert(batch=4).model
            model.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.optimizer.build(model.trainable_variables)
        return model

    rng = np.random.default_rng(0)
    x = rng.integers(0, 1024, (12, 64)).astype(np.int32)
    y = rng.integers(0, 1024, (12, 64)).astype(np.int32)
    plain, hosted = build(emulate.DEVICE), build(emulate.HOST)
    hosted.set_weights(plain.get_weights())
    first = capture.capture(tfswap.keras.step_function(plain, (x[:4], y[:4])))
    peak = measure.measure(first, first.graph_def, [x[:4], y[:4]],
                           inter_op_threads=1).peak_bytes
    expected = plain.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history
    callback = tfswap.keras.SwapCallback(memory_budget=int(0.3 * peak), generations=5,
                                         seed=0, workers=1, verbose=0)
    got = hosted.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                     callbacks=[callback]).history
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5)
    (fast,) = callback.functions.values()
    assert fast.measured_peak_bytes <= int(0.3 * peak)
    assert any(s.kind == "prefetch" for s in fast.plan.swaps)
    worst, name = worst_relative_difference(plain.get_weights(), hosted.get_weights())
    assert worst <= 1e-5, f"weight {name} differs by {worst:.3g} of its scale"
    assert all(v.value.device.endswith(HOST_SUFFIX)
               for v in hosted.weights + hosted.optimizer.variables)
