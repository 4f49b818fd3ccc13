"""Parameters in host memory without changing how the model is built (issue #20).

``tfswap.optimize(..., parameters="auto")`` (the default) keeps the variables
on the device when a plan fits with them there, and otherwise moves them to
host memory in place: the user's objects keep their identity and see every
update.  Every check trains an identical model with its unmodified function
(variables on the device) and compares losses, ``model.get_weights()`` and
the optimizer's state bit for bit.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfswap
from tfswap import zoo
from tfswap.tf import capture, emulate, homes, measure, runtime, stale

STEPS = 3


def device_peak(step) -> int:
    captured = capture.capture(step.concrete_fn)
    return measure.measure(captured, captured.graph_def, step.batch,
                           inter_op_threads=1).peak_bytes


def state(step) -> list:
    return [v.numpy() for v in step.model.weights] + \
        [v.numpy() for v in step.optimizer.variables]


def train(fn, step) -> list:
    return [float(fn(*step.batch)["loss"]) for _ in range(STEPS)]


def assert_trains_like_the_unmodified_step(reference, step, fast):
    """``fast`` (planned for ``step``) trains exactly as ``reference``'s own function,
    where ``reference`` is the same model built again (same seed)."""
    assert train(fast, step) == train(reference.concrete_fn, reference)
    expected, got = reference.model.get_weights(), step.model.get_weights()
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(b, a)
    for a, b in zip(state(reference), state(step)):
        np.testing.assert_array_equal(b, a)


def nbytes(variable) -> int:
    return int(np.prod(variable.shape)) * variable.value.dtype.size


def on_host(variable) -> bool:
    return tf.DeviceSpec.from_string(variable.device).device_index == 1


@pytest.mark.parametrize("build", [zoo.bert, zoo.resnet50], ids=["bert", "resnet50"])
def test_a_quarter_of_the_device_homed_peak_trains_exactly_with_parameters_on_the_host(build):
    reference, step = build(), build()
    budget = device_peak(reference) // 4
    fast = tfswap.optimize(step.concrete_fn, budget, generations=2, seed=0, workers=1,
                           inputs=step.batch)
    assert fast.relocation is not None and "to host memory" in fast.report()
    assert "in host memory; each step fetches" in fast.report()
    assert "most moved:" in fast.report()
    rows = fast.parameter_traffic()
    # Every byte the host work reads from the device is counted once: a new value
    # written back, or the indices of a gather run on the host (BERT's token ids).
    assert sum(r.written_back_bytes + r.indices_bytes for r in rows) == \
        sum(fast.lowered.writebacks.values())
    assert sum(r.fetched_bytes for r in rows) == sum(
        s.bytes for s in fast.plan.swaps if s.kind == "prefetch")
    assert rows[0].fetches >= 1 and rows[0].written_back_bytes == rows[0].nbytes
    # "auto" moves what the plan could swap (variables under the small-pool
    # threshold, never swapped, stay): here nearly every byte.
    moved = {id(m.variable) for m in fast.relocation.moved}
    for v in step.model.trainable_variables:
        assert on_host(v.value) == (id(v.value) in moved), v.path
    assert fast.relocation.nbytes >= 0.9 * sum(nbytes(v) for v in step.model.weights + list(
        step.optimizer.variables))
    assert fast.measured_peak_bytes is not None and fast.measured_peak_bytes <= budget
    assert_trains_like_the_unmodified_step(reference, step, fast)


def test_an_mlp_whose_parameters_and_adam_state_are_twice_the_budget_trains():
    reference, step = zoo.mlp(), zoo.mlp()
    parameters = sum(nbytes(v) for v in step.model.trainable_variables)
    budget = 3 * parameters // 2    # weights + Adam's two slots = 2 x budget
    fast = tfswap.optimize(step.concrete_fn, budget, generations=2, seed=0, workers=1,
                           inputs=step.batch)
    assert fast.relocation.nbytes >= 0.99 * 3 * parameters   # biases under 4 KiB stay
    assert fast.measured_peak_bytes <= budget
    assert_trains_like_the_unmodified_step(reference, step, fast)


def test_parameters_stay_on_the_device_when_the_step_fits():
    step = zoo.mlp()
    fast = tfswap.optimize(step.concrete_fn, 1 << 30, generations=1, workers=1,
                           inputs=step.batch)
    assert fast.relocation is None and not any(on_host(v.value) for v in step.model.weights)


def test_a_failed_plan_puts_the_variables_back_with_their_values():
    step = zoo.mlp()
    before = [v.numpy() for v in step.model.weights]
    with pytest.raises(tfswap.BudgetError):
        tfswap.optimize(step.concrete_fn, 4096, parameters="host", generations=1, workers=1,
                        inputs=step.batch)
    assert not any(on_host(v.value) for v in step.model.weights)
    for v, value in zip(step.model.weights, before):
        np.testing.assert_array_equal(v.numpy(), value)
    step.concrete_fn(*step.batch)     # the user's own function runs as before


def test_moving_keeps_the_users_objects_and_frees_the_device_buffer():
    step = zoo.mlp(layers=1)
    kernel = step.model.trainable_variables[0].value
    value, old_handle = kernel.numpy(), kernel.handle
    moved = homes.move_to_host([kernel], emulate.HOST)
    assert step.model.trainable_variables[0].value is kernel and on_host(kernel)
    np.testing.assert_array_equal(kernel.numpy(), value)
    # What still uses the former handle fails, naming tfswap and the remedy...
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="before tfswap moved it to host memory.*restore_parameters"):
        tf.raw_ops.ReadVariableOp(resource=old_handle, dtype=kernel.dtype)
    # ...and the device resource behind it holds nothing (seen through the handle revived).
    retired = moved.moved[0].retired
    stale.revive(old_handle, retired)
    assert tf.raw_ops.ReadVariableOp(resource=old_handle, dtype=kernel.dtype).shape == (0,)
    assert stale.retire(old_handle, stale.moved_message(kernel)) == retired
    kernel.assign_add(tf.ones_like(kernel))
    host_handle = kernel.handle
    moved.undo()
    assert not on_host(kernel)
    np.testing.assert_array_equal(kernel.numpy(), value + 1)
    np.testing.assert_array_equal(
        tf.raw_ops.ReadVariableOp(resource=old_handle, dtype=kernel.dtype), value + 1)
    # Nor is the host resource read once the variable is back.
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="put back on the device.*take variable.handle again"):
        tf.raw_ops.ReadVariableOp(resource=host_handle, dtype=kernel.dtype)
    moved.undo()                       # done already: nothing changes
    assert not on_host(kernel)
    np.testing.assert_array_equal(kernel.numpy(), value + 1)


def test_moving_passes_over_objects_that_refuse_every_attribute(tmp_path):
    """The move looks at every object in the process; one whose attributes all
    raise (an open ``np.load`` archive's ``.f``, found on a GPU run) is not a
    function or variable and must not stop it."""
    np.savez(tmp_path / "a.npz", a=np.zeros(2))
    archive = np.load(tmp_path / "a.npz")
    refusing = archive.f
    with pytest.raises(AttributeError):
        refusing.__class__
    module, twin = _module(), _module()
    x = tf.ones([2, 8])
    moved = homes.move_to_host([module.v], emulate.HOST)
    assert on_host(module.v)
    np.testing.assert_array_equal(module.f(x), twin.f(x))
    moved.undo()
    assert not on_host(module.v)
    np.testing.assert_array_equal(module.f(x), twin.f(x))
    archive.close()


def _module():
    module = tf.Module()
    module.v = tf.Variable(tf.reshape(tf.range(64, dtype=tf.float32), [8, 8]))
    module.f = tf.function(lambda x: tf.matmul(x, module.v),
                           input_signature=[tf.TensorSpec([2, 8])])
    return module


def test_what_referenced_a_moved_variable_follows_it(tmp_path):
    """A function traced before the move, its graph's capture record (which a
    ConcreteFunction TF makes again from the graph reads), a function traced
    after it that calls it, a SavedModel of it, and the ``_UnreadVariable`` an
    eager ``assign`` returned all use the host resource, as an untouched twin's
    use its own."""
    module, twin = _module(), _module()
    x = tf.ones([2, 8])
    cf, twin_cf = module.f.get_concrete_function(), twin.f.get_concrete_function()
    unread = module.v.assign_add(tf.ones([8, 8]))
    twin_unread = twin.v.assign_add(tf.ones([8, 8]))
    moved = homes.move_to_host([module.v], emulate.HOST)
    assert on_host(module.v)
    assert any(c is module.v.handle for c in cf.graph.external_captures)
    for m in (module, twin):
        m.v.assign_add(tf.ones([8, 8]))
    np.testing.assert_array_equal(cf(x), twin_cf(x))
    np.testing.assert_array_equal(tf.function(lambda x: cf(x) + 1)(x),
                                  tf.function(lambda x: twin_cf(x) + 1)(x))
    np.testing.assert_array_equal(unread.numpy(), twin_unread.numpy())
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    np.testing.assert_array_equal(loaded.f(x), twin_cf(x))
    while_moved = tf.function(lambda: module.v * 2).get_concrete_function()
    moved.undo()
    assert not on_host(module.v)
    np.testing.assert_array_equal(while_moved(), twin.v * 2)
    np.testing.assert_array_equal(cf(x), twin_cf(x))


def test_a_saved_plan_puts_the_variables_where_it_was_planned(tmp_path):
    reference, step = zoo.mlp(), zoo.mlp()
    budget = 3 * sum(nbytes(v) for v in step.model.trainable_variables) // 2
    fast = tfswap.optimize(step.concrete_fn, budget, generations=1, workers=1,
                           inputs=step.batch)
    assert fast.plan.host_variables
    fast.plan.save(tmp_path / "mlp.plan.json")
    moved = {id(m.variable) for m in fast.relocation.moved}
    fast.restore_parameters()
    everything = list(step.model.weights) + list(step.optimizer.variables)
    assert not any(on_host(v.value) for v in everything)
    again = tfswap.load_plan(tmp_path / "mlp.plan.json", step.concrete_fn)
    assert {id(v.value) for v in everything if on_host(v.value)} == moved
    assert_trains_like_the_unmodified_step(reference, step, again)


def test_a_variable_read_inside_a_loop_stays_on_the_device():
    step = zoo.lstm(unroll=False)
    captured = capture.capture(step.concrete_fn)
    movable = {c.name for c in homes.movable(captured)}
    in_loop = {c.name for c in captured.captures if c.variable is not None} - movable
    assert in_loop, "the LSTM's While body reads its kernels"
    assert not {c.name for c in homes.chosen(captured, "auto", 0)} & in_loop
    with pytest.raises(capture.CaptureError, match="parameters='auto'"):
        homes.chosen(captured, "host", 0)


def test_unknown_parameters_are_refused_before_any_work():
    step = zoo.mlp(layers=1)
    with pytest.raises(ValueError, match="parameters must be one of"):
        tfswap.optimize(step.concrete_fn, 1 << 20, parameters="cpu")


def _keras_mlp():
    import keras

    keras.utils.set_random_seed(0)
    # Layers of one size: the budget must hold one layer's update at a time.
    model = keras.Sequential([keras.Input((128,))] + [
        keras.layers.Dense(128, activation="relu") for _ in range(4)] + [keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_keras_fit_with_parameters_on_the_host_is_plain_fit(tmp_path):
    import keras

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    plain, swapped = _keras_mlp(), _keras_mlp()
    fit = dict(batch_size=16, epochs=2, verbose=0, shuffle=False)
    expected = plain.fit(x, y, **fit).history
    budget = 3 * sum(nbytes(v) for v in swapped.trainable_variables) // 2
    callback = tfswap.keras.SwapCallback(budget, generations=1, workers=1, verbose=0)
    assert swapped.fit(x, y, callbacks=[callback], **fit).history == expected
    assert on_host(swapped.trainable_variables[0].value)
    for a, b in zip(plain.get_weights(), swapped.get_weights()):
        np.testing.assert_array_equal(b, a)
    # Keras's own functions were traced again on the moved variables.
    np.testing.assert_array_equal(swapped.predict(x, verbose=0), plain.predict(x, verbose=0))
    assert swapped.fit(x, y, **dict(fit, epochs=1)).history == \
        plain.fit(x, y, **dict(fit, epochs=1)).history
    checkpoint = tf.train.Checkpoint(model=swapped)
    path = checkpoint.save(tmp_path / "ckpt")
    trained = swapped.get_weights()
    swapped.set_weights([np.zeros_like(w) for w in trained])
    checkpoint.restore(path)
    for a, b in zip(trained, swapped.get_weights()):
        np.testing.assert_array_equal(b, a)
    swapped.save(tmp_path / "mlp.keras")
    for a, b in zip(plain.get_weights(), keras.models.load_model(tmp_path / "mlp.keras")
                    .get_weights()):
        np.testing.assert_array_equal(b, a)


def test_in_place_updates_of_host_variables_are_computed_on_the_device():
    """Adam's assign_add / assign_sub on a host variable become an addition on the
    device and an assignment on the host; reads after them take the new value
    instead of fetching it again (trained bit-identically: the tests above)."""
    step = zoo.mlp(layers=1, variables_on=emulate.HOST)
    captured = capture.capture(step.concrete_fn)
    done, made = homes.updates_on_device(captured, emulate.DEVICE)
    nodes = {n.name: n for n in done.graph_def.node}
    trainable = len(step.model.trainable_variables)
    assert len(made) >= 3 * trainable        # the weight and its two Adam slots each
    for new, update in made.items():
        assert nodes[new].op in ("AddV2", "Sub") and nodes[new].device == emulate.DEVICE
        assert nodes[update].op == "AssignVariableOp" and nodes[update].input[1] == new
    reads = [n for n in captured.graph_def.node if n.op == "ReadVariableOp"]
    fetched = [n for n in reads if any(n.name in i for m in done.graph_def.node
                                       for i in m.input if not i.startswith("^"))]
    assert len(fetched) < len(reads)          # reads after an update take the new value
    bound = runtime.bind(done, done.graph_def)
    reference = zoo.mlp(layers=1)
    assert float(bound(*step.batch)["loss"]) == float(
        reference.concrete_fn(*reference.batch)["loss"])
    for a, b in zip(state(reference), state(step)):
        np.testing.assert_array_equal(b, a)
