"""Reports on a plan: a text table, a Chrome trace, a device-memory picture.

Everything here reads a :class:`~tfswap.core.plan.Plan` and, for the trace
and the picture, the simulator's timeline of that plan on a graph and a
device (:func:`tfswap.core.simulator.simulate` with ``events=True``).  No
TensorFlow; matplotlib only inside :func:`plot_memory` (the optional extra
``pip install tfswap[plot]``).

Example::

    print(summary(fast.plan, search=fast.search))
    timeline = simulate_timeline(fast.graph, fast.plan, fast.spec, keep=fast.keep)
    write_chrome_trace("step.trace.json", timeline)   # open in ui.perfetto.dev
    plot_memory("step.memory.png", timeline, budget_bytes=fast.budget_bytes)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import SWAP_KINDS, Plan
from tfswap.core.allocation import default_allocation
from tfswap.core.simulator import SimResult, simulate

STREAMS = ("compute", "h2d", "d2h")
STREAM_TITLES = {"compute": "compute", "h2d": "H2D (host -> device)",
                 "d2h": "D2H (device -> host)"}
HISTORY_ROWS = 6   # generations shown in the summary's search table


class PlotUnavailable(ImportError):
    """matplotlib is not installed; the message says how to install it."""


def human_bytes(nbytes: int | float | None) -> str:
    """1536 -> '1.50 KiB'; binary units, two decimals; '-' for None."""
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def swap_counts(plan: Plan) -> dict[str, int]:
    """Swaps of each kind (every kind listed, zeros included)."""
    counts = {k: 0 for k in SWAP_KINDS}
    for s in plan.swaps:
        counts[s.kind] += 1
    return counts


def summary(plan: Plan, *, search=None, graph: DataflowGraph | None = None,
            title: str | None = None, budget_bytes: int | None = None,
            measured_peak_bytes: int | None = None, measured_on: str | None = None,
            notes: Sequence[str] = ()) -> str:
    """A readable table of what ``plan`` does and what it is predicted to cost.

    Rows: step time predicted vs ideal, device peak vs budget (and the
    measured peak when known), bytes each way, swaps by kind, the tensors
    recomputed and what they cost, resident parameters (their bytes when
    ``graph`` is given), and, with ``search``
    (a :class:`tfswap.core.search.SearchResult`), the search's history.

    Example::

        print(summary(plan))
    """
    pred = plan.prediction
    budget = budget_bytes if budget_bytes is not None else plan.budget_bytes
    lines = [title or f"tfswap plan {plan.id} ({plan.planner}), {len(plan.schedule)} ops"]
    ratio = (f"{pred.step_time_s / pred.ideal_time_s:.3f} x ideal"
             if pred.step_time_s is not None and pred.ideal_time_s else "")
    rows = [("", "predicted", "reference", ""),
            ("step time", _ms(pred.step_time_s), _ms(pred.ideal_time_s),
             f"ideal (no memory limit); {ratio}" if ratio else "ideal (no memory limit)"),
            ("device peak", human_bytes(pred.peak_bytes), human_bytes(budget),
             "budget" + (f"; {100 * pred.peak_bytes / budget:.0f}% used"
                         if pred.peak_bytes is not None and budget else ""))]
    if measured_peak_bytes is not None:
        rows.append(("measured peak", human_bytes(measured_peak_bytes), human_bytes(budget),
                     "budget; measured on the device"))
    rows += [("device -> host", human_bytes(pred.swap_out_bytes), "", "swapped out"),
             ("host -> device", human_bytes(pred.swap_in_bytes), "", "swapped in")]
    lines += _table(rows)
    if measured_peak_bytes is not None and measured_on:
        lines.append(f"  measured peak: {measured_on}")
    counts = swap_counts(plan)
    kinds = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items() if n)
    lines.append(f"  swaps: {len(plan.swaps)}" + (f" ({kinds})" if kinds else ""))
    lines += _recompute_lines(plan, graph)
    resident = len(plan.resident_parameters)
    if graph is not None and resident:
        names = set(plan.resident_parameters)
        nbytes = sum(t.nbytes for t in graph.tensors if t.name in names)
        lines.append(f"  resident parameters: {resident} ({human_bytes(nbytes)}) stay on the "
                     "device")
    elif resident:
        lines.append(f"  resident parameters: {resident} stay on the device")
    if plan.allocation is not None:
        a = plan.allocation
        lines.append(f"  memory pool: {len(a.class_bytes)} size classes, "
                     f"{sum(a.class_count)} objects, {human_bytes(a.pool_bytes)} "
                     f"({'shared' if a.shared else 'disjoint'} layout) + small-tensor "
                     f"pool {human_bytes(a.small_pool_bytes)}")
    if search is not None:
        lines += _search_lines(search)
    lines += [f"  note: {n}" for n in notes]
    return "\n".join(lines)


# Recomputed tensors named in the summary; the rest are counted.
LISTED_RECOMPUTES = 5


def _recompute_lines(plan: Plan, graph: DataflowGraph | None) -> list[str]:
    """What is made again instead of moved: how much, what it costs the compute
    stream (with ``graph``: its ops' times), the largest first."""
    recs = [s for s in plan.swaps if s.kind == "recompute"]
    if not recs:
        return []
    cost = {}
    if graph is not None:
        times = {op.name: op.time_s for op in graph.ops}
        cost = {s.id: sum(times.get(op, 0.0) for op in (s.ops or (s.tensor.rpartition(":")[0],)))
                for s in recs}
    total = human_bytes(sum(s.bytes for s in recs))
    head = f"  recomputed: {len(recs)} tensors, {total} not moved"
    if cost:
        head += f", {_ms(sum(cost.values()))} of ops run again"
    lines = [head]
    for s in sorted(recs, key=lambda s: -s.bytes)[:LISTED_RECOMPUTES]:
        ops = f"{len(s.ops)} ops" if len(s.ops) > 1 else "1 op"
        took = f", {_ms(cost[s.id])}" if s.id in cost else ""
        lines.append(f"    {s.tensor} ({human_bytes(s.bytes)}; {ops}{took})")
    if len(recs) > LISTED_RECOMPUTES:
        lines.append(f"    ... and {len(recs) - LISTED_RECOMPUTES} more")
    return lines


def _search_lines(search) -> list[str]:
    rounds = getattr(search, "pool_rounds", 1)
    over = f" over {rounds} pool sizes (the table: the chosen one's)" if rounds > 1 else ""
    lines = [f"  search: {search.generations} generations, {search.evaluations} simulations"
             f"{over}, stopped on {search.stopped_because}; heuristic plan "
             f"{_ms(search.heuristic_time_s)}"]
    history = list(search.history)
    if not history:
        return lines
    if len(history) > HISTORY_ROWS:  # evenly spaced, first and last always shown
        step = (len(history) - 1) / (HISTORY_ROWS - 1)
        history = [history[round(i * step)] for i in range(HISTORY_ROWS)]
    rows = [("generation", "elapsed", "simulations", "best", "mean", "worst")]
    rows += [(str(h.generation), f"{h.elapsed_s:.1f} s", str(h.evaluations),
              _ms(h.best_time_s), _ms(h.mean_time_s), _ms(h.worst_time_s)) for h in history]
    return lines + _table(rows, indent="    ")


@dataclass(frozen=True)
class Timeline:
    """The simulated step: stream events and device bytes in use over time.

    ``memory``: (seconds, bytes in use) after each change, starting at 0 s;
    bytes count pool objects at their class size plus the small-tensor pool,
    as the simulator's peak does.
    """
    result: SimResult
    memory: tuple[tuple[float, int], ...]
    title: str = ""

    @property
    def peak_bytes(self) -> int:
        return self.result.peak_bytes


def simulate_timeline(graph: DataflowGraph, plan: Plan, spec: DeviceSpec, *,
                      keep: Sequence[str] = (), title: str = "") -> Timeline:
    """Simulate ``plan`` with events and build its memory curve.

    ``keep``: tensors live to the end of the step (the step's outputs and
    assigned variables), as the plan was made with.
    """
    alloc = plan.allocation
    compiled = None
    if alloc is None:  # a version-1 plan: the pool the simulator would assume, made explicit
        compiled = CompiledGraph.build(graph, 1 << 20, keep)
        alloc = default_allocation(compiled, compiled.order_of(plan.schedule),
                                   budget_bytes=np.iinfo(np.int64).max)
    result = simulate(graph, plan, spec, events=True, keep=keep, allocation=alloc,
                      compiled=compiled)
    used = alloc.small_pool_bytes
    memory = [(0.0, used)]
    for e in result.allocation_events:
        size = alloc.class_bytes[e.size_class]
        used += size if e.is_alloc else -size
        if memory[-1][0] == e.time_s:
            memory[-1] = (e.time_s, used)
        else:
            memory.append((e.time_s, used))
    memory.append((result.step_time_s, memory[-1][1]))
    return Timeline(result, tuple(memory), title or f"tfswap plan {plan.id} on {spec.name}")


def chrome_trace(timeline: Timeline) -> dict:
    """The timeline in Chrome's Trace Event Format (a JSON object).

    One process, three threads -- compute, H2D, D2H -- of complete ("X")
    events in microseconds, and a "device memory" counter track.
    """
    pid = 1
    tids = {s: i + 1 for i, s in enumerate(STREAMS)}
    events: list[dict] = [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
                           "args": {"name": timeline.title}}]
    for stream, tid in tids.items():
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                       "args": {"name": STREAM_TITLES[stream]}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}})
    for e in timeline.result.events:
        args = {"bytes": e.nbytes} if e.nbytes else {}
        events.append({"ph": "X", "pid": pid, "tid": tids[e.stream], "name": e.name,
                       "cat": e.stream, "ts": e.start_s * 1e6,
                       "dur": (e.end_s - e.start_s) * 1e6, "args": args})
    for t, nbytes in timeline.memory:
        events.append({"ph": "C", "pid": pid, "tid": 0, "name": "device memory",
                       "ts": t * 1e6, "args": {"MiB": nbytes / 2**20}})
    r = timeline.result
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step_time_s": r.step_time_s, "ideal_time_s": r.ideal_time_s,
                          "peak_bytes": r.peak_bytes, "h2d_bytes": r.h2d_bytes,
                          "d2h_bytes": r.d2h_bytes, "stall_s": r.stall_s}}


