"""tfswap.keras.SwapCallback on the emulated device, against the same fit without it.

Issue #6: with the callback, ``fit`` trains exactly like without it (loss and
metric history, batch logs other callbacks see, final weights) while the
training step's measured device peak stays within a budget of 50% of the
unmodified step's peak; the datasets are not a multiple of the batch size
(so a last, smaller batch is planned too); the Transformer runs with
``steps_per_execution=4`` and validation; the model stays usable afterwards
(evaluate, predict, save/load).
"""

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import keras
import tensorflow as tf

import tfswap
from tfswap import zoo
from tfswap.tf import capture, measure

RTOL = 1e-5
VOCAB = 128


def _compile(model, steps_per_execution=1):
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return model


def cnn():
    """16 Conv/BN/ReLU blocks at 32x32 (zoo.cnn's layers, without tracing its step):
    stored activations, not one conv's scratch (about 30 MB on this CPU), dominate
    the step's peak; the smallest feasible budget is about 41% of the peak."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    layers = [keras.Input((32, 32, 3))]
    for _ in range(16):
        layers += [L.Conv2D(16, 3, padding="same", use_bias=False), L.BatchNormalization(),
                   L.ReLU()]
    return keras.Sequential(layers + [L.GlobalAveragePooling2D(), L.Dense(10)], name="cnn")


def transformer():
    """2 encoder layers (dim 64, 4 heads) over 64 tokens of a 128-token vocabulary.

    With zoo.transformer's 512-token vocabulary the parameters, their Adam slots
    and the 2 MB cross-entropy working set put the smallest feasible budget at
    about 49% of the peak, so 50% failed whenever the traced order was a bad one;
    at 128 tokens it is about 39%."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    tokens = keras.Input((64,), dtype="int32")
    h = zoo.encoder_blocks(L.Embedding(VOCAB, 64)(tokens), layers=2, heads=4, dim=64)
    return keras.Model(tokens, L.Dense(VOCAB)(h), name="transformer")


def data(name, n):
    rng = np.random.default_rng(1)
    if name == "cnn":
        return (rng.standard_normal((n, 32, 32, 3), dtype=np.float32),
                rng.integers(0, 10, n).astype(np.int32))
    return (rng.integers(0, VOCAB, (n, 64)).astype(np.int32),
            rng.integers(0, VOCAB, (n, 64)).astype(np.int32))


# name -> (builder, batch size, samples, validation samples or 0, steps_per_execution).
# The Transformer's samples are not a multiple of the batch: its 5 batches make
# executions of 4 and 1 (the smaller last batch), and validation has a smaller last
# batch too.  The CNN's are one batch (each step shape costs a profile and a plan).
CASES = {"cnn": (cnn, 32, 32, 0, 1), "transformer": (transformer, 8, 36, 12, 4)}


def twins(name):
    """Two compiled copies of one model with the same initial weights."""
    build, spe = CASES[name][0], CASES[name][4]
    a = _compile(build(), spe)
    b = _compile(build(), spe)
    b.set_weights(a.get_weights())
    return a, b


class BatchLogs(keras.callbacks.Callback):
    """What another callback sees: every batch's logs."""

    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append((batch, {k: float(v) for k, v in logs.items()}))


def unmodified_peak(model, batch):
    cf = tfswap.keras.step_function(model, batch)
    captured = capture.capture(cf)
    return measure.measure(captured, captured.graph_def, tf.nest.flatten(batch),
                           inter_op_threads=1).peak_bytes


def fit(model, x, y, batch_size, callbacks=(), epochs=2, **kwargs):
    logs = BatchLogs()
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[*callbacks, logs], **kwargs)
    return history.history, logs.logs


def assert_same_history(expected, actual):
    assert expected.keys() == actual.keys()
    for key in expected:
        np.testing.assert_allclose(actual[key], expected[key], rtol=RTOL, err_msg=key)


