"""The graph Grappler makes of a captured step, computed once at capture time.

TensorFlow runs every function through Grappler when it is instantiated.  A
rewritten graph cannot go through it again (its passes drop the schedule's
control edges, bypass or fold scheduled ops, add swaps of their own), so
tfswap runs it with Grappler off (:func:`tfswap.tf.runtime.grappler_config`).
To compute the same thing as the user's function, the graph that is planned,
rewritten and run is therefore the one Grappler would have produced: fused
kernels, folded constants, rewritten arithmetic and all -- except the memory
optimiser's work, which is tfswap's (:func:`rewriter_config` says why).  So a
large gradient sum is an AddN in input order where the user's function
accumulates in arrival order: the same values, summed in a fixed order.

Functional control flow (While, If, Case and their stateless forms) stays
one op: Grappler's function optimiser would lower it into v1 control flow
(Enter/Exit/Switch/Merge/NextIteration), a cyclic graph that the planner,
whose schedules are orders of a DAG, cannot take.  So for a graph holding
such an op the function optimiser is off; every other pass runs as usual.
The function runtime lowers the loop itself when it runs the step.

One rewrite runs after Grappler whatever the config says: on CPU builds
with oneDNN (TF 2.21's Linux x86 wheel, unless ``TF_ENABLE_ONEDNN_OPTS=0``)
the function runtime's ``MklLayoutRewritePass`` turns the graph's ops into
oneDNN kernels when it instantiates the step, and merges some pairs of ops
into one kernel.  Only pairs whose two ops have the same control inputs
merge, so the control edges of a schedule can stop a merge the unmodified
step makes, and then the step computes differently, or join two ops through
another path, and then the merged graph has a cycle:
:func:`filter_and_bias_grads` and :func:`pads_into_convs` find the pairs
that matter (see there), :func:`runtime_merges` says whether the pass runs
for a device.

Example::

    optimized = optimize(graph_def, fetches=("Identity:0",), keep_ops=("AssignVariableOp",),
                         device="/device:CPU:0")
    filter_and_bias_grads(optimized)   # ((filter gradient, bias gradient), ...) that merge
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Iterable

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, tensor_shape_pb2, types_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
from tensorflow.python.grappler import tf_optimizer
from tensorflow.python.util import _pywrap_util_port


def default_device() -> str:
    """Where an unplaced op of the step runs: the first GPU if any, else CPU:0.

    Grappler's remapper fuses differently per device type, so the graph must
    carry the device it will run on before it is optimised.
    """
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else "/device:CPU:0"


# Ops whose bodies are functions run by the op itself: lowering turns them
# into v1 control flow (loops become cycles).
FUNCTIONAL_CONTROL_FLOW = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                                     "StatelessCase", "_While", "_If"})


def has_functional_control_flow(graph_def) -> bool:
    """True if the graph, or a function its library defines, holds a While / If / Case.

    The library counts too: Grappler's function optimiser inlines function
    calls and would then lower the control flow inside them.

    Example::

        has_functional_control_flow(captured.graph_def)   # True for a tf.while_loop step
    """
    nodes = list(graph_def.node)
    for fn in graph_def.library.function:
        nodes.extend(fn.node_def)
    return any(n.op in FUNCTIONAL_CONTROL_FLOW for n in nodes)


def rewriter_config(graph_def) -> config_pb2.ConfigProto:
    """Grappler's default passes, less the memory optimiser, and less the
    function optimiser where it would lower functional control flow (see the
    module doc).

    The memory optimiser is tfswap's job here, and its default pass breaks
    determinism under a planned schedule: it turns a large AddN into a
    TemporaryVariable that AssignAdds accumulate in whatever order the inputs
    arrive, so a reordered schedule sums the same gradients in another order
    (measured: ResNet-50 b16 128x128, whose conv biases before batch norm have
    a true gradient of zero, moved by 1e-3 after one Adam step).  A plain AddN
    sums in input order whatever the schedule.
    """
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.memory_optimization = \
        rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    if has_functional_control_flow(graph_def):
        config.graph_options.rewrite_options.function_optimization = \
            rewriter_config_pb2.RewriterConfig.OFF
    return config


def optimize(graph_def, fetches: Iterable[str], keep_ops: Iterable[str],
             device: str) -> tf.compat.v1.GraphDef:
    """Run Grappler's default passes on ``graph_def`` as function instantiation would.

    ``fetches``: output tensor names; ``keep_ops``: ops that must run though no
    fetch needs them (variable updates).  Placeholders keep their names, so
    feeds and captured variables map onto the result as onto the original.
    Ops with no device get ``device``.  Functional control flow is kept as
    one op (:func:`rewriter_config`).
    """
    placed = tf.compat.v1.GraphDef()
    placed.CopyFrom(graph_def)
    for node in placed.node:
        if not node.device:
            node.device = device
    stood_in = _stand_in_for_arguments(placed)
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(placed)
    # Grappler preserves what the "train_op" collection names (its fetch set).
    targets = meta.collection_def["train_op"].node_list.value
    targets.extend(list(fetches) + list(keep_ops))
    optimized = tf_optimizer.OptimizeGraph(rewriter_config(placed), meta)
    _restore_arguments(optimized, stood_in)
    _drop_control_edges_from_placeholders(optimized)
    _rename_changed_functions(optimized, graph_def.library)
    return optimized


STAND_IN_SUFFIX = "/tfswap_argument_handle"


def _stand_in_for_arguments(graph_def) -> dict:
    """Replace the argument and variable placeholders by ops Grappler infers
    shapes through; returns what :func:`_restore_arguments` needs.

    Grappler's item builder treats every Placeholder as a feed, and its shape
    inference does not trust a feed's shape.  In the function runtime the same
    tensors are ``_Arg`` nodes with known shapes (and, for a variable, the
    shape of the value behind the handle), so shape-dependent rewrites fire
    there that would not fire here: the arithmetic optimiser grouped a
    LayerNorm's additions into an AddN and removed gradient reshapes in a
    BERT-style step's function only, whose weights then differed in the last
    bits after three Adam steps.  So for Grappler an argument is a
    ``ReadVariableOp`` of a ``VarHandleOp`` of its dtype and shape, and a
    variable's handle a ``VarHandleOp`` of the variable's: stateful ops that
    no pass folds, whose shapes inference knows.
    """
    saved = {}
    for node in list(graph_def.node):
        if node.op != "Placeholder":
            continue
        dtype = node.attr["dtype"].type
        if dtype == tf.resource.as_datatype_enum:
            if "_handle_shapes" not in node.attr or len(node.attr["_handle_dtypes"].list.type) != 1:
                continue   # a resource that is not one variable: left a feed
            saved[node.name] = _attrs(node)
            _var_handle(node, node.attr["_handle_dtypes"].list.type[0],
                        node.attr["_handle_shapes"].list.shape[0])
        elif dtype != tf.variant.as_datatype_enum:
            saved[node.name] = _attrs(node)
            shape = saved[node.name]["shape"].shape
            handle = graph_def.node.add(name=node.name + STAND_IN_SUFFIX, device=node.device)
            _var_handle(handle, dtype, shape)
            node.op = "ReadVariableOp"
            node.ClearField("attr")
            node.attr["dtype"].type = dtype
            node.attr["_output_shapes"].list.shape.add().CopyFrom(shape)
            node.input.append(handle.name)
    return saved


def _attrs(node) -> dict:
    copies = {}
    for key, value in node.attr.items():
        copies[key] = attr_value_pb2.AttrValue()
        copies[key].CopyFrom(value)
    return copies


def _var_handle(node, dtype, shape) -> None:
    shape = tensor_shape_pb2.TensorShapeProto.FromString(shape.SerializeToString())
    node.op = "VarHandleOp"
    node.ClearField("attr")
    node.attr["dtype"].type = dtype
    node.attr["shape"].shape.CopyFrom(shape)
    node.attr["shared_name"].s = node.name.encode()
    node.attr["container"].s = b""


def _restore_arguments(graph_def, saved: dict) -> None:
    """Put back the placeholders :func:`_stand_in_for_arguments` replaced."""
    handles = {name + STAND_IN_SUFFIX for name in saved}
    kept = []
    for node in graph_def.node:
        if node.name in handles:
            continue
        if node.name in saved:
            node.op = "Placeholder"
            node.ClearField("attr")
            for key, value in saved[node.name].items():
                node.attr[key].CopyFrom(value)
            del node.input[:]
        elif any(i.lstrip("^").partition(":")[0] in handles for i in node.input):
            raise RuntimeError(f"Grappler made {node.name!r} read the stand-in of an argument "
                               "directly; tfswap cannot restore the argument")  # pragma: no cover
        kept.append(node)
    del graph_def.node[:]
    graph_def.node.extend(kept)


def _rename_changed_functions(graph_def, original_library) -> None:
    """Give every library function Grappler rewrote or created a name of its own.

    Grappler optimises the bodies of library functions (a While's body and
    condition) and keeps their names.  The user's function registers the
    original definitions under those names in the eager context, and a
    second, different definition under the same name is refused when the
    captured graph is imported there.  The new name carries a digest of the
    whole optimised library, so the same capture always gets the same names.
    """
    before = {f.signature.name: f.SerializeToString(deterministic=True)
              for f in original_library.function}
    changed = [f.signature.name for f in graph_def.library.function
               if before.get(f.signature.name) != f.SerializeToString(deterministic=True)]
    if not changed:
        return
    digest = hashlib.sha1(graph_def.library.SerializeToString(deterministic=True)).hexdigest()
    renamed = {name: f"{name}_tfswap_{digest[:12]}" for name in changed}

    def fix_attr(value) -> None:
        if value.HasField("func"):
            fix_func(value.func)
        elif value.HasField("list"):
            for fn in value.list.func:
                fix_func(fn)

    def fix_func(fn) -> None:
        fn.name = renamed.get(fn.name, fn.name)
        for value in fn.attr.values():
            fix_attr(value)

    def fix_nodes(nodes) -> None:
        for node in nodes:
            node.op = renamed.get(node.op, node.op)     # a direct call names its function
            for value in node.attr.values():
                fix_attr(value)

    fix_nodes(graph_def.node)
    for fn in graph_def.library.function:
        fn.signature.name = renamed.get(fn.signature.name, fn.signature.name)
        fix_nodes(fn.node_def)
    for grad in graph_def.library.gradient:
        grad.function_name = renamed.get(grad.function_name, grad.function_name)
        grad.gradient_func = renamed.get(grad.gradient_func, grad.gradient_func)


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


# -- TensorFlow's oneDNN graph pass (tensorflow/core/common_runtime/mkl_layout_pass.cc).

FILTER_GRAD = "Conv2DBackpropFilter"
BIAS_GRAD = "BiasAddGrad"
# Where each reads the gradient of the convolution's output (``out_backprop``):
# Conv2DBackpropFilter(input, filter_sizes, out_backprop), BiasAddGrad(out_backprop).
FILTER_GRAD_OUT_BACKPROP = 2
BIAS_GRAD_OUT_BACKPROP = 0
# The element types the pass merges the pair for (GetConv2DBackpropFilterOrBiasAddGrad).
_MERGED_TYPES = frozenset({types_pb2.DT_FLOAT, types_pb2.DT_BFLOAT16})
# Conv2D's default data format, where a node leaves the attribute out.
_DEFAULT_DATA_FORMAT = b"NHWC"


def runtime_merges(device: str) -> bool:
    """Whether TensorFlow's oneDNN graph pass rewrites, and merges, the ops this
    process places on ``device``.

    The pass runs when TensorFlow was built with oneDNN and
    ``TF_ENABLE_ONEDNN_OPTS`` does not turn it off, and it touches CPU ops
    only: on a GPU the step's ops run as they are.  An unplaced op counts as
    placed on :func:`default_device`.

    Example::

        runtime_merges("/device:CPU:0")   # True on the Linux x86 wheel
        runtime_merges("/device:GPU:0")   # False
    """
    spec = tf.DeviceSpec.from_string(device or default_device())
    return bool(_pywrap_util_port.IsMklEnabled()) and spec.device_type == "CPU"


def _data_inputs(node) -> list[str]:
    return [i for i in node.input if not i.startswith("^")]


def _data_readers(graph_def) -> dict[str, list[tuple[object, int]]]:
    """Node name -> (node, input slot) of every data input reading one of its outputs."""
    readers: dict[str, list[tuple[object, int]]] = {}
    for node in graph_def.node:
        for slot, ref in enumerate(_data_inputs(node)):
            readers.setdefault(ref.partition(":")[0], []).append((node, slot))
    return readers


# The last few graphs' pairs, by the graph's serialised bytes (a GraphDef is
# mutable): a replicated step's every replica is lowered from one captured graph,
# and each lowering asks (0.3 s a time for the BERT-style step's readers).
_PAIRS: dict[tuple, tuple] = {}
_PAIRS_LOCK = threading.Lock()


def _per_graph(find):
    """``find(graph_def)`` remembered for the last few graphs (and whether the
    pass runs: :func:`runtime_merges`' inputs)."""
    @functools.wraps(find)
    def remembered(graph_def):
        key = (find.__name__, bool(_pywrap_util_port.IsMklEnabled()), default_device(),
               graph_def.SerializeToString(deterministic=True))
        with _PAIRS_LOCK:
            got = _PAIRS.get(key)
        if got is None:
            got = find(graph_def)
            with _PAIRS_LOCK:
                if len(_PAIRS) >= 8:
                    _PAIRS.pop(next(iter(_PAIRS)))
                _PAIRS[key] = got
        return got
    return remembered


def _control_inputs(node) -> frozenset[str]:
    return frozenset(i[1:] for i in node.input if i.startswith("^"))


def _merges(filter_grad, bias_grad) -> bool:
    """The pass's conditions on a found pair, other than the control inputs."""
    t = filter_grad.attr["T"].type
    return (t in _MERGED_TYPES and bias_grad.attr["T"].type == t
            and filter_grad.attr["padding"].s != b"EXPLICIT"   # not supported by the merged kernel
            and (filter_grad.attr["data_format"].s or _DEFAULT_DATA_FORMAT)
            == (bias_grad.attr["data_format"].s or _DEFAULT_DATA_FORMAT)
            and filter_grad.device == bias_grad.device and runtime_merges(filter_grad.device))


@_per_graph
def filter_and_bias_grads(graph_def) -> tuple[tuple[str, str], ...]:
    """The (Conv2DBackpropFilter, BiasAddGrad) pairs of ``graph_def`` that
    TensorFlow's oneDNN pass merges into one kernel when it runs the graph.

    The gradients of a convolution's filter and of the bias added to its
    output both reduce the output's gradient ``G``; where the pass runs
    (:func:`runtime_merges`) it computes them as one kernel,
    ``_MklNativeConv2DBackpropFilterWithBias``, named as the filter gradient,
    whose bias gradient sums ``G`` in another order than ``BiasAddGrad`` alone.
    The pass merges a ``BiasAddGrad`` with the ``Conv2DBackpropFilter`` that
    reads the same node's output as ``out_backprop`` if both are float or
    bfloat16, the filter gradient's padding is not EXPLICIT, data formats and
    devices agree, and -- the condition a schedule's control edges can break --
    **their control inputs are the same set** (``CheckForNodeMerge``).  A bias
    before a batch norm has a true gradient of zero, so all it gets is rounding
    noise, which an optimizer such as RMSprop scales up to a full step: one
    merge lost moved such a bias by 1.2e-4 of its norm in two epochs (issue #22).

    Where a node's output feeds several filter or bias gradients, which one
    the pass picks depends on its edge order, so such pairs are left out.

    Example::

        for filter_grad, bias_grad in filter_and_bias_grads(captured.graph_def):
            ...
    """
    readers = _data_readers(graph_def)
    pairs = []
    for node in graph_def.node:
        data = _data_inputs(node)
        if node.op != FILTER_GRAD or len(data) <= FILTER_GRAD_OUT_BACKPROP:
            continue
        # The pass matches by the node that produces G, not by the output slot.
        source = readers.get(data[FILTER_GRAD_OUT_BACKPROP].partition(":")[0], [])
        filters = [n for n, slot in source if n.op == FILTER_GRAD
                   and slot == FILTER_GRAD_OUT_BACKPROP]
        biases = [n for n, slot in source if n.op == BIAS_GRAD and slot == BIAS_GRAD_OUT_BACKPROP]
        if len(filters) != 1 or len(biases) != 1 or not _merges(node, biases[0]) \
                or _control_inputs(node) != _control_inputs(biases[0]):
            continue
        pairs.append((node.name, biases[0].name))
    return tuple(pairs)


PAD = "Pad"
# The convolutions the pass merges a Pad into (GetPadOrConv2D, GetPadOrFusedConv2D),
# and the formats the merged kernel takes for the fused one.
PADDED_CONVS = frozenset({"Conv2D", "_FusedConv2D"})
_FUSED_DATA_FORMATS = frozenset({b"NHWC", b"NCHW"})
_FUSED_FILTER_FORMATS = frozenset({b"HWIO", b"OIHW"})
_DEFAULT_FILTER_FORMAT = b"HWIO"


def _pad_merges(pad, conv) -> bool:
    """The pass's conditions on a Pad feeding a convolution, other than the
    control inputs (MergePadWithConv2D and the two lookups)."""
    if conv.attr["padding"].s != b"VALID":      # the merged kernel pads, then convolves VALID
        return False
    if conv.op == "Conv2D":
        shapes_ok = pad.attr["T"].type in _MERGED_TYPES
    else:
        shapes_ok = ((conv.attr["data_format"].s or _DEFAULT_DATA_FORMAT) in _FUSED_DATA_FORMATS
                     and (conv.attr["filter_format"].s or _DEFAULT_FILTER_FORMAT)
                     in _FUSED_FILTER_FORMATS
                     and conv.attr["num_host_args"].i == 0)
    return (shapes_ok and pad.attr["T"].type == conv.attr["T"].type
            and pad.device == conv.device and runtime_merges(conv.device))


@_per_graph
def pads_into_convs(graph_def) -> tuple[tuple[str, str], ...]:
    """The (Pad, convolution) pairs of ``graph_def`` that TensorFlow's oneDNN
    pass merges into one kernel (``_MklNativePadWithConv2D``,
    ``_MklNativePadWithFusedConv2D``, named as the convolution).

    A ``Pad`` whose output only a VALID ``Conv2D`` or ``_FusedConv2D`` reads,
    as its input, on the same device and with the same element type; and, as
    for :func:`filter_and_bias_grads`, **the same control inputs**.  The
    padded tensor is never made.  In a training step the filter gradient
    reads the padded tensor too, so these merge in inference steps
    (``predict``, ``evaluate``): Keras's ZeroPadding2D before a VALID
    convolution, as in ResNet-50's first layer.  The merged node keeps the
    Pad's outgoing control edges, so a schedule chain edge from the Pad to an
    op that the convolution waits for makes a cycle (the step fails to run:
    "nodes in a cycle"), which :mod:`tfswap.tf.rewrite` avoids.

    Example::

        for pad, conv in pads_into_convs(captured.graph_def):
            ...
    """
    readers = _data_readers(graph_def)
    pairs = []
    for node in graph_def.node:
        if node.op != PAD:
            continue
        read = readers.get(node.name, [])
        if len(read) != 1 or read[0][1] != 0 or read[0][0].op not in PADDED_CONVS:
            continue
        conv = read[0][0]
        if _pad_merges(node, conv) and _control_inputs(node) == _control_inputs(conv):
            pairs.append((node.name, conv.name))
    return tuple(pairs)
