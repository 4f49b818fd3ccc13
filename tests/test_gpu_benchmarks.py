"""benchmarks/gpu_validate.py and benchmarks/gpu_link.py run on the emulated device
(``--emulated``), as they run on a GPU, on small sizes (issue #19)."""

import csv
import json
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
    assert "emulated device" in details[0]["measured_how"]
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
    got = {(r["direction"], int(r["bytes"])) for r in rows}
    assert got == {(d, n) for d in ("d2h", "h2d", "duplex") for n in (1 << 20, 4 << 20)}
    assert all(float(r["per_copy_s"]) > 0 and float(r["bytes_per_s"]) > 0 for r in rows)
    assert "d2h: latency" in printed and "h2d: latency" in printed


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
