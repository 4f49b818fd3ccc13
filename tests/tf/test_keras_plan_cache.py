"""One training script run again and again on one plan cache (issue #44).

A cache can hold plans that disagree about where the model's variables live:
a background search's training plan saved with them on the device, validation
plans that moved the table to host memory.  Loaded one after another, the
second plan's move invalidated the first, and the re-plan after the move
rewrote a graph tfswap had rewritten already.  Each run here is a fresh
process (the script as a user reruns it), trains, and compares its history
and weights with plain ``fit`` in the same process.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path

    import numpy as np
    import keras

    import tfswap
    from tfswap.tf import emulate

    emulate.setup()
    cache, mode = Path(sys.argv[1]), sys.argv[2]
    # Training needs its variables and Adam's slots (1 MB) in host memory to fit;
    # validation (0.27 MB) fits with them anywhere.
    BUDGET = 700_000

    def build():
        # Built first in each process: the same layer names, so the same graphs.
        keras.utils.set_random_seed(0)
        L = keras.layers
        model = keras.Sequential([keras.Input((8,), dtype="int32"), L.Embedding(2000, 32),
                                  L.GlobalAveragePooling1D(), L.Dense(16, activation="relu"),
                                  L.Dense(4)], name="text")
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 2000, (24, 8)).astype(np.int32), rng.integers(0, 4, 24).astype(np.int32)
    xv, yv = x[:12], y[:12]
    model = build()

    def fitted(model, callbacks):
        evaluated = model.evaluate(xv, yv, batch_size=8, verbose=0, callbacks=callbacks) \\
            if mode == "evaluate-first" else None
        history = model.fit(x, y, batch_size=8, epochs=2, validation_data=(xv, yv),
                            shuffle=False, verbose=0, callbacks=callbacks).history
        return evaluated, history

    if mode in ("device", "host"):   # plans saved with the variables there
        budget = BUDGET if mode == "host" else 1 << 30   # where "device" fits
        callback = tfswap.keras.SwapCallback(budget, generations=1, workers=1, plan_path=cache,
                                             parameters=mode, background=False, verbose=0)
        fitted(model, [callback])
        print("CACHE WRITTEN", flush=True)
        sys.exit(0)

    callback = tfswap.keras.SwapCallback(BUDGET, generations=1, workers=1, plan_path=cache,
                                         background=False)
    evaluated, history = fitted(model, [callback])
    reference = build()
    expected_evaluated, expected = fitted(reference, [])
    assert (evaluated, history) == (expected_evaluated, expected), (evaluated, history,
                                                                   expected_evaluated, expected)
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(b, a)
    print("SAME AS PLAIN FIT", flush=True)
""")


def run(script, cache, mode):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, str(script), str(cache), mode], capture_output=True,
                          text=True, cwd=script.parent, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_same_script_trains_as_plain_fit_on_a_cache_whose_plans_disagree(tmp_path):
    script, cache = tmp_path / "train.py", tmp_path / "plans"
    script.write_text(SCRIPT)
    for homes in ("device", "host"):
        assert "CACHE WRITTEN" in run(script, tmp_path / homes, homes)
    # The training plan keeps every variable on the device, the validation plans
    # (a full batch and the smaller last one) move them to host memory.
    cache.mkdir()
    for path in (tmp_path / "device").glob("text-train-*.plan.json"):
        # As if a search had found it at this budget (the loader checks the field).
        (cache / path.name).write_text(path.read_text().replace(
            f'"budget_bytes": {1 << 30}', '"budget_bytes": 700000'))
    for path in (tmp_path / "host").glob("text-test-*.plan.json"):
        path.rename(cache / path.name)
    assert len(list(cache.glob("*.plan.json"))) == 3

    # Evaluate first: a validation plan moves the table before training is planned.
    first = run(script, cache, "evaluate-first")
    assert "SAME AS PLAIN FIT" in first
    assert "lives in host memory now" in first     # the device-homed training plan: re-planned
    for _ in range(2):
        again = run(script, cache, "fit")
        assert "SAME AS PLAIN FIT" in again
        assert "planning again" not in again, again   # the cache now agrees with itself
