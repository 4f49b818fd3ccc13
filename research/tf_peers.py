"""What a TensorFlow user does instead of tfswap when a step does not fit (issue #23).

Benchmark helpers, not part of the package:

* :func:`checkpointed` -- gradient checkpointing: the same Keras model's step
  with ``tf.recompute_grad`` around each block, so only the blocks' inputs are
  kept for the backward pass and each block's inside is computed again there.
  Blocks are found from the functional graph (:func:`blocks`): a cut is a
  point where exactly one tensor is live (ResNet-50: each residual block's
  output; BERT: each post-LN sub-layer; a stacked LSTM: each layer).
* :func:`swapping_config` -- Grappler's memory optimizer with its swapping
  heuristics, the only swapping TensorFlow 2.21 has; :func:`grappler_swaps`
  counts the swap pairs it inserts into a captured step for a device of a
  given memory size.

Example::

    step = zoo.lstm(batch=64, layers=4)
    fn = checkpointed(step)            # a ConcreteFunction like step.concrete_fn
    fn(*step.batch)["loss"]
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """Consecutive nodes of a functional Keras model with one tensor in and one out."""

    nodes: tuple            # keras Nodes in execution order
    source: object          # the KerasTensor the block reads (None: the model's inputs)
    result: object          # the KerasTensor it returns (None: the model's outputs)


def _functional(model):
    functional = getattr(model, "_functional", model)   # a Sequential wraps one
    if not hasattr(functional, "_nodes_by_depth"):
        raise TypeError(f"{model.name} is not a functional Keras model; checkpointing here "
                        "splits functional graphs only")
    return functional


def _order(functional) -> list:
    depths = sorted(functional._nodes_by_depth, reverse=True)
    return [n for d in depths for n in functional._nodes_by_depth[d]
            if n.operation is not None and not n.is_input]


def blocks(model) -> list[Block]:
    """The model cut wherever one tensor alone is live: a stacked LSTM's layers,
    a ResNet's residual blocks (and each op of its stem), a post-LN encoder's
    sub-layers."""
    functional = _functional(model)
    order = _order(functional)
    last_use = {}
    for i, node in enumerate(order):
        for t in node.input_tensors:
            last_use[id(t)] = i
    for t in functional.outputs:
        last_use[id(t)] = len(order)
    live: dict[int, object] = {id(t): t for t in functional.inputs}
    found, start, source = [], 0, None
    for i, node in enumerate(order):
        for t in node.outputs:
            live[id(t)] = t
        live = {k: t for k, t in live.items() if last_use.get(k, -1) > i}
        if len(live) == 1 and i < len(order) - 1:
            (result,) = live.values()
            found.append(Block(tuple(order[start:i + 1]), source, result))
            start, source = i + 1, result
    found.append(Block(tuple(order[start:]), source, None))
    # A one-node piece after a larger block is that block's tail (a residual
    # block's last ReLU): joined, the block keeps one tensor for backward, not two.
    joined = [found[0]]
    for block in found[1:]:
        if len(block.nodes) == 1 and len(joined[-1].nodes) > 1:
            joined[-1] = Block(joined[-1].nodes + block.nodes, joined[-1].source, block.result)
        else:
            joined.append(block)
    return joined


def _run(block: Block, functional, inputs, training: bool):
    from keras.src import tree
    from keras.src.models.functional import operation_fn

    if block.source is None:
        values = {id(x): v for x, v in zip(functional.inputs, inputs)}
    else:
        values = {id(block.source): inputs[0]}
    for node in block.nodes:
        args, kwargs = node.arguments.fill_in(values)
        out = operation_fn(node.operation, training=training)(*args, **kwargs)
        for x, y in zip(node.outputs, tree.flatten(out)):
            values[id(x)] = y
    if block.result is None:
        outs = [values[id(x)] for x in functional.outputs]
        return outs[0] if len(outs) == 1 else outs
    return values[id(block.result)]


def forward(model, x, *, recompute: bool, training: bool = True):
    """``model(x, training=training)`` block by block, each under
    ``tf.recompute_grad`` when ``recompute``."""
    import tensorflow as tf

    functional = _functional(model)
    inputs = list(x) if isinstance(x, (list, tuple)) else [x]
    h = inputs
    for block in blocks(model):
        def run(*args, _block=block):
            return _run(_block, functional, args, training)
        # The block reading the model's inputs runs as is: its input is kept
        # anyway, and an embedding lookup's gradient stays IndexedSlices (under
        # recompute_grad it comes out dense, and Keras's Adam then also decays
        # the moments of the rows the batch did not touch: another training).
        again = recompute and block.source is not None
        h = [tf.recompute_grad(run)(*h) if again else run(*h)]
    return h[0]


def checkpointed(step, learning_rate: float = 1e-3):
    """``step``'s Adam step (a :class:`tfswap.zoo.TrainStep`) with gradient
    checkpointing around each block: a ConcreteFunction of the same inputs
    returning ``{"loss": ...}``, on the same model and a new Adam.

    Recomputing a block runs its ops again in the backward pass, batch
    normalisation's moving-statistics update included: the trainable
    weights' gradients are those of the plain step, the moving averages take
    a second update per step (as with ``tf.recompute_grad`` in any Keras model).
    """
    import keras
    import tensorflow as tf

    model = step.model
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(model.trainable_variables)

    @tf.function
    def train(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, forward(model, x, recompute=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    specs = [tf.TensorSpec(b.shape, tf.as_dtype(b.dtype)) for b in step.batch]
    fn = train.get_concrete_function(*specs)
    fn._tfswap_keep = (model, optimizer)   # tf.function holds variables weakly
    return fn, optimizer


def swapping_config(base=None):
    """A ConfigProto with Grappler's memory optimizer set to its swapping
    heuristics (``RewriterConfig.SWAPPING_HEURISTICS``)."""
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

    config = config_pb2.ConfigProto()
    if base is not None:
        config.CopyFrom(base)
    config.graph_options.rewrite_options.memory_optimization = \
        rewriter_config_pb2.RewriterConfig.SWAPPING_HEURISTICS
    return config


SWAP_OPS = ("_CopyFromGpuToHost", "_CopyFromHostToGpu")


def grappler_swaps(graph_def, fetches, keep_ops, device: str, memory_bytes: int,
                   config=None) -> int:
    """Swap-out nodes Grappler's memory optimizer inserts into ``graph_def``
    (placed on ``device``) when the device has ``memory_bytes``: the pass runs
    on a virtual cluster of this machine's devices with that one's memory
    size set, as the function runtime's cluster takes a device's memory limit.
    Its candidates are tensors on devices of type GPU whose statically
    estimated peak exceeds the memory size (grappler/optimizers/
    memory_optimizer.cc), so on a CPU device it is always 0."""
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow.python.grappler import cluster as gcluster
    from tensorflow.python.grappler import tf_optimizer
    import tensorflow as tf

    placed = tf.compat.v1.GraphDef()
    placed.CopyFrom(graph_def)
    for node in placed.node:
        if not node.device:
            node.device = device
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(placed)
    meta.collection_def["train_op"].node_list.value.extend(list(fetches) + list(keep_ops))
    wanted = tf.DeviceSpec.from_string(device)
    devices = []
    for named in gcluster.Cluster().ListDevices():
        here = tf.DeviceSpec.from_string(named.name)
        if (here.device_type, here.device_index) == (wanted.device_type,
                                                     wanted.device_index or 0):
            named.properties.memory_size = int(memory_bytes)
        devices.append(named)
    cluster = gcluster.Cluster(devices=devices)
    optimized = tf_optimizer.OptimizeGraph(config or swapping_config(), meta, cluster=cluster)
    return sum(1 for n in optimized.node if n.op == SWAP_OPS[0])
