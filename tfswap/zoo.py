"""Small built-in Keras training steps for the demo, the tests and the benchmarks.

Each builder returns a :class:`TrainStep`: the Keras model, its optimizer,
the ``tf.function`` ConcreteFunction of one training step (returns
``{"loss": ...}``), and a deterministic batch to feed it.  Build models after
:func:`tfswap.tf.emulate.setup` when using the emulated device.

Example::

    step = zoo.cnn(batch=32)
    step.concrete_fn(*step.batch)      # one Adam step, returns {"loss": ...}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TrainStep:
    name: str
    model: Any
    optimizer: Any
    concrete_fn: Any
    batch: tuple


def _train_step(name, model, batch, loss_fn, learning_rate=1e-3):
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    specs = [tf.TensorSpec(b.shape, tf.as_dtype(b.dtype)) for b in batch]
    return TrainStep(name, model, optimizer, step.get_concrete_function(*specs), batch)


def cnn(batch: int = 32, image: int = 32, channels: int = 16, classes: int = 10,
        seed: int = 0) -> TrainStep:
    """Conv/BN/ReLU x3 -> pooling -> Dense, sparse cross-entropy, Adam."""
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    model = keras.Sequential([
        keras.Input((image, image, 3)),
        L.Conv2D(channels, 3, padding="same", use_bias=False), L.BatchNormalization(), L.ReLU(),
        L.Conv2D(channels, 3, padding="same", use_bias=False), L.BatchNormalization(), L.ReLU(),
        L.Conv2D(2 * channels, 3, padding="same", use_bias=False), L.BatchNormalization(), L.ReLU(),
        L.GlobalAveragePooling2D(), L.Dense(classes),
    ], name="cnn")
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal((batch, image, image, 3), dtype=np.float32),
            rng.integers(0, classes, batch).astype(np.int32))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _train_step("cnn", model, data, loss)


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


MODELS = {"cnn": cnn, "transformer": transformer}
