"""The graph Grappler makes of a captured step, computed once at capture time.

TensorFlow runs every function through Grappler when it is instantiated.  A
rewritten graph cannot go through it again (its passes drop the schedule's
control edges, bypass or fold scheduled ops, add swaps of their own), so
tfswap runs it with Grappler off (:func:`tfswap.tf.runtime.grappler_config`).
To compute the same thing as the user's function, the graph that is planned,
rewritten and run is therefore the one Grappler would have produced: fused
kernels, folded constants, rewritten arithmetic and all.

Example::

    optimized = optimize(graph_def, fetches=("Identity:0",), keep_ops=("AssignVariableOp",),
                         device="/device:CPU:0")
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
from tensorflow.python.grappler import tf_optimizer


def default_device() -> str:
    """Where an unplaced op of the step runs: the first GPU if any, else CPU:0.

    Grappler's remapper fuses differently per device type, so the graph must
    carry the device it will run on before it is optimised.
    """
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else "/device:CPU:0"


def optimize(graph_def, fetches: Iterable[str], keep_ops: Iterable[str],
             device: str) -> tf.compat.v1.GraphDef:
    """Run Grappler's default passes on ``graph_def`` as function instantiation would.

    ``fetches``: output tensor names; ``keep_ops``: ops that must run though no
    fetch needs them (variable updates).  Placeholders keep their names, so
    feeds and captured variables map onto the result as onto the original.
    Ops with no device get ``device``.
    """
    placed = tf.compat.v1.GraphDef()
    placed.CopyFrom(graph_def)
    for node in placed.node:
        if not node.device:
            node.device = device
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(placed)
    # Grappler preserves what the "train_op" collection names (its fetch set).
    targets = meta.collection_def["train_op"].node_list.value
    targets.extend(list(fetches) + list(keep_ops))
    optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
    _drop_control_edges_from_placeholders(optimized)
    return optimized


def _drop_control_edges_from_placeholders(graph_def) -> None:
    """Constant folding leaves ``^x`` control inputs on folded constants.

    An argument is available before the function starts, so such an edge
    orders nothing; but ``import_graph_def``'s ``input_map`` remaps data inputs
    only, and an edge left on a placeholder would need it fed a second time.
    """
    placeholders = {n.name for n in graph_def.node if n.op == "Placeholder"}
    for node in graph_def.node:
        kept = [i for i in node.input if not (i.startswith("^") and i[1:] in placeholders)]
        if len(kept) != len(node.input):
            del node.input[:]
            node.input.extend(kept)
