"""The op library's loader: build stamps, the installed library vs the cache
copy, and the ops called from a tf.function (no AutoGraph conversion)."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfswap import ops
from tfswap.ops import build

REPO = Path(__file__).resolve().parents[2]


def test_stamp_records_tf_version_and_sources(tmp_path):
    lib = tmp_path / "lib.so"
    build.write_stamp(lib, "2.21.0")
    assert build.read_stamp(lib) == ("2.21.0", build.source_digest())


def test_missing_or_old_format_stamp_reads_as_none(tmp_path):
    lib = tmp_path / "lib.so"
    assert build.read_stamp(lib) is None
    build.stamp_path(lib).write_text("2.21.0\n")   # tfswap <= 0.1 recorded only this
    assert build.read_stamp(lib) is None


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """An installed library path under tmp_path, the cache under tmp_path/cache,
    and a compiler that records what it was asked to build."""
    installed = tmp_path / "site" / "_tfswap_ops.so"
    installed.parent.mkdir()
    installed.write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(ops, "installed_library", lambda: installed)
    built = []

    def compile_library(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"")
        built.append(out)
        return out

    monkeypatch.setattr(ops, "compile_library", compile_library)
    return installed, built


def test_stamped_installed_library_is_used_without_compiling_or_logging(fake_build, caplog):
    installed, built = fake_build
    build.write_stamp(installed, "2.21.0")
    with caplog.at_level(logging.DEBUG, logger="tfswap"):
        assert ops.library_for("2.21.0") == installed
    assert built == [] and caplog.records == []


@pytest.mark.parametrize("stamp, reason", [
    (None, "no build stamp"),
    ("2.20.0 {digest}", "built for TensorFlow 2.20.0"),
    ("2.21.0 000000000000", "other sources"),
])
def test_mismatched_installed_library_is_compiled_into_the_cache_once(
        fake_build, caplog, stamp, reason):
    installed, built = fake_build
    if stamp is not None:
        build.stamp_path(installed).write_text(stamp.format(digest=build.source_digest()))
    with caplog.at_level(logging.DEBUG, logger="tfswap"):
        first = ops.library_for("2.21.0")
        second = ops.library_for("2.21.0")
    assert first == second == ops.cache_library("2.21.0") and built == [first]
    [note] = caplog.records     # one note, for the one compile
    assert reason in note.getMessage() and "\n" not in note.getMessage()


def test_no_installed_library_is_compiled_at_first_use(fake_build, monkeypatch, caplog):
    _, built = fake_build
    monkeypatch.setattr(ops, "installed_library", lambda: None)
    with caplog.at_level(logging.DEBUG, logger="tfswap"):
        assert ops.library_for("2.21.0") == ops.cache_library("2.21.0") == built[0]
    [note] = caplog.records
    assert "none was built at install time" in note.getMessage()


# TensorFlow from here on.

def _tf():
    return pytest.importorskip("tensorflow")


def test_fresh_process_loads_the_installed_library_silently(tmp_path):
    """After `make` / `pip install -e .` the in-tree library is stamped: loading
    it compiles nothing into the cache and prints nothing of tfswap's."""
    _tf()
    if ops.installed_library() is None:
        pytest.skip("no installed op library (TensorFlow absent at install time)")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", "import tfswap.ops as o; print(o.library_path())"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(ops.installed_library()), (
        "the installed op library was not used; rebuild it (make, or pip install -e .)")
    assert "tfswap" not in proc.stderr
    assert not (tmp_path / "cache" / "tfswap").exists()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_ops_in_a_tf_function_are_not_converted_by_autograph():
    tf = _tf()
    records = _Records()
    tf_logger = logging.getLogger("tensorflow")   # AutoGraph warns there
    tf_logger.addHandler(records)
    try:
        @tf.function
        def step(x):
            ops.load()
            host = ops.swap_out(x * 2.0)
            return ops.swap_in(host) + 1.0

        out = step(tf.constant([1.0, 2.0, 3.0]))
    finally:
        tf_logger.removeHandler(records)
    np.testing.assert_array_equal(out.numpy(), [3.0, 5.0, 7.0])
    assert not [m for m in records.messages if "AutoGraph" in m]
