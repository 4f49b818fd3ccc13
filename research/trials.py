"""What the GPU benchmarks share: timing a step, running one child process per
piece of work and reading its rows back, writing rows as CSV + JSON lines.

A child prints each result as one line ``ROW_MARK + json``; anything else it
prints is passed through, its stderr goes to a log file.  A child that dies
(out of memory in CUDA, a timeout) still returns the rows it printed.

Example::

    rows, failure = run_child([sys.executable, "bench.py", "--child", "x"], env, log, 300)
    write_rows(rows, Path("out.csv"), ("model", "batch"))
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import time
from pathlib import Path

ROW_MARK = "TFSWAP_BENCH_ROW "


def sync(outputs) -> None:
    """Wait until ``outputs`` are computed (one scalar read per tensor)."""
    import tensorflow as tf

    for t in tf.nest.flatten(outputs):
        if isinstance(t, tf.Tensor):
            tf.reduce_sum(tf.reshape(t, [-1])[:1]).numpy()


def step_time(fn, batch, variables, steps: int, repeats: int) -> float:
    """Median seconds per step over ``repeats`` timings of ``steps`` consecutive steps
    (one scalar read at the end of each), after one untimed step; variables put back."""
    saved = [v.numpy() for v in variables]
    try:
        sync(fn(*batch))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = None
            for _ in range(steps):
                out = fn(*batch)
            sync(out)
            times.append((time.perf_counter() - start) / steps)
    finally:
        for v, value in zip(variables, saved):
            v.assign(value)
    return float(statistics.median(times))


def emit(row: dict) -> None:
    """Print ``row`` for the parent (from a child process)."""
    print(ROW_MARK + json.dumps(row, default=str), flush=True)


def run_child(cmd, env, log: Path, timeout_s: float | None, cwd=None):
    """Run ``cmd``; (rows it emitted, None or why it failed).  Its stderr is
    appended to ``log``, its other output printed."""
    with log.open("a") as err:
        err.write(f"==== {' '.join(map(str, cmd))}\n")
        err.flush()
        try:
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                  env=env, cwd=cwd, timeout=timeout_s)
            stdout = done.stdout
            failure = f"exit status {done.returncode}" if done.returncode else None
        except subprocess.TimeoutExpired as timeout:
            stdout = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else \
                (timeout.stdout or "")
            failure = f"timed out after {timeout_s} s"
    rows = []
    for line in stdout.splitlines():
        if line.startswith(ROW_MARK):
            rows.append(json.loads(line[len(ROW_MARK):]))
        else:
            print(line, flush=True)
    return rows, failure


def _cell(row, column):
    value = row.get(column)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_rows(rows, out: Path, columns) -> None:
    """``out`` as CSV of ``columns``, and every row whole in ``out``'s ``.jsonl``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row, c) for c in columns])
    with out.with_suffix(".jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")


def read_rows(path: Path) -> list[dict]:
    """The rows of a CSV written by :func:`write_rows`, whole from its .jsonl if there."""
    details = path.with_suffix(".jsonl")
    if details.exists():
        return [json.loads(line) for line in details.read_text().splitlines() if line]
    with path.open() as f:
        return list(csv.DictReader(f))