def relative_difference(expected, actual) -> float:
    """||expected - actual|| / max(||expected||, 1): per-element tolerances fail on
    near-zero entries of arrays whose float32 sums were merely regrouped."""
    expected = np.asarray(expected, dtype=np.float64)
    return float(np.linalg.norm(expected - actual)) / max(1.0, float(np.linalg.norm(expected)))


def assert_same_weights(expected_model, actual_model):
    for var, a, b in zip(expected_model.weights, expected_model.get_weights(),
                         actual_model.get_weights()):
        assert relative_difference(a, b) <= RTOL, var.path


@pytest.fixture(scope="module", params=sorted(CASES))
def trained(request):
    name = request.param
    _, batch_size, n, n_val, spe = CASES[name]
    x, y = data(name, n)
    reference, model = twins(name)
    budget = int(0.5 * unmodified_peak(reference, (x[:batch_size], y[:batch_size])))
    validation = dict(validation_data=(x[:n_val], y[:n_val])) if n_val else {}
    ref_history, ref_logs = fit(reference, x, y, batch_size, **validation)
    callback = tfswap.keras.SwapCallback(budget, generations=3, seed=0, workers=1, verbose=0)
    history, logs = fit(model, x, y, batch_size, [callback], **validation)
    return dict(name=name, x=x, y=y, batch_size=batch_size, budget=budget, callback=callback,
                n_val=n_val, steps_per_execution=spe,
                reference=reference, model=model, ref_history=ref_history, history=history,
                ref_logs=ref_logs, logs=logs)


def test_fit_trains_like_keras_without_the_callback(trained):
    logged = {"loss", "accuracy"} | ({"val_loss", "val_accuracy"} if trained["n_val"] else set())
    assert set(trained["history"]) == logged
    assert_same_history(trained["ref_history"], trained["history"])
    assert_same_weights(trained["reference"], trained["model"])


def test_other_callbacks_see_the_same_batch_logs(trained):
    ref, got = trained["ref_logs"], trained["logs"]
    assert [b for b, _ in got] == [b for b, _ in ref]
    # One log per execution: with steps_per_execution=4, executions of 4 and 1 batches
    # an epoch (Keras numbers the short one's end as a full one's).
    batches = -(-len(trained["x"]) // trained["batch_size"])
    assert len(got) == 2 * -(-batches // trained["steps_per_execution"])
    for (_, expected), (_, actual) in zip(ref, got):
        assert expected.keys() == actual.keys()
        for key in expected:
            np.testing.assert_allclose(actual[key], expected[key], rtol=RTOL, err_msg=key)


def test_training_step_measured_peak_is_within_half_the_unmodified_peak(trained):
    b, x, y = trained["batch_size"], trained["x"], trained["y"]
    shapes = [leaf[:3] for leaf in tfswap.keras.batch_signature((x[:b], y[:b]))]
    (fast,) = [f for (kind, sig), f in trained["callback"].functions.items()
               if kind == "train" and [leaf[:3] for leaf in sig] == shapes]
    after = measure.measure(fast.captured, fast.graph_def, [x[:b], y[:b]])
    print(f"\n{trained['name']}: budget {trained['budget']} B (50% of unmodified), "
          f"measured {after.peak_bytes} B\n{fast.report()}")
    assert fast.plan.swaps
    assert after.peak_bytes <= trained["budget"]


def test_the_smaller_last_batch_and_validation_get_plans_of_their_own(trained):
    b, n = trained["batch_size"], len(trained["x"])
    n_val, functions = trained["n_val"], trained["callback"].functions
    signatures = {kind: {sig[0][1][0] for k, sig in functions if k == kind}
                  for kind in ("train", "test")}
    assert signatures["train"] == {b, n % b} - {0}
    validation = {b, n_val % b} - {0} if n_val else set()
    assert validation <= signatures["test"]   # (evaluate may have planned more by now)
    # Each measured by optimize's own verification run of the rewritten step.
    for (kind, _), fast in functions.items():
        if kind == "train":
            assert fast.measured_peak_bytes is not None
            assert fast.measured_peak_bytes <= trained["budget"]


def test_model_stays_usable_after_fit(trained, tmp_path):
    model, reference, x, y = trained["model"], trained["reference"], trained["x"], trained["y"]
    # Keras's own functions are back: train_on_batch / evaluate / predict run unmodified.
    assert not trained["callback"]._saved
    assert "tfswap" not in getattr(model.train_function, "__module__", "")
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0),
                               reference.evaluate(x, y, verbose=0), rtol=RTOL)
    predictions = model.predict(x, verbose=0)
    assert relative_difference(reference.predict(x, verbose=0), predictions) <= RTOL
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), predictions)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_evaluate_and_predict_with_the_callback_plan_those_steps(trained):
    """The callback fit used, passed to evaluate and predict: it plans their steps
    (the Transformer's test steps are the ones validation planned; with
    steps_per_execution=4 predict concatenates each execution's batches as Keras
    does)."""
    model, b, callback = trained["model"], trained["batch_size"], trained["callback"]
    x, y = trained["x"], trained["y"]
    plain = model.evaluate(x, y, batch_size=b, verbose=0)
    planned = model.evaluate(x, y, batch_size=b, verbose=0, callbacks=[callback])
    np.testing.assert_allclose(planned, plain, rtol=RTOL)
    plain = model.predict(x, batch_size=b, verbose=0)
    planned = model.predict(x, batch_size=b, verbose=0, callbacks=[callback])
    assert planned.shape == plain.shape and relative_difference(plain, planned) <= RTOL
    sizes = {len(x) % b or b, b}
    planned = {(kind, sig[0][1][0]) for (kind, sig), f in callback.functions.items()
               if f is not None}
    assert {(kind, size) for kind in ("test", "predict") for size in sizes} <= planned


