"""DeviceSpec: what the planner needs to know about an accelerator and its link.

All values are in bytes and seconds.  ``h2d_bytes_per_s`` / ``d2h_bytes_per_s``
are each direction's bandwidth when only that direction is busy;
``duplex_bytes_per_s`` is the total when both are (the paper's V100 machine:
12 GB/s one way, 20 GB/s both ways, so 10 GB/s each while both run).
``copy_latency_s`` is a fixed cost added to every copy (a swap-out or a
swap-in) on top of its bytes / bandwidth: launching the copy, and on the
emulated device the swap op's own pass through the executor.
``copies_on_compute`` says the copies run on the thread or stream that runs
the ops (the emulated device with one executor thread), so a copy and an op
never overlap; by default each direction has its own stream (a GPU's copy
engines).

Example::

    spec = device_spec("v100-16g-pcie3")
    spec.memory_bytes                 # 16 * 2**30
    spec.copy_time_s(1 << 30, "h2d")  # ~0.089 s
"""

from __future__ import annotations

import json
import numbers
import os
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

GB = 10**9
GiB = 2**30


SHARED_LINK_ORDERS = ("fair", "fifo")


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_bytes: int
    peak_flops: float                 # dense FP32 FLOP/s the kernels can reach
    memory_bandwidth_bytes_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    duplex_bytes_per_s: float         # both directions together
    launch_overhead_s: float = 5e-6   # fixed cost per op
    copy_latency_s: float = 0.0       # fixed cost per copy, on top of bytes / bandwidth
    copies_on_compute: bool = False   # copies and ops share one stream (no overlap)
    # What an elementwise kernel on the host's CPU moves per second (bytes read +
    # written), for work placed on the host; None: as fast as the profiled op
    # (the emulated device, whose host is the same CPU).
    host_memory_bandwidth_bytes_per_s: float | None = None
    # What the copies of all the host's devices move together per second in each
    # direction (the emulated link, one per process; GPUs behind one PCIe switch
    # or root port); None: each device's link is its own.  A step replicated over
    # several devices copies on all of them at once: see shared_by.
    shared_link_bytes_per_s: float | None = None
    # How the devices' copies in one direction share it: "fair", each moving at
    # once at an even share (DMA engines behind one switch, whose arbiter
    # interleaves their packets); "fifo", one copy at a time, each at the full
    # rate, in the order they asked for it (the emulated link's reservations).
    shared_link_order: str = "fair"

    def __post_init__(self):
        for field_name in ("memory_bytes", "peak_flops", "memory_bandwidth_bytes_per_s",
                           "h2d_bytes_per_s", "d2h_bytes_per_s", "duplex_bytes_per_s"):
            if not getattr(self, field_name) > 0:
                raise ValueError(f"DeviceSpec {self.name!r}: {field_name} must be > 0, "
                                 f"got {getattr(self, field_name)!r}")
        for field_name in ("launch_overhead_s", "copy_latency_s"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not 0 <= value < float("inf"):
                raise ValueError(f"DeviceSpec {self.name!r}: {field_name} must be a finite "
                                 f"number of seconds >= 0, got {value!r}")
        for field_name in ("host_memory_bandwidth_bytes_per_s", "shared_link_bytes_per_s"):
            value = getattr(self, field_name)
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, numbers.Real) or not 0 < value < float("inf")):
                raise ValueError(f"DeviceSpec {self.name!r}: {field_name} must be None or a "
                                 f"finite number of bytes per second > 0, got {value!r}")
        if self.shared_link_order not in SHARED_LINK_ORDERS:
            raise ValueError(f"DeviceSpec {self.name!r}: shared_link_order must be one of "
                             f"{SHARED_LINK_ORDERS}, got {self.shared_link_order!r}")
        if not isinstance(self.copies_on_compute, bool):
            raise ValueError(f"DeviceSpec {self.name!r}: copies_on_compute must be True or "
                             f"False, got {self.copies_on_compute!r}")

    def copy_time_s(self, nbytes: int, direction: str, duplex: bool = False) -> float:
        """Seconds to move ``nbytes`` one way, the per-copy latency included;
        ``duplex``: the other way is busy too."""
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        bw = self.h2d_bytes_per_s if direction == "h2d" else self.d2h_bytes_per_s
        if duplex:
            bw = min(bw, self.duplex_bytes_per_s / 2)
        return self.copy_latency_s + nbytes / bw

    def shared_by(self, devices: int) -> "DeviceSpec":
        """The link as one of ``devices`` devices that copy at the same time sees it
        (the replicas of a data-parallel step run the same plan in step): each
        direction at most its share of ``shared_link_bytes_per_s``.  Unchanged
        where that is None or ``devices`` is 1.

        Example::

            one = cpu_emulated(link_bytes_per_s=200e6)
            one.shared_by(2).h2d_bytes_per_s   # 100e6
        """
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be an int >= 1, got {devices!r}")
        if self.shared_link_bytes_per_s is None or devices == 1:
            return self
        share = self.shared_link_bytes_per_s / devices
        return replace(self, name=f"{self.name} (shared by {devices})",
                       h2d_bytes_per_s=min(self.h2d_bytes_per_s, share),
                       d2h_bytes_per_s=min(self.d2h_bytes_per_s, share),
                       duplex_bytes_per_s=min(self.duplex_bytes_per_s, 2 * share))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DeviceSpec":
        return cls(**json.loads(text))


