"""The framework-free Profile: validation and versioned JSON (tfswap.core.profile)."""

import json
import subprocess
import sys

import pytest

from tfswap.core.profile import OpProfile, Profile, ProfileFormatError


def sample():
    return Profile(source="trace", device="/device:CPU:0", ops=(
        OpProfile("conv", "Conv2D", time_s=1e-3, output_bytes=(4096,), scratch_bytes=512,
                  source="trace"),
        OpProfile("relu", "Relu", time_s=1e-5, output_bytes=(4096,), aliases=((0, 0),),
                  source="trace"),
    ), executed_order=("conv", "relu"), peak_bytes=8192, runs=3, warmup=1)


def test_json_round_trip(tmp_path):
    prof = sample()
    path = tmp_path / "p.json"
    prof.save(path)
    loaded = Profile.load(path)
    assert loaded == prof
    assert loaded.op("relu").aliases == ((0, 0),)
    assert loaded.total_time_s == pytest.approx(1.01e-3)


def test_loads_without_tensorflow(tmp_path):
    path = tmp_path / "p.json"
    sample().save(path)
    code = ("import sys; from tfswap.core.profile import Profile; "
            f"p = Profile.load({str(path)!r}); assert p.op('conv').scratch_bytes == 512; "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_other_versions_and_files_are_refused():
    body = json.loads(sample().to_json())
    body["format_version"] = 99
    with pytest.raises(ProfileFormatError, match="version 99"):
        Profile.from_json(json.dumps(body))
    with pytest.raises(ProfileFormatError, match="not a tfswap profile"):
        Profile.from_json('{"kind": "tfswap.plan"}')
    with pytest.raises(ProfileFormatError, match="invalid JSON"):
        Profile.from_json("{")


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="time_s must be >= 0"):
        OpProfile("a", "X", time_s=-1.0)
    with pytest.raises(ValueError, match="source"):
        Profile(source="guess", device="x", ops=())
    with pytest.raises(ValueError, match="twice"):
        Profile(source="analytic", device="x", ops=(OpProfile("a", "X"), OpProfile("a", "X")))
    with pytest.raises(KeyError, match="no op 'b'"):
        sample().op("b")