def two_headed():
    """Dict inputs, two outputs with loss weights and a metric each, and sample weights."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    image, extra = keras.Input((32, 32, 3), name="image"), keras.Input((4,), name="extra")
    h = image
    for _ in range(8):
        h = L.ReLU()(L.BatchNormalization()(L.Conv2D(16, 3, padding="same", use_bias=False)(h)))
    h = L.Concatenate()([L.GlobalAveragePooling2D()(h), extra])
    outputs = {"label": L.Dense(10, name="label")(h), "value": L.Dense(1, name="value")(h)}
    model = keras.Model({"image": image, "extra": extra}, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss={"label": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        "value": keras.losses.MeanSquaredError()},
                  loss_weights={"label": 1.0, "value": 0.5},
                  metrics={"label": ["accuracy"], "value": ["mae"]})
    return model


def test_dict_inputs_two_outputs_loss_weights_and_sample_weights():
    # A multiple of the batch: Keras weights each output's "<name>_loss" log by the
    # batch size it read when tracing, and its retrace for a smaller last batch
    # reads None (weight 1); a planned step has a static size (README, Keras).
    b, n = 16, 32
    rng = np.random.default_rng(2)
    x = {"image": rng.standard_normal((n, 32, 32, 3), dtype=np.float32),
         "extra": rng.standard_normal((n, 4), dtype=np.float32)}
    y = {"label": rng.integers(0, 10, n).astype(np.int32),
         "value": rng.standard_normal((n, 1), dtype=np.float32)}
    weights = rng.uniform(0.5, 1.5, n).astype(np.float32)
    reference, model = two_headed(), two_headed()
    model.set_weights(reference.get_weights())
    ref_history, ref_logs = fit(reference, x, y, b, epochs=1, sample_weight=weights)
    first = ({k: v[:b] for k, v in x.items()}, {k: v[:b] for k, v in y.items()}, weights[:b])
    # 8 blocks at batch 16: one conv's ~30 MB scratch is most of the peak, so only
    # a mild budget is feasible; the point here is the batch structure.
    budget = int(0.85 * unmodified_peak(model, first))
    callback = tfswap.keras.SwapCallback(budget, generations=3, workers=1, verbose=0)
    history, logs = fit(model, x, y, b, [callback], epochs=1, sample_weight=weights)
    assert {"label_accuracy", "value_mae", "label_loss", "value_loss"} <= set(history)
    assert_same_history(ref_history, history)
    assert_same_weights(reference, model)
    (fast,) = [f for (kind, _), f in callback.functions.items() if kind == "train"]
    assert fast.plan.swaps and fast.measured_peak_bytes <= budget


def test_plan_path_saves_then_loads_and_replans_for_another_budget(tmp_path, capsys):
    # Plans match by graph, and Keras names the layers of a model built again in
    # the same process differently; so the second fit continues the same model
    # (as a restarted script would rebuild an identically named one).
    (reference, x, y), (model, _, _) = _tiny(), _tiny()
    budget = 1 << 30
    first = tfswap.keras.SwapCallback(budget, generations=1, workers=1, plan_path=tmp_path)
    histories = [fit(model, x, y, 8, [first], epochs=1)[0]]
    assert "tfswap plan" in capsys.readouterr().out
    assert len(list(tmp_path.glob("*.plan.json"))) == 1

    second = tfswap.keras.SwapCallback(budget, generations=1, workers=1, plan_path=tmp_path)
    histories.append(fit(model, x, y, 8, [second], epochs=1)[0])
    (fast,) = second.functions.values()
    assert any("plan loaded from" in note for note in fast.notes)
    assert fast.plan == next(iter(first.functions.values())).plan
    for history in histories:
        assert_same_history(fit(reference, x, y, 8, epochs=1)[0], history)
    assert_same_weights(reference, model)

    third = tfswap.keras.SwapCallback(budget // 2, generations=1, workers=1,
                                      plan_path=tmp_path)
    fit(model, x, y, 8, [third], epochs=1)
    assert f"not {budget // 2}; planning again" in capsys.readouterr().out
    (fast,) = third.functions.values()
    assert fast.plan.budget_bytes == budget // 2


def test_new_shapes_original_runs_keras_step_with_one_warning():
    (reference, x, y), (model, _, _) = _tiny(), _tiny()
    x, y = np.concatenate([x, x[:4]]), np.concatenate([y, y[:4]])     # batches of 8, 8, 4
    ref_history, _ = fit(reference, x, y, 8)
    callback = tfswap.keras.SwapCallback(1 << 30, generations=1, workers=1, verbose=0,
                                         new_shapes="original")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history, _ = fit(model, x, y, 8, [callback])
    ours = [w for w in caught if "tfswap.keras.SwapCallback" in str(w.message)]
    assert len(ours) == 1 and "[4, 8]" in str(ours[0].message)
    assert sorted(f is None for f in callback.functions.values()) == [False, True]
    assert_same_history(ref_history, history)
    assert_same_weights(reference, model)


@pytest.mark.parametrize("kwargs, message", [
    (dict(new_shapes="skip"), "new_shapes"),
    (dict(verbose=-1), "verbose"),
    (dict(search_time=0), "search_time"),
    # Checked by tfswap.Options, as for optimize (0: each search's first generation).
    (dict(generations=-1), "generations"),
])
def test_bad_arguments_say_what_is_expected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tfswap.keras.SwapCallback("1MiB", **kwargs)


def test_the_callback_and_optimize_take_the_same_options_object():
    options = tfswap.Options("1MiB", generations=3, seed=2, parameters="device")
    callback = tfswap.keras.SwapCallback(options=options, seed=5, verbose=0)
    assert callback.options == options.replace(seed=5)
    assert callback.memory_budget == "1MiB"
    with pytest.raises(TypeError, match="unknown setting.*'generation'"):
        tfswap.keras.SwapCallback("1MiB", generation=3)


def test_plan_path_must_be_a_directory(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match="must be a directory"):
        tfswap.keras.SwapCallback("1MiB", plan_path=path)


def test_importing_tfswap_does_not_import_keras():
    code = ("import sys, tfswap; assert 'keras' not in sys.modules; "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    # Loaded on first use (here TensorFlow is imported already, as it is then).
    assert tfswap.keras is sys.modules["tfswap.keras"]


def _tiny(**compile_kwargs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse", **compile_kwargs)
    return model, np.ones((16, 8), np.float32), np.zeros((16, 4), np.float32)


def test_run_eagerly_is_refused_with_what_to_do():
    model, x, y = _tiny(run_eagerly=True)
    with pytest.raises(RuntimeError, match="run_eagerly=False"):
        model.fit(x, y, verbose=0, callbacks=[tfswap.keras.SwapCallback("1GiB", verbose=0)])


def test_an_xla_model_runs_the_planned_graph_step_after_a_warning():
    model, x, y = _tiny(jit_compile=True)
    callback = tfswap.keras.SwapCallback(1 << 30, generations=1, workers=1, verbose=0)
    with pytest.warns(UserWarning, match="without XLA"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[callback])
    assert [f is not None for f in callback.functions.values()] == [True]


def test_a_failed_plan_leaves_keras_functions_in_place():
    model, x, y = _tiny()
    callback = tfswap.keras.SwapCallback(64, generations=1, workers=1, verbose=0)
    with pytest.raises(tfswap.BudgetError):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[callback])
    assert not callback._saved
    assert "tfswap" not in getattr(model.train_function, "__module__", "")
    model.fit(x, y, batch_size=8, verbose=0)          # Keras alone, as before


def test_plans_are_reused_across_fits_and_replanned_after_compile():
    (reference, x, y), (model, _, _) = _tiny(), _tiny()
    callback = tfswap.keras.SwapCallback(1 << 30, generations=1, workers=1, verbose=0)
    for m, callbacks in ((reference, []), (model, [callback])):
        m.fit(x, y, batch_size=8, verbose=0, callbacks=callbacks)
    (first,) = callback.functions.values()
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[callback])
    reference.fit(x, y, batch_size=8, verbose=0)
    assert list(callback.functions.values()) == [first]
    # A new optimizer: the old plan would update the old optimizer's variables.
    for m, callbacks in ((reference, []), (model, [callback])):
        m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
        m.fit(x, y, batch_size=8, verbose=0, callbacks=callbacks)
    (again,) = callback.functions.values()
    assert again is not first
    assert model.optimizer.iterations.numpy() == reference.optimizer.iterations.numpy() == 2
    assert_same_weights(reference, model)


def skip_mlp(width=256, depth=4):
    """An encoder-decoder MLP whose skip connections keep early activations alive
    until the mirrored decoder layer: what inference can swap (paper §6.3)."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    x = keras.Input((width,))
    h, skips = x, []
    for _ in range(depth):
        h = L.Dense(width, activation="relu")(h)
        skips.append(h)
    for skip in reversed(skips):
        h = L.Dense(width, activation="relu")(L.Add()([h, skip]))
    model = keras.Model(x, L.Dense(10)(h), name="skip_mlp")
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_predict_with_the_callback_swaps_within_the_budget():
    model, b = skip_mlp(), 1024
    x = np.random.default_rng(3).standard_normal((b, 256), dtype=np.float32)
    cf = tfswap.keras.step_function(model, (x,), kind="predict")
    captured = capture.capture(cf)
    peak = measure.measure(captured, captured.graph_def, [x], inter_op_threads=1).peak_bytes
    budget = int(0.8 * peak)
    callback = tfswap.keras.SwapCallback(budget, generations=5, workers=1, verbose=0)
    planned = model.predict(x, batch_size=b, verbose=0, callbacks=[callback])
    assert relative_difference(model.predict(x, batch_size=b, verbose=0), planned) <= RTOL
    (fast,) = callback.functions.values()
    after = measure.measure(fast.captured, fast.graph_def, [x]).peak_bytes
    print(f"\npredict: unmodified {peak} B, budget {budget} B, measured {after} B, "
          f"{len(fast.plan.swaps)} swaps")
    assert fast.plan.swaps and after <= budget


