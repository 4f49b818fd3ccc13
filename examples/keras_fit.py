"""Train a Keras CNN in half the device memory its training step needs: one callback.

    python examples/keras_fit.py

Runs on the emulated device (CPU:0 = accelerator, CPU:1 = host).  Measures the
unmodified training step's device peak, fits twice for two epochs -- once as
usual, once with ``tfswap.keras.SwapCallback`` at 50% of that peak -- and
prints the plan summaries, the measured peak of the swapping step, and both
loss histories.
"""

import time

from tfswap.tf import emulate

emulate.setup()  # before TensorFlow creates its devices

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfswap  # noqa: E402
from tfswap import zoo  # noqa: E402
from tfswap.tf import capture, measure  # noqa: E402

BATCH, SAMPLES, EPOCHS = 32, 72, 2      # 72 = 2 full batches + a last one of 8


def build():
    """16 Conv/BN/ReLU blocks: the stored activations dominate the step's memory."""
    model = zoo.cnn(batch=BATCH, blocks=16).model
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


rng = np.random.default_rng(0)
x = rng.standard_normal((SAMPLES, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 10, SAMPLES).astype(np.int32)
first = (x[:BATCH], y[:BATCH])

plain, swapped = build(), build()
swapped.set_weights(plain.get_weights())

# The unmodified step's device peak, measured the way tfswap verifies its plans.
step = capture.capture(tfswap.keras.step_function(plain, first))
unmodified = measure.measure(step, step.graph_def, list(first), inter_op_threads=1).peak_bytes
budget = unmodified // 2
print(f"unmodified training step: device peak {unmodified / 2**20:.2f} MiB; "
      f"budget {budget / 2**20:.2f} MiB (50%)")

started = time.perf_counter()
expected = plain.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0).history
plain_s = time.perf_counter() - started

callback = tfswap.keras.SwapCallback(memory_budget=budget, generations=20, seed=0, workers=1)
started = time.perf_counter()
history = swapped.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=2,
                      callbacks=[callback]).history
swapped_s = time.perf_counter() - started

for (kind, signature), fast in callback.functions.items():
    inputs = [np.asarray(v)[:shape[0]] for v, (_, shape, _, _) in zip(first, signature)]
    peak = measure.measure(fast.captured, fast.graph_def, inputs).peak_bytes
    print(f"{kind} step, batch {signature[0][1][0]}: measured device peak "
          f"{peak / 2**20:.2f} MiB with {len(fast.plan.swaps)} swaps "
          f"({'within' if peak <= budget else 'OVER'} the {budget / 2**20:.2f} MiB budget)")
print(f"loss without tfswap {expected['loss']}\nloss with tfswap    {history['loss']}")
difference = max(abs(a - b) / abs(a) for a, b in zip(expected["loss"], history["loss"]))
weights = max(float(np.max(np.abs(a - b))) for a, b in
              zip(plain.get_weights(), swapped.get_weights()))
print(f"largest relative loss difference {difference:.2e}, largest weight difference "
      f"{weights:.2e}; fit took {plain_s:.1f} s without, {swapped_s:.1f} s with tfswap "
      "(first plans included; the search goes on in the background)")
