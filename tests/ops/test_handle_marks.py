"""TfswapRetireHandle / TfswapReviveHandle: a retired handle, and every copy of it,
fails with the message; revived, it reaches its variable again."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.framework import kernels, op_def_registry  # noqa: E402

from tfswap.tf import stale  # noqa: E402

OPS = ("TfswapRetireHandle", "TfswapReviveHandle")


@pytest.mark.parametrize("op", OPS)
def test_cpu_and_gpu_kernels_are_registered_and_stateful(op):
    stale.ready()
    by_device = {k.device_type: set(k.host_memory_arg)
                 for k in kernels.get_registered_kernels_for_op(op).kernel}
    assert "CPU" in by_device
    # A GPU variable's handle lives in host memory: the op runs on its device there.
    assert "handle" in by_device["GPU"]
    assert op_def_registry.get(op).is_stateful


def test_every_copy_of_a_retired_handle_fails_with_the_message_until_revived():
    v = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    handle = v.handle
    # Copies made before: a dataset's captured input, a function's captured input.
    data = tf.data.Dataset.range(1).map(lambda _: tf.reduce_sum(v))
    graph = tf.function(lambda: tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32))
    graph()
    identity = stale.retire(handle, "retired by the test")
    for read in (v.numpy, graph, lambda: list(data),
                 lambda: tf.raw_ops.ResourceGather(resource=handle, indices=[1],
                                                   dtype=tf.float32)):
        with pytest.raises(tf.errors.OpError, match="retired by the test"):
            read()
    with pytest.raises(tf.errors.FailedPreconditionError, match="retired already"):
        stale.retire(handle, "again")
    stale.revive(handle, identity)
    stale.revive(handle, identity)      # not retired: nothing changes
    np.testing.assert_array_equal(graph(), v.numpy())
    assert [float(s) for s in data] == [15.0]
    assert stale.retire(handle, "once more") == identity
    stale.revive(handle, identity)
