"""tfswap.tf.rewrite on hand-written plans whose swaps share a buffer.

A planner's swap moves a buffer; a buffer that leaves twice, or that holds
views, must still be carried by the copy each reader reads (fuzz seed 1211:
``'Sum' does not read MatMul_1:0``).
"""

import numpy as np
import pytest
import tensorflow as tf

from tfswap.tf.tensor_swaps import tensor_swaps
from tfswap.core.plan import Plan, Swap
from tfswap.tf import capture, ir, rewrite, runtime
from tfswap.tf.emulate import DEVICE, HOST


def _step():
    w = tf.Variable(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32))

    @tf.function
    def step(x):
        m = tf.matmul(x, w)
        a = tf.tanh(tf.concat([m, x], axis=1))
        s = tf.reduce_sum(tf.reshape(m, (-1, 32, 2)), axis=2)
        return {"loss": tf.reduce_sum(s) + tf.reduce_sum(a)}

    cf = step.get_concrete_function(tf.TensorSpec((128, 64), tf.float32))
    return w, capture.capture(cf)


def _readers(graph_def, name):
    return sorted(n.name for n in graph_def.node
                  if any(i.partition(":")[0] == name for i in n.input if not i.startswith("^")))


def test_a_buffer_that_leaves_twice_leaves_from_its_copy_and_views_follow():
    """MatMul's buffer leaves after concat, comes back for the Reshape (a view),
    and leaves again before the Sum reading that view: the second swap-out reads
    the first swap-in, the Sum reads the second, the original has no late reader."""
    w, captured = _step()
    graph = ir.lower(captured, None).graph
    assert graph.tensor("Reshape:0").alias_of == "MatMul:0"
    schedule = ("x", "MatMul/ReadVariableOp", "MatMul", "concat", "Tanh", "Reshape", "Sum_2",
                "Sum", "Sum_1", "add", "Identity")
    plan = Plan(schedule=schedule, swaps=(
        Swap("MatMul:0", out_after="concat", in_after="Tanh", consumers=("Reshape",),
             bytes=128 * 64 * 4),
        Swap("MatMul:0", out_after="Reshape", in_after="Sum_2", consumers=("Sum",),
             bytes=128 * 64 * 4, id="MatMul:0#1")))
    plan = tensor_swaps(plan, graph)
    assert [(s.tensor, s.consumers) for s in plan.swaps] == [("MatMul:0", ("Reshape",)),
                                                              ("MatMul:0", ("Sum",))]
    rewritten = rewrite.rewrite(captured, plan, DEVICE, HOST)
    first, second = rewritten.swaps
    assert _readers(rewritten.graph_def, "MatMul") == sorted(["concat", first.swap_out])
    assert _readers(rewritten.graph_def, first.swap_in) == sorted(["Reshape", second.swap_out])
    x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    want = runtime.bind(captured, captured.graph_def)(x)["loss"].numpy()
    got = runtime.bind(captured, rewritten.graph_def)(x)["loss"].numpy()
    assert got == want


def test_swap_outs_run_on_the_device_and_their_host_copies_are_not_device_memory():
    """A swap-out on the emulated host read its tensor through a Send/Recv whose
    callback could hold the device buffer well after the copy (fuzz seed 1010)."""
    from tensorflow.core.framework import step_stats_pb2

    from tfswap.tf import measure

    _, captured = _step()
    plan = Plan(schedule=("x", "MatMul/ReadVariableOp", "MatMul", "concat", "Tanh", "Reshape",
                          "Sum_2", "Sum", "Sum_1", "add", "Identity"),
                swaps=(Swap("MatMul:0", out_after="concat", in_after="Tanh",
                            consumers=("Reshape",), bytes=128 * 64 * 4),))
    rewritten = rewrite.rewrite(captured, plan, DEVICE, HOST)
    assert {n.device for n in rewritten.graph_def.node if n.op == "SwapOut"} == {DEVICE}

    stats = step_stats_pb2.StepStats()
    dev = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0")
    for name, op, records in (("MatMul", "MatMul", ((1, 100), (5, -100))),
                              ("tfswap/swap_out_0", "SwapOut", ((4, 100),)),
                              ("tfswap/swap_in_0", "SwapIn", ((6, 100), (8, -100)))):
        node = dev.node_stats.add(node_name=name, timeline_label=f"{name} = {op}(x)")
        mem = node.memory.add(allocator_name="cpu")
        for t, nbytes in records:
            mem.allocation_records.add(alloc_micros=t, alloc_bytes=nbytes)
    assert measure.transient_peak(stats, DEVICE) == 100


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
    planned = ("MatMul/ReadVariableOp", "MatMul", "Tanh", "Sum", "Reshape", "mul", "Sum_1",
               "Sum_2", "mul_1", "Sum_3")
    # Then the sum of the four (Grappler's AddN or adds, as it rewrites them).
    kinds = {n.name: n.op for n in captured.graph_def.node}
    schedule = planned + tuple(n for n in rewrite.topological_order(captured.graph_def)
                               if n not in planned and kinds[n] not in ("Placeholder", "Const"))
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


