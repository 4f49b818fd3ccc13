"""tfswap.tf.measure: what a step held, from its step stats."""

import pytest

pytest.importorskip("tensorflow")

from tensorflow.core.framework import step_stats_pb2  # noqa: E402

from tfswap.tf import measure  # noqa: E402


def _stats(device, rows):
    """Step stats of one device: rows of (node, [(micros, bytes), ...])."""
    stats = step_stats_pb2.StepStats()
    dev = stats.dev_stats.add(device=device)
    for name, records in rows:
        node = dev.node_stats.add(node_name=name, timeline_label=f"{name} = Op(x)")
        mem = node.memory.add(allocator_name="cpu")
        for micros, nbytes in records:
            mem.allocation_records.add(alloc_micros=micros, alloc_bytes=nbytes)
    return stats


def test_live_at_peak_names_what_each_node_held_at_the_peak():
    stats = _stats("/job:localhost/replica:0/task:0/device:CPU:0", [
        ("a", [(1, 100), (3, -100)]),
        ("b", [(2, 50), (6, -50)]),
        ("c", [(4, 120), (5, -20), (7, -100)]),
        # A free and an allocation at the same instant: the free first.
        ("d", [(6, 60), (8, -60)]),
    ])
    peak, held, node = measure.live_at_peak(stats, "/device:CPU:0")
    assert peak == 170 == measure.transient_peak(stats, "/device:CPU:0")
    assert held == {"b": 50, "c": 120} and node == "c"
    # Another device's records are not this device's.
    assert measure.live_at_peak(stats, "/device:GPU:0") == (0, {}, "")


def test_live_at_peak_of_a_traced_step_adds_up_to_its_peak():
    from tfswap import zoo
    from tfswap.tf import capture

    step = zoo.cnn(batch=4, image=16, channels=4, blocks=2)
    captured = capture.capture(step.concrete_fn)
    traced = measure.run_traced(captured, captured.graph_def, step.batch, runs=1)
    stats = traced.metadata[0].step_stats
    peak, held, node = measure.live_at_peak(stats)
    assert peak == measure.transient_peak(stats) > 0 and node in held
    assert sum(held.values()) == peak and all(b > 0 for b in held.values())
    nodes = {n.name for n in captured.graph_def.node}
    assert sum(b for name, b in held.items() if name in nodes) > peak / 2
