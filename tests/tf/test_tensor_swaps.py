"""tfswap.tf.tensor_swaps.tensor_swaps: the planner's buffer swaps as swaps of TF tensors.

Framework-free graphs stand for what the trace reports: slices sharing one
buffer (Unpack) and an in-place forward that a reordered schedule breaks.
"""

from tfswap.tf.tensor_swaps import tensor_swaps
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.plan import Plan, Swap


def _graph(ops, tensors):
    return DataflowGraph.build(ops, tensors)


def test_slices_of_one_buffer_each_travel_to_their_own_readers():
    ops = [Op("a", "Transpose"), Op("u", "Unpack", inputs=("a:0",)),
           Op("x", "Relu", inputs=("u:0",)), Op("c0", "MatMul", inputs=("u:0",)),
           Op("c1", "MatMul", inputs=("u:1",))]
    tensors = [Tensor("a:0", 8), Tensor("u:0", 4, alias_of="a:0"), Tensor("u:1", 4, alias_of="a:0"),
               Tensor("x:0", 4), Tensor("c0:0", 4), Tensor("c1:0", 4)]
    ops.append(Op("d", "Relu", inputs=("c0:0",)))
    tensors.append(Tensor("d:0", 4))
    # c0:0 leaves and comes back once the slices' buffer has left.
    plan = Plan(schedule=("a", "u", "x", "c0", "c1", "d"), swaps=(
        Swap("a:0", out_after="x", in_after="x", consumers=("c0", "c1"), bytes=8),
        Swap("c0:0", out_after="c0", in_after="c1", consumers=("d",), in_wait_for=("a:0",))))
    got = tensor_swaps(plan, _graph(ops, tensors))
    parts = [s for s in got.swaps if s.id.startswith("a:0|")]
    assert [(s.tensor, s.consumers, s.bytes) for s in parts] == [("u:0", ("c0",), 4),
                                                                 ("u:1", ("c1",), 4)]
    waiting = next(s for s in got.swaps if s.tensor == "c0:0")
    assert waiting.in_wait_for == ("a:0|u:0", "a:0|u:1")


def test_a_forward_broken_by_the_schedule_carries_the_earlier_value():
    # The trace saw g's buffer forwarded to m (its last reader then); under this
    # schedule r reads g after m, so TF keeps g and the swap must carry g itself.
    ops = [Op("g", "MatMul"), Op("m", "Mul", inputs=("g:0",)), Op("r", "Relu", inputs=("g:0",))]
    tensors = [Tensor("g:0", 8), Tensor("m:0", 8, alias_of="g:0"), Tensor("r:0", 8)]
    plan = Plan(schedule=("g", "m", "r"), swaps=(
        Swap("g:0", out_after="m", in_after="m", consumers=("r",), bytes=8),))
    got = tensor_swaps(plan, _graph(ops, tensors))
    assert [(s.tensor, s.consumers, s.id) for s in got.swaps] == [("g:0", ("r",), "g:0")]


def test_each_reader_gets_the_value_it_reads_through_its_views():
    # g's buffer holds g, a view v of g, and m, which the trace saw forwarded
    # into it.  After the gap q reads m and r reads v: r must get g's copy (the
    # value v views), not m's (an Einsum's gradient swap once listed a MatMul
    # reading another member of its buffer).
    ops = [Op("g", "MatMul"), Op("v", "Reshape", inputs=("g:0",)), Op("m", "Mul", inputs=("g:0",)),
           Op("q", "Relu", inputs=("m:0",)), Op("r", "Sum", inputs=("v:0",))]
    tensors = [Tensor("g:0", 8), Tensor("v:0", 8, alias_of="g:0"),
               Tensor("m:0", 8, alias_of="g:0"), Tensor("q:0", 8), Tensor("r:0", 1)]
    plan = Plan(schedule=("g", "v", "m", "q", "r"), swaps=(
        Swap("g:0", out_after="m", in_after="m", consumers=("q", "r"), bytes=8),))
    got = tensor_swaps(plan, _graph(ops, tensors))
    assert [(s.tensor, s.consumers, s.id, s.bytes) for s in got.swaps] == [
        ("g:0", ("r",), "g:0|g:0", 8), ("m:0", ("q",), "g:0|m:0", 8)]


def test_a_member_written_after_the_gap_needs_no_copy():
    # The swapped-in g is forwarded into m by the first consumer; n reads m.
    ops = [Op("g", "MatMul"), Op("a", "Relu", inputs=("g:0",)), Op("m", "Mul", inputs=("g:0",)),
           Op("n", "Relu", inputs=("m:0",))]
    tensors = [Tensor("g:0", 8), Tensor("a:0", 8), Tensor("m:0", 8, alias_of="g:0"),
               Tensor("n:0", 8)]
    plan = Plan(schedule=("g", "a", "m", "n"), swaps=(
        Swap("g:0", out_after="a", in_after="a", consumers=("m", "n"), bytes=8),))
    got = tensor_swaps(plan, _graph(ops, tensors))
    assert [(s.tensor, s.consumers, s.id) for s in got.swaps] == [("g:0", ("m",), "g:0")]


def test_a_slice_read_only_by_a_later_trip_leaves_with_the_first_one():
    # The trip after x carries u:1 to c1; u:0 is read only after the next trip.
    # Left behind, it would hold the whole Unpack buffer on the device through
    # the gap the plan counts as free (the zoo's LSTM at 40% measured two 64 KiB
    # stacks over its prediction so): it leaves too, and its reader reads the copy.
    ops = [Op("a", "Transpose"), Op("u", "Unpack", inputs=("a:0",)),
           Op("x", "Relu", inputs=("u:0",)), Op("y", "Relu", inputs=("x:0",)),
           Op("c1", "MatMul", inputs=("u:1",)), Op("z", "Relu", inputs=("y:0",)),
           Op("c0", "MatMul", inputs=("u:0",))]
    tensors = [Tensor("a:0", 8), Tensor("u:0", 4, alias_of="a:0"),
               Tensor("u:1", 4, alias_of="a:0"), Tensor("x:0", 4), Tensor("y:0", 4),
               Tensor("c1:0", 4), Tensor("z:0", 4), Tensor("c0:0", 4)]
    plan = Plan(schedule=("a", "u", "x", "y", "c1", "z", "c0"), swaps=(
        Swap("a:0", out_after="x", in_after="y", consumers=("c1",), bytes=8),
        Swap("a:0", out_after="c1", in_after="z", consumers=("c0",), bytes=8, id="a:0#2")))
    got = tensor_swaps(plan, _graph(ops, tensors))
    first = [(s.tensor, s.consumers, s.bytes) for s in got.swaps if s.out_after == "x"]
    assert first == [("u:0", ("c0",), 4), ("u:1", ("c1",), 4)]
