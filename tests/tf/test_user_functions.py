"""The user's own functions after tfswap moved their variables to host memory (issue #29).

``parameters="auto"`` may move the variables a step reads; every
``tf.function`` traced before (and its concrete functions, Keras's own
train/test/predict functions) then follows them to the host, and
``restore_parameters`` brings every function back with them.  What cannot
run where the variables are (a step planned for their former home, an XLA
function) raises :class:`tfswap.tf.homes.MovedVariablesError`.  Every check
runs the same calls on an identical model that tfswap never touches and
compares losses, weights and optimizer state bit for bit.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfswap
from tfswap.tf import homes

FEATURES, CLASSES = 128, 10


def layers():
    """Layers of one size: the budget must hold one layer's update at a time."""
    return keras.Sequential([keras.Input((FEATURES,))] + [
        keras.layers.Dense(FEATURES, activation="relu") for _ in range(4)] + [
        keras.layers.Dense(CLASSES)])


class Model:
    """A Keras MLP, its Adam and the user's own train step, a plain ``tf.function``."""

    def __init__(self, jit_compile: bool = False):
        keras.utils.set_random_seed(0)
        self.model = layers()
        self.optimizer = keras.optimizers.Adam(1e-3)
        self.optimizer.build(self.model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, self.model(x, training=True))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            return {"loss": loss}

        self.step = tf.function(step, jit_compile=jit_compile)

    def concrete(self, batch: int):
        return self.step.get_concrete_function(tf.TensorSpec((batch, FEATURES)),
                                               tf.TensorSpec((batch,), tf.int32))

    def state(self) -> list:
        return [v.numpy() for v in self.model.weights] + \
            [v.numpy() for v in self.optimizer.variables]

    def budget(self) -> int:
        """1.5x the weights: weights and Adam's two slots cannot all stay on the device."""
        return 3 * sum(int(np.prod(v.shape)) * 4 for v in self.model.trainable_variables) // 2


def batch(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, FEATURES), dtype=np.float32),
            rng.integers(0, CLASSES, n).astype(np.int32))


def loss(outputs) -> float:
    return float(outputs["loss"])


def assert_same_state(expected: Model, got: Model):
    for a, b in zip(expected.state(), got.state(), strict=True):
        np.testing.assert_array_equal(b, a)


def on_host(variable) -> bool:
    return tf.DeviceSpec.from_string(variable.device).device_index == 1


def test_the_users_function_traced_before_the_move_trains_like_the_untouched_twin():
    user, twin = Model(), Model()
    x, y = batch(16)
    small_x, small_y = batch(8, seed=1)
    cf = user.concrete(16)
    user.concrete(8)                      # another signature, traced before too
    fast = tfswap.optimize(cf, user.budget(), generations=1, seed=0, workers=1, inputs=(x, y))
    assert fast.relocation is not None     # the kernels and their Adam slots
    assert all(on_host(m.variable) for m in fast.relocation.moved)
    twin_cf = twin.concrete(16)
    calls = [
        (lambda m, c: m.step(x, y)),                     # (1) the signature traced before
        (lambda m, c: c(x, y)),                          # (2) its concrete function
        (lambda m, c: m.step(small_x, small_y)),         # the other one traced before
        (lambda m, c: m.step(x[:4], y[:4])),             # (3) traced after the move
        (lambda m, c: fast(x, y) if m is user else c(x, y)),   # the planned step, between
        (lambda m, c: m.step(x, y)),
    ]
    for call in calls:
        assert loss(call(user, cf)) == loss(call(twin, twin_cf))
    assert_same_state(twin, user)


def test_restore_parameters_brings_every_function_back_to_the_device():
    user, twin = Model(), Model()
    x, y = batch(16)
    cf, twin_cf = user.concrete(16), twin.concrete(16)
    fast = tfswap.optimize(cf, user.budget(), generations=1, seed=0, workers=1, inputs=(x, y))
    assert loss(fast(x, y)) == loss(twin_cf(x, y))
    while_moved = user.concrete(4)        # captured the variables' host handles
    fast.restore_parameters()
    assert not any(on_host(v.value) for v in user.model.weights)
    # (4) traced while the variables were on the host: reads them on the device now.
    assert loss(while_moved(x[:4], y[:4])) == loss(twin.step(x[:4], y[:4]))
    assert loss(user.step(x, y)) == loss(twin.step(x, y))
    with pytest.raises(homes.MovedVariablesError, match="restore_parameters"):
        fast(x, y)                        # planned for the host: it must not run now
    assert_same_state(twin, user)