def regularised_cnn():
    """Conv blocks with biases before BatchNorm, Dropout and RMSprop (issue #22).

    A bias before BatchNorm has a true gradient of zero, so what it gets is
    rounding noise; RMSprop divides a gradient by its own running magnitude, so
    it turns a difference in the last bit of that noise into a step up to about
    3 * learning rate (issue #22: weights 3.3e-3 off).
    """
    keras.utils.set_random_seed(0)
    L = keras.layers
    layers = [keras.Input((16, 16, 3))]
    for _ in range(3):
        layers += [L.Conv2D(16, 3, padding="same"), L.BatchNormalization(), L.ReLU()]
    model = keras.Sequential(layers + [L.Dropout(0.3), L.GlobalAveragePooling2D(),
                                       L.Dropout(0.3), L.Dense(10)], name="regularised_cnn")
    model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=2)
    return model


@pytest.mark.parametrize("scale, fraction", [(1.0, 0.6), (0.01, 0.6), (0.01, None)],
                         ids=["inputs-60%", "inputs-x0.01-60%", "inputs-x0.01-1GiB"])
def test_batchnorm_dropout_rmsprop_grouped_steps_and_a_smaller_last_batch(scale, fraction):
    # 39 samples in batches of 8: executions of 2, 2 and 1 batches, the last of 7
    # samples; validation 12 (8 and 4).  With a smaller last batch Keras traces its
    # step with the batch dimension unknown; a static trace of the batch of 7 lets
    # Grappler turn BatchNorm's x / (7*16*16) into x * (1/1792), which rounds
    # differently (for 8, 1/2048 is exact).
    # Inputs scaled by 0.01: the conv biases' gradients (noise, see regularised_cnn)
    # are then small enough for RMSprop to turn a last-bit difference into 1.2e-4 of
    # the first bias's norm.  That difference was TensorFlow's oneDNN pass running
    # each Conv2DBackpropFilter and its BiasAddGrad apart in the rewritten step (the
    # schedule chain gave them different control inputs) and as one kernel in
    # Keras's (tests/tf/test_onednn_merge.py); at 1 GiB nothing is swapped and only
    # the chain is left to keep them apart.
    b, n = 8, 39
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, 16, 16, 3), dtype=np.float32) * np.float32(scale)
    y = rng.integers(0, 10, n).astype(np.int32)
    reference, model = regularised_cnn(), regularised_cnn()
    model.set_weights(reference.get_weights())
    budget = int(fraction * unmodified_peak(reference, (x[:b], y[:b]))) if fraction \
        else 1 << 30
    validation = dict(validation_data=(x[:12], y[:12]))
    keras.utils.set_random_seed(5)
    ref_history, ref_logs = fit(reference, x, y, b, **validation)
    callback = tfswap.keras.SwapCallback(budget, generations=3, seed=0, workers=1, verbose=0)
    keras.utils.set_random_seed(5)
    history, logs = fit(model, x, y, b, [callback], **validation)
    assert_same_history(ref_history, history)
    assert [batch for batch, _ in logs] == [batch for batch, _ in ref_logs]
    for (_, expected), (_, actual) in zip(ref_logs, logs):
        for key in expected:
            np.testing.assert_allclose(actual[key], expected[key], rtol=RTOL, err_msg=key)
    assert_same_weights(reference, model)
    assert relative_difference(reference.predict(x, verbose=0),
                               model.predict(x, verbose=0)) <= RTOL
    planned = {sig[0][1][0]: f for (kind, sig), f in callback.functions.items()
               if kind == "train"}
    assert sorted(planned) == [7, 8]
    # Both planned as Keras traces them, the batch dimension unknown (the batch of 8
    # matched before only because 1/2048 is exact).
    assert {sig[0][3][0] for kind, sig in callback.functions} == {None}
    for fast in planned.values():
        if fraction:
            assert fast.plan.swaps and fast.measured_peak_bytes <= budget
        else:   # nothing to swap: only the schedule chain changes the step
            assert not fast.plan.swaps


