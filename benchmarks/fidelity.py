"""Simulator fidelity (issue #7 part 5, SwapAdvisor Fig. 11): simulated against measured.

    .venv/bin/python benchmarks/fidelity.py [--models cnn,inception,bert,lstm] [--count 20]
        [--fraction 0.6] [--runs 5] [--inter-op-threads 1] [--out benchmarks/out]
        [--copy-latency 15e-6] [--copy-streams] [--link-bandwidth BYTES_PER_S]
        [--link-latency SECONDS] [--issue-cost SECONDS] [--ordered-copies]
        [--csv-name fidelity.csv]

On the emulated device (CPU:0 plays the device, CPU:1 the host), for each
model: measure the unmodified step's device peak, profile it with the trace
profiler, and take a budget of ``--fraction`` of that peak.  Draw random
individuals as the genetic search's first generation draws them
(``tfswap.core.search.random_individuals``: TF's or the memory-greedy order
mutated at a random rate, a random class map, counts cut to the budget);
one the planner rejects (an op cannot get its objects) is replaced by the
next draw, until ``--count`` plans exist.  Each plan is rewritten and run
(``tfswap.tf.measure``, ``--runs`` traced runs after one warm-up, median
step time, ``--inter-op-threads`` executor threads), and compared with the
simulator's step time and peak.  Two simulated peaks: the pool's (objects
at their class's size, what the pool allocator would hold on a GPU) and the
live bytes of the same simulation (buffers at their own size, what TF's
allocator holds on the emulated device, so the one to compare there).

The device model: ``cpu_emulated`` with ``--copy-latency`` seconds per copy
(``benchmarks/copy_latency.py`` measures it) and its copies on the compute
stream (one executor thread runs the swap ops and the compute ops alike);
``--copy-streams`` gives the copies their own streams instead.  Every plan is
also simulated by the model without either (three streams, no latency), the
"streams" columns, so the two can be compared on the same runs.

``--link-bandwidth B`` runs on an emulated link of B bytes/s each way
(``rewrite(..., emulated_link_bytes_per_s=B)``: each SwapOut/SwapIn completes
when such a link would have moved its bytes, one FIFO link per direction,
sleeping, not computing) and simulates with ``cpu_emulated(link_bytes_per_s=B)``
(``--ordered-copies``: each direction's copies chained in the simulator's
stream order, ``rewrite(..., ordered_copies=True)``);
copies then have their own streams, no per-copy latency unless
``--copy-latency`` says so, and the executor gets 2 inter-op threads unless
``--inter-op-threads`` says otherwise (the compute ops are serialised by the
schedule's control chain anyway; the copies overlap them).  The point: the
CPU here is 50-100x slower than a V100 at these models, so its memcpy link
makes every copy nearly free; 100-300 MB/s gives a V100 + PCIe 3-like
compute:copy ratio and plans whose simulated slowdowns differ.

Bytes moved.  The planner plans buffer swaps and prices each copy at its
buffer's bytes; the rewrite (``tfswap.tf.tensor_swaps``) copies the values the
readers after the gap read: only the slices read of an Unpack's or Split's
buffer, or each value a buffer held in turn when TF forwarded it in place.
The "moved bytes" simulation (``simulator.simulate(..., copy_bytes=...)``,
columns ``sim_time_moved_s``, ``copy_bytes_moved``) prices each copy at what
the rewritten graph copies; memory stays the buffer's.  ``sim_time_s`` is the
planner's own prediction (buffer bytes).

Calibrated step time.  The profile's op times were scaled once, at profiling
time, to the untraced step of that moment; the shared machine's speed drifts
after that.  Each plan's runs are followed by runs of the unmodified graph in
the same session (``reference_time_s``), so for each plan the "calibrated"
simulation re-simulates the same plan with every compute op's time multiplied
by c = measured unmodified step / simulated unmodified step (``calibration``
column) and the copies at the bytes moved, the link's copy times unchanged
(the emulated link sleeps: it does not drift with the machine's speed);
``sim_time_calibrated_buffers_s``: the same at the buffers' bytes.  With
``--link-latency L`` (``benchmarks/link_latency.py`` measures it) one more
calibrated simulation charges L per copy the rewritten graph makes
(``sim_time_calibrated_latency_s``; ``copies_rewritten``).  The raw
(uncalibrated) columns stay.

Issue order.  The planner's simulator runs each direction's copies in the
plan's order (sorted by first reader), a copy that is not ready holding up
the ones after it; TensorFlow runs a swap op once its inputs and control
inputs are done, and the link (or a GPU's copy engine) takes copies in the
order they were issued, so a copy needed later but triggered earlier goes
first.  ``sim_time_ready_s``: the calibrated, moved-bytes simulation with
``simulator.simulate(..., copy_order="ready")``, ``--link-latency`` per copy
as a completion delay (the emulated link reserves a copy's bytes when the op
runs and completes it from a timer thread; the next copy's bytes do not wait
for that), and ``--issue-cost`` seconds of compute per copy the rewritten
graph makes (the swap op's CPU work on the cores the compute uses;
``benchmarks/link_latency.py --overhead`` measures it).

Peaks: ``sim_live_peak_bytes`` adds the small-tensor pool's peak to the pool
buffers' live peak; ``sim_live_timed_peak_bytes``
(``simulator.live_peak_bytes_timed``) counts the small buffers live when they
are, which is what TF's allocator holds (the unrolled LSTM: see RESULTS.md).
Since c comes from a measurement next to the plan's own runs, the calibrated
error measures the model of swapping (stalls, overlap, the executor's cost of
the added ops), not the absolute compute speed, which no model here predicts.

Writes ``fidelity.csv`` (one row per individual) and prints the per-model
Markdown table (``research.fidelity``: errors are (measured -
simulated) / measured; "orders kept" as in the paper's Fig. 11).
"""

