"""Plan reports: the summary table, the Chrome trace and the memory PNG (no TensorFlow)."""

import json
import struct
import subprocess
import sys

import pytest

from tfswap import report
from tfswap.core import search as ga
from research import synthetic
from tfswap.core.devices import device_spec
from tfswap.core.plan import Plan
from tfswap.core.planner import plan_swaps

SPEC = device_spec("v100-16g-pcie3")


@pytest.fixture(scope="module")
def searched():
    graph = synthetic.layered_training_step(120, seed=1)
    need = plan_swaps(graph, 1 << 62, SPEC).prediction.peak_bytes
    result = ga.plan(graph, need // 2, SPEC,
                     config=ga.SearchConfig(time_budget_s=None, max_generations=8, workers=1))
    return graph, need // 2, result


def test_summary_lists_times_peak_bytes_swaps_and_history(searched):
    graph, budget, result = searched
    plan = result.plan
    text = report.summary(plan, search=result, graph=graph)
    pred = plan.prediction
    assert f"{pred.step_time_s * 1e3:.3f} ms" in text
    assert f"{pred.ideal_time_s * 1e3:.3f} ms" in text
    assert f"{pred.step_time_s / pred.ideal_time_s:.3f} x ideal" in text
    assert report.human_bytes(pred.peak_bytes) in text
    assert report.human_bytes(budget) in text
    assert report.human_bytes(pred.swap_out_bytes) in text
    counts = report.swap_counts(plan)
    assert sum(counts.values()) == len(plan.swaps)
    assert f"swaps: {len(plan.swaps)}" in text
    for kind, n in counts.items():
        if n:
            assert f"{n} {kind.replace('_', ' ')}" in text
    assert f"resident parameters: {len(plan.resident_parameters)}" in text
    assert f"{result.generations} generations" in text
    lines = text.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if "generation  " in line):]
    assert table[0].split() == ["generation", "elapsed", "simulations", "best", "mean", "worst"]
    assert table[1].split()[0] == "0" and table[-1].split()[0] == str(result.generations)
    assert len(table) - 1 <= report.HISTORY_ROWS


def test_summary_of_a_hand_written_plan_without_prediction():
    text = report.summary(Plan(schedule=("a", "b")))
    assert "swaps: 0" in text and "step time" in text and "search" not in text


def test_human_bytes_picks_a_readable_unit():
    assert report.human_bytes(512) == "512 B"
    assert report.human_bytes(1536) == "1.50 KiB"
    assert report.human_bytes(3 * 2**30) == "3.00 GiB"
    assert report.human_bytes(None) == "-"


def test_timeline_memory_curve_reaches_the_simulated_peak(searched):
    graph, budget, result = searched
    timeline = report.simulate_timeline(graph, result.plan, SPEC)
    assert timeline.peak_bytes == result.plan.prediction.peak_bytes
    assert max(b for _, b in timeline.memory) == timeline.peak_bytes <= budget
    times = [t for t, _ in timeline.memory]
    assert times == sorted(times) and times[0] == 0.0
    assert times[-1] == pytest.approx(timeline.result.step_time_s)


def test_chrome_trace_has_compute_h2d_and_d2h_tracks(searched, tmp_path):
    graph, _, result = searched
    path = report.write_chrome_trace(tmp_path / "step.trace.json",
                                     report.simulate_timeline(graph, result.plan, SPEC))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(threads.values()) == sorted(report.STREAM_TITLES.values())
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:  # what Perfetto needs of a complete event
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0
    by_track = {name: [e for e in spans if e["tid"] == tid] for tid, name in threads.items()}
    assert len(by_track["compute"]) == len(result.plan.schedule)
    sim = report.simulate_timeline(graph, result.plan, SPEC).result
    assert sum(e["args"]["bytes"] for e in by_track[report.STREAM_TITLES["h2d"]]) \
        == sim.h2d_bytes > 0
    assert sum(e["args"]["bytes"] for e in by_track[report.STREAM_TITLES["d2h"]]) \
        == sim.d2h_bytes > 0
    compute = sorted(by_track["compute"], key=lambda e: e["ts"])
    for a, b in zip(compute, compute[1:]):  # one op at a time on the compute stream
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-6
    counters = [e for e in events if e["ph"] == "C"]
    assert max(e["args"]["MiB"] for e in counters) == pytest.approx(sim.peak_bytes / 2**20)


