"""A read of a moved variable through what tfswap could not re-point fails loudly
(issue #44 item 4).

``tfswap.optimize`` with ``parameters="auto"`` or ``"host"`` moves variables to
host memory and empties their device resources.  Each check makes something
that reads a variable before the move (a raw handle, a ``tf.data`` map, a
``tf.function``, a Keras metric), runs the optimized step, and then reads
through it: either tfswap's error naming the remedy, or the value an
identical model that tfswap never touches gives after the same steps; never a
value computed from the emptied buffer.  After ``restore_parameters()`` each
gives the untouched twin's value.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfswap

FEATURES, CLASSES, BATCH = 128, 10, 16
# What tfswap's error says (the read quotes it as the variable's name).
MOVED = r"before tfswap moved it to host memory.*restore_parameters\(\)"


class Model:
    """A Keras MLP, its Adam, a Mean of the losses and the user's own train step
    (a plain ``tf.function``) that updates all three."""

    def __init__(self):
        keras.utils.set_random_seed(0)
        self.model = keras.Sequential([keras.Input((FEATURES,))] + [
            keras.layers.Dense(FEATURES, activation="relu") for _ in range(2)] + [
            keras.layers.Dense(CLASSES)])
        self.optimizer = keras.optimizers.Adam(1e-3)
        self.optimizer.build(self.model.trainable_variables)
        self.losses = keras.metrics.Mean()
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, self.model(x, training=True))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            self.losses.update_state(loss)
            return {"loss": loss}

        self.step = tf.function(step)
        self.kernel = self.model.layers[0].kernel.value   # the tf.Variable under Keras's

    def concrete(self):
        return self.step.get_concrete_function(tf.TensorSpec((BATCH, FEATURES)),
                                               tf.TensorSpec((BATCH,), tf.int32))

    def budget(self) -> int:
        """1.5x the weights: weights and Adam's two slots cannot all stay on the device."""
        return 3 * sum(int(np.prod(v.shape)) * 4 for v in self.model.trainable_variables) // 2


def batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((BATCH, FEATURES), dtype=np.float32),
            rng.integers(0, CLASSES, BATCH).astype(np.int32))


def trained(user: Model, twin: Model, parameters: str = "auto"):
    """``user``'s step optimized (its kernels moved to host memory) and run twice,
    ``twin``'s own step run twice on the same batches."""
    x, y = batch()
    fast = tfswap.optimize(user.concrete(), user.budget(), parameters=parameters,
                           generations=1, seed=0, workers=1, inputs=(x, y))
    assert any(m.variable is user.kernel for m in fast.relocation.moved)
    for _ in range(2):
        assert float(fast(x, y)["loss"]) == float(twin.step(x, y)["loss"])
    return fast


def test_a_handle_kept_from_before_the_move_raises_then_reads_the_value_once_restored():
    user, twin = Model(), Model()
    handle = user.kernel.handle
    fast = trained(user, twin)
    with pytest.raises(tf.errors.FailedPreconditionError, match=MOVED):
        tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=MOVED):
        tf.raw_ops.ResourceGather(resource=handle, indices=[0], dtype=tf.float32)
    # A write through it fails too: nothing lands in the emptied device resource.
    with pytest.raises(tf.errors.InvalidArgumentError, match=MOVED):
        tf.raw_ops.AssignVariableOp(resource=handle, value=tf.zeros(user.kernel.shape))
    np.testing.assert_array_equal(user.kernel.numpy(), twin.kernel.numpy())
    fast.restore_parameters()
    np.testing.assert_array_equal(tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32),
                                  twin.kernel.numpy())


def test_a_tf_data_map_built_before_the_move_raises_then_runs_once_restored():
    user, twin = Model(), Model()
    x, _ = batch(1)

    def pipeline(model: Model):
        return tf.data.Dataset.from_tensor_slices(x).batch(4).map(
            lambda rows: tf.matmul(rows, model.kernel)).prefetch(1)

    data, twin_data = pipeline(user), pipeline(twin)
    fast = trained(user, twin)
    with pytest.raises(tf.errors.FailedPreconditionError, match=MOVED):
        list(data)
    fast.restore_parameters()
    for got, expected in zip(data, twin_data, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_tf_function_traced_before_the_move_reads_the_moved_value():
    user, twin = Model(), Model()
    x, _ = batch(1)

    def reader(model: Model):
        read = tf.function(lambda rows: tf.matmul(rows, model.kernel))
        read(x)                         # traced now, before the move
        return read

    read, twin_read = reader(user), reader(twin)
    fast = trained(user, twin)
    np.testing.assert_array_equal(read(x), twin_read(x))
    fast.restore_parameters()
    np.testing.assert_array_equal(read(x), twin_read(x))


def test_keras_metrics_updated_after_the_move_read_the_moved_values():
    """The step's own metric (moved with ``parameters="host"``), a metric updated
    by a ``tf.function`` reading a weight, and Keras's ``evaluate`` traced before
    the move, all updated after it."""
    user, twin = Model(), Model()
    x, y = batch(1)
    norms = {}
    for model in (user, twin):
        model.model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                            metrics=["accuracy"], jit_compile=False)
        model.model.evaluate(x, y, verbose=0)          # Keras traces its test function
        norm = keras.metrics.Mean()
        track = tf.function(lambda m=model, n=norm: n.update_state(tf.reduce_sum(
            tf.square(m.kernel))))
        track()
        norms[id(model)] = norm, track
    fast = trained(user, twin, parameters="host")
    assert any(m.variable is user.losses.variables[0].value for m in fast.relocation.moved)
    for model in (user, twin):
        norms[id(model)][1]()
    assert float(user.losses.result()) == float(twin.losses.result())
    assert float(norms[id(user)][0].result()) == float(norms[id(twin)][0].result())
    assert user.model.evaluate(x, y, verbose=0, return_dict=True) == \
        twin.model.evaluate(x, y, verbose=0, return_dict=True)
    fast.restore_parameters()
    for model in (user, twin):
        model.losses.update_state(1.0)
        norms[id(model)][1]()
    assert float(user.losses.result()) == float(twin.losses.result())
    assert float(norms[id(user)][0].result()) == float(norms[id(twin)][0].result())
