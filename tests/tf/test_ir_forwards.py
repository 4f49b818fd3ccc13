"""tfswap.tf.ir keeps the in-place forwards a trace saw: the op that wrote into
an input's buffer runs after every other reader of that buffer, in every
schedule the planner can try (fuzz seed 1058: a Square the trace saw forward
its input, scheduled before that input's other reader, allocated 256 KiB the
memory model did not count)."""

import numpy as np
import tensorflow as tf

from tfswap.core import liveness
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.profile import OpProfile, Profile
from tfswap.tf import capture, ir


def _captured():
    w = tf.Variable(np.ones((32, 32), np.float32))

    @tf.function
    def step(x):
        y = tf.matmul(x, w)
        return {"loss": tf.reduce_sum(y) + tf.reduce_sum(tf.square(y))}

    return w, capture.capture(step.get_concrete_function(tf.TensorSpec((64, 32), tf.float32)))


def _trace(captured, order, aliases):
    names = [n.name for n in captured.graph_def.node]
    ops = [OpProfile(name=n, type=next(m.op for m in captured.graph_def.node if m.name == n),
                     time_s=1e-6, aliases=aliases.get(n, ()), source="trace") for n in names]
    before = [n for n in names[:names.index("MatMul")] if n not in order]
    after = [n for n in names[names.index("MatMul"):] if n not in order]
    return Profile(source="trace", device="/device:CPU:0", ops=ops,
                   executed_order=tuple(before + list(order) + after))


def test_the_other_reader_of_a_traced_forward_runs_first_in_every_schedule():
    w, captured = _captured()
    square = next(n.name for n in captured.graph_def.node if n.op == "Square")
    readers = [n.name for n in captured.graph_def.node if "MatMul" in n.input and n.name != square]
    assert len(readers) == 1
    prof = _trace(captured, ("MatMul", readers[0], square), {square: ((0, 0),)})
    low = ir.lower(captured, prof)
    assert low.graph.tensor(f"{square}:0").alias_of == "MatMul:0"
    assert readers[0] in low.graph.op(square).control_inputs
    # Asked to run the forward first, the schedule still runs the reader before it.
    schedule = low.schedule(["MatMul", square, readers[0]])
    assert schedule.index(readers[0]) < schedule.index(square)


def test_without_a_traced_forward_no_order_is_added():
    w, captured = _captured()
    square = next(n.name for n in captured.graph_def.node if n.op == "Square")
    low = ir.lower(captured, _trace(captured, ("MatMul", square), {}))
    assert low.graph.op(square).control_inputs == ()


def test_views_and_slices_share_a_buffer_without_ordering_its_readers():
    # r reads g; v (a view) and the halves of s (slices) share g's buffer and
    # write nothing; only m, which the trace saw write into it, waits for r.
    ops = [Op("g", "MatMul"), Op("r", "Relu", inputs=("g:0",)), Op("v", "Reshape", inputs=("g:0",)),
           Op("s", "Split", inputs=("g:0",)), Op("m", "Mul", inputs=("g:0",))]
    tensors = [Tensor("g:0", 64), Tensor("r:0", 64), Tensor("v:0", 64, alias_of="g:0"),
               Tensor("s:0", 32, alias_of="g:0"), Tensor("s:1", 32, alias_of="g:0"),
               Tensor("m:0", 64, alias_of="g:0")]
    got = {op.name: op.control_inputs
           for op in ir._keep_traced_forwards(ops, tensors, ("g", "r", "v", "s", "m"))}
    assert got == {"g": (), "r": (), "v": (), "s": (), "m": ("r", "v", "s")}


def test_a_reader_of_a_variables_value_stays_before_its_in_place_update():
    # r read the value before the update u in the trace; a schedule moving r after
    # u would make TF copy the variable first (fuzz seed 1029 measured that copy).
    ops = [Op("read", "ReadVariableOp"), Op("r", "MatMul", inputs=("read:0",)),
           Op("g", "Relu"), Op("u", "AssignSubVariableOp", inputs=("g:0",)),
           Op("later", "ReadVariableOp"), Op("s", "MatMul", inputs=("later:0",))]
    tensors = [Tensor("read:0", 64), Tensor("r:0", 64), Tensor("g:0", 64),
               Tensor("later:0", 64, alias_of="read:0"), Tensor("s:0", 64)]
    got = {op.name: op.control_inputs for op in ir._keep_traced_forwards(
        ops, tensors, ("read", "g", "r", "u", "later", "s"), updates={"u": "read:0"})}
    assert got["u"] == ("r",) and got["s"] == ()