import argparse
import csv
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfswap.tf import emulate  # noqa: E402

emulate.setup()

import numpy as np  # noqa: E402

from tfswap import zoo  # noqa: E402
from tfswap.tf import lower as tf_lower
from tfswap.core.infeasible import Infeasible  # noqa: E402
from tfswap.core import simulator  # noqa: E402
from research import fidelity  # noqa: E402
from tfswap.core.compiled import CompiledGraph  # noqa: E402
from tfswap.core.devices import cpu_emulated  # noqa: E402
from tfswap.core.planner import plan_swaps  # noqa: E402
from tfswap.core.simulator import PlanError  # noqa: E402
from tfswap.core.search import random_individuals  # noqa: E402
from tfswap.tf import capture, measure, rewrite  # noqa: E402
from tfswap.tf.finish import finish  # noqa: E402
from tfswap.tf import profile as profiler  # noqa: E402
from tfswap.tf.profile import _node_nanos  # noqa: E402

# Sizes whose step runs in well under a second here, with activations (not
# parameters, which stay on the device) making most of the peak.  "cnn" is a
# chain: its random individuals make one plan; "inception" has branches.
MODELS = {
    "cnn": lambda: zoo.cnn(batch=32, image=32),
    "inception": lambda: zoo.inception(batch=16, image=32),
    "bert": lambda: zoo.bert(batch=16, seq=128, dim=128, layers=2),
    "lstm": lambda: zoo.lstm(batch=16, steps=24, features=32, units=64, layers=4),
}
FIELDS = ("model", "individual", "draws", "swaps", "swap_out_bytes", "ideal_time_s",
          "sim_time_s", "measured_time_s", "measured_times_s", "sim_pool_peak_bytes",
          "sim_live_peak_bytes", "measured_peak_bytes", "budget_bytes",
          "unmodified_peak_bytes", "unmodified_time_s", "time_scale", "reference_time_s",
          "measured_ratio", "sim_ratio", "swap_kernel_traced_s", "copy_latency_s",
          "copies_on_compute", "sim_time_streams_s", "sim_ratio_streams", "copies",
          "copy_bytes", "link_bytes_per_s", "inter_op_threads", "calibration",
          "sim_time_calibrated_s", "ordered_copies", "sim_time_moved_s", "sim_ratio_moved",
          "copy_bytes_moved", "sim_time_calibrated_buffers_s", "sim_live_timed_peak_bytes",
          "copies_rewritten", "link_latency_s", "sim_time_calibrated_latency_s",
          "sim_time_ready_s", "issue_cost_s")


