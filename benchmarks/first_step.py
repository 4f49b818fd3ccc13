"""How soon a Keras ``fit`` with SwapCallback trains, and what the background search ends with (#32).

On the first GPU, under op determinism, or where there is none on the emulated
device, in a fresh process per run: a small BatchNorm/Dropout
CNN (150 training samples in batches of 32, the last of 22; 40 validation
samples, 32 and 8; 2 epochs; ``steps_per_execution=2``), fitted once plainly
and once with ``SwapCallback(budget)`` (defaults: background search,
``search_time=60``; ``plan_path=None`` so no run starts on an earlier run's
plans), in alternating order.  Per run: the seconds from the ``fit`` call to
the end of its first execution (two steps: Keras reports executions), both
fits' wall times and their ratio, whether history and weights are
bit-identical, and every plan that ran with its measured peak (verification's).
With ``--foreground``, the first run then waits for the background searches and
compares the training step's plan with a foreground search of as many seconds
on the same problem (the same profile; predicted step times).

    python benchmarks/first_step.py --runs 5 --foreground --out benchmarks/out/first_step.jsonl

``--model gru``: instead a model the callback was not developed on (Embedding ->
Conv1D -> a GRU unrolled over 48 steps -> LayerNorm, SGD with momentum, batches
of 24 sequences), whose many small state tensors defeat the size-class pools:
its first plan comes from the byte-cap planner at a lowered small-tensor
threshold, the slowest way to a first plan.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BATCH, SAMPLES, VALIDATION, EPOCHS = 32, 150, 40, 2
MODELS = ("cnn", "gru")
GRU_BATCH, GRU_STEPS, GRU_VOCABULARY = 24, 48, 512


def child(run: int, fraction: float, search_time: float, foreground: bool,
          model_name: str = "cnn") -> dict:
    import tensorflow as tf

    from tfswap.tf import emulate

    # On a GPU the fits run there (issue #41 item 4), under op determinism so that
    # the two histories compare bit for bit; else on the emulated device.
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.experimental.enable_op_determinism()
        device = "/device:GPU:0"
        device_name = tf.config.experimental.get_device_details(gpus[0]).get("device_name",
                                                                             "GPU")
    else:
        emulate.setup()
        device, device_name = emulate.DEVICE, "emulated"
    import keras
    import numpy as np

    import tfswap
    from tfswap.pipeline import NO_SWAP
    from tfswap.tf import capture, measure

    def build_gru():
        keras.utils.set_random_seed(0)
        L = keras.layers
        model = keras.Sequential([
            keras.Input((GRU_STEPS,), dtype="int32"), L.Embedding(GRU_VOCABULARY, 64),
            L.Conv1D(64, 3, padding="same", activation="relu"),
            L.GRU(64, unroll=True, return_sequences=True), L.LayerNormalization(),
            L.GlobalAveragePooling1D(), L.Dense(10)], name="gru")
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    def build():
        if model_name == "gru":
            return build_gru()
        keras.utils.set_random_seed(0)
        L = keras.layers
        layers = [keras.Input((16, 16, 3))]
        for _ in range(4):
            layers += [L.Conv2D(16, 3, padding="same"), L.BatchNormalization(), L.ReLU()]
        model = keras.Sequential(layers + [L.Dropout(0.3), L.GlobalAveragePooling2D(),
                                           L.Dropout(0.3), L.Dense(10)], name="bn_dropout_cnn")
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=2)
        return model

    rng = np.random.default_rng(0)
    batch = GRU_BATCH if model_name == "gru" else BATCH
    x = rng.integers(0, GRU_VOCABULARY, (SAMPLES + VALIDATION, GRU_STEPS)).astype(np.int32) \
        if model_name == "gru" else \
        rng.standard_normal((SAMPLES + VALIDATION, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES + VALIDATION).astype(np.int32)
    train, val = (x[:SAMPLES], y[:SAMPLES]), (x[SAMPLES:], y[SAMPLES:])
    plain, swapped = build(), build()
    swapped.set_weights(plain.get_weights())
    first = (x[:batch], y[:batch])
    step = capture.capture(tfswap.keras.step_function(build(), first))
    unmodified = measure.measure(step, step.graph_def, list(first), inter_op_threads=1,
                                 device=device).peak_bytes
    budget = int(fraction * unmodified)

    class FirstStep(keras.callbacks.Callback):
        def __init__(self, started):
            super().__init__()
            self.started, self.first = started, None

        def on_train_batch_end(self, batch, logs=None):
            if self.first is None:
                self.first = time.perf_counter() - self.started

    ran = []   # (kind, batch, plan id, measured peak) of every plan that ran

    def fit(model, callbacks):
        keras.utils.set_random_seed(5)
        started = time.perf_counter()
        timer = FirstStep(started)
        history = model.fit(*train, batch_size=batch, epochs=EPOCHS, validation_data=val,
                            shuffle=False, verbose=0, callbacks=[*callbacks, timer]).history
        return history, time.perf_counter() - started, timer.first

    callback = tfswap.keras.SwapCallback(budget, search_time=search_time, plan_path=None,
                                         verbose=0, workers=1)
    order = [("plain", plain, []), ("tfswap", swapped, [callback])]
    if run % 2:
        order.reverse()
    out = {}
    for name, model, callbacks in order:
        out[name] = fit(model, callbacks)
    (ref, plain_s, plain_first), (got, swap_s, swap_first) = out["plain"], out["tfswap"]
    identical = ref == got and all(np.array_equal(a, b) for a, b in
                                   zip(plain.get_weights(), swapped.get_weights()))
    for (kind, sig), fast in callback.functions.items():
        spans = fast.plans if isinstance(fast, tfswap.AnytimeFunction) else ()
        ran.append(dict(kind=kind, batch=sig[0][1][0], plans=[
            dict(plan=s.plan_id, planner=s.planner, calls=[s.first_call, s.last_call],
                 measured_peak_bytes=s.measured_peak_bytes) for s in spans],
            outcome=getattr(fast, "outcome", "")))
    # A step that fits unmodified ("tfswap.no-swap": its profile's measured peak within
    # the budget) runs as it is, and is not measured again.
    measured = [p["measured_peak_bytes"] for fn in ran for p in fn["plans"]
                if p["planner"] != NO_SWAP]
    row = dict(run=run, model=model_name, device=device_name,
               order=[n for n, _, _ in order], budget_bytes=budget,
               worst_measured_peak_bytes=max((m for m in measured if m is not None),
                                             default=None),
               within_budget=bool(measured) and all(m is not None and m <= budget
                                                    for m in measured),
               unmodified_peak_bytes=unmodified, first_step_s=swap_first,
               plain_first_step_s=plain_first, fit_s=swap_s, plain_fit_s=plain_s,
               ratio=swap_s / plain_s, identical=identical, functions=ran)
    if foreground:
        from tfswap import pipeline
        from tfswap.tf import lower as tf_lower
        from tfswap.core import planners, search

        key = next(k for k in callback.functions if k[0] == "train"
                   and k[1][0][1][0] == batch)
        fast = callback.functions[key]
        for f in callback.functions.values():
            f.wait()
        fast(first)    # the switch, if the search found better
        searched = fast.plan
        # The foreground search on the same problem (the same profile: predicted
        # times of plans on two profiles would not compare), for as long.
        usable, _ = tf_lower.planner_budget(budget, fast.lowered, 0.05)
        config = search.SearchConfig(time_budget_s=search_time, seed=0, workers=1)
        fg = planners.run(planners.DEFAULT_PLANNER, fast.problem, usable, fast.spec,
                          config=config, allocator="exact").plan
        row.update(first_plan_step_s=fast.plans[0].predicted_step_s,
                   background_plan=searched.id,
                   background_step_s=searched.prediction.step_time_s,
                   background_outcome=fast.outcome, background_plans=[
                       s.plan_id for s in fast.plans],
                   ideal_step_s=searched.prediction.ideal_time_s,
                   foreground_step_s=fg.prediction.step_time_s,
                   background_over_foreground=searched.prediction.step_time_s
                   / fg.prediction.step_time_s)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--fraction", type=float, default=0.5,
                    help="budget as a fraction of the unmodified training step's peak")
    ap.add_argument("--search-time", type=float, default=60.0)
    ap.add_argument("--foreground", action="store_true",
                    help="run 0 also compares with a foreground search")
    ap.add_argument("--model", choices=MODELS, default="cnn")
    ap.add_argument("--out", default="benchmarks/out/first_step.jsonl")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        row = child(args.child, args.fraction, args.search_time,
                    args.foreground and args.child == 0, args.model)
        print("ROW " + json.dumps(row), flush=True)
        return
    rows = []
    root = Path(__file__).resolve().parents[1]
    for run in range(args.runs):
        cmd = [sys.executable, __file__, "--child", str(run), "--fraction", str(args.fraction),
               "--search-time", str(args.search_time), "--model", args.model] + (["--foreground"]
                                                          if args.foreground else [])
        env = dict(os.environ, TF_FORCE_GPU_ALLOW_GROWTH="true")
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
        line = next((x for x in done.stdout.splitlines() if x.startswith("ROW ")), None)
        if line is None:
            raise RuntimeError(f"run {run} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(line[4:]))
        r = rows[-1]
        print(f"run {run} ({r['device']}): first execution {r['first_step_s']:.1f} s (plain "
              f"{r['plain_first_step_s']:.1f} s), fit {r['fit_s']:.1f} s vs "
              f"{r['plain_fit_s']:.1f} s (x{r['ratio']:.2f}), identical {r['identical']}, "
              f"plans' measured peaks within the budget of {r['budget_bytes']} B: "
              f"{r['within_budget']} (worst {r['worst_measured_peak_bytes']} B)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    firsts = [r["first_step_s"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    print(f"first execution: median {statistics.median(firsts):.1f} s (range "
          f"{min(firsts):.1f}-{max(firsts):.1f}); fit with/without: median "
          f"x{statistics.median(ratios):.2f} (range x{min(ratios):.2f}-x{max(ratios):.2f}); "
          f"identical in {sum(r['identical'] for r in rows)} of {len(rows)}")
    for r in rows:
        for fn in r["functions"]:
            plans = "; ".join(f"{p['plan']} ({p['planner']}) calls {p['calls']} measured "
                              f"{p['measured_peak_bytes']} B" for p in fn["plans"])
            print(f"  run {r['run']} {fn['kind']} b{fn['batch']}, budget {r['budget_bytes']} B: "
                  f"{plans}")
        if "foreground_step_s" in r:
            print(f"  run {r['run']}: predicted step of the first plan "
                  f"{r['first_plan_step_s'] * 1e3:.3f} ms, after the background search "
                  f"{r['background_step_s'] * 1e3:.3f} ms, a foreground search on the same "
                  f"problem {r['foreground_step_s'] * 1e3:.3f} ms (background/foreground "
                  f"x{r['background_over_foreground']:.4f}), ideal "
                  f"{r['ideal_step_s'] * 1e3:.3f} ms; {r['background_outcome']}")


if __name__ == "__main__":
    main()
