"""The reference liveness model with shared buffers, scratch and residents."""

from tfswap.core import liveness
from tfswap.core.graph import DataflowGraph, Op, Tensor

MB = 1 << 20


def chain(alias=True, scratch=0):
    """a -> relu (in place on a's buffer when ``alias``) -> b reads relu; c reads a late."""
    ops = [Op("a", "Conv"), Op("relu", "Relu", ("a:0",)), Op("b", "Conv", ("relu:0",),
                                                                scratch_bytes=scratch),
           Op("c", "Add", ("b:0", "relu:0"))]
    tensors = [Tensor("a:0", MB), Tensor("relu:0", MB, alias_of="a:0" if alias else ""),
               Tensor("b:0", MB), Tensor("c:0", MB)]
    return DataflowGraph.build(ops, tensors)


def test_aliases_share_one_buffer_until_the_last_reader_of_any():
    names = ["a", "relu", "b", "c"]
    plain = liveness.live_bytes(chain(alias=False), names)
    shared = liveness.live_bytes(chain(alias=True), names)
    assert list(plain) == [MB, 2 * MB, 2 * MB, 3 * MB]
    # a's buffer is relu's: counted once, and held until c (relu's last reader)
    assert list(shared) == [MB, MB, 2 * MB, 3 * MB]
    assert liveness.buffers(chain())["a:0"] == [0, 1]


def test_scratch_counts_only_while_its_op_runs():
    names = ["a", "relu", "b", "c"]
    curve = liveness.live_bytes(chain(scratch=5 * MB), names)
    base = liveness.live_bytes(chain(), names)
    assert list(curve - base) == [0, 0, 5 * MB, 0]


def test_residents_live_the_whole_step():
    names = ["a", "relu", "b", "c"]
    curve = liveness.live_bytes(chain(alias=False), names, resident=["c:0"])
    assert all(v >= MB for v in curve)
    assert liveness.peak(chain(alias=False), names, resident=["c:0"]) == 3 * MB


def test_alias_chains_resolve_to_the_owner():
    ops = [Op("a", "X"), Op("r1", "Reshape", ("a:0",)), Op("r2", "Reshape", ("r1:0",))]
    tensors = [Tensor("a:0", MB), Tensor("r1:0", MB, alias_of="a:0"),
               Tensor("r2:0", MB, alias_of="r1:0")]
    g = DataflowGraph.build(ops, tensors)
    assert liveness.buffer_root(g, "r2:0") == "a:0"
    assert liveness.peak(g, ["a", "r1", "r2"]) == MB


def test_in_place_update_copies_only_while_an_earlier_read_is_still_used():
    """w is read (r1), updated in place (upd), read again (r2); f uses r1 late."""
    ops = [Op("r1", "ReadVariableOp"), Op("upd", "AssignSub"), Op("r2", "ReadVariableOp"),
           Op("f", "MatMul", ("r1:0", "r2:0"))]
    tensors = [Tensor("r1:0", MB), Tensor("r2:0", MB, alias_of="r1:0"), Tensor("f:0", MB)]
    g = DataflowGraph.build(ops, tensors)
    # r1's value is still read by f after the update: TF copies the variable first
    assert liveness.variable_copies(g, ["r1", "upd", "r2", "f"], {"upd": "r1:0"}) == [(1, MB)]
    # reads before the update are all done: updated in place, no copy
    ops2 = ops[:1] + [Op("g", "Relu", ("r1:0",))] + ops[1:3]
    g2 = DataflowGraph.build(ops2, tensors[:2] + [Tensor("g:0", MB)])
    assert liveness.variable_copies(g2, ["r1", "g", "upd", "r2"], {"upd": "r1:0"}) == []
