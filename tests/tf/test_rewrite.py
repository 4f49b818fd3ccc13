"""rewrite.rewrite on hand-written plans: what the rewritten graph reads and computes."""

import numpy as np
import tensorflow as tf

from tfswap.core.plan import Plan, Swap
from tfswap.tf import capture, rewrite, runtime
from tfswap.tf.emulate import DEVICE, HOST


def test_a_second_round_trip_moves_the_first_copy_that_a_view_reads():
    """``a`` leaves, comes back for ``Sum`` and its view ``Reshape``, leaves again and
    comes back for ``mul_1``, which reads it through the Reshape: the second swap-out
    must carry the first swap-in's copy (the Reshape now reads it), and ``mul_1`` a
    view of the second copy.  (Seen in a Keras Transformer step: the buffer of an
    attention gradient with a Reshape view made two round trips.)"""
    w = tf.Variable(tf.reshape(tf.range(256, dtype=tf.float32), (16, 16)) / 256.0)

    @tf.function
    def f(x):
        a = tf.matmul(x, w)
        r = tf.reshape(a, [-1])
        return (tf.reduce_sum(a) + tf.reduce_sum(r * 2.0) + tf.reduce_sum(tf.tanh(x))
                + tf.reduce_sum(r * 3.0))

    captured = capture.capture(f.get_concrete_function(tf.TensorSpec((16, 16))))
    schedule = ("MatMul/ReadVariableOp", "MatMul", "Tanh", "Sum", "Reshape", "mul", "Sum_1",
                "Sum_2", "mul_1", "Sum_3", "add", "add_1", "add_2", "Identity")
    swaps = (Swap(tensor="MatMul:0", bytes=1024, id="MatMul:0", out_after="MatMul",
                  in_after="Tanh", consumers=("Sum", "Reshape")),
             Swap(tensor="MatMul:0", bytes=1024, id="MatMul:0#1", out_after="mul",
                  in_after="Sum_2", consumers=("mul_1",)))
    rewritten = rewrite.rewrite(captured, Plan(schedule=schedule, swaps=swaps), DEVICE, HOST)

    nodes = {n.name: n for n in rewritten.graph_def.node}
    first, second = rewritten.swaps
    assert nodes[first.swap_out].input[0] == "MatMul"
    assert nodes["Reshape"].input[0] == first.swap_in
    assert nodes[second.swap_out].input[0] == first.swap_in
    view = nodes["mul_1"].input[0]
    assert nodes[view].op == "Reshape" and nodes[view].input[0] == second.swap_in

    x = np.linspace(-1.0, 1.0, 256, dtype=np.float32).reshape(16, 16)
    expected = f(tf.constant(x)).numpy()
    got = runtime.bind(captured, rewritten.graph_def)(x)
    np.testing.assert_allclose(np.asarray(tf.nest.flatten(got)[0]), expected, rtol=1e-6)
