"""The SwapOut/SwapIn library: copies, registrations, error on bad dtypes."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.framework import kernels  # noqa: E402

from tfswap import ops  # noqa: E402


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.bool_])
def test_round_trip_is_a_copy_with_identical_bytes(dtype):
    x = tf.constant(np.arange(24).reshape(2, 3, 4).astype(dtype))
    host = ops.swap_out(x)
    back = ops.swap_in(host)
    np.testing.assert_array_equal(back.numpy(), x.numpy())
    assert back.shape == x.shape and back.dtype == x.dtype


def test_empty_tensor():
    x = tf.zeros([0, 3])
    assert ops.swap_in(ops.swap_out(x)).shape == (0, 3)


def test_string_tensors_are_refused():
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot swap"):
        ops.swap_out(tf.constant(["a"]))


@pytest.mark.parametrize("op", ops.OP_TYPES)
def test_cpu_and_gpu_kernels_are_registered(op):
    registered = kernels.get_registered_kernels_for_op(op).kernel
    by_device = {k.device_type: list(k.host_memory_arg) for k in registered}
    assert "CPU" in by_device
    assert by_device["GPU"] == ["host_copy"]  # host side pinned, declared HostMemory


def test_ops_are_stateful_so_grappler_keeps_them():
    from tensorflow.python.framework import op_def_registry
    ops.load()
    for op in ops.OP_TYPES:
        assert op_def_registry.get(op).is_stateful