# Published figures: V100-PCIe (14 TFLOP/s FP32, 900 GB/s HBM2), A100-40G-PCIe
# (19.5 TFLOP/s FP32, 1555 GB/s), H100-PCIe (51 TFLOP/s FP32, 2000 GB/s).  Kernels
# reach ~70% of peak FLOP/s, which is what the roofline should see.  Link rates
# are what cudaMemcpyAsync on pinned memory achieves on PCIe 3/4/5 x16.  Their
# copy_latency_s is left at 0: a per-call cudaMemcpyAsync overhead of 5-7 us for
# small copies has been reported (Wu et al., "DualPath", arXiv 2602.21548, §5.2),
# on one unnamed machine; set it with dataclasses.replace to study its effect.
# Work tfswap places on the host (gathers of a host table's rows, updates of
# host variables: tfswap.tf.host_side) runs on the host's CPU at what its
# elementwise kernels move: 14-16 GB/s (bytes read + written) measured for
# TensorFlow's AddV2 of two 5-20 MiB float32 tensors on a 2-core AMD EPYC
# (2026-11-25).  A server with more cores moves more, so this prices host
# work conservatively.
HOST_CPU_BYTES_PER_S = 15 * GB

PRESETS: dict[str, DeviceSpec] = {
    "v100-16g-pcie3": DeviceSpec(
        name="v100-16g-pcie3", memory_bytes=16 * GiB, peak_flops=0.7 * 14.0e12,
        memory_bandwidth_bytes_per_s=0.8 * 900 * GB, h2d_bytes_per_s=12 * GB,
        d2h_bytes_per_s=12 * GB, duplex_bytes_per_s=20 * GB, launch_overhead_s=5e-6,
        host_memory_bandwidth_bytes_per_s=HOST_CPU_BYTES_PER_S),
    "a100-40g-pcie4": DeviceSpec(
        name="a100-40g-pcie4", memory_bytes=40 * GiB, peak_flops=0.7 * 19.5e12,
        memory_bandwidth_bytes_per_s=0.8 * 1555 * GB, h2d_bytes_per_s=24 * GB,
        d2h_bytes_per_s=24 * GB, duplex_bytes_per_s=40 * GB, launch_overhead_s=4e-6,
        host_memory_bandwidth_bytes_per_s=HOST_CPU_BYTES_PER_S),
    "h100-80g-pcie5": DeviceSpec(
        name="h100-80g-pcie5", memory_bytes=80 * GiB, peak_flops=0.7 * 51.0e12,
        memory_bandwidth_bytes_per_s=0.8 * 2000 * GB, h2d_bytes_per_s=50 * GB,
        d2h_bytes_per_s=50 * GB, duplex_bytes_per_s=80 * GB, launch_overhead_s=4e-6,
        host_memory_bandwidth_bytes_per_s=HOST_CPU_BYTES_PER_S),
}
# An H100 PCIe training in bf16 on its tensor cores: 756 TFLOP/s dense bf16
# (NVIDIA's H100 datasheet: 1,513 with 2:4 sparsity), the same HBM and PCIe 5
# link.  The graphs priced with it keep the step's own dtypes: a float32 step's
# copies, and its memory-bound ops, move twice the bytes its bf16 version
# would, while its matrix work runs at the bf16 rate.
PRESETS["h100-80g-pcie5-bf16"] = replace(PRESETS["h100-80g-pcie5"], name="h100-80g-pcie5-bf16",
                                         peak_flops=0.7 * 756.0e12)


# GPU names as the CUDA driver reports them (TensorFlow's
# ``tf.config.experimental.get_device_details(gpu)["device_name"]``, nvidia-smi's
# "Product Name") -> the preset with that memory size and host link.  Only the
# host link and the memory size must match: SXM boards ("H100 80GB HBM3",
# "A100-SXM4-40GB", "V100-SXM2-16GB") reach the host over the same PCIe generation
# as the PCIe boards, and their faster compute is measured by the traced profile
# (the preset's compute figures serve the analytic profile only).  Other
# memory sizes of a family (H100 NVL 94 GB, A100 80 GB, V100 32 GB) match no
# preset: their figures are measured (``tfswap.tf.gpu``).
GPU_NAME_PRESETS: tuple[tuple[str, str], ...] = (
    (r"\bH100\b(?!.*\bNVL\b).*\b(80\s*GB|PCIe)\b", "h100-80g-pcie5"),
    (r"\bA100\b.*\b40\s*GB\b", "a100-40g-pcie4"),
    (r"\bV100\b.*\b16\s*GB\b", "v100-16g-pcie3"),
)


