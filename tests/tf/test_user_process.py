"""Planning respects the user's process: a training script without a main guard
calls ``optimize(..., workers=2)`` and its top level runs once (the search scores
candidates in threads; no worker process imports the script again)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import tfswap
    from tfswap import zoo
    from tfswap.tf import emulate

    emulate.setup()
    print("TOP-LEVEL RAN", flush=True)
    step = zoo.cnn(batch=16, image=16)
    fast = tfswap.optimize(step.concrete_fn, memory_budget=int(0.6 * {peak}), generations=2,
                           workers=2, inputs=step.batch)
    assert fast.plan.swaps, "the budget should need swaps"
    assert fast.measured_peak_bytes is not None and fast.measured_peak_bytes <= fast.budget_bytes
    print("OPTIMIZED", len(fast.plan.swaps), flush=True)
""")


def test_a_script_without_main_guard_runs_its_top_level_once(tmp_path):
    from tfswap import zoo
    from tfswap.tf import capture, profile

    step = zoo.cnn(batch=16, image=16)
    peak = profile.trace(capture.capture(step.concrete_fn), step.batch, runs=1).peak_bytes
    script = tmp_path / "train.py"   # no `if __name__ == "__main__":`
    script.write_text(SCRIPT.format(peak=peak))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("TOP-LEVEL RAN") == 1, done.stdout
    assert "OPTIMIZED" in done.stdout