def test_version1_plan_gets_a_timeline_with_the_default_pool():
    graph = synthetic.random_dag(__import__("numpy").random.default_rng(3), n_ops=15)
    plan = Plan(schedule=tuple(op.name for op in graph.ops))
    timeline = report.simulate_timeline(graph, plan, SPEC)
    assert timeline.result.h2d_bytes == 0 and timeline.peak_bytes > 0
    assert max(b for _, b in timeline.memory) == timeline.peak_bytes


def test_memory_png_is_written(searched, tmp_path):
    pytest.importorskip("matplotlib")
    graph, budget, result = searched
    path = report.plot_memory(tmp_path / "step.memory.png",
                              report.simulate_timeline(graph, result.plan, SPEC),
                              budget_bytes=result.plan.budget_bytes)
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width >= 800 and height >= 400


def test_without_matplotlib_the_error_says_how_to_install_it(searched, tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from tfswap import report\n"
            "try:\n    report.plot_memory('x.png', None)\n"
            "except report.PlotUnavailable as e:\n    print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path, env={"PYTHONPATH": str(_root())})
    assert "REFUSED" in out.stdout and "pip install 'tfswap[plot]'" in out.stdout


def test_reports_import_neither_tensorflow_nor_matplotlib():
    code = ("import sys, tfswap.report, tfswap.core.plan\n"
            "print(sorted(m for m in ('tensorflow', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(_root())})
    assert out.stdout.strip() == "[]"


def _root():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


def test_summary_of_a_shared_pool_search_says_its_generations_span_pool_sizes(searched):
    graph, budget, _ = searched
    result = ga.plan(graph, budget, SPEC, config=ga.SearchConfig(
        time_budget_s=None, max_generations=4, workers=1, pool_layout="shared"))
    text = report.summary(result.plan, search=result, graph=graph)
    # This graph's arena needs several pool sizes (5, seeded): each ran 4 generations.
    assert result.pool_rounds > 1 and result.generations == 4 * result.pool_rounds
    assert (f"search: {result.generations} generations, {result.evaluations} simulations over "
            f"{result.pool_rounds} pool sizes (the table: the chosen one's)") in text


def test_summary_lists_what_is_recomputed_and_what_it_costs():
    """A plan that makes tensors again says how many, the bytes not moved, the time
    of the ops run again, and names the largest."""
    import dataclasses

    from research.synthetic import layered_training_step
    from tests.core.plan_checks import slow_v100
    from tfswap.core import byte_planner

    spec = slow_v100(1e9, 1.5e9)
    graph = layered_training_step(300, seed=4)
    peak = byte_planner.plan(graph, 1 << 62, spec).prediction.peak_bytes
    plan = byte_planner.plan(graph, int(0.7 * peak), spec,
                             recomputable=[op.name for op in graph.ops])
    recs = [s for s in plan.swaps if s.kind == "recompute"]
    assert recs
    text = report.summary(plan, graph=graph)
    times = {op.name: op.time_s for op in graph.ops}
    run_again = sum(times[op] for s in recs for op in s.ops)
    assert f"recomputed: {len(recs)} tensors, {report.human_bytes(sum(s.bytes for s in recs))} " \
           f"not moved, {run_again * 1e3:.3f} ms of ops run again" in text
    largest = max(recs, key=lambda s: s.bytes)
    assert f"    {largest.tensor} ({report.human_bytes(largest.bytes)}; " in text
    assert "recomputed" not in report.summary(dataclasses.replace(
        plan, swaps=tuple(s for s in plan.swaps if s.kind != "recompute")), graph=graph)