def study(name: str, count: int, fraction: float, runs: int, threads: int, seed: int,
          calibrate: bool, copy_latency_s: float, copies_on_compute: bool,
          link: float | None = None, ordered: bool = False, link_latency_s: float = 0.0,
          issue_cost_s: float = 0.0):
    """Rows (dicts of FIELDS) for ``count`` random individuals of model ``name``;
    ``link``: the emulated link's bytes/s (None: plain memcpys)."""
    step = MODELS[name]()
    captured = capture.capture(step.concrete_fn)
    # The budget's reference: the unmodified step's peak in TF's order at one
    # executor thread (the order the planner starts from; with two threads and
    # no schedule chain TF runs the LSTM in another order, at half the peak).
    base = measure.run_traced(captured, captured.graph_def, step.batch, runs=2,
                              inter_op_threads=1, untraced_runs=runs)
    base_peak = max(measure.transient_peak(md.step_stats) for md in base.metadata) \
        + base.variable_bytes
    prof = profiler.trace(captured, step.batch, runs=runs, calibrate=calibrate)
    spec = cpu_emulated(copy_latency_s=copy_latency_s, copies_on_compute=copies_on_compute,
                        link_bytes_per_s=link)
    streams = cpu_emulated(link_bytes_per_s=link)
    stage = tf_lower.lower(captured, prof, spec, tf_lower.small_threshold(prof.peak_bytes))
    budget = int(fraction * base_peak)
    planner_budget, outside = tf_lower.planner_budget(budget, stage.lowered, 0.05)
    # The unmodified step as simulated (TF's order, no swaps): what the paired
    # reference runs measure.
    ideal = stage.unconstrained.prediction.step_time_s
    cg = CompiledGraph.build(stage.problem.graph, stage.small, stage.problem.keep)
    # The paired reference run after each plan's runs: the unmodified step.  With
    # more than one executor thread, the unmodified step chained in TF's order
    # (the unconstrained plan, no swaps), so that it runs its ops one at a time
    # like the simulated unmodified step ``ideal`` and the rewritten plans.
    reference = captured.graph_def if threads == 1 else rewrite.rewrite(
        captured, stage.unconstrained, emulate.DEVICE, emulate.HOST).graph_def
    draws = random_individuals(stage.problem.graph, planner_budget, initial_schedule=stage.problem.schedule,
                               keep=stage.problem.keep, small_threshold_bytes=stage.small, seed=seed,
                               compiled=cg)
    rows, drawn = [], 0
    while len(rows) < count:
        schedule, allocation = next(draws)
        drawn += 1
        if drawn > 50 * count:
            raise RuntimeError(f"{name}: the planner rejected {drawn - len(rows)} of {drawn} "
                               "draws; raise --fraction")
        try:
            plan = plan_swaps(stage.problem.graph, planner_budget, spec, schedule=schedule,
                              allocation=allocation, keep=stage.problem.keep,
                              small_threshold_bytes=stage.small, compiled=cg)
        except (Infeasible, PlanError):   # draw another
            continue
        sim = simulator.simulate(stage.problem.graph, plan, spec, events=True, keep=stage.problem.keep,
                                 compiled=cg)
        live = simulator.live_peak_bytes(sim, allocation.small_pool_bytes) + outside
        # The small pool's buffers live when they are (not at their peak throughout).
        live_timed = simulator.live_peak_bytes_timed(sim, cg, plan.schedule) + outside
        sim_streams = simulator.simulate(stage.problem.graph, plan, streams, keep=stage.problem.keep,
                                         compiled=cg).step_time_s
        final = finish(plan, captured, stage.lowered, budget, outside)
        try:
            rewritten = rewrite.rewrite(captured, final, emulate.DEVICE, emulate.HOST,
                                        emulated_link_bytes_per_s=link,
                                        ordered_copies=ordered)
        except rewrite.RewriteError as err:   # counted in "draws"; see RESULTS.md
            print(f"  {name}: rewrite refused a plan: {str(err)[:200]}", flush=True)
            continue
        # Two traced runs for the peak; the step time from untraced runs
        # (FULL_TRACE slows the kernels), alternating with them.
        traced = measure.run_traced(captured, rewritten.graph_def, step.batch, runs=2,
                                    inter_op_threads=threads, untraced_runs=runs,
                                    reference_graph_def=reference)
        ratio = float(np.median(np.array(traced.untraced_times_s)
                                / np.array(traced.reference_times_s)))
        # What the rewrite moves: the planner prices a swap at its buffer's bytes,
        # the rewrite copies the values read after the gap (tfswap.tf.tensor_swaps):
        # slices of an Unpack's buffer, or each value an in-place buffer held.
        ids = {sw.id for sw in plan.swaps}
        moved, parts = {}, {}
        for part in final.swaps:
            orig = part.id if part.id in ids else part.id.rsplit("|", 1)[0]
            moved[orig] = moved.get(orig, 0) + stage.lowered.graph.tensor(part.tensor).nbytes
            parts[orig] = parts.get(orig, 0) + 1
        sim_moved = simulator.simulate(stage.problem.graph, plan, spec, keep=stage.problem.keep, compiled=cg,
                                       copy_bytes=moved)
        # Calibrated: the same plan, compute ops at the speed the unmodified
        # step ran at next to this plan's runs; copies at the link's rate.
        calibration = float(np.median(traced.reference_times_s)) / ideal
        scaled = dataclasses.replace(cg, op_time=cg.op_time * calibration)
        sim_calibrated = simulator.simulate(stage.problem.graph, plan, spec, keep=stage.problem.keep,
                                            compiled=scaled, copy_bytes=moved).step_time_s
        sim_calibrated_buffers = simulator.simulate(stage.problem.graph, plan, spec, keep=stage.problem.keep,
                                                    compiled=scaled).step_time_s
        # ... and each copy the rewritten graph makes paying the emulated link's
        # measured per-copy cost (benchmarks/link_latency.py), if given.
        sim_calibrated_latency = simulator.simulate(
            stage.problem.graph, plan, dataclasses.replace(spec, copy_latency_s=link_latency_s),
            keep=stage.problem.keep, compiled=scaled, copy_bytes=moved,
            copy_parts=parts).step_time_s if link_latency_s else float("nan")
        # ... and the copies in the order TF issues them (each when its swap op
        # is ready), the latency delaying each copy's completion, not its link.
        sim_ready = simulator.simulate(
            stage.problem.graph, plan, dataclasses.replace(spec, copy_latency_s=link_latency_s),
            keep=stage.problem.keep, compiled=scaled, copy_bytes=moved, copy_parts=parts,
            copy_order="ready", issue_cost_s=issue_cost_s).step_time_s \
            if not copies_on_compute else float("nan")
        copies_rewritten = sum(bool(n) for sw in rewritten.swaps
                               for n in (sw.swap_out, sw.swap_in))
        peak = max(measure.transient_peak(md.step_stats) for md in traced.metadata)
        swap_nodes = {n for sw in rewritten.swaps for n in (sw.swap_out, sw.swap_in) if n}
        swap_kernel = float(np.median([sum(
            _node_nanos(node)[1] for dev in md.step_stats.dev_stats for node in dev.node_stats
            if node.node_name in swap_nodes) * 1e-9 for md in traced.metadata]))
        rows.append(dict(
            model=name, individual=len(rows), draws=drawn, swaps=len(plan.swaps),
            swap_out_bytes=plan.prediction.swap_out_bytes,
            ideal_time_s=plan.prediction.ideal_time_s, sim_time_s=plan.prediction.step_time_s,
            measured_time_s=float(np.median(traced.untraced_times_s)),
            measured_times_s=" ".join(f"{t:.6f}" for t in traced.untraced_times_s),
            sim_pool_peak_bytes=final.prediction.peak_bytes, sim_live_peak_bytes=live,
            measured_peak_bytes=peak + traced.variable_bytes, budget_bytes=budget,
            unmodified_peak_bytes=base_peak,
            unmodified_time_s=float(np.median(base.untraced_times_s)),
            time_scale=prof.time_scale,
            reference_time_s=float(np.median(traced.reference_times_s)),
            measured_ratio=ratio, sim_ratio=plan.prediction.step_time_s / ideal,
            swap_kernel_traced_s=swap_kernel, copy_latency_s=copy_latency_s,
            copies_on_compute=int(copies_on_compute), sim_time_streams_s=sim_streams,
            sim_ratio_streams=sim_streams / ideal,
            copies=sum(e.stream != "compute" for e in sim.events),
            copy_bytes=sim.h2d_bytes + sim.d2h_bytes, link_bytes_per_s=link or 0.0,
            inter_op_threads=threads, calibration=calibration, ordered_copies=int(ordered),
            sim_time_calibrated_s=sim_calibrated, sim_time_moved_s=sim_moved.step_time_s,
            sim_ratio_moved=sim_moved.step_time_s / ideal,
            copy_bytes_moved=sim_moved.h2d_bytes + sim_moved.d2h_bytes,
            sim_time_calibrated_buffers_s=sim_calibrated_buffers,
            sim_live_timed_peak_bytes=live_timed, copies_rewritten=copies_rewritten,
            link_latency_s=link_latency_s or 0.0,
            sim_time_calibrated_latency_s=sim_calibrated_latency,
            sim_time_ready_s=sim_ready, issue_cost_s=issue_cost_s))
        r = rows[-1]
        print(f"  {name} #{r['individual']:2d}: {r['swaps']:3d} swaps, sim "
              f"{r['sim_time_s'] * 1e3:8.2f} ms, measured {r['measured_time_s'] * 1e3:8.2f} ms"
              f" (x{ratio:.3f} of unmodified, sim x{r['sim_ratio']:.3f}; calibrated x{calibration:.2f}"
              f" {sim_calibrated * 1e3:.2f} ms; moved bytes {r['copy_bytes_moved']} of"
              f" {r['copy_bytes']}, sim {r['sim_time_moved_s'] * 1e3:.2f} ms; {copies_rewritten} copies,"
              f" calibrated with latency {sim_calibrated_latency * 1e3:.2f} ms,"
              f" issue order {sim_ready * 1e3:.2f} ms);"
              f" live timed {live_timed};"
              f" peak sim live {live} pool {r['sim_pool_peak_bytes']} measured "
              f"{r['measured_peak_bytes']}", flush=True)
    return rows



