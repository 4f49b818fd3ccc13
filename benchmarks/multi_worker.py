"""A MultiWorkerMirroredStrategy step planned per worker (issue #31): what runs.

    python benchmarks/multi_worker.py [--workers 2] [--fraction 0.6] [--steps 3]
        [--generations 3] [--out benchmarks/out/multi_worker.jsonl]

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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fraction", type=float, default=0.6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default="benchmarks/out/multi_worker.jsonl")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ports", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        row = worker(args.worker, [int(p) for p in args.ports.split(",")], args.fraction,
                     args.steps, args.generations)
        print("ROW " + json.dumps(row), flush=True)
        return
    ports = []
    for _ in range(args.workers):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            ports.append(s.getsockname()[1])
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", str(k), "--ports", ",".join(map(str, ports)),
         "--fraction", str(args.fraction), "--steps", str(args.steps), "--generations",
         str(args.generations)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in range(args.workers)]
    rows = []
    for k, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"worker {k} did not finish in {args.timeout:.0f} s")
        line = next((x for x in out.splitlines() if x.startswith("ROW ")), None)
        if line is None:
            raise RuntimeError(f"worker {k} failed:\n{err[-3000:]}")
        rows.append(json.loads(line[4:]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for r in rows:
        print(f"worker {r['worker']} of {r['workers']} on {r['device']}: budget "
              f"{r['budget_bytes']} B ({args.fraction:.0%} of the analytic peak "
              f"{r['analytic_peak_bytes']} B), predicted peak {r['predicted_peak_bytes']} B, "
              f"{r['swaps']} swaps ({r['recomputes']} recomputed), plan {r['plan']} "
              f"({r['planner']}); losses {r['losses']} vs unmodified {r['expected_losses']}: "
              f"{'bit-identical' if r['identical'] else 'DIFFERENT'} (weights too)")


if __name__ == "__main__":
    main()
