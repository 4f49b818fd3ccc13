"""CapturedFunction -> core.DataflowGraph (names, types, shapes, bytes).

Every GraphDef node that an output or a side effect needs becomes an op and every output a tensor whose bytes are
its static shape times its dtype size (all shapes are known: capture rejects
unknown dimensions).  Handles, strings and variants are marked unswappable.

Example::

    graph = to_dataflow_graph(captured)
    graph.tensor("conv1/Relu:0").nbytes
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.tf.capture import CapturedFunction
from tfswap.tf.shapes import static_shapes

_UNSWAPPABLE = (tf.resource, tf.variant, tf.string)


def tensor_bytes(dtype: tf.DType, shape: tf.TensorShape) -> int:
    """Bytes of a tensor's buffer (0 where the size is not a plain product)."""
    if dtype in _UNSWAPPABLE or not shape.is_fully_defined():
        return 0
    return int(np.prod(shape.as_list(), dtype=np.int64)) * dtype.size


def to_dataflow_graph(captured: CapturedFunction) -> DataflowGraph:
    shapes = static_shapes(captured, captured.graph_def)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(captured.graph_def, name="")
    # Like the function runtime, drop what neither an output nor a side effect needs.
    needed = set()
    stack = [graph.get_tensor_by_name(f).op for f in captured.fetches]
    stack += [graph.get_operation_by_name(n) for n in captured.control_outputs]
    while stack:
        op = stack.pop()
        if op.name in needed:
            continue
        needed.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    ops, tensors = [], []
    for op in graph.get_operations():
        if op.name not in needed:
            continue
        ops.append(Op(
            name=op.name, type=op.type,
            inputs=tuple(t.name for t in op.inputs),
            control_inputs=tuple(c.name for c in op.control_inputs),
            device=op.device))
        for t in op.outputs:
            shape = shapes[t.name]
            tensors.append(Tensor(
                name=t.name, nbytes=tensor_bytes(t.dtype, shape), dtype=t.dtype.name,
                shape=tuple(shape.as_list()) if shape.rank is not None else (),
                swappable=t.dtype not in _UNSWAPPABLE and shape.is_fully_defined()))
    return DataflowGraph.build(ops, tensors)