def write_chrome_trace(path: str | Path, timeline: Timeline) -> Path:
    """Write :func:`chrome_trace` to ``path``; open it in ui.perfetto.dev or chrome://tracing."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(timeline)))
    return path


def plot_memory(path: str | Path, timeline: Timeline, *, budget_bytes: int | None = None,
                dpi: int = 120) -> Path:
    """A PNG of device memory over the step against the budget, above the three streams.

    Needs matplotlib (``pip install tfswap[plot]``); raises
    :class:`PlotUnavailable` saying so when it is missing.
    """
    try:
        import matplotlib
    except ImportError as err:
        raise PlotUnavailable("plot_memory needs matplotlib: pip install 'tfswap[plot]' "
                              "(or pip install matplotlib)") from err
    matplotlib.use("Agg", force=False)  # files only; never opens a window
    from matplotlib.figure import Figure

    path = Path(path)
    r = timeline.result
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    mem_ax, lane_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    times = [t * 1e3 for t, _ in timeline.memory]
    mib = [b / 2**20 for _, b in timeline.memory]
    mem_ax.step(times, mib, where="post", color="tab:blue", label="device memory (simulated)")
    mem_ax.fill_between(times, mib, step="post", color="tab:blue", alpha=0.15)
    mem_ax.axhline(r.peak_bytes / 2**20, color="tab:blue", linestyle=":", linewidth=1,
                   label=f"peak {human_bytes(r.peak_bytes)}")
    if budget_bytes is not None:
        mem_ax.axhline(budget_bytes / 2**20, color="tab:red", linestyle="--",
                       label=f"budget {human_bytes(budget_bytes)}")
    mem_ax.set_ylabel("MiB on the device")
    mem_ax.set_ylim(bottom=0)
    mem_ax.legend(loc="upper right", fontsize="small")
    mem_ax.set_title(f"{timeline.title}: step {r.step_time_s * 1e3:.2f} ms "
                     f"(ideal {r.ideal_time_s * 1e3:.2f} ms), "
                     f"{human_bytes(r.d2h_bytes)} out, {human_bytes(r.h2d_bytes)} in",
                     fontsize="medium")
    colors = {"compute": "tab:gray", "h2d": "tab:green", "d2h": "tab:orange"}
    for lane, stream in enumerate(reversed(STREAMS)):
        spans = [(e.start_s * 1e3, (e.end_s - e.start_s) * 1e3) for e in r.events
                 if e.stream == stream]
        lane_ax.broken_barh(spans, (lane + 0.1, 0.8), color=colors[stream])
    lane_ax.set_yticks([i + 0.5 for i in range(len(STREAMS))],
                       [STREAM_TITLES[s].split(" ")[0] for s in reversed(STREAMS)])
    lane_ax.set_xlabel("time in the step (ms, simulated)")
    lane_ax.set_xlim(0, max(r.step_time_s * 1e3, 1e-6))
    fig.savefig(path, dpi=dpi)
    return path


__all__ = ["PlotUnavailable", "Timeline", "chrome_trace", "human_bytes", "plot_memory",
           "simulate_timeline", "summary", "swap_counts", "write_chrome_trace"]