def gpu_preset(device_name: str) -> str | None:
    """The preset for a GPU of this name, or None when no preset describes it.

    Example::

        gpu_preset("NVIDIA H100 80GB HBM3")    # "h100-80g-pcie5"
        gpu_preset("NVIDIA H200")              # None: measure it
    """
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str, got {type(device_name).__name__}")
    for pattern, preset in GPU_NAME_PRESETS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return preset
    return None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tfswap"


def measure_host_copy_bandwidth(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Best-of-``repeats`` bytes/s of one host memcpy of ``nbytes`` (numpy copy)."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def cpu_emulated(memory_bytes: int = 8 * GiB, cache: bool = True, *,
                 copy_latency_s: float = 0.0, copies_on_compute: bool = False,
                 link_bytes_per_s: float | None = None) -> DeviceSpec:
    """The emulated device (CPU:0 as device, CPU:1 as host; swaps are memcpys).

    The memcpy bandwidth is measured once and cached in ``~/.cache/tfswap``
    (``XDG_CACHE_HOME`` moves the cache, as everywhere); compute figures are
    rough single-core numbers, replaced by measured profiles in practice.

    ``copy_latency_s`` and ``copies_on_compute``: what a swap op costs beyond
    its memcpy, and whether it shares the ops' thread.  Run with one executor
    thread (``inter_op_threads=1``, as the profiler and the fidelity benchmark
    do) the swap ops are kernels on the only thread, so pass
    ``copies_on_compute=True`` and the latency ``benchmarks/copy_latency.py``
    measures (5-20 us a copy on the machine in benchmarks/RESULTS.md, where the
    rewritten LSTM's swaps cost more: see "Simulator fidelity" there).

    ``link_bytes_per_s``: the emulated link's bandwidth, for graphs rewritten
    with ``rewrite(..., emulated_link_bytes_per_s=...)`` at the same rate (the
    swap ops then complete when such a link would have moved their bytes, one
    FIFO link per direction, independent of each other): each direction moves
    that many bytes per second whether or not the other is busy (duplex = 2x).
    None (default): the measured memcpy rate each way and in total.

    Example::

        spec = cpu_emulated(copy_latency_s=15e-6, copies_on_compute=True)
        slow = cpu_emulated(link_bytes_per_s=200e6)   # a GPU-like compute:copy ratio
    """
    if link_bytes_per_s is not None and (
            isinstance(link_bytes_per_s, bool) or not isinstance(link_bytes_per_s, numbers.Real)
            or not 0 < link_bytes_per_s < float("inf")):
        raise ValueError(f"link_bytes_per_s must be None or a finite number of bytes per "
                         f"second > 0, got {link_bytes_per_s!r}")
    path = _cache_dir() / "host_copy_bandwidth.json"
    bw = None
    if cache and path.exists():
        try:
            bw = float(json.loads(path.read_text())["bytes_per_s"])
        except (ValueError, KeyError, OSError):
            bw = None
    if bw is None:
        bw = measure_host_copy_bandwidth()
        if cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"bytes_per_s": bw}))
    link = float(link_bytes_per_s) if link_bytes_per_s is not None else None
    return DeviceSpec(
        name="cpu-emulated", memory_bytes=memory_bytes, peak_flops=50e9,
        memory_bandwidth_bytes_per_s=bw, h2d_bytes_per_s=link or bw,
        d2h_bytes_per_s=link or bw, duplex_bytes_per_s=2 * link if link else bw,
        launch_overhead_s=2e-6, copy_latency_s=copy_latency_s,
        copies_on_compute=copies_on_compute,
        # The op library has one emulated link per direction for the process:
        # replicas on several emulated devices share it, one reserved copy after
        # another.  (Plain memcpys run on each replica's own threads.)
        shared_link_bytes_per_s=link, shared_link_order="fifo")


def device_spec(name: str | DeviceSpec) -> DeviceSpec:
    """A preset by name ("v100-16g-pcie3", "a100-40g-pcie4", "h100-80g-pcie5",
    "cpu-emulated"), or a DeviceSpec passed through."""
    if isinstance(name, DeviceSpec):
        return name
    if name == "cpu-emulated":
        return cpu_emulated()
    if name not in PRESETS:
        raise ValueError(f"unknown device spec {name!r}; use one of "
                         f"{sorted(PRESETS) + ['cpu-emulated']} or pass a DeviceSpec")
    return PRESETS[name]


def with_memory(spec: DeviceSpec, memory_bytes: int) -> DeviceSpec:
    """The same device with a different memory size (for what-if studies)."""
    return replace(spec, memory_bytes=memory_bytes)


def check_planner_arguments(budget_bytes, spec) -> None:
    """Raise a clear error unless ``budget_bytes`` is a positive int and ``spec`` a
    :class:`DeviceSpec` (what every planner takes)."""
    if not isinstance(spec, DeviceSpec):
        raise TypeError(f"spec must be a DeviceSpec (tfswap.core.devices.device_spec(name)), "
                        f"got {type(spec).__name__}")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)) \
            or budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be a positive int (bytes), got {budget_bytes!r}")