def test_an_int32_tensor_makes_a_round_trip_and_the_result_is_exact():
    """Integer tensors are swapped like float ones (the GA moves one only when its
    traced order makes it worth moving, so this forces it with a plan given as data)."""
    @tf.function
    def f(x):
        i = tf.cast(tf.round(x * 8.0), tf.int32)
        t = tf.tanh(x)
        return tf.reduce_sum(tf.cast(tf.math.floormod(i, 3), tf.float32) * t)

    captured = capture.capture(f.get_concrete_function(tf.TensorSpec((64, 64))))
    nodes = {n.name: n for n in captured.graph_def.node}
    schedule = tuple(n for n in rewrite.topological_order(captured.graph_def)
                     if nodes[n].op != "Placeholder")
    cast = next(n for n in schedule if nodes[n].op == "Cast"
                and nodes[n].attr["DstT"].type == tf.int32.as_datatype_enum)
    readers = tuple(n.name for n in captured.graph_def.node
                    if any(i.split(":")[0] == cast for i in n.input))
    tanh = next(n for n in schedule if nodes[n].op == "Tanh")
    # The tanh runs between the swap-out and the swap-in, the readers right after.
    base = [n for n in schedule if n not in readers and n != tanh]
    at = base.index(cast) + 1
    schedule = tuple(base[:at]) + (tanh,) + readers + tuple(base[at:])
    assert schedule.index(cast) < schedule.index(tanh) < min(schedule.index(r) for r in readers)
    swap = Swap(tensor=f"{cast}:0", bytes=64 * 64 * 4, id=f"{cast}:0", out_after=cast,
                in_after=tanh, consumers=readers)
    rewritten = rewrite.rewrite(captured, Plan(schedule=schedule, swaps=(swap,)), DEVICE, HOST)
    x = np.linspace(-2.0, 2.0, 64 * 64, dtype=np.float32).reshape(64, 64)
    expected = f(tf.constant(x)).numpy()
    got = runtime.bind(captured, rewritten.graph_def)(x)
    assert np.asarray(tf.nest.flatten(got)[0]) == expected


def _one_swap_plan():
    return Plan(schedule=("x", "MatMul/ReadVariableOp", "MatMul", "concat", "Tanh", "Reshape",
                          "Sum_2", "Sum", "Sum_1", "add", "Identity"),
                swaps=(Swap("MatMul:0", out_after="concat", in_after="Tanh",
                            consumers=("Reshape",), bytes=128 * 64 * 4),))


def test_an_emulated_link_is_set_on_every_swap_op_and_the_result_is_exact():
    import time

    _, captured = _step()
    plain = rewrite.rewrite(captured, _one_swap_plan(), DEVICE, HOST)
    assert all("link_bytes_per_s" not in n.attr for n in plain.graph_def.node
               if n.op in ("SwapOut", "SwapIn"))
    bw = 2e6   # 32 KiB each way: >= 16 ms a copy
    slow = rewrite.rewrite(captured, _one_swap_plan(), DEVICE, HOST,
                           emulated_link_bytes_per_s=bw)
    swap_ops = [n for n in slow.graph_def.node if n.op in ("SwapOut", "SwapIn")]
    assert len(swap_ops) == 2 and all(n.attr["link_bytes_per_s"].f == bw for n in swap_ops)
    x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    want = runtime.bind(captured, captured.graph_def)(x)["loss"].numpy()
    run = runtime.bind(captured, slow.graph_def)
    run(x)
    start = time.perf_counter()
    got = run(x)["loss"].numpy()
    # the swap-in waits for the swap-out: both copies cross the link in turn
    assert time.perf_counter() - start >= 2 * 128 * 64 * 4 / bw
    assert got == want


