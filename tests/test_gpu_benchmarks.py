"""benchmarks/gpu_validate.py and benchmarks/gpu_link.py run on the emulated device
(``--emulated``), as they run on a GPU, on small sizes (issue #19)."""

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

ROOT = Path(__file__).resolve().parents[1]
VALIDATE_COLUMNS = ["model", "batch", "fraction", "budget_bytes", "predicted_peak_bytes",
                    "measured_peak_bytes", "predicted_step_s", "measured_step_s",
                    "unmodified_step_s", "identical", "plan_s"]


def _run(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_gpu_validate_writes_one_row_within_its_budget(tmp_path):
    out = tmp_path / "gpu_validate.csv"
    _run("benchmarks/gpu_validate.py", "--emulated", "--small", "--models", "cnn",
         "--generations", "2", "--workers", "1", "--out", str(out))
    with out.open() as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [dict(zip(header, r)) for r in reader]
    assert header == VALIDATE_COLUMNS
    assert len(rows) == 1
    row = rows[0]
    assert row["model"] == "cnn" and row["batch"] == "16" and float(row["fraction"]) == 0.5
    assert 0 < int(row["measured_peak_bytes"]) <= int(row["budget_bytes"])
    assert int(row["predicted_peak_bytes"]) <= int(row["budget_bytes"])
    assert row["identical"] in ("true", "false")
    assert all(float(row[c]) > 0 for c in ("predicted_step_s", "measured_step_s",
                                           "unmodified_step_s", "plan_s"))
    details = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert details[0]["model"] == "cnn" and "error" not in details[0]
    assert details[0]["optimize_planner"] == "tfswap"   # optimize's default planner
    assert "emulated device" in details[0]["measured_how"]
    # What tells a model error from a run-time effect on a GPU (docs/gpu.md).
    assert "explain_error" not in details[0], details[0].get("explain_error")
    assert details[0]["stats_peak_bytes"] > 0 and details[0]["profile_peak_bytes"] > 0
    for step in ("stats", "profile"):   # the rewritten step's, the unmodified one's
        live = details[0][f"{step}_live_at_peak"]   # by allocating node, the large ones
        assert live and all(b >= 4096 for b in live.values())
        assert sum(live.values()) + details[0][f"{step}_live_small_bytes"] == \
            details[0][f"{step}_live_peak_bytes"] > 0
    assert isinstance(details[0]["executed_added_types"], dict)
    # The row's planning problem is saved (tfswap.core.problem_file), with the measured
    # row: the plan simulates again to its prediction here, without TensorFlow's
    # device (how a GPU's plans are studied on a CPU), and the re-plan command plans it.
    from tfswap.core import problem_file, simulator

    path = Path(details[0]["problem_file"])
    assert path == tmp_path / "gpu_validate_problems" / "gpu_validate.cnn.0.5.json.gz"
    saved = problem_file.read(path)
    assert saved.row["measured_peak_bytes"] == int(row["measured_peak_bytes"])
    assert saved.budget_bytes == int(row["budget_bytes"]) >= saved.planner_budget_bytes
    assert saved.allocator == "exact"   # TF's allocator, the plan verified
    again = simulator.simulate(saved.problem.graph, saved.plan, saved.spec,
                               keep=saved.problem.keep, compiled=saved.problem.compiled)
    assert again.step_time_s == pytest.approx(float(row["predicted_step_s"]), rel=1e-5)
    table = tmp_path / "replan.csv"
    printed = _run("benchmarks/replan.py", str(path), "--planners", "tfswap,tfswap.order",
                   "--generations", "2", "--out", str(table))
    assert "cnn" in printed and "tfswap.order" in printed
    with table.open() as f:
        replanned = list(csv.DictReader(f))
    assert [r["planner"] for r in replanned] == ["tfswap", "tfswap.order"]
    assert all(r["error"] or float(r["vs_ideal"]) >= 1.0 for r in replanned)
    # Merging the CSVs of several calls keeps the columns and the rows.
    merged = tmp_path / "merged.csv"
    _run("benchmarks/gpu_validate.py", "--merge", str(out), str(out), "--out", str(merged))
    with merged.open() as f:
        assert [r for r in csv.reader(f)][0] == VALIDATE_COLUMNS
    assert len(merged.with_suffix(".jsonl").read_text().splitlines()) == 2


def test_gpu_link_writes_each_direction_and_size(tmp_path):
    out = tmp_path / "gpu_link.csv"
    # An emulated link of 1 GB/s: each copy takes 1-4 ms, far above a shared CPU's noise.
    printed = _run("benchmarks/gpu_link.py", "--emulated", "--sizes", "1048576,4194304",
                   "--link-bytes-per-s", "1e9", "--short", "1", "--long", "3", "--repeats",
                   "2", "--out", str(out))
    with out.open() as f:
        rows = list(csv.DictReader(f))
    got = {(r["direction"], r["mode"], int(r["bytes"])) for r in rows}
    assert got == {(d, m, n) for d in ("d2h", "h2d", "duplex") for m in ("chained", "pipelined")
                   for n in (1 << 20, 4 << 20)}
    # Each figure is a difference of two chains' times, which load on the shared
    # cores can move either way (below zero: no line fits, and the script says so);
    # the rate's lower bound is tested on a chain (tests/tf/test_gpu_paths.py).
    assert all(math.isfinite(float(r["per_copy_s"])) for r in rows)
    assert all(f"{d} {m}: latency" in printed or f"{d} {m}: no line fitted" in printed
               for d in ("d2h", "h2d") for m in ("chained", "pipelined"))


def test_gpu_validate_moves_parameters_that_do_not_fit_and_compares_with_a_twin(tmp_path):
    """The "auto" rows (issue #20): the model is built on the device, optimize moves
    its variables to host memory, and an identical model trained by its own
    function is the reference."""
    out = tmp_path / "auto.csv"
    _run("benchmarks/gpu_validate.py", "--emulated", "--small", "--models", "mlp_auto",
         "--generations", "1", "--workers", "1", "--out", str(out))
    details = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    row = details[0]
    assert "error" not in row, row.get("traceback")
    assert row["moved_bytes"] > 0 and row["identical"] is True
    assert row["identical_to_captured_graph"] is True
    assert row["measured_peak_bytes"] <= row["budget_bytes"]


PEERS_COLUMNS = ["model", "policy", "cap_bytes", "largest_batch", "largest_vs_tf",
                 "per_sample_s", "throughput_2x_vs_ideal", "throughput_4x_vs_ideal", "note"]


def test_gpu_peers_finds_each_policys_largest_batch_on_the_emulated_card(tmp_path):
    """Issue #23's benchmark on the emulated device: batches doubling until the
    step's measured peak is over the card, per policy, and the throughput at 2x
    plain TF's largest batch against the unlimited step."""
    out = tmp_path / "peers.csv"
    args = ["benchmarks/gpu_peers.py", "--emulated", "--small", "--models", "lstm4",
            "--policies", "tf,checkpoint,tf_swap,tfswap", "--max-batch", "64",
            "--resolution", "1", "--oversubscription", "2", "--generations", "1",
            "--workers", "1", "--out", str(out)]
    printed = _run(*args)
    with out.open() as f:
        reader = csv.reader(f)
        assert next(reader) == PEERS_COLUMNS
        summary = {r[1]: dict(zip(PEERS_COLUMNS, r)) for r in reader}
    assert set(summary) == {"tf", "checkpoint", "tf_swap", "tfswap"}
    tf_batch = int(summary["tf"]["largest_batch"])
    assert float(summary["tf"]["largest_vs_tf"]) == 1.0
    # Checkpointing is measured, not assumed to help: in a tf.function nothing
    # orders a block's recomputation late, and on the emulated device it saved
    # memory in some runs and not in others (RESULTS.md, issue #23).
    assert summary["checkpoint"]["largest_batch"] == "" or \
        int(summary["checkpoint"]["largest_batch"]) >= 1
    # tfswap swaps what does not fit: at least twice plain TF's batch trains.
    assert int(summary["tfswap"]["largest_batch"]) >= 2 * tf_batch, printed
    assert float(summary["tfswap"]["throughput_2x_vs_ideal"]) > 0
    assert float(summary["tf"]["throughput_2x_vs_ideal"]) == 0   # 2x does not fit plain TF
    # Grappler's swapping acts on GPU devices only: said, not measured as 0.
    assert summary["tf_swap"]["largest_batch"] == ""
    assert "GPU devices only" in summary["tf_swap"]["note"]
    assert summary["tf_swap"]["throughput_2x_vs_ideal"] == ""
    trials = [json.loads(line) for line in
              (tmp_path / "peers.trials.jsonl").read_text().splitlines()]
    cap = trials[0]["cap_bytes"]
    for t in trials:
        if t["capped"] and t.get("trains"):
            assert t["peak_bytes"] <= cap, t
        if t["policy"] in ("tf", "checkpoint") and t["capped"] and not t.get("trains"):
            assert t["out_of_memory"] and f"> the card's {cap} B" in t["error"], t
    assert any(not t["capped"] and t.get("trains") for t in trials)   # the ideal
    # --resume with no time left summarises the same trials without running any.
    printed = _run(*args, "--resume", "--deadline-s", "0")
    assert f"lstm4 tf: largest batch {tf_batch}" in printed
    assert len((tmp_path / "peers.trials.jsonl").read_text().splitlines()) == len(trials)


def test_gradient_checkpointing_trains_as_the_plain_step():
    """research/tf_peers.checkpointed: tf.recompute_grad around each block gives
    the plain step's losses and weights (recomputation repeats the same ops)."""
    import numpy as np

    from research import tf_peers
    from tfswap import zoo

    def build():
        return zoo.bert(batch=4, seq=16, dim=32, heads=2, layers=2, vocab=64)

    plain, checkpointed = build(), build()
    assert [len(b.nodes) for b in tf_peers.blocks(zoo.lstm(layers=3).model)] == [1, 1, 1, 1]
    fn, _ = tf_peers.checkpointed(checkpointed)
    ref = [float(plain.concrete_fn(*plain.batch)["loss"]) for _ in range(2)]
    got = [float(fn(*checkpointed.batch)["loss"]) for _ in range(2)]
    assert got == ref
    for a, b in zip(plain.model.get_weights(), checkpointed.model.get_weights()):
        assert np.array_equal(a, b)


def test_gpu_validate_arena_rows_run_apart_and_compare_with_the_saved_unmodified_training(
        tmp_path):
    """--arena (issue #19, point 6): the unmodified step in one process, which saves
    its training; each row in its own, compared with it.  No GPU here, so no arena
    is installed; the processes and the comparison are what is checked."""
    out = tmp_path / "arena.csv"
    _run("benchmarks/gpu_validate.py", "--emulated", "--small", "--arena", "--models", "cnn",
         "--fractions", "0.5", "--generations", "1", "--workers", "1", "--out", str(out))
    details = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert len(details) == 1
    row = details[0]
    assert "error" not in row, row.get("traceback")
    assert row["arena"] == "none (the emulated device)"
    assert row["budget_bytes"] == int(0.5 * row["unmodified_peak_bytes"])
    assert 0 < row["measured_peak_bytes"] <= row["budget_bytes"]
    assert row["identical"] is True and row["worst_relative_difference"] == 0.0
    assert (tmp_path / "arena.cnn.reference.npz").exists()


def test_replan_weighs_the_planners_optimize_weighed_on_a_saved_h200_problem():
    # BERT-style at 40% on the H200 (2026-11-28): optimize planned in the shared
    # layout, and its plan, made to the bytes the step holds ("exact"), lays out
    # no shared arena. Re-planned as if its layout were disjoint, the default left
    # the byte-cap planner out and gave the search's 51.9 ms, not 45.2 ms.
    import importlib.util

    from tfswap.core import planners, problem_file

    spec = importlib.util.spec_from_file_location("replan", ROOT / "benchmarks" / "replan.py")
    replan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replan)
    saved = problem_file.read(ROOT / "benchmarks/problems/gv_h200_default.bert.0.4.json.gz")
    assert saved.allocator == "exact" and not saved.plan.allocation.shared
    options = replan.options_for("tfswap", saved, generations=1)
    assert options["layout"] == "shared"
    result = planners.run("tfswap", saved.problem, saved.planner_budget_bytes, saved.spec,
                          **options)
    weighed = {c.planner: c for c in result.candidates}
    assert weighed["tfswap.bytes"].step_time_s is not None
    assert result.plan.prediction.step_time_s == min(
        c.step_time_s for c in result.candidates if c.step_time_s is not None)
    assert result.plan.prediction.step_time_s < weighed["tfswap.ga"].step_time_s
    # Scaled to the measured unmodified step (the profile was calibrated with one
    # executor thread there), the ops add up to that step.
    path = ROOT / "benchmarks/problems/gv_h200_default.bert.0.4.json.gz"
    (row,) = replan.rows_of(path, ["tfswap.order"], generations=1, scale=True)
    assert row["time_scale"] < 1.0 and row["saved_predicted_step_s"] > 0
    assert row["ideal_s"] == pytest.approx(saved.row["unmodified_step_s"], rel=1e-9)


def test_first_step_fits_with_swapcallback_as_plain_fit_within_its_budget(tmp_path):
    """Issue #41 item 4's row, on the emulated device (on a GPU the same script fits
    there under op determinism): plain fit and fit with SwapCallback's defaults,
    the same history and weights, every plan that ran measured within the budget."""
    out = tmp_path / "first_step.jsonl"
    printed = _run("benchmarks/first_step.py", "--runs", "1", "--search-time", "2",
                   "--out", str(out))
    row = json.loads(out.read_text().splitlines()[0])
    assert row["device"] == "emulated" and row["identical"], printed
    assert row["within_budget"] and row["worst_measured_peak_bytes"] <= row["budget_bytes"]
    assert 0 < row["first_step_s"] and row["functions"]
