"""DeviceSpec presets, copy times, JSON and the cached host bandwidth (tfswap.core.devices)."""

import json
from dataclasses import replace

import pytest

from tfswap.core import devices
from tfswap.core.devices import GB, GiB, DeviceSpec, device_spec


def test_v100_preset_is_the_papers_machine():
    spec = device_spec("v100-16g-pcie3")
    assert spec.memory_bytes == 16 * GiB
    assert spec.h2d_bytes_per_s == spec.d2h_bytes_per_s == 12 * GB
    assert spec.duplex_bytes_per_s == 20 * GB
    assert spec.copy_time_s(12 * GB, "h2d") == pytest.approx(1.0)
    # both directions busy: 10 GB/s each
    assert spec.copy_time_s(10 * GB, "d2h", duplex=True) == pytest.approx(1.0)


def test_newer_presets_have_more_memory_and_faster_links():
    v100, a100, h100 = (device_spec(n) for n in ("v100-16g-pcie3", "a100-40g-pcie4",
                                                  "h100-80g-pcie5"))
    assert v100.memory_bytes < a100.memory_bytes < h100.memory_bytes
    assert v100.h2d_bytes_per_s < a100.h2d_bytes_per_s < h100.h2d_bytes_per_s
    assert v100.peak_flops < a100.peak_flops < h100.peak_flops


def test_json_round_trip_and_passthrough():
    spec = device_spec("a100-40g-pcie4")
    assert DeviceSpec.from_json(spec.to_json()) == spec
    assert device_spec(spec) is spec
    assert devices.with_memory(spec, 8 * GiB).memory_bytes == 8 * GiB


def test_bad_values_and_names_are_rejected():
    with pytest.raises(ValueError, match="unknown device spec 'v200'"):
        device_spec("v200")
    with pytest.raises(ValueError, match="memory_bytes must be > 0"):
        DeviceSpec("x", 0, 1.0, 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="direction"):
        device_spec("v100-16g-pcie3").copy_time_s(1, "sideways")


def test_cpu_emulated_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def fake_measure(*args, **kwargs):
        calls.append(1)
        return 3.0e9

    monkeypatch.setattr(devices, "measure_host_copy_bandwidth", fake_measure)
    first = devices.cpu_emulated()
    second = device_spec("cpu-emulated")
    assert calls == [1]
    assert first.h2d_bytes_per_s == second.d2h_bytes_per_s == 3.0e9
    cached = json.loads((tmp_path / "tfswap" / "host_copy_bandwidth.json").read_text())
    assert cached == {"bytes_per_s": 3.0e9}


def test_host_copy_bandwidth_is_a_positive_rate():
    assert devices.measure_host_copy_bandwidth(nbytes=1 << 20, repeats=2) > 0


def test_copy_latency_is_validated_and_charged_per_copy():
    spec = device_spec("v100-16g-pcie3")
    assert spec.copy_latency_s == 0.0 and not spec.copies_on_compute
    slow = DeviceSpec(**{**spec.__dict__, "copy_latency_s": 1e-5})
    assert slow.copy_time_s(0, "h2d") == 1e-5
    assert slow.copy_time_s(12 * GB, "d2h") == pytest.approx(1.0 + 1e-5)
    for bad in (-1e-6, float("inf"), float("nan"), True, "1e-5"):
        with pytest.raises(ValueError, match="copy_latency_s must be a finite number"):
            DeviceSpec(**{**spec.__dict__, "copy_latency_s": bad})
    with pytest.raises(ValueError, match="copies_on_compute must be True or False"):
        DeviceSpec(**{**spec.__dict__, "copies_on_compute": 1})


def test_a_link_shared_by_several_devices_gives_each_its_share():
    spec = replace(device_spec("h100-80g-pcie5"), shared_link_bytes_per_s=64 * GB)
    four = spec.shared_by(4)
    assert four.h2d_bytes_per_s == four.d2h_bytes_per_s == 16 * GB
    assert four.duplex_bytes_per_s == 32 * GB and four.memory_bytes == spec.memory_bytes
    assert spec.shared_by(1) == spec
    assert spec.shared_by(2).h2d_bytes_per_s == 32 * GB    # below the device's own 50 GB/s
    assert device_spec("h100-80g-pcie5").shared_by(8) == device_spec("h100-80g-pcie5")
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="devices"):
            spec.shared_by(bad)
    with pytest.raises(ValueError, match="shared_link_bytes_per_s"):
        replace(spec, shared_link_bytes_per_s=0.0)
    assert spec.shared_link_order == "fair"
    for bad in ("lifo", None, 1):
        with pytest.raises(ValueError, match="shared_link_order"):
            replace(spec, shared_link_order=bad)


def test_specs_saved_before_the_copy_fields_still_load():
    spec = device_spec("a100-40g-pcie4")
    old = json.loads(spec.to_json())
    del old["copy_latency_s"], old["copies_on_compute"]
    assert DeviceSpec.from_json(json.dumps(old)) == spec


def test_cpu_emulated_prices_copies_at_the_emulated_link(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(devices, "measure_host_copy_bandwidth", lambda *a, **k: 7.0e9)
    spec = devices.cpu_emulated(link_bytes_per_s=2e8)
    assert spec.h2d_bytes_per_s == spec.d2h_bytes_per_s == 2e8
    assert spec.duplex_bytes_per_s == 4e8    # one link per direction, independent
    assert spec.copy_time_s(2 * 10**8, "h2d", duplex=True) == 1.0
    assert spec.memory_bandwidth_bytes_per_s == 7.0e9
    plain = devices.cpu_emulated()
    assert plain.h2d_bytes_per_s == plain.duplex_bytes_per_s == 7.0e9
    # The op library's emulated link is the process's: replicas share it, one
    # reserved copy after another.
    assert spec.shared_link_order == "fifo"
    two = spec.shared_by(2)
    assert two.h2d_bytes_per_s == two.d2h_bytes_per_s == 1e8 and two.duplex_bytes_per_s == 2e8
    assert spec.shared_by(1) == spec and plain.shared_by(2) == plain
    for bad in (0, -1.0, float("inf"), float("nan"), True, "2e8"):
        with pytest.raises(ValueError, match="link_bytes_per_s"):
            devices.cpu_emulated(link_bytes_per_s=bad)


@pytest.mark.parametrize("name, preset", [
    ("NVIDIA H100 80GB HBM3", "h100-80g-pcie5"),     # SXM5: PCIe 5 to the host
    ("NVIDIA H100 PCIe", "h100-80g-pcie5"),
    ("NVIDIA A100-SXM4-40GB", "a100-40g-pcie4"),
    ("NVIDIA A100-PCIE-40GB", "a100-40g-pcie4"),
    ("Tesla V100-PCIE-16GB", "v100-16g-pcie3"),
    ("Tesla V100-SXM2-16GB", "v100-16g-pcie3"),
    # Another memory size of a family, or another GPU: no preset (measured).
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", None),
    ("NVIDIA A100-SXM4-80GB", None),
    ("NVIDIA A100 80GB PCIe", None),
    ("Tesla V100-SXM2-32GB", None),
    ("NVIDIA GeForce RTX 4090", None),
    ("", None),
])
def test_a_gpu_name_maps_to_the_preset_of_its_memory_and_link(name, preset):
    assert devices.gpu_preset(name) == preset
    if preset is not None:
        assert devices.device_spec(preset).name == preset


def test_a_gpu_name_must_be_a_string():
    with pytest.raises(TypeError, match="device_name must be a str"):
        devices.gpu_preset(None)