def test_memcpy_copies_run_before_the_op_scheduled_after_their_trigger():
    """Issue #44: left free, TensorFlow's executor ran some swap-outs many ops after
    the op they follow, holding their buffers till then (fuzz seed 8018: 24% over
    its prediction in about 1 session of 12), and with only those ordered it ran
    an early swap-in late.  Where the copies are plain memcpys (a CPU device, no
    emulated link) the op scheduled after each copy's trigger waits for it; on a
    link a copy takes time, and waiting would stall the compute ops.  Results
    exact either way."""
    _, captured = _step()
    plan = Plan(schedule=_one_swap_plan().schedule,
                swaps=(Swap("MatMul:0", out_after="MatMul", in_after="concat",
                            consumers=("Reshape",), bytes=128 * 64 * 4),))
    x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    want = runtime.bind(captured, captured.graph_def)(x)["loss"].numpy()
    for link, waits in ((None, True), (2e9, False)):
        got = rewrite.rewrite(captured, plan, DEVICE, HOST, emulated_link_bytes_per_s=link)
        (swap,) = got.swaps
        nodes = {n.name: n for n in got.graph_def.node}
        # The swap-out follows MatMul, before concat; the swap-in follows concat, before Tanh.
        assert ("^" + swap.swap_out in nodes["concat"].input) == waits
        assert ("^" + swap.swap_in in nodes["Tanh"].input) == waits
        assert runtime.bind(captured, got.graph_def)(x)["loss"].numpy() == want


@pytest.mark.parametrize("bad", [0, 0.0, -5.0, float("inf"), float("nan"), True, "1e9", 1e300])
def test_rewrite_refuses_a_bad_emulated_link(bad):
    _, captured = _step()
    with pytest.raises(ValueError, match="emulated_link_bytes_per_s"):
        rewrite.rewrite(captured, _one_swap_plan(), DEVICE, HOST, emulated_link_bytes_per_s=bad)


def test_ordered_copies_chain_each_direction_in_stream_order():
    """Two round trips: the later swap-out waits for the earlier one, the swap-in
    whose first reader comes later waits for the other swap-in; results exact."""
    _, captured = _step()
    schedule = ("x", "MatMul/ReadVariableOp", "MatMul", "concat", "Tanh", "Reshape",
                "Sum_2", "Sum", "Sum_1", "add", "Identity")
    plan = Plan(schedule=schedule, swaps=(
        Swap("Tanh:0", out_after="Tanh", in_after="Reshape", consumers=("Sum_2",),
             bytes=128 * 128 * 4, id="late"),
        Swap("MatMul:0", out_after="concat", in_after="Tanh", consumers=("Reshape",),
             bytes=128 * 64 * 4, id="early")))
    plain = rewrite.rewrite(captured, plan, DEVICE, HOST)
    ordered = rewrite.rewrite(captured, plan, DEVICE, HOST, ordered_copies=True)
    by_id = {s.swap_id: s for s in ordered.swaps}
    nodes = {n.name: n for n in ordered.graph_def.node}
    assert "^" + by_id["early"].swap_out in nodes[by_id["late"].swap_out].input
    assert "^" + by_id["early"].swap_in in nodes[by_id["late"].swap_in].input
    plain_nodes = {n.name: n for n in plain.graph_def.node}
    assert "^" + by_id["early"].swap_in not in plain_nodes[by_id["late"].swap_in].input
    x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    want = runtime.bind(captured, captured.graph_def)(x)["loss"].numpy()
    assert runtime.bind(captured, ordered.graph_def)(x)["loss"].numpy() == want
    with pytest.raises(ValueError, match="ordered_copies"):
        rewrite.rewrite(captured, plan, DEVICE, HOST, ordered_copies="yes")