def test_predict_of_a_zero_padded_valid_convolution_runs_as_keras_does():
    """Keras's ZeroPadding2D before a VALID convolution (ResNet-50's first layer):
    in an inference step TensorFlow's oneDNN pass merges the Pad into the
    convolution, and the planned step failed with "nodes in a cycle" while the
    schedule chain ran from the Pad to the convolution through other ops
    (tests/tf/test_onednn_merge.py).  Nothing needs swapping to show it."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    model = keras.Sequential([keras.Input((16, 16, 3)), L.ZeroPadding2D(1),
                              L.Conv2D(8, 3, activation="relu"), L.GlobalAveragePooling2D(),
                              L.Dense(10)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(6).standard_normal((8, 16, 16, 3), dtype=np.float32)
    callback = tfswap.keras.SwapCallback(1 << 30, generations=1, workers=1, verbose=0)
    planned = model.predict(x, batch_size=8, verbose=0, callbacks=[callback])
    np.testing.assert_array_equal(planned, model.predict(x, batch_size=8, verbose=0))
    assert [f is not None for f in callback.functions.values()] == [True]


def test_the_default_plan_path_is_the_users_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tfswap.keras.default_plan_path() == tmp_path / "tfswap"
    assert tfswap.keras.SwapCallback("1GiB").plan_path == tmp_path / "tfswap"
    # The XDG rule: unset, empty or relative means ~/.cache.
    for value in ("", "relative/cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", value)
        assert tfswap.keras.default_plan_path() == Path.home() / ".cache" / "tfswap"
    assert tfswap.keras.SwapCallback("1GiB", plan_path=None).plan_path is None
    with pytest.raises(ValueError, match="background"):
        tfswap.keras.SwapCallback("1GiB", background=1)


def test_fit_starts_on_a_first_plan_and_the_next_fit_on_the_searched_one(capsys):
    """The first fit runs on first-round plans while the search goes on; the plan the
    search ends with is saved in the cache, and the next fit of the same model
    starts on it, saying so; both train exactly like plain fit."""
    b, n = 16, 40   # batches of 16, 16 and 8
    x, y = data("cnn", n)
    reference, model = twins("cnn")
    budget = int(0.5 * unmodified_peak(reference, (x[:b], y[:b])))
    histories = []
    for _ in range(2):
        ref_history, _ = fit(reference, x, y, b, epochs=1)
        callback = tfswap.keras.SwapCallback(budget, generations=2, seed=0, workers=1)
        history, _ = fit(model, x, y, b, [callback], epochs=1)
        assert_same_history(ref_history, history)
        assert_same_weights(reference, model)
        histories.append(callback.functions)
        for fast in callback.functions.values():
            if isinstance(fast, tfswap.AnytimeFunction):
                assert fast.wait(300) and fast.error is None, fast.outcome
    first, second = histories
    assert all(isinstance(f, tfswap.AnytimeFunction) for f in first.values())
    assert all(f.plans[0].first_call == 1 for f in first.values())
    full = [f for (_, sig), f in first.items() if sig[0][1][0] == b]
    assert len(full) == 1 and full[0].plan.swaps
    assert full[0].outcome.startswith(("plan", "kept plan", "the search found")), \
        full[0].outcome   # it searched in the background
    saved = sorted(tfswap.keras.default_plan_path().glob("cnn-train-*.plan.json"))
    assert len(saved) == 2   # the batches of 16 and of 8
    assert all(any("plan loaded from" in note for note in f.notes) for f in second.values())
    for key, fast in second.items():   # the plan each search ended with
        assert fast.plan == first[key].current.plan
    out = capsys.readouterr().out
    assert "plans of this function (anytime mode)" in out
