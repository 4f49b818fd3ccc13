"""An example step for ``tfswap plan``: one Adam step of a deep Keras MLP.

Try::

    tfswap plan examples.mlp_step:train_step --budget 40MiB --generations 20 \
        --trace mlp.trace.json --plot mlp.memory.png

``train_step`` builds the model when tfswap calls it, after tfswap has set up
the device (a GPU, or without one the emulated device).  It returns the
ConcreteFunction of the step (fixed shapes, so every tensor's bytes are known)
as ``concrete_fn`` next to the model and optimizer: a ConcreteFunction holds
only weak references to its variables, so their owners must stay alive.
"""

from types import SimpleNamespace

import tensorflow as tf

BATCH, FEATURES, WIDTH, DEPTH, CLASSES = 1024, 256, 512, 8, 10


def train_step():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input((FEATURES,))]
        + [tf.keras.layers.Dense(WIDTH, activation="relu") for _ in range(DEPTH)]
        + [tf.keras.layers.Dense(CLASSES)])
    optimizer = tf.keras.optimizers.Adam(1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    concrete_fn = step.get_concrete_function(tf.TensorSpec([BATCH, FEATURES], tf.float32),
                                             tf.TensorSpec([BATCH], tf.int32))
    return SimpleNamespace(model=model, optimizer=optimizer, concrete_fn=concrete_fn)