def test_a_step_planned_for_the_device_refuses_to_run_while_the_variables_are_away():
    user, twin = Model(), Model()
    x, y = batch(16)
    small_x, small_y = batch(8, seed=1)
    on_device = tfswap.optimize(user.concrete(8), 1 << 30, generations=1, workers=1,
                                inputs=(small_x, small_y), parameters="device")
    on_the_host = tfswap.optimize(user.concrete(16), user.budget(), generations=1, seed=0,
                                  workers=1, inputs=(x, y))
    assert on_the_host.relocation is not None
    with pytest.raises(homes.MovedVariablesError, match="planned with .* on the device"):
        on_device(small_x, small_y)
    assert loss(on_the_host(x, y)) == loss(twin.step(x, y))
    on_the_host.restore_parameters()
    assert loss(on_device(small_x, small_y)) == loss(twin.step(small_x, small_y))
    assert_same_state(twin, user)


def test_an_xla_function_traced_before_the_move_says_why_it_cannot_run():
    user, twin = Model(jit_compile=True), Model(jit_compile=True)
    x, y = batch(16)
    assert loss(user.step(x, y)) == loss(twin.step(x, y))    # traced and compiled
    plain = Model()
    fast = tfswap.optimize(plain.concrete(16), plain.budget(), generations=1, workers=1,
                           inputs=(x, y))
    assert fast.relocation is not None
    # The move of another model's variables leaves this one as it was.
    assert loss(user.step(x, y)) == loss(twin.step(x, y))
    moved = homes.move_to_host([v.value for v in user.model.trainable_variables],
                               "/device:CPU:1")
    with pytest.raises(homes.MovedVariablesError, match="XLA"):
        user.step(x, y)
    moved.undo()
    assert loss(user.step(x, y)) == loss(twin.step(x, y))
    assert_same_state(twin, user)


def _keras_mlp(jit_compile: bool = False):
    keras.utils.set_random_seed(0)
    model = layers()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=jit_compile,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _swap(model) -> tfswap.keras.SwapCallback:
    budget = 3 * sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables) // 2
    return tfswap.keras.SwapCallback(budget, generations=1, workers=1, verbose=0)


FIT = dict(batch_size=16, epochs=1, verbose=0, shuffle=False)


def assert_same_weights(expected, got):
    for a, b in zip(expected.get_weights(), got.get_weights(), strict=True):
        np.testing.assert_array_equal(b, a)


def test_keras_evaluate_predict_and_fit_after_a_fit_that_moved_the_variables():
    x, y = batch(64)
    plain, swapped = _keras_mlp(), _keras_mlp()
    # Keras traces its test and predict functions here, before any move.
    for model in (plain, swapped):
        model.evaluate(x, y, batch_size=16, verbose=0)
        model.predict(x, batch_size=16, verbose=0)
    predict_function = swapped.predict_function
    callback = _swap(swapped)
    assert swapped.fit(x, y, callbacks=[callback], **FIT).history == \
        plain.fit(x, y, **FIT).history
    assert on_host(swapped.trainable_variables[0].value)
    assert swapped.predict_function is predict_function      # followed, not traced again
    steps = [
        lambda m, cb: m.evaluate(x, y, batch_size=16, verbose=0, return_dict=True,
                                 callbacks=cb),
        lambda m, cb: m.predict(x, batch_size=16, verbose=0, callbacks=cb),
        lambda m, cb: m.fit(x, y, callbacks=cb, **FIT).history,
    ]
    for callbacks in ([], [callback]):
        for step in steps:
            expected, got = step(plain, []), step(swapped, callbacks)
            if isinstance(expected, np.ndarray):
                np.testing.assert_array_equal(got, expected)
            else:
                assert got == expected
    assert {kind for kind, _ in callback.functions} == {"train", "test", "predict"}
    assert_same_weights(plain, swapped)


def test_an_xla_keras_model_runs_without_xla_after_its_variables_moved():
    x, y = batch(64)
    plain, swapped = _keras_mlp(), _keras_mlp(jit_compile=True)
    with pytest.warns(UserWarning, match="now run without XLA"):
        history = swapped.fit(x, y, callbacks=[_swap(swapped)], **FIT).history
    assert history == plain.fit(x, y, **FIT).history and not swapped.jit_compile
    assert swapped.evaluate(x, y, verbose=0) == plain.evaluate(x, y, verbose=0)
    np.testing.assert_array_equal(swapped.predict(x, verbose=0), plain.predict(x, verbose=0))
    assert swapped.fit(x, y, **FIT).history == plain.fit(x, y, **FIT).history
    assert_same_weights(plain, swapped)
