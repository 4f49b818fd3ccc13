"""The `tfswap` command as a newcomer meets it: help, usage errors, demo, plan."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tfswap import cli

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tfswap.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


def test_help_says_what_tfswap_does_and_where_to_start(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "more device memory than the" in out and "emulated device" in out
    assert "Start with `tfswap demo`" in out
    for command in ("demo", "plan"):
        assert f"    {command}" in out


def test_plan_help_explains_function_budget_and_device(capsys):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = capsys.readouterr().out
    for needle in ("MODULE:FUNCTION", "--budget", "8GiB", "--device-spec", "v100-16g-pcie3",
                   "input_signature", "Examples:", "examples.mlp_step:train_step"):
        assert needle in out


def test_plan_without_a_budget_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "examples.mlp_step:train_step"])
    assert exit_.value.code == 2
    assert "--budget" in capsys.readouterr().err


@pytest.mark.parametrize("target,needle", [
    ("examples.mlp_step", "expected MODULE:FUNCTION"),
    ("no_such_module_xyz:step", "cannot import module 'no_such_module_xyz'"),
    ("json:no_such_step", "module 'json' has no attribute 'no_such_step'"),
    ("missing/dir/step.py:step", "no such file"),
    ("json:__doc__", "not a ConcreteFunction"),
])
def test_bad_targets_say_what_is_wrong(target, needle):
    with pytest.raises(cli.UsageError, match=needle):
        cli.load_function(target)


def test_tf_function_without_input_signature_is_explained(tmp_path, monkeypatch):
    (tmp_path / "unsigned_step.py").write_text(
        "import tensorflow as tf\nstep = tf.function(lambda x: x * 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(cli.UsageError, match="without an input_signature"):
        cli.load_function("unsigned_step:step")


def test_plan_writes_the_plan_trace_and_picture(tmp_path):
    out = tmp_path / "mlp.plan.json"
    done = _run("plan", "examples.mlp_step:train_step", "--budget", "40MiB",
                "--generations", "3", "--workers", "1", "--out", str(out),
                "--trace", str(tmp_path / "mlp.trace.json"), "--plot",
                str(tmp_path / "mlp.memory.png"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "device peak" in done.stdout and "swaps:" in done.stdout
    assert str(out) in done.stdout
    from tfswap.core.plan import Plan

    plan = Plan.load(out)
    assert plan.swaps and plan.budget_bytes == 40 << 20
    trace = json.loads((tmp_path / "mlp.trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    assert (tmp_path / "mlp.memory.png").read_bytes()[:4] == b"\x89PNG"


def test_plan_below_the_working_set_fails_with_the_smallest_budget(tmp_path):
    done = _run("plan", "examples.mlp_step:train_step", "--budget", "4MiB",
                "--generations", "1", "--workers", "1", "--out", str(tmp_path / "p.json"))
    assert done.returncode == 1
    assert "smallest budget that can work is about" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "p.json").exists()


def test_demo_trains_identically_and_says_where_it_wrote(tmp_path):
    done = _run("demo", "--generations", "3", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "identical to the unmodified tf.function" in done.stdout
    # The banner's count is per pool size tried; the report's is all of them.
    assert "3 generations for each pool size" in done.stdout
    total = re.search(r"search: (\d+) generations", done.stdout)
    assert total and int(total[1]) % 3 == 0 and int(total[1]) >= 3
    for name in ("demo.plan.json", "demo.trace.json", "demo.memory.png"):
        assert (tmp_path / name).is_file()
        assert str(tmp_path / name) in done.stdout

