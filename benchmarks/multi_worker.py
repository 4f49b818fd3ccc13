"""A MultiWorkerMirroredStrategy step planned per worker (issue #31): what runs.

    python benchmarks/multi_worker.py [--workers 2] [--fraction 0.6] [--steps 3]
        [--generations 3] [--out benchmarks/out/multi_worker.jsonl]
    python benchmarks/multi_worker.py --keras [--workers 2] [--fraction 0.6] [--epochs 2]
        [--generations 3] [--out benchmarks/out/multi_worker_keras.jsonl]

Starts ``--workers`` processes on this machine, a cluster on localhost ports
(``TF_CONFIG``), each with the emulated device (``emulate.setup()``: CPU:0 the
device, CPU:1 the host).  In each: the zoo's 4-block CNN step (batch 16, each
worker training on its slice) replicated by a ``MultiWorkerMirroredStrategy``
(``tfswap.zoo.replicated``), twice from the same seed; one copy planned with
``tfswap.optimize(..., profile="analytic", verify_rounds=0)`` at ``--fraction`` of
its analytic unconstrained peak (a multi-worker step cannot run in a local
session, where its all-reduce would wait for the other workers, so it is
planned from its shapes and not verified); then ``--steps`` steps of the
unmodified step and of the planned one, in the same order on every worker
(their all-reduces pair up across workers), losses and weights compared.
One JSON line per worker.  The device peak is not measured: tfswap measures it
from a Session run's step stats, and the eager runtime's run metadata carries
no allocation records.

``--keras`` (issue #43): the same cluster trains a small Keras model (a 3-block
BatchNorm CNN, 64 images, global batch 32: 16 rows per worker and step, Adam,
accuracy, validation on 32 images) for ``--epochs`` epochs twice from the same
seed, with plain ``model.fit`` and with ``tfswap.keras.SwapCallback`` at
``--fraction`` of the training step's analytic peak, then predicts with each
(the callback leaves ``predict`` to Keras on several workers), and prints one
JSON line per worker: both histories, whether history, final weights and
predictions are identical, the plans, and the callback's notes and report.  Keras 3.15's own ``fit`` fails under a multi-worker
strategy (keras-team/keras#20585): :func:`keras_multi_worker_fixes` patches
its two faults in each worker first (see there).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def worker(index: int, ports: list[int], fraction: float, steps: int, generations: int) -> dict:
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{p}" for p in ports]},
        "task": {"type": "worker", "index": index}})
    from tfswap.tf import emulate

    emulate.setup()
    import numpy as np
    import tensorflow as tf

    import tfswap
    from tfswap import pipeline, zoo
    from tfswap import options as options_mod

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    reference = zoo.replicated(zoo.cnn, strategy, batch=16, blocks=4)
    step = zoo.replicated(zoo.cnn, strategy, batch=16, blocks=4)
    analytic = dict(profile="analytic", verify_rounds=0, workers=1, inputs=step.batch)
    whole = pipeline.prepare(step.concrete_fn, options_mod.Options.of(1.0, generations=1,
                                                                    **analytic))
    peak = whole.step.unconstrained.prediction.peak_bytes
    budget = int(fraction * peak)
    fast = tfswap.optimize(step.concrete_fn, budget, generations=generations, seed=0,
                           **analytic)
    expected = [float(reference.concrete_fn(*reference.batch)["loss"]) for _ in range(steps)]
    got = [float(fast(*step.batch)["loss"]) for _ in range(steps)]
    same = expected == got and all(
        np.array_equal(a.numpy(), b.numpy())
        for a, b in zip(reference.model.weights, step.model.weights))
    plan = fast.plan
    return dict(worker=index, workers=len(ports), device=fast.device, host=fast.host,
                analytic_peak_bytes=peak, budget_bytes=budget,
                predicted_peak_bytes=plan.prediction.peak_bytes,
                predicted_step_s=plan.prediction.step_time_s,
                swaps=len(plan.swaps), recomputes=sum(s.kind == "recompute" for s in plan.swaps),
                planner=plan.planner, plan=plan.id, losses=got, expected_losses=expected,
                identical=same, notes=list(fast.notes))


def keras_multi_worker_fixes() -> None:
    """Make Keras 3.15's ``fit`` run under a ``MultiWorkerMirroredStrategy`` over several
    workers, as Keras means it to (keras-team/keras#20585, open):

    1. ``fit`` builds the model's metrics and optimizer from its first batch after
       ``strategy.reduce("MEAN", batch)`` of the whole (x, y) structure, which the
       multi-worker strategy cannot reduce ("Attempt to convert a value (PerReplica...)
       to a Tensor"): built here from this worker's first replica's batch, which has
       the same shapes.  This runs before any callback, so a user of SwapCallback needs
       it too.
    2. The training step averages each log across workers with ``strategy.reduce("MEAN",
       log, axis=0)``, which fails on a scalar log: averaged here with ``axis=None``, the
       reduction over every replica that Keras uses on one machine
       (:func:`tfswap.keras_steps.reduce_outputs` does the same in the planned step).
    """
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    def symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        strategy = self.distribute_strategy
        if iterator is not None:
            for _, _, it in iterator:
                data_batch = tree.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v, next(it))
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    keras_reduce = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return keras_reduce(values, strategy, reduction)

    trainer.TensorFlowTrainer._maybe_symbolic_build = symbolic_build
    trainer.reduce_per_replica = reduce_per_replica


def keras_worker(index: int, ports: list[int], fraction: float, epochs: int,
                 generations: int) -> dict:
    """Plain multi-worker ``fit`` and ``fit`` with ``SwapCallback``, in this worker."""
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{p}" for p in ports]},
        "task": {"type": "worker", "index": index}})
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    from tfswap.tf import emulate

    emulate.setup()
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    import tfswap
    from tfswap import options as options_mod
    from tfswap import pipeline

    keras_multi_worker_fixes()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    layers = keras.layers

    def build():
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential(
                [keras.Input((16, 16, 3))]
                + [layer for _ in range(3) for layer in (
                    layers.Conv2D(16, 3, padding="same", use_bias=False),
                    layers.BatchNormalization(), layers.ReLU())]
                + [layers.GlobalAveragePooling2D(), layers.Dense(10)])
            model.compile(optimizer="adam", jit_compile=False, metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    batch = 32
    rows = batch // len(ports)   # what each worker's replica gets of a global batch
    fit = dict(batch_size=batch, epochs=epochs, verbose=0, shuffle=False,
               validation_data=(x[:batch], y[:batch]))

    # The budget: a fraction of this worker's training step's analytic peak.
    shards = ((x[:rows], y[:rows]),)
    cf = tfswap.keras.step_function(build(), shards, "train", replicated=True)
    analytic = options_mod.Options.of(1.0, profile="analytic", verify_rounds=0,
                                      generations=1, workers=1)
    peak = pipeline.prepare(cf, analytic).step.unconstrained.prediction.peak_bytes
    budget = int(fraction * peak)

    plain, model = build(), build()
    started = time.monotonic()
    expected = plain.fit(x, y, **fit).history
    plain_s = time.monotonic() - started
    callback = tfswap.keras.SwapCallback(memory_budget=budget, generations=generations,
                                         seed=0, workers=1, plan_path=None, verbose=0)
    started = time.monotonic()
    got = model.fit(x, y, callbacks=[callback], **fit).history
    swap_s = time.monotonic() - started
    import warnings

    with warnings.catch_warnings(record=True) as warned:   # Keras's own step predicts
        warnings.simplefilter("always")
        predicted = model.predict(x, batch_size=batch, verbose=0, callbacks=[callback])
    predict_identical = bool(np.array_equal(predicted, plain.predict(x, batch_size=batch,
                                                                     verbose=0)))
    planned = [(key, fast) for key, fast in callback.functions.items() if fast is not None]
    return dict(
        worker=index, workers=len(ports), mode="keras", budget_bytes=budget,
        analytic_peak_bytes=peak, epochs=epochs,
        history=got, expected_history=expected, history_identical=got == expected,
        weights_identical=all(np.array_equal(a, b) for a, b in
                              zip(model.get_weights(), plain.get_weights())),
        plans=[dict(kind=key[0], shapes=[list(leaf[1]) for leaf in key[1]], plan=fast.plan.id,
                    planner=fast.plan.planner, swaps=len(fast.plan.swaps),
                    recomputes=sum(s.kind == "recompute" for s in fast.plan.swaps),
                    predicted_peak_bytes=fast.plan.prediction.peak_bytes,
                    measured_peak_bytes=fast.measured_peak_bytes,
                    other_workers=fast.captured.other_workers,
                    background=isinstance(fast, tfswap.anytime.AnytimeFunction),
                    notes=list(fast.notes))
               for key, fast in planned],
        predict_identical=predict_identical,
        predict_warnings=[str(w.message) for w in warned if "tfswap" in str(w.message)],
        profile=callback.options.profile, verify_rounds=callback.options.verify_rounds,
        callback_notes=list(callback.notes), report=callback.report(),
        plain_fit_s=round(plain_s, 2), swap_fit_s=round(swap_s, 2))


def run_workers(commands: list[list[str]], timeout: float) -> list[dict]:
    """Run one process per command (a worker each) and return their rows.  Their
    output goes to files (TensorFlow's logs could fill a pipe and stall them); a
    worker that fails ends the others, which would wait for it in a collective."""
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as folder:
        logs = [(open(Path(folder) / f"{k}.out", "w+"), open(Path(folder) / f"{k}.err", "w+"))
                for k in range(len(commands))]
        procs = [subprocess.Popen(c, stdout=out, stderr=err, text=True)
                 for c, (out, err) in zip(commands, logs)]
        deadline = time.monotonic() + timeout
        try:
            while any(p.poll() is None for p in procs):
                failed = next((k for k, p in enumerate(procs) if p.poll() not in (None, 0)),
                              None)
                if failed is not None:
                    err = logs[failed][1]
                    err.seek(0)
                    raise RuntimeError(f"worker {failed} failed:\n{err.read()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the workers did not finish in {timeout:.0f} s")
                time.sleep(0.2)
            rows = []
            for k, (p, (out, err)) in enumerate(zip(procs, logs)):
                out.seek(0)
                err.seek(0)
                line = next((x for x in out.read().splitlines() if x.startswith("ROW ")), None)
                if p.returncode != 0 or line is None:
                    raise RuntimeError(f"worker {k} failed:\n{err.read()[-3000:]}")
                rows.append(json.loads(line[4:]))
            return rows
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for out, err in logs:
                out.close()
                err.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fraction", type=float, default=0.6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--keras", action="store_true",
                    help="model.fit with SwapCallback against plain multi-worker fit")
    ap.add_argument("--epochs", type=int, default=2, help="--keras: epochs of each fit")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default=None, help="default: benchmarks/out/multi_worker.jsonl "
                    "(multi_worker_keras.jsonl with --keras)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ports", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = f"benchmarks/out/multi_worker{'_keras' if args.keras else ''}.jsonl"
    if args.worker is not None:
        ports = [int(p) for p in args.ports.split(",")]
        row = keras_worker(args.worker, ports, args.fraction, args.epochs, args.generations) \
            if args.keras else worker(args.worker, ports, args.fraction, args.steps,
                                      args.generations)
        print("ROW " + json.dumps(row), flush=True)
        return
    ports = []
    for _ in range(args.workers):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            ports.append(s.getsockname()[1])
    command = [sys.executable, __file__, "--ports", ",".join(map(str, ports)), "--fraction",
               str(args.fraction), "--steps", str(args.steps), "--generations",
               str(args.generations), "--epochs", str(args.epochs)]
    rows = run_workers([command + ["--worker", str(k)] + (["--keras"] if args.keras else [])
                        for k in range(args.workers)], args.timeout)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    if args.keras:   # one JSON line per worker
        for r in rows:
            print(json.dumps(r), flush=True)
        return
    for r in rows:
        print(f"worker {r['worker']} of {r['workers']} on {r['device']}: budget "
              f"{r['budget_bytes']} B ({args.fraction:.0%} of the analytic peak "
              f"{r['analytic_peak_bytes']} B), predicted peak {r['predicted_peak_bytes']} B, "
              f"{r['swaps']} swaps ({r['recomputes']} recomputed), plan {r['plan']} "
              f"({r['planner']}); losses {r['losses']} vs unmodified {r['expected_losses']}: "
              f"{'bit-identical' if r['identical'] else 'DIFFERENT'} (weights too)")


if __name__ == "__main__":
    main()
