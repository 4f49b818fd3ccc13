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


# The emulated link (link_bytes_per_s > 0, CPU kernels): same bytes, and the op
# completes no sooner than its bytes would cross the link.  Sleeping guarantees
# the lower bound, so only that is asserted (a loaded machine makes it later).

def test_unthrottled_ops_default_to_no_link():
    from tensorflow.python.framework import op_def_registry
    ops.load()
    for op in ops.OP_TYPES:
        attr = {a.name: a for a in op_def_registry.get(op).attr}["link_bytes_per_s"]
        assert attr.default_value.f == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_])
def test_throttled_round_trip_is_bit_identical(dtype):
    x = tf.constant((np.random.default_rng(0).standard_normal(4096) * 50).astype(dtype))
    back = ops.swap_in(ops.swap_out(x, link_bytes_per_s=1e8), link_bytes_per_s=1e8)
    assert back.numpy().tobytes() == x.numpy().tobytes()
    assert back.dtype == x.dtype and back.shape == x.shape


def test_throttled_copy_takes_at_least_bytes_over_bandwidth():
    import time
    x = tf.ones([1 << 18], tf.float32)   # 1 MiB
    bw = 50e6                             # 21 ms a copy
    ops.swap_out(x, link_bytes_per_s=bw).numpy()   # warm up (kernel creation)
    start = time.perf_counter()
    ops.swap_out(x, link_bytes_per_s=bw).numpy()
    assert time.perf_counter() - start >= x.shape[0] * 4 / bw


def test_copies_in_one_direction_share_the_link():
    """Two swap-outs in one graph, free to run together: the d2h link moves
    them one after the other, so the step takes at least twice one copy."""
    import time
    bw = 50e6
    x = tf.ones([1 << 18], tf.float32)

    @tf.function
    def two(a):
        return (ops.swap_out(a, link_bytes_per_s=bw), ops.swap_out(a * 2, link_bytes_per_s=bw))

    [t.numpy() for t in two(x)]
    start = time.perf_counter()
    out = [t.numpy() for t in two(x)]
    assert time.perf_counter() - start >= 2 * x.shape[0] * 4 / bw
    assert np.array_equal(out[1], 2 * x.numpy())


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_bad_link_bandwidth_is_refused_by_the_kernel(bad):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        ops.swap_out(tf.ones([4]), link_bytes_per_s=bad).numpy()
