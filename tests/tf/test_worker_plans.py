"""``SwapCallback`` under a ``MultiWorkerMirroredStrategy`` over two workers (issue #43,
item 5), and the settings a worker plans with (``tfswap.worker_plans``).

The two workers are processes on this machine, a cluster on free localhost ports
(``TF_CONFIG``), each with the emulated device: ``benchmarks/multi_worker.py
--keras`` starts them.  In each, a small BatchNorm CNN trains for 2 epochs (with
validation) twice from the same seed: plain multi-worker ``fit``, and ``fit`` with
``SwapCallback`` at 60% of the training step's analytic peak.  History and final
weights must be bit-identical, as ``tests/tf/test_replicas.py`` asserts them under a
``MirroredStrategy``: the planned step runs the same kernels on the same values, the
all-reduce included (the same collective implementation, summing in the same order),
so exact equality is what holds.  Keras 3.15's own ``fit`` fails under a multi-worker
strategy (keras-team/keras#20585); the benchmark patches its two faults in each worker
(``keras_multi_worker_fixes``), so "plain" is Keras's ``fit`` as Keras means it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfswap
from tfswap import worker_plans
from tfswap.core.profile import Profile
from tfswap.options import Options
from tfswap.worker_plans import WorkerSettingsError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("multi_worker") / "rows.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               KERAS_BACKEND="tensorflow")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "multi_worker.py"), "--keras", "--workers",
         "2", "--fraction", "0.6", "--epochs", "2", "--generations", "2", "--timeout", "240",
         "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert printed == [json.loads(line) for line in out.read_text().splitlines()]
    return printed


def test_two_workers_fit_with_the_callback_as_plain_multi_worker_fit(rows):
    assert [r["worker"] for r in rows] == [0, 1] and all(r["workers"] == 2 for r in rows)
    for r in rows:
        assert r["history_identical"] and r["history"] == r["expected_history"], r
        assert r["weights_identical"], r["worker"]
        assert set(r["history"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
        assert all(len(values) == 2 for values in r["history"].values())
    # The logs are averaged over every worker's replica: the same on both workers.
    assert rows[0]["history"] == rows[1]["history"]


def test_each_worker_plans_from_shapes_unverified_in_the_foreground(rows):
    for r in rows:
        assert r["profile"] == "analytic" and r["verify_rounds"] == 0
        train = [p for p in r["plans"] if p["kind"] == "train"]
        assert len(train) == 1 and {p["kind"] for p in r["plans"]} == {"train", "test"}
        (plan,) = train
        # 60% of the analytic peak needs swaps; the memory model holds the budget.
        assert plan["swaps"] > 0 and plan["predicted_peak_bytes"] <= r["budget_bytes"]
        assert r["budget_bytes"] < r["analytic_peak_bytes"]
        for p in r["plans"]:
            # Nothing ran the step alone: no measured peak; planned before the first
            # batch (an OptimizedFunction, no background search), on every worker.
            assert p["other_workers"] and p["measured_peak_bytes"] is None
            assert not p["background"]
        assert any("not verified" in note and "other workers" in note
                   for note in plan["notes"]), plan["notes"]
        notes = " ".join(r["callback_notes"])
        assert "2 workers" in notes and f"worker {r['worker']}" in notes
        assert "memory model alone" in notes and "same step" in notes
        assert "not verified: its peak is the memory model's prediction" in r["report"]
        # predict is Keras's own step there, after a warning, and predicts as plain.
        assert r["predict_identical"]
        assert len(r["predict_warnings"]) == 1 and "predict" in r["predict_warnings"][0]


# -- the settings, without a cluster


def test_a_worker_plans_from_shapes_without_verification():
    options = worker_plans.worker_options(Options("1MiB", generations=2), set(), workers=2)
    assert options.profile == "analytic" and options.verify_rounds == 0
    assert options.generations == 2 and options.memory_budget == "1MiB"
    # "auto" and the worker's own values, given, are accepted.
    for profile in ("auto", "analytic"):
        given = Options("1MiB", profile=profile, verify_rounds=0)
        assert worker_plans.worker_options(given, {"profile", "verify_rounds"},
                                           2).profile == "analytic"


@pytest.mark.parametrize("setting, value, says", [
    ("verify_rounds", 3, "leave verify_rounds unset, or pass verify_rounds=0"),
    ("verify_rounds", 1, "verify_rounds=1 under a MultiWorkerMirroredStrategy with 2 workers"),
    ("profile", "trace", "leave profile unset, or pass profile='analytic'"),
    ("profile", "isolated", "profile='isolated'"),
])
def test_a_setting_that_would_run_the_step_alone_is_refused(setting, value, says):
    options = Options("1MiB", **{setting: value})
    explicit = worker_plans.explicit_settings(None, {setting: value})
    with pytest.raises(WorkerSettingsError, match="wait for the other workers") as err:
        worker_plans.worker_options(options, explicit, workers=2)
    assert says in str(err.value)
    # Given in an Options object, a value other than the default is the caller's too.
    explicit = worker_plans.explicit_settings(options, {})
    if value != getattr(Options("1MiB"), setting):
        with pytest.raises(WorkerSettingsError):
            worker_plans.worker_options(options, explicit, workers=2)


def test_a_profile_object_is_refused():
    profile = Profile(source="trace", device="/device:CPU:0", ops=())
    with pytest.raises(WorkerSettingsError, match="profile=<Profile>"):
        worker_plans.worker_options(Options("1MiB", profile=profile), {"profile"}, workers=2)


def test_one_worker_or_none_is_not_several():
    assert worker_plans.worker_count(None) == 1
    assert worker_plans.worker_count(tf.distribute.get_strategy()) == 1


def _fit_as_one_of_two_workers(monkeypatch, callback):
    """``fit`` with ``callback`` as if the model trained on two workers (only the
    count is faked: the callback refuses before any step runs)."""
    import keras

    monkeypatch.setattr(worker_plans, "worker_count", lambda strategy: 2)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    model.fit(np.ones((8, 4), np.float32), np.ones((8, 2), np.float32), batch_size=4,
              epochs=1, verbose=0, callbacks=[callback])


@pytest.mark.parametrize("settings, says", [
    (dict(verify_rounds=3), "pass verify_rounds=0"),
    (dict(profile="trace"), "pass profile='analytic'"),
    (dict(options=Options("1MiB", verify_rounds=2)), "verify_rounds=2"),
    (dict(background=True), "background=True under a MultiWorkerMirroredStrategy with 2 "
                            "workers"),
])
def test_the_callback_refuses_such_settings_at_fit_before_any_step(monkeypatch, settings,
                                                                     says):
    callback = tfswap.keras.SwapCallback(memory_budget="1MiB", generations=1, verbose=0,
                                         plan_path=None, **settings)
    with pytest.raises(WorkerSettingsError) as err:
        _fit_as_one_of_two_workers(monkeypatch, callback)
    assert says in str(err.value)
    assert not callback.functions   # nothing planned, nothing ran