def test_an_op_tensorflow_folds_at_run_time_keeps_its_place_in_the_chain():
    """A mean loss's gradient seed that Grappler left (a ``Tile`` of constants,
    scaled by a constant) is folded by TensorFlow when it instantiates the step,
    which replaces its data edge to its reader with a constant: the op would run
    whenever its inputs allow and hold its 256 KiB where the plan counts it
    freed (fuzz seed 8263, 4.4% over its budget).  The chain orders it with a
    control edge as well, and the step computes what the unmodified one does."""
    from research import fuzz

    step = fuzz.random_step(8263)
    captured = capture.capture(step.concrete_fn)
    reference = tf.Graph()
    with reference.as_default():
        tf.graph_util.import_graph_def(captured.graph_def, name="")
    foldable = rewrite._foldable(captured.graph_def, reference)
    assert {"gradient_tape/Tile", "gradient_tape/truediv"} <= foldable
    nodes = {n.name: n for n in captured.graph_def.node}
    assert not foldable & {name for name, n in nodes.items()
                           if n.op in ("Const", "Placeholder", "ReadVariableOp")}
    # The seed's plan ran the scaled seed right before its reader.
    folded, reader = "gradient_tape/truediv", "gradient_tape/Mul_1"
    assert folded in rewrite._predecessors(nodes[reader]) and reader not in foldable
    schedule = _order_with(nodes, folded, reader)
    rewritten = rewrite.rewrite(captured, Plan(schedule=schedule), DEVICE, HOST)
    after = {n.name: n for n in rewritten.graph_def.node}
    assert "^" + folded in after[reader].input
    for a, b in zip(schedule, schedule[1:]):   # a data edge alone orders the others
        if a not in foldable and "^" + a not in nodes[b].input \
                and a in (source for source, _ in rewrite._data_inputs(nodes[b])):
            assert "^" + a not in after[b].input, (a, b)
    initial = [v.numpy() for v in step.variables]
    plain = runtime.bind(captured, captured.graph_def)(*step.batch)
    for v, value in zip(step.variables, initial):   # the step updates them
        v.assign(value)
    got = runtime.bind(captured, rewritten.graph_def)(*step.batch)
    for key in plain:
        np.testing.assert_array_equal(got[key].numpy(), plain[key].numpy())


def _order_with(nodes: dict, first: str, then: str) -> tuple[str, ...]:
    """A topological order of ``nodes`` that runs ``then`` right after ``first``."""
    preds = {name: set(rewrite._predecessors(n)) & set(nodes) for name, n in nodes.items()}
    order, done = [], set()
    while len(order) < len(nodes):
        ready = [name for name in nodes if name not in done and preds[name] <= done]
        pick = next(name for name in ready
                    if name not in (first, then) or preds[then] - {first} <= done)
        for name in ((first, then) if pick in (first, then) else (pick,)):
            order.append(name)
            done.add(name)
    return tuple(order)


def test_a_shape_reader_the_schedule_leaves_out_runs_before_the_ops_reading_its_value():
    """A ``Shape`` TF keeps (the shapes are not static here) holds its value while it
    waits to run; the op that would write its output into that value's buffer then
    allocates a new one (a GELU gradient's ``Mul`` in the Keras Transformer: 512 KiB
    over the plan in 1 of 40 runs).  The schedule leaves shape readers out, and the
    rewrite runs each before the scheduled ops that read the same value."""
    @tf.function(input_signature=[tf.TensorSpec([4, 6], tf.float32)])
    def step(x):
        # As many values as x has distinct ones: no static shape, so the Shape stays.
        unique, _ = tf.unique(tf.reshape(tf.round(x), [-1]))
        a = tf.exp(unique)
        b = a * 3.0          # may write into a's buffer once nothing else holds it
        # A Shape that waits for an assertion too (as Keras's loss checks label shapes).
        with tf.control_dependencies([tf.debugging.assert_positive(tf.size(unique))]):
            checked = tf.shape(a)[0]
        return b + tf.cast(tf.shape(a)[0] + checked, tf.float32)

    captured = capture.capture(step.get_concrete_function())
    nodes = {n.name: n for n in captured.graph_def.node}
    shapes = [n for n in nodes.values() if n.op == "Shape"]
    assert shapes, "the test needs a Shape that Grappler did not fold"
    assert any(i.startswith("^") for n in shapes for i in n.input), \
        "the test needs a Shape with a control input"
    # Left out of the schedule as the lowering leaves them: the shape-only ops, and
    # the assertion on shapes (in the Keras step, its ops run on the host).
    schedule = tuple(name for name in rewrite.topological_order(captured.graph_def)
                     if nodes[name].op not in rewrite.SHAPE_OPS
                     and not name.startswith("assert_positive/"))
    rewritten = rewrite.rewrite(captured, Plan(schedule=schedule), DEVICE, HOST)
    after = {n.name: n for n in rewritten.graph_def.node}
    for shape in shapes:
        (value,) = rewrite._data_inputs(shape)
        readers = [name for name in schedule if value in rewrite._data_inputs(after[name])]
        assert readers
        for name in readers:
            assert "^" + shape.name in after[name].input, (shape.name, name)
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    got = runtime.bind(captured, rewritten.graph_def)(x)
    np.testing.assert_array_equal(got.numpy(), step(tf.constant(x)).numpy())
