"""Issue #30: tfswap against ``tf.recompute_grad`` at the same batch, timed in turns.

    .venv/bin/python research/studies/peers_paired.py --model lstm4 --batch 72 [--cap 5MiB]
        [--rounds 5] [--steps 5] [--generations 2] [--out benchmarks/out/peers_paired.csv]

``benchmarks/gpu_peers.py --emulated --small`` times each policy once, in its
own trial, two steps: on a shared 2-core CPU that is too noisy to say which of
two policies is faster at one batch.  This script builds, at ``--batch``
(default: twice plain TensorFlow's largest batch under the cap, as
``gpu_peers.py`` found it), the same Keras model and Adam three times
(:data:`gpu_peers.SMALL` sizes, emulated device): plain TensorFlow with no
cap (the reference), ``tf.recompute_grad`` around each block
(``tf_peers.checkpointed``), and ``tfswap.optimize(step, cap)``.  The two
capped policies' measured peaks are checked against ``--cap``; then the
three are timed in turns, ``--rounds`` rounds of ``--steps`` steps each
(after one untimed step, variables put back after each timing), and each
round's tfswap / checkpointing step-time ratio is reported.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tfswap.tf import emulate  # noqa: E402

emulate.setup()

from benchmarks import gpu_peers  # noqa: E402
from research import tf_peers  # noqa: E402
from research.trials import step_time, sync  # noqa: E402

COLUMNS = ("model", "batch", "cap_bytes", "policy", "peak_bytes", "step_s_median",
           "step_s_rounds", "vs_checkpoint_rounds")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="lstm4", choices=sorted(gpu_peers.SMALL))
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--cap", type=gpu_peers.parse_bytes, default=None,
                    help="the card (default: the model's in gpu_peers.SMALL)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/out/peers_paired.csv")
    args = ap.parse_args(argv)
    import tfswap

    spec = gpu_peers.SMALL[args.model]
    cap = args.cap or spec.cap

    def build():
        from tfswap import zoo

        return getattr(zoo, spec.builder)(batch=args.batch, **spec.sizes)

    made = {}
    plain = build()
    made["tf"] = (plain.concrete_fn, plain, gpu_peers._variables(plain.model, plain.optimizer),
                  gpu_peers._emulated_peak(plain.concrete_fn, plain.batch))
    step = build()
    fn, optimizer = tf_peers.checkpointed(step)
    sync(fn(*step.batch))
    made["checkpoint"] = (fn, step, gpu_peers._variables(step.model, optimizer),
                          gpu_peers._emulated_peak(fn, step.batch))
    step = build()
    fast = tfswap.optimize(step.concrete_fn, cap, generations=args.generations, seed=0,
                           workers=1, inputs=step.batch, parameters="auto")
    made["tfswap"] = (fast, step, fast.captured.variables, fast.measured_peak_bytes)
    for name, (_, _, _, peak) in made.items():
        fits = "no cap" if name == "tf" else ("within" if peak <= cap else "OVER")
        print(f"{args.model} b{args.batch} {name}: measured peak {peak} B ({fits} the cap "
              f"of {cap} B)", flush=True)
    times = {name: [] for name in made}
    for r in range(args.rounds):
        for name, (fn, step, variables, _) in made.items():
            times[name].append(step_time(fn, step.batch, variables, steps=args.steps,
                                         repeats=1))
        print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1] * 1e3:.2f} ms"
                                             for n, t in times.items()), flush=True)
    ratios = [a / b for a, b in zip(times["tfswap"], times["checkpoint"])]
    rows = []
    for name, (_, _, _, peak) in made.items():
        rows.append(dict(model=args.model, batch=args.batch, cap_bytes=cap, policy=name,
                         peak_bytes=peak, step_s_median=statistics.median(times[name]),
                         step_s_rounds=" ".join(f"{t:.6f}" for t in times[name]),
                         vs_checkpoint_rounds=" ".join(
                             f"{t / c:.3f}" for t, c in zip(times[name], times["checkpoint"]))))
    print(f"tfswap / checkpointing by round: {' '.join(f'{x:.3f}' for x in ratios)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    exists = Path(args.out).exists()
    with open(args.out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if not exists:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
