"""Static shapes of every tensor of a captured graph, variables included.

Imported on its own, a captured graph reads each variable through a
``Placeholder`` of type resource, so nothing downstream of a ``ReadVariableOp``
has a known shape (a convolution's output loses its channel count).  Imported
with each such placeholder mapped to a ``VarHandleOp`` of the variable's shape
and dtype, shape inference sees what the function runtime sees.

Example::

    shapes = static_shapes(captured, captured.graph_def)
    shapes["conv1/Conv2D:0"]        # TensorShape([32, 16, 16, 64])
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import tensorflow as tf

from tfswap.tf.capture import CaptureError, CapturedFunction


def static_shapes(captured: CapturedFunction, graph_def) -> dict[str, tf.TensorShape]:
    """Tensor name -> static shape, for every output of every node of ``graph_def``."""
    present = {node.name for node in graph_def.node}
    graph = tf.Graph()
    with graph.as_default():
        input_map = {}
        with tf.name_scope("tfswap_shapes"):  # keeps these helper nodes off the graph's names
            for k, cap in enumerate(captured.captures):
                if cap.variable is None or cap.name.partition(":")[0] not in present:
                    continue
                input_map[cap.name] = tf.raw_ops.VarHandleOp(
                    dtype=cap.variable.dtype, shape=cap.variable.shape,
                    shared_name=f"tfswap_shapes_{k}")
        tf.graph_util.import_graph_def(graph_def, input_map=input_map, name="")
    return {t.name: t.shape for op in graph.get_operations()
            if not op.name.startswith("tfswap_shapes/") for t in op.outputs}


# import_with_shapes' graphs, most recent last: one optimize call reads the same
# graph in each stage (profile, lowering at each small-tensor threshold, the
# recomputable ops, the host's values), and each import costs two imports of it
# (0.4 s each for a Keras GRU step unrolled over 48 steps).
IMPORTED_GRAPHS_KEPT = 4
_imported: OrderedDict = OrderedDict()
_imported_lock = threading.Lock()


def import_with_shapes(captured: CapturedFunction, graph_def) -> tf.Graph:
    """``graph_def`` imported as is (same node names and inputs), every tensor's
    static shape set from :func:`static_shapes`.  The graph is finalized and
    shared by the calls on the same graph and variables: read it, never add to it."""
    key = (hashlib.sha256(graph_def.SerializeToString(deterministic=True)).digest(),
           tuple((c.name, c.variable.dtype.name, str(c.variable.shape))
                 for c in captured.captures if c.variable is not None))
    with _imported_lock:
        if key in _imported:
            _imported.move_to_end(key)
            return _imported[key]
    shapes = static_shapes(captured, graph_def)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    for op in graph.get_operations():
        for t in op.outputs:
            t.set_shape(shapes[t.name])
    graph.finalize()
    with _imported_lock:
        _imported[key] = graph
        while len(_imported) > IMPORTED_GRAPHS_KEPT:
            _imported.popitem(last=False)
    return graph


def refuse_unsized(captured: CapturedFunction, lowered, source: str) -> None:
    """Refuse tensors whose size only the running step knows (e.g. a boolean_mask's
    output): a profile that does not run the whole step would count them as 0 bytes."""
    unsized = {t.name for t in lowered.graph.tensors if t.nbytes == 0}
    found = [f"{t.name} (shape {t.shape})"
             for op in import_with_shapes(captured, captured.graph_def).get_operations()
             for t in op.outputs
             if t.name in unsized and not t.shape.is_fully_defined()
             and t.dtype not in (tf.resource, tf.variant, tf.string)]
    if found:
        raise CaptureError(
            f"{len(found)} tensor(s) of this step have unknown dimensions, so the {source} "
            f"profile cannot count their bytes: {', '.join(found[:3])}"
            f"{' ...' if len(found) > 3 else ''}. Use profile='trace' (it runs the step once "
            "and measures every tensor; the sizes must not change between steps), or make "
            "the shapes static (e.g. multiply by a mask instead of tf.boolean_mask).")
