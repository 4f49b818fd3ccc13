"""Issue #29 on the emulated device: a table in host memory, its rows gathered where it lives.

    .venv/bin/python benchmarks/host_tables.py [--vocab 100000] [--fraction 0.6]
        [--link-bandwidth 200e6] [--runs 5] [--rounds 3] [--out benchmarks/out/host_tables.csv]

``zoo.embedding`` (a ``vocab`` x 64 table, a small dense head, plain SGD,
batch 32 x 16 ids) planned by ``tfswap.optimize`` with the variables moved
to host memory (``parameters="auto"`` at ``--fraction`` of the unmodified
step's measured peak, where the whole table also fits on the device, so both
ways can run), two ways:

* ``sparse`` (tfswap): the ``GatherV2`` runs on the host, next to the table,
  so each step fetches the gathered rows and sends the ids; SGD's
  ``ResourceScatterSub`` runs there too, with the touched rows' gradient.
* ``dense``: the gather on the device, as before this change, which fetches
  the whole table every step (:func:`tfswap.tf.host_side.gathers_on_host`
  switched off for this row only).

Each plan is made for, and rewritten with, an emulated link of
``--link-bandwidth`` bytes/s each way (``cpu_emulated(link_bytes_per_s=...)``,
``rewrite(..., emulated_link_bytes_per_s=...)``), so copies cost what they
would on a GPU-like link.  Printed and written per row: bytes fetched and
written back per step, the predicted step time, the measured device peak
and the measured step time (median of ``--runs`` traced runs; the two rows
alternate ``--rounds`` times, and the median round is reported with the
spread of the sparse/dense ratio), and whether 3 training steps are
bit-identical to the unmodified function's.

Then the Adam update that cannot fit the device (``--adam-vocab`` x 64 table,
Adam, ``--adam-fraction`` of its unmodified peak): where ``optimize`` placed
the table's update and the simulated step time of each place it priced
(``Plan.update_places``), the measured peak and step time on the same link,
and bit-identity (written to the CSV as way ``adam:<place>``).
"""

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfswap.tf import emulate  # noqa: E402

emulate.setup()

import numpy as np  # noqa: E402

import tfswap  # noqa: E402
from tfswap import zoo  # noqa: E402
from tfswap.core.devices import cpu_emulated  # noqa: E402
from tfswap.tf import capture, host_side, measure, rewrite  # noqa: E402

COLUMNS = ("way", "vocab", "budget_bytes", "table_bytes", "fetched_bytes", "written_back_bytes",
           "predicted_step_s", "measured_peak_bytes", "measured_step_s", "identical")


def state(step) -> list:
    return [v.numpy() for v in list(step.model.weights) + list(step.optimizer.variables)]


