"""Static shapes of a captured graph (tfswap.tf.shapes): the imported graph knows
every tensor's shape, variables' reads included, and one import serves the stages
that read the same graph."""

import pytest
import tensorflow as tf

from tfswap import zoo
from tfswap.tf import capture, shapes


@pytest.fixture(scope="module")
def step():
    built = zoo.cnn(batch=4, image=8, blocks=1)
    return built, capture.capture(built.concrete_fn)


def test_every_tensor_has_its_static_shape(step):
    _, captured = step
    graph = shapes.import_with_shapes(captured, captured.graph_def)
    convs = [op for op in graph.get_operations() if op.type == "Conv2D"]
    assert convs and all(op.outputs[0].shape.is_fully_defined() for op in convs)
    assert {op.name for op in graph.get_operations()} == {n.name for n in
                                                          captured.graph_def.node}


def test_one_import_serves_every_reader_of_the_same_graph(step):
    _, captured = step
    first = shapes.import_with_shapes(captured, captured.graph_def)
    again = shapes.import_with_shapes(captured, tf.compat.v1.GraphDef.FromString(
        captured.graph_def.SerializeToString()))    # equal, not the same object
    assert again is first
    with pytest.raises(RuntimeError, match="finalized"):   # shared: nobody may add to it
        with first.as_default():
            tf.constant(1.0)
    other = tf.compat.v1.GraphDef()
    other.CopyFrom(captured.graph_def)
    del other.node[-1]
    assert shapes.import_with_shapes(captured, other) is not first
