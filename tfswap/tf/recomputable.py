"""Which ops of a captured step may run twice: the recomputation half of a hybrid plan.

A recomputed op is a copy of the original (same op, attributes and device)
reading the same tensors (:func:`tfswap.tf.rewrite.rewrite` points it at the
copies the plan has on the device then), so it computes the same value when
its result depends on nothing but those tensors.  That rules out, always:

* stateful ops (TensorFlow's own flag): random ops with a stream of their own
  (``RandomUniform``, dropout's legacy ops), queues, prints, variable writes;
* ops on a resource (a variable read: re-reading after the step assigned the
  variable gives the new value, the reason Keras 3 dropout's seed, read from
  its ``SeedGenerator`` state, is never read again: the stateless random op
  reading the seed tensor may be copied, the read may not);
* functional ops (loops, branches, calls), whose bodies tfswap does not see;
* ops placed off the device, and tfswap's own swap ops.

Beyond those, only the op types of :data:`OFFERED` are offered to the
planner: elementwise activations and arithmetic (Grappler's fused
``_UnaryOpsComposition`` too), normalizations, softmax, pooling, views and
cheap data movement, gathers, and convolutions and matrix products (costly
to run again, but on a GPU whose compute outruns its host link often
cheaper than moving their output: the simulator decides).  Not ``Pad``, nor
a ``BiasAdd`` of a convolution's output, nor the convolution either reads
or feeds (``merged``): TensorFlow's oneDNN pass merges those pairs when it
instantiates the step on a CPU, a second reader would stop the merge, and
the step would compute differently.

Example::

    names = recomputable_ops(captured)       # op names the planner may recompute
    refusal(node, graph)                      # "" or why a node may not be
"""

from __future__ import annotations

import tensorflow as tf

from tfswap.tf.capture import CapturedFunction, same_device

OFFERED = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Gelu", "Sigmoid", "Tanh", "Softplus", "Softsign",
    "LeakyRelu", "Erf", "Exp", "Log", "Neg", "Abs", "Square", "Sqrt", "Rsqrt", "Reciprocal",
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum",
    "SquaredDifference", "Cast", "Select", "SelectV2", "Mean", "Softmax", "LogSoftmax",
    "FusedBatchNormV3", "FusedBatchNorm", "_FusedBatchNormEx", "Transpose", "ConcatV2",
    "Tile", "AddN", "MaxPool", "AvgPool",
    "Conv2D", "_FusedConv2D", "DepthwiseConv2dNative", "MatMul", "_FusedMatMul",
    "BatchMatMulV2", "Einsum", "BiasAdd", "_UnaryOpsComposition", "GatherV2",
    "Identity", "Reshape", "Squeeze", "ExpandDims",
    # erf-based GELU's halves; an LSTM cell's gates (a Split along an inner axis
    # copies; see _split_refusal).  Not Unpack or slices, whose outputs may be views.
    "Erfc", "Expm1", "Log1p", "Pow", "Split"})
CONVOLUTIONS = frozenset({"Conv2D", "_FusedConv2D", "DepthwiseConv2dNative"})
FUNCTIONAL = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
                        "PartitionedCall", "StatefulPartitionedCall"})


def merged(graph_def) -> frozenset:
    """The ops TensorFlow's oneDNN pass merges with a neighbour at run time (a
    convolution and the ``Pad`` it reads, or the ``BiasAdd`` of its output), on
    the devices where it runs (CPUs: :func:`tfswap.tf.grappler.runtime_merges`)."""
    from tfswap.tf import grappler

    pads = {name for pair in grappler.pads_into_convs(graph_def) for name in pair}
    nodes = {n.name: n for n in graph_def.node}
    biases = set()
    for node in graph_def.node:   # a convolution and the BiasAdd of its output
        if node.op == "BiasAdd" and node.input:
            source = nodes.get(node.input[0].partition(":")[0])
            # The pass touches CPU ops only: on a GPU both may run again (on the
            # H200, refusing them there left ResNet-50 with 8 recomputed tensors).
            if source is not None and source.op in CONVOLUTIONS \
                    and grappler.runtime_merges(source.device):
                biases.update((node.name, source.name))
    return frozenset(pads | biases)


def refusal(node, graph: tf.Graph, device: str = "", merged_ops: frozenset = frozenset()) -> str:
    """Why ``node`` (a GraphDef node of ``graph``'s step) may not be recomputed,
    or "" if it may; ``merged_ops``: :func:`merged` of the step."""
    if node.op in ("SwapIn", "SwapOut"):
        return "it is one of tfswap's swap ops"
    if node.op in FUNCTIONAL:
        return f"it is a {node.op} (a body tfswap does not see)"
    try:
        op = graph.get_operation_by_name(node.name)
    except KeyError:
        return "it is not an op of the captured step"
    if op.op_def.is_stateful:
        return f"{node.op} is stateful (it would not compute the same value again)"
    if any(t.dtype == tf.resource for t in op.inputs):
        return f"{node.op} reads a variable (the step may have written it since)"
    if device and node.device and not same_device(node.device, device):
        return f"it runs on {node.device}, not on the device"
    if node.name in merged_ops:
        return f"TensorFlow merges it with a neighbour when it runs the step"
    if node.op not in OFFERED:
        return f"{node.op} is not among the ops offered for recomputation (OFFERED)"
    if node.op == "Split":
        return _split_refusal(op)
    return ""


def _split_refusal(op) -> str:
    """"" where a ``Split`` makes each output afresh.  TensorFlow's CPU and GPU
    kernels hand out views of the input when there is one output or the split
    is along the first axis (outputs then share the input's buffer), so a
    copy of the op would not make the buffers the memory model counts."""
    axis_op = op.inputs[0].op
    rank = op.inputs[1].shape.rank
    if axis_op.type != "Const" or rank is None:
        return "a Split whose axis or rank is not known when the step is planned"
    axis = int(tf.make_ndarray(axis_op.get_attr("value")))
    axis = axis + rank if axis < 0 else axis
    if axis == 0 or op.get_attr("num_split") == 1:
        return "a Split along the first axis or into one part shares its input's buffer"
    return ""


def recomputable_ops(captured: CapturedFunction, graph: tf.Graph | None = None) -> frozenset:
    """The names of the ops of ``captured`` that may be recomputed (:func:`refusal`)."""
    if graph is None:
        from tfswap.tf.shapes import import_with_shapes

        graph = import_with_shapes(captured, captured.graph_def)
    merged_ops = merged(captured.graph_def)
    return frozenset(node.name for node in captured.graph_def.node
                     if not refusal(node, graph, captured.device, merged_ops))


__all__ = ["CONVOLUTIONS", "OFFERED", "merged", "recomputable_ops", "refusal"]