def plan(way: str, vocab: int, budget: int, link: float):
    step = zoo.embedding(vocab=vocab, optimizer="sgd")
    keep = host_side.gathers_on_host
    if way == "dense":   # what tfswap did before: the gather (and the table) on the device
        host_side.gathers_on_host = lambda captured: (captured, ())
    try:
        fast = tfswap.optimize(step.concrete_fn, budget, generations=5, seed=0, workers=1,
                               inputs=step.batch, device_spec=cpu_emulated(
                                   link_bytes_per_s=link))
    finally:
        host_side.gathers_on_host = keep
    return step, fast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=100000)
    parser.add_argument("--fraction", type=float, default=0.6)
    parser.add_argument("--link-bandwidth", type=float, default=200e6)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--adam-vocab", type=int, default=20000)
    parser.add_argument("--adam-fraction", type=float, default=0.55)
    parser.add_argument("--out", default="benchmarks/out/host_tables.csv")
    args = parser.parse_args()

    reference = zoo.embedding(vocab=args.vocab, optimizer="sgd")
    captured = capture.capture(reference.concrete_fn)
    peak = measure.measure(captured, captured.graph_def, reference.batch,
                           inter_op_threads=1).peak_bytes
    budget = int(args.fraction * peak)
    expected = [float(reference.concrete_fn(*reference.batch)["loss"]) for _ in range(3)]
    rows, graphs = {}, {}
    for way in ("sparse", "dense"):
        step, fast = plan(way, args.vocab, budget, args.link_bandwidth)
        graphs[way] = (step, fast, rewrite.rewrite(fast.captured, fast.plan, fast.device, fast.host,
                                             emulated_link_bytes_per_s=args.link_bandwidth))
        rows[way] = dict(
            way=way, vocab=args.vocab, budget_bytes=budget, table_bytes=args.vocab * 64 * 4,
            fetched_bytes=sum(s.bytes for s in fast.plan.swaps if s.kind == "prefetch"),
            written_back_bytes=sum(fast.lowered.writebacks.values()),
            predicted_step_s=fast.plan.prediction.step_time_s)
    times: dict = {"sparse": [], "dense": []}
    peaks: dict = {"sparse": 0, "dense": 0}
    for _ in range(args.rounds):
        for way in ("sparse", "dense"):
            _, fast, rewritten = graphs[way]
            m = measure.measure(fast.captured, rewritten.graph_def, reference.batch,
                                runs=args.runs)
            times[way].append(m.step_time_s)
            peaks[way] = max(peaks[way], m.peak_bytes)
    for way in ("sparse", "dense"):
        # measure ran copies of the variables: the step's own are still untrained.
        step, fast, _ = graphs[way]
        losses = [float(fast(*step.batch)["loss"]) for _ in range(3)]
        rows[way].update(measured_peak_bytes=peaks[way],
                         measured_step_s=statistics.median(times[way]),
                         identical=losses == expected and all(
                             np.array_equal(a, b) for a, b in zip(state(reference), state(step))))
        fast.restore_parameters()
    ratios = [s / d for s, d in zip(times["sparse"], times["dense"])]
    adam = adam_row(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for way in ("sparse", "dense"):
            writer.writerow(rows[way])
        writer.writerow({k: adam[k] for k in COLUMNS})
    print(f"budget {budget} B ({args.fraction:.0%} of the unmodified peak {peak} B), link "
          f"{args.link_bandwidth:.3g} B/s each way")
    for way in ("sparse", "dense"):
        r = rows[way]
        print(f"{way:7s} fetched {r['fetched_bytes']:>10d} B  written back "
              f"{r['written_back_bytes']:>8d} B  predicted {r['predicted_step_s'] * 1e3:7.2f} ms  "
              f"measured {r['measured_step_s'] * 1e3:7.2f} ms  peak {r['measured_peak_bytes']} B  "
              f"identical {r['identical']}")
    print(f"sparse/dense measured step time: median {statistics.median(ratios):.3f} "
          f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})")
    print(f"adam    {adam['vocab']} x 64 at {args.adam_fraction:.0%}: update {adam['way']}; "
          f"{adam['why']}; measured {adam['measured_step_s'] * 1e3:.2f} ms, peak "
          f"{adam['measured_peak_bytes']} B of {adam['budget_bytes']} B, identical "
          f"{adam['identical']}")
    print(f"wrote {out}")


def adam_row(args) -> dict:
    reference, step = zoo.embedding(vocab=args.adam_vocab), zoo.embedding(vocab=args.adam_vocab)
    captured = capture.capture(reference.concrete_fn)
    budget = int(args.adam_fraction * measure.measure(
        captured, captured.graph_def, reference.batch, inter_op_threads=1).peak_bytes)
    fast = tfswap.optimize(step.concrete_fn, budget, generations=5, seed=0, workers=1,
                           inputs=step.batch,
                           device_spec=cpu_emulated(link_bytes_per_s=args.link_bandwidth))
    rewritten = rewrite.rewrite(fast.captured, fast.plan, fast.device, fast.host,
                                emulated_link_bytes_per_s=args.link_bandwidth)
    runs = [measure.measure(fast.captured, rewritten.graph_def, step.batch, runs=args.runs)
            for _ in range(args.rounds)]
    expected = [float(reference.concrete_fn(*reference.batch)["loss"]) for _ in range(3)]
    losses = [float(fast(*step.batch)["loss"]) for _ in range(3)]
    (placed,) = fast.plan.update_places
    row = dict(way=f"adam:{placed.place}" + (f"x{placed.pieces}" if placed.pieces else ""),
               vocab=args.adam_vocab, budget_bytes=budget, table_bytes=args.adam_vocab * 64 * 4,
               fetched_bytes=sum(s.bytes for s in fast.plan.swaps if s.kind == "prefetch"),
               written_back_bytes=sum(fast.lowered.writebacks.values()),
               predicted_step_s=fast.plan.prediction.step_time_s,
               measured_peak_bytes=max(m.peak_bytes for m in runs),
               measured_step_s=statistics.median(m.step_time_s for m in runs),
               identical=losses == expected and all(
                   np.array_equal(a, b) for a, b in zip(state(reference), state(step))),
               why=placed.why)
    fast.restore_parameters()
    return row


if __name__ == "__main__":
    main()