def _time_columns(c) -> str:
    """Median and max abs time error, orders and pairs kept, as table cells."""
    return (f" {c['median_abs_error']:.1%} | {c['max_abs_error']:.1%} "
            f"| {c['orders_kept']}/{c['n']} | {c['pairs_kept']}/{c['pairs']} |")

def table(rows, streams: bool = False) -> str:
    """The per-model Markdown table; ``streams``: of the simulation without
    copy latency, copies on their own streams (the "streams" columns).  Rows
    with a calibrated simulation (``sim_time_calibrated_s``) also get its time
    error and orders (module docstring), and every table the range of the
    simulated and measured slowdowns (paired)."""
    sim_key, ratio_key = ("sim_time_streams_s", "sim_ratio_streams") if streams \
        else ("sim_time_s", "sim_ratio")
    calibrated = not streams and all(r.get("sim_time_calibrated_s") not in (None, "")
                                     for r in rows)
    head = ("| model | n | budget (% of peak) | median abs time error | max abs time error "
            "| median time error | median abs peak error (live) | max abs peak error (live) "
            "| median abs peak error (pool) | orders kept | pairs kept "
            "| median abs slowdown error (paired) | orders kept (paired) "
            "| pairs kept (paired) | median run spread |")
    moved = not streams and all(r.get("sim_time_moved_s") not in (None, "") for r in rows)
    extra = (" median abs time error (calibrated) | max abs time error (calibrated) "
             "| orders kept (calibrated) | pairs kept (calibrated) |") if calibrated else ""
    extra += (" median abs time error (moved bytes) | orders kept (moved bytes) "
              "| median abs time error (calibrated, buffer bytes) "
              "| orders kept (calibrated, buffer bytes) "
              "| median abs peak error (live, small pool timed) "
              "| max abs peak error (live, small pool timed) |") if moved else ""
    latency = not streams and all(float(r.get("link_latency_s") or 0) > 0 for r in rows)
    extra += (" median abs time error (calibrated, moved bytes, per-copy latency) "
              "| max abs time error (same) | orders kept (same) | pairs kept (same) |") \
        if latency else ""
    ready = not streams and all(np.isfinite(float(r.get("sim_time_ready_s") or "nan"))
                                for r in rows)
    extra += (" median abs time error (calibrated, moved bytes, issue order) "
              "| max abs time error (same) | orders kept (same) | pairs kept (same) |") \
        if ready else ""
    extra += " slowdown sim | slowdown measured |"
    lines = [head + extra, "|" + "---|" * ((head + extra).count("|") - 1)]
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        t = fidelity.summary([r[sim_key] for r in mine],
                             [r["measured_time_s"] for r in mine])
        live = np.abs(fidelity.relative_errors([r["sim_live_peak_bytes"] for r in mine],
                                               [r["measured_peak_bytes"] for r in mine]))
        pool = np.abs(fidelity.relative_errors([r["sim_pool_peak_bytes"] for r in mine],
                                               [r["measured_peak_bytes"] for r in mine]))
        share = mine[0]["budget_bytes"] / mine[0]["unmodified_peak_bytes"]
        slow = np.abs(fidelity.relative_errors([r[ratio_key] for r in mine],
                                               [r["measured_ratio"] for r in mine]))
        # The same ordering question on the slowdowns against the paired runs:
        # the machine's load, which moves the absolute times, mostly cancels.
        paired = fidelity.summary([r[ratio_key] for r in mine],
                                  [r["measured_ratio"] for r in mine])
        spread = np.median([fidelity.spread([float(x) for x in r["measured_times_s"].split()])
                            for r in mine])
        line = (f"| {name} | {t['n']} | {share:.0%} | {t['median_abs_error']:.1%} "
                f"| {t['max_abs_error']:.1%} | {t['median_error']:+.1%} | {np.median(live):.1%} "
                f"| {live.max():.1%} | {np.median(pool):.1%} | {t['orders_kept']}/{t['n']} "
                f"| {t['pairs_kept']}/{t['pairs']} | {np.median(slow):.1%} "
                f"| {paired['orders_kept']}/{t['n']} | {paired['pairs_kept']}/{t['pairs']} "
                f"| {spread:.0%} |")
        if calibrated:
            c = fidelity.summary([r["sim_time_calibrated_s"] for r in mine],
                                 [r["measured_time_s"] for r in mine])
            line += _time_columns(c)
        if moved:
            m = fidelity.summary([r["sim_time_moved_s"] for r in mine],
                                 [r["measured_time_s"] for r in mine])
            b = fidelity.summary([r["sim_time_calibrated_buffers_s"] for r in mine],
                                 [r["measured_time_s"] for r in mine])
            timed = np.abs(fidelity.relative_errors(
                [r["sim_live_timed_peak_bytes"] for r in mine],
                [r["measured_peak_bytes"] for r in mine]))
            line += (f" {m['median_abs_error']:.1%} | {m['orders_kept']}/{m['n']} "
                     f"| {b['median_abs_error']:.1%} | {b['orders_kept']}/{b['n']} "
                     f"| {np.median(timed):.1%} | {timed.max():.1%} |")
        if latency:
            q = fidelity.summary([r["sim_time_calibrated_latency_s"] for r in mine],
                                 [r["measured_time_s"] for r in mine])
            line += _time_columns(q)
        if ready:
            line += _time_columns(fidelity.summary([r["sim_time_ready_s"] for r in mine],
                                                   [r["measured_time_s"] for r in mine]))
        sim_r = [r[ratio_key] for r in mine]
        got_r = [r["measured_ratio"] for r in mine]
        line += (f" {min(sim_r):.2f}-{max(sim_r):.2f} | {min(got_r):.2f}-{max(got_r):.2f} |")
        lines.append(line)
    return "\n".join(lines)


