"""tfswap.optimize / load_plan refuse bad input with messages that say what to do.

Complements tests/tf/test_capture_errors.py (capture itself) and
tests/core/test_budget.py (budget parsing): here each error is met the way a
user meets it, through the public API.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

import tfswap
from tfswap.core.plan import PlanFormatError
from tfswap.tf.capture import CaptureError

ROOT = Path(__file__).resolve().parents[2]
WIDTH, BATCH, LAYERS = 256, 512, 6


@pytest.fixture(scope="module")
def mlp():
    """A small training step whose activations (512 KiB each) dominate its memory."""
    weights = [tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], seed=(k, 0)) * 0.05)
               for k in range(LAYERS)]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for w in weights:
                h = tf.nn.relu(tf.matmul(h, w))
            loss = tf.reduce_mean(h * h)
        for w, g in zip(weights, tape.gradient(loss, weights)):
            w.assign_sub(0.1 * g)
        return {"loss": loss}

    cf = step.get_concrete_function(tf.TensorSpec([BATCH, WIDTH]))
    return cf, weights


@pytest.mark.parametrize("budget,needle", [
    (0, "must be > 0"), (-1, "must be > 0"), ("-3MiB", "cannot read"),
    ("lots", "cannot read"), ("64", "no unit"), ("1 TiB", "more than the device has"),
    (2.0, "fraction of the device's memory")])
def test_unusable_budgets_are_refused_before_any_work(mlp, budget, needle):
    cf, _ = mlp
    with pytest.raises(tfswap.BudgetError, match=needle):
        tfswap.optimize(cf, budget, generations=1, workers=1)


def test_unknown_planner_is_refused_before_any_work(mlp):
    cf, _ = mlp
    with pytest.raises(ValueError, match="planner must be one of the registered planners"):
        tfswap.optimize(cf, 0.5, planner="packed", generations=1, workers=1)


def test_budget_below_the_working_set_names_the_op_its_bytes_and_the_minimum(mlp):
    cf, _ = mlp
    with pytest.raises(tfswap.BudgetError) as err:
        tfswap.optimize(cf, "256KiB", generations=1, workers=1, parameters="device")
    message = str(err.value)
    found = re.search(r"op '([^']+)' \((\w+)\) needs (\d+) bytes at once for its inputs, "
                      r"outputs and scratch", message)
    assert found, message
    assert found.group(2) == "MatMul"       # the largest op of the step reads 2 activations
    op_bytes = int(found.group(3))
    assert op_bytes >= 2 * BATCH * WIDTH * 4
    pinned = int(re.search(r"parameters that stay on the device take (\d+) bytes",
                           message).group(1))
    minimum = int(re.search(r"smallest budget that can work is about (\d+) bytes",
                            message).group(1))
    assert minimum >= op_bytes + pinned


def _minimum_budget(cf) -> int:
    with pytest.raises(tfswap.BudgetError) as err:
        tfswap.optimize(cf, "256KiB", generations=1, workers=1, parameters="device")
    return int(re.search(r"smallest budget that can work is about (\d+) bytes",
                         str(err.value)).group(1))


def test_the_named_minimum_budget_is_enough_to_plan(mlp):
    cf, _ = mlp
    budget = _minimum_budget(cf)   # exactly the budget the error names
    fast = tfswap.optimize(cf, budget, generations=2, workers=1, verify_rounds=0,
                           parameters="device")
    assert fast.plan.prediction.peak_bytes <= budget


def test_plain_python_function_and_unsigned_tf_function_through_optimize():
    with pytest.raises(CaptureError, match="needs a ConcreteFunction, got function"):
        tfswap.optimize(lambda x: x, "1MiB")
    with pytest.raises(CaptureError, match="get_concrete_function"):
        tfswap.optimize(tf.function(lambda x: x + 1), "1MiB")


def test_unknown_input_dimension_through_optimize():
    fn = tf.function(lambda x: {"loss": tf.reduce_sum(x)})
    cf = fn.get_concrete_function(tf.TensorSpec([None, 4]))
    with pytest.raises(CaptureError, match=r"unknown dimension 0 .*Trace one concrete"):
        tfswap.optimize(cf, "1MiB")


def test_data_dependent_shapes_need_a_profile_that_runs_the_step():
    w = tf.Variable(tf.ones([64, 64]))

    @tf.function
    def step(x):
        kept = tf.boolean_mask(x, x[:, 0] > 0)       # rows known only when it runs
        return {"loss": tf.reduce_sum(tf.matmul(kept, w))}

    cf = step.get_concrete_function(tf.TensorSpec([256, 64]))
    with pytest.raises(CaptureError, match=r"unknown dimensions, so the analytic profile "
                                           r"cannot count their bytes: boolean_mask.*"
                                           r"Use profile='trace'"):
        tfswap.optimize(cf, "1MiB", profile="analytic", generations=1, workers=1)
    # The trace profile measures those tensors, so the same step plans.
    assert tfswap.optimize(cf, "1MiB", profile="trace", generations=1, workers=1).plan


def test_variables_collected_after_tracing_are_explained():
    def make():
        v = tf.Variable(tf.ones([4]))
        return tf.function(lambda x: {"loss": tf.reduce_sum(v * x)}).get_concrete_function(
            tf.TensorSpec([4]))

    cf = make()   # v is gone: the function holds only a weak reference to it
    with pytest.raises(CaptureError, match="variables that no longer exist.*Keep them alive"):
        tfswap.optimize(cf, "1MiB")


def test_plan_for_another_graph_is_refused(mlp, tmp_path):
    cf, weights = mlp
    fast = tfswap.optimize(cf, 1 << 30, generations=1, workers=1)
    path = tmp_path / "mlp.plan.json"
    fast.plan.save(path)
    other = tf.function(lambda x: {"loss": tf.reduce_sum(tf.matmul(x, weights[0]))})
    with pytest.raises(tfswap.PlanMismatchError,
                       match="made for another graph.*Re-plan with tfswap.optimize"):
        tfswap.load_plan(path, other.get_concrete_function(tf.TensorSpec([BATCH, WIDTH])))


@pytest.mark.parametrize("text,needle", [
    ('{"kind": "tfswap.plan", "format_version": 2, "sched', "invalid JSON"),
    ('{"format_version": 2, "schedule": []}', "missing kind 'tfswap.plan'"),
    ('{"kind": "tfswap.plan", "format_version": 99, "schedule": []}', "version 99"),
    ('{"kind": "tfswap.plan", "format_version": 2, "schedule": ["a", "a"]}', "corrupted"),
])
def test_corrupted_plan_file_names_the_file_and_what_to_do(mlp, tmp_path, text, needle):
    cf, _ = mlp
    path = tmp_path / "broken.plan.json"
    path.write_text(text)
    with pytest.raises(PlanFormatError, match=re.escape(str(path)) + ".*" + needle):
        tfswap.load_plan(path, cf)


def test_no_emulated_device_and_no_gpu_says_how_to_set_one_up():
    code = ("import tensorflow as tf, tfswap\n"
            "assert not tf.config.list_physical_devices('GPU')\n"
            "cf = tf.function(lambda x: {'y': x * 2}).get_concrete_function("
            "tf.TensorSpec([4]))\n"
            "try:\n    tfswap.optimize(cf, '1MiB')\n"
            "except tfswap.NoDeviceError as e:\n    print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT),
                                                    "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert "REFUSED tfswap found no GPU" in out.stdout
    assert "tfswap.tf.emulate.setup()" in out.stdout


def test_host_alone_is_refused_where_no_strategy_names_the_device():
    """Under a tf.distribute strategy the replicas' devices are the step's; a step on
    one device gives ``host=`` nothing to go with, so the device must be named."""
    cf = tf.function(lambda x: {"y": x * 2}).get_concrete_function(tf.TensorSpec([4]))
    with pytest.raises(ValueError, match=r"host='/device:CPU:1' alone does not say where the "
                                         r"step runs.*not replicated.*Pass device= as well"):
        tfswap.optimize(cf, "1MiB", host="/device:CPU:1")
    with pytest.raises(ValueError, match=r"device='/device:CPU:0' alone.*pass host= as well"):
        tfswap.optimize(cf, "1MiB", device="/device:CPU:0")
