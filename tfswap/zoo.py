"""Small built-in Keras training steps for the demo, the tests and the benchmarks.

Each builder returns a :class:`TrainStep`: the Keras model, its optimizer,
the ``tf.function`` ConcreteFunction of one training step (returns
``{"loss": ...}``), and a deterministic batch to feed it.  Build models after
:func:`tfswap.tf.emulate.setup` when using the emulated device.  Every builder
takes ``variables_on``: where the model's and the optimizer's variables live
(the host keeps the parameters in host memory; tfswap swaps them in).

Example::

    step = zoo.cnn(batch=32)
    step.concrete_fn(*step.batch)      # one Adam step, returns {"loss": ...}
    offloaded = zoo.cnn(batch=32, variables_on="/device:CPU:1")
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np


def _homed(builder):
    """Add ``variables_on`` to a builder: the device (e.g. the host,
    ``"/device:CPU:1"`` on the emulated device) where the model's and the
    optimizer's variables are created; None: TensorFlow's default placement.
    Variables in host memory are parameters tfswap swaps in before use."""
    @functools.wraps(builder)
    def build(*args, variables_on: str | None = None, **kwargs):
        import tensorflow as tf

        with tf.device(variables_on) if variables_on else contextlib.nullcontext():
            return builder(*args, **kwargs)

    return build


@dataclass(frozen=True)
class TrainStep:
    name: str
    model: Any
    optimizer: Any
    concrete_fn: Any
    batch: tuple
    loss: Any = None   # loss(y, model(x)), what the step minimizes


OPTIMIZERS = ("adam", "sgd", "momentum", "adagrad")


def make_optimizer(name: str, learning_rate: float):
    """A Keras optimizer by name (:data:`OPTIMIZERS`): Adam, plain SGD, SGD with
    momentum 0.9, or Adagrad."""
    import keras

    makers = {"adam": lambda: keras.optimizers.Adam(learning_rate),
              "sgd": lambda: keras.optimizers.SGD(learning_rate),
              "momentum": lambda: keras.optimizers.SGD(learning_rate, momentum=0.9),
              "adagrad": lambda: keras.optimizers.Adagrad(learning_rate)}
    if name not in makers:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    return makers[name]()


def step_function(model, specs, loss_fn, learning_rate=1e-3, optimizer: str = "adam"):
    """One optimizer step (Adam by default, :data:`OPTIMIZERS`) of ``model`` on
    ``loss_fn(y, model(x))`` as a ConcreteFunction of ``specs`` (x's and y's
    TensorSpecs): (concrete function, optimizer).  The caller keeps ``model`` and
    the optimizer alive (tf.function holds variables weakly)."""
    import tensorflow as tf

    optimizer = make_optimizer(optimizer, learning_rate)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    return step.get_concrete_function(*specs), optimizer


def _train_step(name, model, batch, loss_fn, learning_rate=1e-3, optimizer="adam"):
    import tensorflow as tf

    if tf.distribute.has_strategy():
        # Under a strategy's scope (replicated): the variables only; the step is
        # replicated's, which runs this one per replica.
        optimizer = make_optimizer(optimizer, learning_rate)
        optimizer.build(model.trainable_variables)
        return TrainStep(name, model, optimizer, None, batch, loss_fn)
    specs = [tf.TensorSpec(b.shape, tf.as_dtype(b.dtype)) for b in batch]
    fn, optimizer = step_function(model, specs, loss_fn, learning_rate, optimizer)
    return TrainStep(name, model, optimizer, fn, batch, loss_fn)


def replicated(build, strategy, *args, **kwargs) -> TrainStep:
    """The step of ``build(*args, **kwargs)`` (a builder of this module)
    replicated by ``strategy`` (a ``tf.distribute.MirroredStrategy``): model and
    optimizer created under its scope, each replica training on its slice of
    the batch (which the replicas divide), the mean loss's gradients summed
    across replicas by the optimizer, the losses summed into the one returned.

    Example::

        devices = tfswap.tf.emulate.setup(replicas=2)
        strategy = tf.distribute.MirroredStrategy(devices.replicas)
        step = zoo.replicated(zoo.cnn, strategy, batch=32)
        step.concrete_fn(*step.batch)["loss"]
    """
    import tensorflow as tf

    with strategy.scope():
        one = build(*args, **kwargs)
    n = strategy.num_replicas_in_sync
    model, optimizer, loss_fn = one.model, one.optimizer, one.loss
    rows = one.batch[0].shape[0]
    if rows % n:
        raise ValueError(f"the batch of {rows} does not divide among {n} replicas")

    @tf.function
    def step(x, y):
        def replica(x, y):
            k = tf.distribute.get_replica_context().replica_id_in_sync_group
            size = rows // n
            xs, ys = x[k * size:(k + 1) * size], y[k * size:(k + 1) * size]
            with tf.GradientTape() as tape:
                loss = loss_fn(ys, model(xs, training=True)) / n
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return {"loss": strategy.reduce("SUM", strategy.run(replica, args=(x, y)), axis=None)}

    specs = [tf.TensorSpec(b.shape, tf.as_dtype(b.dtype)) for b in one.batch]
    return TrainStep(f"{one.name}_x{n}", model, optimizer, step.get_concrete_function(*specs),
                     one.batch, loss_fn)


def replicated_mlp(strategy, batch: int = 16, features: int = 256, hidden: int = 512,
                   layers: int = 4, classes: int = 10, learning_rate: float = 1e-3,
                   seed: int = 0) -> TrainStep:
    """An MLP trained with Adam and replicated by ``strategy``, written with
    ``tf.Variable``s (``model``: the weights, ``optimizer``: the Adam state, all
    mirrored): each gradient all-reduced on its own, each update applied by
    ``strategy.extended.update``.  Keras 3 all-reduces every gradient through one
    concatenation, an op that holds all of them twice on each device at once, so
    a Keras step never fits a device below twice its parameters; this one's
    largest op holds one gradient.

    Example::

        step = zoo.replicated_mlp(strategy)
        step.concrete_fn(*step.batch)["loss"]
        [w.numpy() for w in step.model]       # what every replica holds
    """
    import tensorflow as tf

    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    rng = np.random.default_rng(seed)
    shapes = [(features, hidden)] + [(hidden, hidden)] * (layers - 1) + [(hidden, classes)]
    b1, b2, eps = 0.9, 0.999, 1e-7
    with strategy.scope():
        weights = []
        for k, (a, b) in enumerate(shapes):
            weights.append(tf.Variable((rng.standard_normal((a, b)) / np.sqrt(a)).astype(
                np.float32), name=f"dense_{k}/kernel"))
            weights.append(tf.Variable(np.zeros(b, np.float32), name=f"dense_{k}/bias"))
        slots = [(tf.Variable(tf.zeros_like(w), name=f"m_{k}"),
                  tf.Variable(tf.zeros_like(w), name=f"v_{k}")) for k, w in enumerate(weights)]
    n = strategy.num_replicas_in_sync
    data = (rng.standard_normal((batch, features), dtype=np.float32),
            rng.integers(0, classes, batch).astype(np.int32))
    if batch % n:
        raise ValueError(f"the batch of {batch} does not divide among {n} replicas")

    def forward(x):
        for k in range(0, len(weights), 2):
            x = tf.matmul(x, weights[k]) + weights[k + 1]
            if k + 2 < len(weights):
                x = tf.nn.relu(x)
        return x

    def adam(w, g, m, v):
        m.assign_add((g - m) * (1 - b1))
        v.assign_add((tf.square(g) - v) * (1 - b2))
        w.assign_sub(learning_rate * m / (tf.sqrt(v) + eps))

    def apply(strategy, grads):
        for w, g, (m, v) in zip(weights, grads, slots):
            strategy.extended.update(w, adam, args=(g, m, v), group=False)

    @tf.function
    def step(x, y):
        def replica(x, y):
            ctx = tf.distribute.get_replica_context()
            k = ctx.replica_id_in_sync_group
            size = batch // n
            xs, ys = x[k * size:(k + 1) * size], y[k * size:(k + 1) * size]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=ys, logits=forward(xs))) / n
            grads = [ctx.all_reduce("SUM", g) for g in tape.gradient(loss, weights)]
            ctx.merge_call(apply, args=(grads,))
            return loss

        return {"loss": strategy.reduce("SUM", strategy.run(replica, args=(x, y)), axis=None)}

    specs = [tf.TensorSpec(b.shape, tf.as_dtype(b.dtype)) for b in data]
    return TrainStep(f"mlp_adam_x{n}", weights, [s for pair in slots for s in pair],
                     step.get_concrete_function(*specs), data)


def _image_step(name, model, batch, image, classes, seed):
    """The step of an image classifier: a seeded batch of ``image`` x ``image`` RGB
    inputs and integer labels, sparse cross-entropy on logits."""
    import keras

    rng = np.random.default_rng(seed)
    data = (rng.standard_normal((batch, image, image, 3), dtype=np.float32),
            rng.integers(0, classes, batch).astype(np.int32))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _train_step(name, model, data, loss)


def encoder_blocks(h, layers: int, heads: int, dim: int):
    """``layers`` post-LN BERT blocks (self-attention, GELU feed-forward of width
    4 x ``dim``) on the Keras tensor ``h``."""
    import keras

    L = keras.layers
    for _ in range(layers):
        a = L.MultiHeadAttention(heads, dim // heads)(h, h)
        h = L.LayerNormalization(epsilon=1e-12)(h + L.Dense(dim)(a))
        f = L.Dense(4 * dim, activation="gelu")(h)
        h = L.LayerNormalization(epsilon=1e-12)(h + L.Dense(dim)(f))
    return h


@_homed
def cnn(batch: int = 32, image: int = 32, channels: int = 16, classes: int = 10,
        blocks: int = 16, seed: int = 0) -> TrainStep:
    """Conv/BN/ReLU x ``blocks`` -> pooling -> Dense, sparse cross-entropy, Adam.

    16 blocks by default: on some CPUs one convolution's backward keeps a fixed
    ~30 MB of scratch, and a shallower step's peak is then mostly that one op.
    """
    import keras

    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    keras.utils.set_random_seed(seed)
    L = keras.layers
    layers = [keras.Input((image, image, 3))]
    for k in range(blocks):
        width = channels
        layers += [L.Conv2D(width, 3, padding="same", use_bias=False), L.BatchNormalization(),
                   L.ReLU()]
    model = keras.Sequential(layers + [L.GlobalAveragePooling2D(), L.Dense(classes)],
                             name="cnn")
    return _image_step("cnn", model, batch, image, classes, seed)


@_homed
def inception(batch: int = 16, image: int = 32, channels: int = 8, classes: int = 10,
              blocks: int = 4, seed: int = 0) -> TrainStep:
    """An Inception-style CNN: a Conv/BN/ReLU stem, then ``blocks`` modules of four
    parallel branches (1x1; 1x1 -> 3x3; 1x1 -> 3x3 -> 3x3; 3x3 average pool -> 1x1,
    each convolution followed by BN and ReLU) concatenated to 4 x ``channels``, with
    a 2x2 max pool after every second module; pooling -> Dense, sparse
    cross-entropy, Adam.

    Unlike :func:`cnn`'s chain, the branches leave the schedule freedom (which
    branch runs first, forward and backward) and tensors of several sizes, the
    shape of the Inception models SwapAdvisor evaluates.

    Example::

        step = zoo.inception(batch=16, image=32)
        step.concrete_fn(*step.batch)      # one Adam step, returns {"loss": ...}
    """
    import keras

    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    if channels < 2:
        raise ValueError(f"channels must be >= 2, got {channels}")
    keras.utils.set_random_seed(seed)
    L = keras.layers

    def conv(x, width, size):
        x = L.Conv2D(width, size, padding="same", use_bias=False)(x)
        return L.ReLU()(L.BatchNormalization()(x))

    inputs = keras.Input((image, image, 3))
    h = conv(inputs, 4 * channels, 3)
    half = max(channels // 2, 1)
    for k in range(blocks):
        branches = [conv(h, channels, 1),
                    conv(conv(h, half, 1), channels, 3),
                    conv(conv(conv(h, half, 1), channels, 3), channels, 3),
                    conv(L.AveragePooling2D(3, strides=1, padding="same")(h), channels, 1)]
        h = L.Concatenate()(branches)
        if k % 2 == 1 and k < blocks - 1 and h.shape[1] >= 2:
            h = L.MaxPooling2D(2)(h)
    logits = L.Dense(classes)(L.GlobalAveragePooling2D()(h))
    model = keras.Model(inputs, logits, name="inception")
    return _image_step("inception", model, batch, image, classes, seed)


@_homed
def transformer(batch: int = 8, seq: int = 64, dim: int = 64, heads: int = 4,
                layers: int = 2, vocab: int = 512, seed: int = 0) -> TrainStep:
    """A small Transformer encoder (embedding, MHA, LayerNorm, FFN) for token classification."""
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    tokens = keras.Input((seq,), dtype="int32")
    h = L.Embedding(vocab, dim)(tokens)
    for _ in range(layers):
        a = L.MultiHeadAttention(heads, dim // heads)(h, h)
        h = L.LayerNormalization()(h + a)
        f = L.Dense(4 * dim, activation="gelu")(h)
        h = L.LayerNormalization()(h + L.Dense(dim)(f))
    logits = L.Dense(vocab)(h)
    model = keras.Model(tokens, logits, name="transformer")
    rng = np.random.default_rng(seed)
    data = (rng.integers(0, vocab, (batch, seq)).astype(np.int32),
            rng.integers(0, vocab, (batch, seq)).astype(np.int32))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _train_step("transformer", model, data, loss)


@_homed
def resnet50(batch: int = 2, image: int = 32, classes: int = 10, seed: int = 0) -> TrainStep:
    """keras.applications.ResNet50 (weights=None) at ``image`` x ``image`` (>= 32), Adam."""
    import keras

    if image < 32:
        raise ValueError(f"ResNet50 needs images of at least 32x32 pixels, got {image}")
    keras.utils.set_random_seed(seed)
    model = keras.applications.ResNet50(weights=None, input_shape=(image, image, 3),
                                        classes=classes, classifier_activation=None)
    return _image_step("resnet50", model, batch, image, classes, seed)


@_homed
def bert(batch: int = 4, seq: int = 64, dim: int = 128, heads: int = 4, layers: int = 2,
         vocab: int = 1024, seed: int = 0) -> TrainStep:
    """A BERT-style encoder: token + learned position embeddings, LayerNorm, post-LN
    blocks (self-attention, GELU feed-forward of width 4 x dim), masked-LM head."""
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    tokens = keras.Input((seq,), dtype="int32")
    positions = keras.ops.arange(seq, dtype="int32")
    h = L.Embedding(vocab, dim)(tokens) + L.Embedding(seq, dim)(positions)[None]
    h = encoder_blocks(L.LayerNormalization(epsilon=1e-12)(h), layers, heads, dim)
    h = L.Dense(dim, activation="gelu")(h)
    logits = L.Dense(vocab)(L.LayerNormalization(epsilon=1e-12)(h))
    model = keras.Model(tokens, logits, name="bert")
    rng = np.random.default_rng(seed)
    data = (rng.integers(0, vocab, (batch, seq)).astype(np.int32),
            rng.integers(0, vocab, (batch, seq)).astype(np.int32))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _train_step("bert", model, data, loss)


@_homed
def lstm(batch: int = 8, steps: int = 16, features: int = 32, units: int = 64,
         layers: int = 2, classes: int = 10, unroll: bool = True, seed: int = 0) -> TrainStep:
    """A stack of LSTMs over ``steps`` time steps, then Dense on the last state.

    ``unroll=True`` builds one cell per time step (no control flow);
    ``unroll=False`` keeps Keras's ``While`` loop (functional control flow).
    """
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    stack = [keras.Input((steps, features))]
    for k in range(layers):
        stack.append(L.LSTM(units, return_sequences=k < layers - 1, unroll=unroll))
    stack.append(L.Dense(classes))
    model = keras.Sequential(stack, name="lstm" if unroll else "lstm_loop")
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal((batch, steps, features), dtype=np.float32),
            rng.integers(0, classes, batch).astype(np.int32))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _train_step("lstm" if unroll else "lstm_loop", model, data, loss)


@_homed
def mlp(batch: int = 16, features: int = 256, hidden: int = 512, layers: int = 4,
        classes: int = 10, seed: int = 0) -> TrainStep:
    """``layers`` Dense+ReLU layers of width ``hidden``, then Dense, Adam: a step whose
    parameters and optimizer state are most of its memory."""
    import keras

    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    keras.utils.set_random_seed(seed)
    L = keras.layers
    stack = [keras.Input((features,))] + [L.Dense(hidden, activation="relu")
                                          for _ in range(layers)]
    model = keras.Sequential(stack + [L.Dense(classes)], name="mlp")
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal((batch, features), dtype=np.float32),
            rng.integers(0, classes, batch).astype(np.int32))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _train_step("mlp", model, data, loss)


@_homed
def embedding(batch: int = 32, seq: int = 16, vocab: int = 20000, dim: int = 64,
              hidden: int = 64, classes: int = 10, optimizer: str = "adam",
              learning_rate: float = 1e-2, seed: int = 0) -> TrainStep:
    """A large embedding table and a small dense head: ``Embedding(vocab, dim)`` of
    ``seq`` token ids, averaged, ``Dense(hidden, relu)``, ``Dense(classes)``, sparse
    cross-entropy; ``optimizer`` one of :data:`OPTIMIZERS`.  The classic model whose
    parameters (the table) are larger than the device while each step reads only
    ``batch * seq`` of its rows.

    Example::

        step = zoo.embedding(vocab=100000, optimizer="sgd")
        step.concrete_fn(*step.batch)      # one SGD step, returns {"loss": ...}
    """
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    model = keras.Sequential([keras.Input((seq,), dtype="int32"), L.Embedding(vocab, dim),
                              L.GlobalAveragePooling1D(), L.Dense(hidden, activation="relu"),
                              L.Dense(classes)], name="embedding")
    rng = np.random.default_rng(seed)
    data = (rng.integers(0, vocab, (batch, seq)).astype(np.int32),
            rng.integers(0, classes, batch).astype(np.int32))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _train_step("embedding", model, data, loss, learning_rate, optimizer)


MODELS = {"cnn": cnn, "inception": inception, "transformer": transformer,
          "resnet50": resnet50, "bert": bert, "lstm": lstm, "mlp": mlp,
          "embedding": embedding}