def latency_what_if(row, latency_s):
    """``row`` with its plan's simulated time at ``latency_s`` per copy.  Exact for
    the same plan: with the copies on the compute stream nothing overlaps, so
    the step is the ops plus every copy (tests/core/test_native.py)."""
    if not row.get("copies_on_compute"):
        raise ValueError("--latency-what-if needs rows simulated with copies on the compute "
                         "stream (a fidelity.csv written without --copy-streams)")
    extra = row["copies"] * (latency_s - row["copy_latency_s"])
    sim = row["sim_time_s"] + extra
    return {**row, "sim_time_s": sim, "sim_ratio": sim / (row["sim_time_s"] / row["sim_ratio"]),
            "copy_latency_s": latency_s}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.6)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--inter-op-threads", type=int,
                        help="executor threads (default 1; 2 with --link-bandwidth)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--uncalibrated", action="store_true",
                        help="keep the trace profile's kernel times as traced")
    parser.add_argument("--copy-latency", type=float,
                        help="seconds each copy costs beyond its bytes (copy_latency.py; "
                             "default 15e-6, 0 with --link-bandwidth)")
    parser.add_argument("--link-bandwidth", type=float,
                        help="run on an emulated link of this many bytes/s each way and "
                             "simulate at that rate (copies on their own streams)")
    parser.add_argument("--link-latency", type=float, default=0.0,
                        help="seconds each copy of the rewritten graph costs on the emulated "
                             "link beyond its bytes (benchmarks/link_latency.py): one more "
                             "calibrated column with it")
    parser.add_argument("--issue-cost", type=float, default=0.0,
                        help="seconds of compute each copy of the rewritten graph costs when "
                             "issued (benchmarks/link_latency.py --overhead), in the "
                             "issue-order column")
    parser.add_argument("--ordered-copies", action="store_true",
                        help="rewrite with ordered_copies=True: each direction's copies "
                             "chained in the simulator's stream order")
    parser.add_argument("--copy-streams", action="store_true",
                        help="copies on streams of their own, not on the compute stream")
    parser.add_argument("--latency-what-if", type=float,
                        help="with --table-from: the rows' plans re-timed with this many "
                             "seconds per copy (copies on the compute stream only)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--csv-name", default="fidelity.csv",
                        help="the CSV's file name under --out")
    parser.add_argument("--table-from", type=Path, nargs="+",
                        help="print the table of these CSVs (rows concatenated) and exit")
    args = parser.parse_args()
    if args.table_from:
        rows = [{k: (v if k in ("model", "measured_times_s") else float(v))
                 for k, v in r.items()} for p in args.table_from for r in csv.DictReader(p.open())]
        if args.latency_what_if is not None:
            rows = [latency_what_if(r, args.latency_what_if) for r in rows]
        print(table(rows))
        if "sim_time_streams_s" in rows[0]:
            print("\nThe same runs, simulated with copies on their own streams, no latency:")
            print(table(rows, streams=True))
        return
    link = args.link_bandwidth
    if not 0 <= args.issue_cost < float("inf"):
        parser.error(f"--issue-cost must be a number of seconds >= 0, got {args.issue_cost}")
    if link is not None and not 0 < link < float("inf"):
        parser.error(f"--link-bandwidth must be a positive number of bytes/s, got {link}")
    latency = args.copy_latency if args.copy_latency is not None \
        else (0.0 if link is not None else 15e-6)
    threads = args.inter_op_threads or (2 if link is not None else 1)
    on_compute = not args.copy_streams and link is None
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / args.csv_name
    for name in args.models.split(","):
        t0 = time.perf_counter()
        rows += study(name, args.count, args.fraction, args.runs, threads,
                      args.seed, not args.uncalibrated, latency, on_compute, link,
                      args.ordered_copies, args.link_latency, args.issue_cost)
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
        with path.open("w", newline="") as f:   # after each model: a long run keeps its rows
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    print(table(rows))
    print("\nThe same runs, simulated with copies on their own streams, no latency:")
    print(table(rows, streams=True))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
