"""Data parallel as a multi-GPU user meets it (issue #43, items 1 and 2).

A new user's script: two emulated devices (CPU:0 and CPU:1) under a
``MirroredStrategy``, the host on CPU:2, and ``SwapCallback(memory_budget=half a
replica's peak, host=...)`` with no ``device=``: the strategy names the devices.
It runs in a process of its own, because each ``MirroredStrategy`` numbers its
collectives from the same keys and the process's collective executor keeps an
instance's shape: a second strategy in the process of ``test_replicas.py``
(CPU:0 and CPU:2) fails with "Shape mismatch in the collective instance".

What it checks against plain ``fit`` under the same strategy: 3 epochs with
validation, then ``evaluate`` and ``predict``, bit for bit; each step planned once
per signature (the callback used to take the replicas' own copies of the mirrored
variables for another model's and planned the training step again every epoch,
printing so, and forgot it); every training plan within the budget on each device,
its per-device peaks kept after ``fit``.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys
    import numpy as np
    import tensorflow as tf
    from tfswap.tf import emulate

    emulate.setup(replicas=2)            # CPU:0, CPU:1, CPU:2
    import keras
    import tfswap
    from tfswap import api, pipeline
    from tfswap.tf import capture, measure

    DEVICES, HOST = ["/device:CPU:0", "/device:CPU:1"], "/device:CPU:2"
    strategy = tf.distribute.MirroredStrategy(DEVICES)

    def build():
        keras.utils.set_random_seed(0)
        L = keras.layers
        with strategy.scope():
            model = keras.Sequential(
                [keras.Input((32, 32, 3))]
                + [layer for _ in range(4) for layer in (
                    L.Conv2D(16, 3, padding="same", use_bias=False),
                    L.BatchNormalization(), L.ReLU())]
                + [L.GlobalAveragePooling2D(), L.Dense(10)])
            model.compile(optimizer="adam", jit_compile=False, metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, 96).astype(np.int32)
    xv, yv = x[:32], y[:32]
    shards = ((x[:16], y[:16]), (x[16:32], y[16:32]))
    cf = tfswap.keras.step_function(build(), shards, "train", replicated=True)
    captured = capture.capture(cf, device=DEVICES[0])
    inputs = [leaf for shard in shards for leaf in shard]
    peak = max(measure.measure(dataclasses.replace(captured, device=d), captured.graph_def,
                               inputs, runs=2, device=d).peak_bytes for d in DEVICES)
    budget = peak // 2

    plain, model = build(), build()
    fit = dict(batch_size=32, epochs=3, verbose=0, shuffle=False, validation_data=(xv, yv))
    expected = plain.fit(x, y, **fit).history
    expected_eval = plain.evaluate(xv, yv, batch_size=32, verbose=0)
    expected_predict = plain.predict(x, batch_size=32, verbose=0)

    # Every plan the callback makes goes through optimize, which profiles and lowers
    # the step in prepare; every background search starts in searching_again.
    made, prepared, searches = [], [], []
    optimize, prepare, again = api.optimize, pipeline.prepare, pipeline.searching_again
    api.optimize = lambda cf, *a, **k: made.append(1) or optimize(cf, *a, **k)
    pipeline.prepare = lambda cf, o: prepared.append(1) or prepare(cf, o)
    pipeline.searching_again = lambda *a, **k: searches.append(1) or again(*a, **k)
    callback = tfswap.keras.SwapCallback(memory_budget=budget, host=HOST, generations=2,
                                         workers=1, verbose=1)
    got = model.fit(x, y, callbacks=[callback], **fit).history
    after_fit = {key[0]: fast for key, fast in callback.functions.items()}
    got_eval = model.evaluate(xv, yv, batch_size=32, verbose=0, callbacks=[callback])
    got_predict = model.predict(x, batch_size=32, verbose=0, callbacks=[callback])
    train = [fast for key, fast in callback.functions.items() if key[0] == "train"]
    for fast in callback.functions.values():
        assert fast.wait(600), "a background search did not end"
    result = dict(
        budget=budget,
        history_equal=got == expected,
        weights_equal=all(np.array_equal(a, b)
                          for a, b in zip(model.get_weights(), plain.get_weights())),
        evaluate_equal=got_eval == expected_eval,
        predict_equal=bool(np.array_equal(got_predict, expected_predict)),
        kinds=sorted(key[0] for key in callback.functions),
        kept=all(callback.functions.get(key) is fast for key, fast in
                 ((k, f) for k, f in callback.functions.items() if k[0] in after_fit)),
        made=len(made), prepared=len(prepared), searches=len(searches),
        searched=sorted(key[0] for key, fast in callback.functions.items()
                        if fast.outcome != "nothing to search"),
        train_spans=[[dict(s.measured_peaks), s.measured_peak_bytes, s.first_call]
                     for fast in train for s in fast.plans],
        train_peaks=[fast.measured_peaks for fast in train],
        train_swaps=[len(fast.plan.swaps) + sum(len(p.swaps) for p in fast.replica_plans)
                     for fast in train],
        train_devices=[list(fast.captured.replicas) for fast in train],
        train_host=[fast.host for fast in train],
        report=train[0].report() if train else "",
    )
    print("RESULT " + json.dumps(result), flush=True)
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data_parallel")
    script = folder / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=folder, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), done.stdout


def test_host_alone_under_a_strategy_fits_evaluates_and_predicts_as_plain_keras(run):
    result, _ = run
    assert result["train_devices"] == [["/device:CPU:0", "/device:CPU:1"]]
    assert result["train_host"] == ["/device:CPU:2"]
    assert result["history_equal"] and result["weights_equal"]
    assert result["evaluate_equal"] and result["predict_equal"]


def test_each_step_is_planned_once_across_epochs_evaluate_and_predict(run):
    result, printed = run
    # One training, one validation/evaluate and one predict signature: three plans,
    # one search each, and no plan dropped between epochs or by evaluate/predict.
    assert result["kinds"] == ["predict", "test", "train"]
    assert result["made"] == 3 and result["prepared"] == 3
    # Only a step that does not fit as it is searches on, in the background, once.
    assert "train" in result["searched"] and result["searches"] == len(result["searched"])
    assert result["kept"]
    assert "no longer uses" not in printed
    # Planned once; a later line names the step again only when the background
    # search's plan takes over, which depends on how soon that search ends.
    announced = [line for line in printed.splitlines()
                 if line.startswith("tfswap: train step for batches")
                 and "from the background search takes over" not in line]
    assert len(announced) == 1, announced


def test_every_training_plan_is_within_the_budget_on_each_device_after_fit(run):
    result, _ = run
    budget = result["budget"]
    assert result["train_swaps"][0] > 0, "half the peak should need swaps"
    devices = {"/device:CPU:0", "/device:CPU:1"}
    (peaks,) = result["train_peaks"]
    assert set(peaks) == devices and max(peaks.values()) <= budget, peaks
    spans = result["train_spans"]
    assert spans and all(first >= 1 for _, _, first in spans)   # each plan ran
    for per_device, worst, _ in spans:
        assert set(per_device) == devices and worst == max(per_device.values()) <= budget
    for device in devices:
        assert f"{device}: {peaks[device]} B" in result["report"]
