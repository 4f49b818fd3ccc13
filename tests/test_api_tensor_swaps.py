"""tfswap.api._tensor_swaps: the planner's buffer swaps as swaps of TF tensors.

Framework-free graphs stand for what the trace reports: slices sharing one
buffer (Unpack) and an in-place forward that a reordered schedule breaks.
"""

from tfswap.api import _tensor_swaps
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
    got = _tensor_swaps(plan, _graph(ops, tensors))
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
    got = _tensor_swaps(plan, _graph(ops, tensors))
    assert [(s.tensor, s.consumers, s.id) for s in got.swaps] == [("g:0", ("r",), "g:0")]
