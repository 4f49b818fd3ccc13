"""A Keras training script without a main guard trains with ``SwapCallback(...,
workers=2)`` and its top level runs once (issue #22: the search scores candidates
in threads, so no worker process imports the script again; see
tests/tf/test_user_process.py for ``optimize``)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A script as a user writes it: no `if __name__ == "__main__":`.  It measures its
# own step to pick a budget that needs swaps (60% of the unmodified peak).
SCRIPT = textwrap.dedent("""
    import numpy as np
    import keras

    import tfswap
    from tfswap.tf import capture, emulate, measure

    emulate.setup()
    print("TOP-LEVEL RAN", flush=True)
    keras.utils.set_random_seed(0)
    L = keras.layers
    blocks = [[L.Conv2D(16, 3, padding="same"), L.BatchNormalization(), L.ReLU()]
              for _ in range(3)]
    model = keras.Sequential([keras.Input((16, 16, 3))] + sum(blocks, [])
                             + [L.GlobalAveragePooling2D(), L.Dense(10)])
    model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, 16).astype(np.int32)
    batch = (x[:8], y[:8])
    captured = capture.capture(tfswap.keras.step_function(model, batch))
    peak = measure.measure(captured, captured.graph_def, list(batch),
                           inter_op_threads=1).peak_bytes
    callback = tfswap.keras.SwapCallback(int(0.6 * peak), generations=2, seed=0, workers=2,
                                         verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    (fast,) = callback.functions.values()
    assert fast.plan.swaps, "the budget should need swaps"
    assert fast.measured_peak_bytes is not None and fast.measured_peak_bytes <= fast.budget_bytes
    print("FIT DONE", len(fast.plan.swaps), flush=True)
""")


def test_a_keras_script_without_main_guard_fits_with_the_callback_once(tmp_path):
    script = tmp_path / "train.py"   # no `if __name__ == "__main__":`
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("TOP-LEVEL RAN") == 1, done.stdout
    assert "FIT DONE" in done.stdout, done.stdout
