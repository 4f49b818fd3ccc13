"""Device variables below the small-tensor threshold are held all step (issue #44)."""

from tfswap.core.compiled import CompiledGraph
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.kinds import classify
from tfswap.tf.lower import pin_parameters


def test_a_small_device_variable_is_held_for_the_whole_step():
    """TensorFlow holds a device variable for the whole step (the measured peak
    adds every one); the small pool counted a small one only from its read to its
    last reader (BERT-style at 40%: 556 KiB of biases, norms and Adam moments,
    predicted 3% under the measured).  Pinned on the device, it stays persistent
    in the small pool: live at every position.  A host-homed one (not pinned) is
    fetched for its readers only, as before."""
    ops = [Op("x", "Placeholder"), Op("b", "ReadVariableOp"), Op("h", "ReadVariableOp"),
           Op("y", "Add", ("x:0", "b:0", "h:0")), Op("z", "Mul", ("y:0",)),
           Op("loss", "Sum", ("z:0",))]
    tensors = [Tensor("x:0", 1 << 20), Tensor("b:0", 256), Tensor("h:0", 512),
               Tensor("y:0", 1 << 20), Tensor("z:0", 1 << 20), Tensor("loss:0", 4)]
    g = classify(DataflowGraph.build(ops, tensors), loss=["loss:0"], inputs=["x:0"],
                 variables=["b:0", "h:0"], small_bytes=4096)
    assert g.tensor("b:0").kind == "small"
    order = list(range(len(ops)))
    before = CompiledGraph.build(g, 4096).small_live_bytes(order)
    pinned = pin_parameters(g, ["b:0"])
    assert pinned.tensor("b:0").kind == "parameter" and not pinned.tensor("b:0").swappable
    assert pinned.tensor("h:0").kind == "small"
    after = CompiledGraph.build(pinned, 4096).small_live_bytes(order)
    # b: 256 B at every position (before: from its read, position 1, to y, 3).
    assert [int(v) for v in before] == [0, 256, 768, 768, 0, 4]
    assert [int(v) for v in after] == [256, 256, 768, 768, 256, 260]