def test_a_trace_order_that_disagrees_with_the_graph_adds_no_cycle():
    # The trace sorts by start microsecond, then by name: r, which reads m's
    # output, can start in m's microsecond and sort first.  Ordering r before
    # m (r also reads m's input buffer) would close a cycle m -> r -> m.
    ops = [Op("g", "MatMul"), Op("m", "Mul", inputs=("g:0",)),
           Op("r", "AddV2", inputs=("g:0", "m:0")), Op("x", "Relu", inputs=("g:0",))]
    tensors = [Tensor("g:0", 64), Tensor("m:0", 64, alias_of="g:0"), Tensor("r:0", 64),
               Tensor("x:0", 64)]
    kept = ir._keep_traced_forwards(ops, tensors, ("g", "x", "r", "m"))
    got = {op.name: op.control_inputs for op in kept}
    assert got == {"g": (), "m": ("x",), "r": (), "x": ()}
    DataflowGraph.build(kept, tensors).topological_order()   # raises on a cycle


def test_a_reader_of_a_variables_value_runs_before_its_update_even_where_the_trace_ran_it_after():
    # TF itself ran the update u before r, which still read the old value: TF copied
    # the variable, and held old and new until r ended (fuzz seeds 5326, 5123 of
    # 2026-11-27).  A planned step orders r before u; s reads the new value: no edge.
    ops = [Op("read", "ReadVariableOp"), Op("g", "Relu"),
           Op("u", "AssignSubVariableOp", inputs=("g:0",)),
           Op("r", "MatMul", inputs=("read:0",)),
           Op("later", "ReadVariableOp", control_inputs=("u",)),
           Op("s", "MatMul", inputs=("later:0",))]
    tensors = [Tensor("read:0", 64), Tensor("r:0", 64), Tensor("g:0", 64),
               Tensor("later:0", 64, alias_of="read:0"), Tensor("s:0", 64)]
    kept, added = ir._updates_after_old_readers(ops, tensors, {"u": "read:0"})
    got = {op.name: op.control_inputs for op in kept}
    assert got["u"] == ("r",) and got["s"] == () and got["later"] == ("u",)
    assert added == {"u": ("r",)}
    DataflowGraph.build(kept, tensors).topological_order()   # raises on a cycle


def test_a_reader_that_needs_the_update_is_not_ordered_before_it():
    # r reads the old value but also the update's result (through x): an edge r -> u
    # would close a cycle; none is added.
    ops = [Op("read", "ReadVariableOp"), Op("g", "Relu"),
           Op("u", "AssignSubVariableOp", inputs=("g:0",)),
           Op("x", "Identity", control_inputs=("u",)),
           Op("r", "AddV2", inputs=("read:0",), control_inputs=("x",))]
    tensors = [Tensor("read:0", 64), Tensor("g:0", 64), Tensor("x:0", 64), Tensor("r:0", 64)]
    kept, added = ir._updates_after_old_readers(ops, tensors, {"u": "read:0"})
    assert {op.name: op.control_inputs for op in kept}["u"] == () and added == {}
    DataflowGraph.build(kept, tensors).topological_order()


def _sgd_step():
    w = tf.Variable(np.ones((64, 64), np.float32))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.matmul(x, w)
            loss = tf.reduce_sum(tf.matmul(h, w))
        dw = tape.gradient(loss, w)
        w.assign_sub(0.1 * dw)
        return {"loss": loss}

    return w, capture.capture(step.get_concrete_function(tf.TensorSpec((128, 64), tf.float32)))


def test_the_plan_orders_updates_after_old_readers_and_the_unmodified_order_counts_the_copy():
    # The unmodified step may run the update before a reader of the old weight
    # (TF's order), copying the variable; planned schedules cannot.
    w, captured = _sgd_step()
    nodes = {n.name: n for n in captured.graph_def.node}
    update = next(n for n in nodes if nodes[n].op == "AssignSubVariableOp")
    low = ir.lower(captured, Profile(source="analytic", device="/device:CPU:0", ops=[
        OpProfile(name=n, type=nodes[n].op, time_s=1e-6, source="analytic") for n in nodes]))
    readers = low.before_updates[update]
    assert readers and all(r in low.graph.op(update).control_inputs for r in readers)
    planned = low.schedule()
    assert all(planned.index(r) < planned.index(update) for r in readers)
    # TF's order with the update first: the copy (the variable's bytes) is counted.
    first = [op for op in planned if op not in readers]
    first = first[:first.index(update) + 1] + list(readers) + first[first.index(update) + 1:]
    tf_order = low.tf_schedule(first)
    assert tf_order.index(update) < min(tf_order.index(r) for r in readers)
    copies = liveness.variable_copies(low.graph, tf_order, low.updates)
    assert copies == [(tf_order.index(update), 64 * 64 * 4)]
    assert liveness.variable_copies(low.graph, planned, low.updates) == []
    assert low.predicted_peak(tf_order) >= low.predicted_peak(planned)
