"""Capture and emulation reject bad input with messages that say what to do."""

import subprocess
import sys

import pytest
import tensorflow as tf

from tfswap.tf import emulate
from tfswap.tf.capture import CaptureError, capture


def test_plain_python_function_is_rejected():
    with pytest.raises(CaptureError, match="needs a ConcreteFunction, got function"):
        capture(lambda x: x)


def test_tf_function_without_signature_is_rejected():
    fn = tf.function(lambda x: x * 2)
    with pytest.raises(CaptureError, match="get_concrete_function"):
        capture(fn)


def test_unknown_dimension_names_input_and_axis():
    @tf.function
    def f(images, labels):
        return tf.reduce_sum(images) + tf.cast(tf.reduce_sum(labels), tf.float32)

    cf = f.get_concrete_function(tf.TensorSpec([None, 8]), tf.TensorSpec([4], tf.int32))
    with pytest.raises(CaptureError, match=r"input args/0 \(images\) has an unknown dimension 0"):
        capture(cf)


def test_capture_lists_feeds_fetches_and_variables():
    v = tf.Variable(tf.ones([3]))

    @tf.function
    def f(x):
        v.assign_add(x)
        return {"sum": tf.reduce_sum(v)}

    c = capture(f.get_concrete_function(tf.TensorSpec([3])))
    assert c.feeds == ("x:0",)
    assert len(c.fetches) == 1
    assert c.variables == (v,)
    assert c.control_outputs


def test_emulation_after_devices_exist_fails_clearly():
    code = ("import tensorflow as tf; tf.constant(1.0)\n"
            "from tfswap.tf import emulate\n"
            "try:\n    emulate.setup()\nexcept emulate.DevicesAlreadyInitialized as e:\n"
            "    print('REFUSED', 'right after `import tensorflow`' in str(e))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "REFUSED True" in out.stdout


def _replicated(devices):
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        w = tf.Variable(tf.ones([4, 2]))

    @tf.function
    def step(x):
        def replica(xb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.matmul(xb, w))
            grad = tf.distribute.get_replica_context().all_reduce("SUM", tape.gradient(loss, w))
            return loss + tf.reduce_sum(grad)
        return strategy.reduce("SUM", strategy.run(replica, args=(x,)), axis=None)

    return step.get_concrete_function(tf.TensorSpec([3, 4])), w


def test_a_replicated_step_is_captured_with_its_devices_and_refused_on_the_host():
    import tfswap

    cf, _ = _replicated([emulate.DEVICE, "/device:CPU:2"])
    assert capture(cf, device=emulate.DEVICE).replicas == (emulate.DEVICE, "/device:CPU:2")
    with pytest.raises(CaptureError, match=r"not on /device:CPU:3"):
        capture(cf, device="/device:CPU:3")
    # A strategy over the emulated host: the swaps would copy to a replica's memory.
    cf, _ = _replicated([emulate.DEVICE, emulate.HOST])
    with pytest.raises(CaptureError, match=r"the host /device:CPU:1 is one of the replicas"):
        tfswap.optimize(cf, memory_budget="1MiB", generations=1)
