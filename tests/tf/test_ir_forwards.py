"""tfswap.tf.ir keeps the in-place forwards a trace saw: the op that wrote into
an input's buffer runs after every other reader of that buffer, in every
schedule the planner can try (fuzz seed 1058: a Square the trace saw forward
its input, scheduled before that input's other reader, allocated 256 KiB the
memory model did not count)."""

import numpy as np
import tensorflow as tf

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
