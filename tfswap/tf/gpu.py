"""The GPU a step runs on: its name, and the figures the planner uses for it.

A user on a GPU passes no ``device_spec``: :func:`spec_for_gpu` names the GPU
(``tf.config.experimental.get_device_details``) and takes the preset for
that name (:func:`tfswap.core.devices.gpu_preset`: "NVIDIA H100 80GB HBM3" ->
"h100-80g-pcie5"), or, for a GPU no preset describes, measures it once
(:func:`measured_spec`: the swap link with tfswap's own ops, a matmul's
FLOP/s, an elementwise op's memory bandwidth, the memory size from the CUDA
driver) and caches the figures in ``~/.cache/tfswap`` under the GPU's name.
Either way a note says which figures were taken and why.

GPU-only: everything here but :func:`physical_index` runs only where
TensorFlow sees a GPU (no test here executes it).

Example::

    spec, note = spec_for_gpu("/device:GPU:0")
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import re
import statistics
import time

from tfswap.core.devices import (HOST_CPU_BYTES_PER_S, DeviceSpec, _cache_dir, device_spec,
                                 gpu_preset)

# Sizes of the link measurement for an unknown GPU: one per decade from 64 KiB to
# 64 MiB, enough for the line's intercept (latency) and slope (bandwidth).
LINK_SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)


def physical_index(device: str) -> int:
    """The index of ``device`` ("/device:GPU:1", "GPU:1", "/job:.../device:GPU:1")
    among the physical GPUs (logical GPUs map one to one unless virtual devices
    were configured; then this is the logical index)."""
    found = re.search(r"GPU:(\d+)", device, flags=re.IGNORECASE)
    if found is None:
        raise ValueError(f"{device!r} is not a GPU device name (e.g. '/device:GPU:0')")
    return int(found.group(1))


def device_name(device: str) -> str:
    """The CUDA name of the GPU ``device`` runs on, e.g. "NVIDIA H100 80GB HBM3".
    GPU-only."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise RuntimeError(f"no GPU is visible to TensorFlow (asked for {device})")
    index = physical_index(device)
    gpu = gpus[index] if index < len(gpus) else gpus[0]
    return str(tf.config.experimental.get_device_details(gpu).get("device_name", ""))


def spec_for_gpu(device: str) -> tuple[DeviceSpec, str]:
    """(figures, a note saying where they come from) for the GPU ``device``. GPU-only."""
    name = device_name(device)
    preset = gpu_preset(name)
    if preset is not None:
        return device_spec(preset), (
            f"device spec {preset}: the preset for the {name!r} the step runs on "
            "(detected by name; pass device_spec= to use other figures)")
    spec, how = measured_spec(device, name)
    return spec, (f"device spec {spec.name}: no preset describes {name or 'this GPU'!r}, so "
                  f"its figures were {how} (pass device_spec= to use other figures)")


def total_memory_bytes(index: int) -> int:
    """The GPU's memory in bytes, from the CUDA driver (``cuDeviceTotalMem``).
    GPU-only: raises RuntimeError where the driver cannot say."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise RuntimeError(f"the CUDA driver library (libcuda.so.1) did not load: {err}") \
            from err
    dev = ctypes.c_int()
    total = ctypes.c_size_t()
    for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), index)),
                       ("cuDeviceTotalMem_v2", (ctypes.byref(total), dev))):
        status = getattr(cuda, call)(*args)
        if status != 0:
            raise RuntimeError(f"{call} failed with CUDA error {status}")
    return int(total.value)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def measured_spec(device: str, name: str, host: str = "/device:CPU:0",
                  cache: bool = True) -> tuple[DeviceSpec, str]:
    """The GPU's figures, measured (or read from the cache made the first time):
    (spec, how they were obtained). GPU-only."""
    slug = _slug(name)
    # ".pipelined": figures cached before the link was timed unchained (their copy
    # latency the chained hand-back, ~120 us on an H200) are measured again.
    path = _cache_dir() / f"gpu-{slug}.pipelined.json"
    if cache and path.exists():
        try:
            spec = DeviceSpec.from_json(path.read_text())
            if spec.host_memory_bandwidth_bytes_per_s is None:   # cached before the field
                spec = dataclasses.replace(
                    spec, host_memory_bandwidth_bytes_per_s=HOST_CPU_BYTES_PER_S)
            return spec, f"measured earlier (cached in {path})"
        except (ValueError, TypeError, KeyError, OSError):
            pass
    from tfswap.tf import link

    started = time.monotonic()
    # Copies issued at once, as a plan's queue on a stream (tfswap.tf.link): the
    # latency is what a copy holds the stream for, not a chain's hand-back.
    samples = {d: [link.sample(d, n, device, host, short=2, long=8, repeats=3, chained=False)
                   for n in LINK_SIZES] for d in ("h2d", "d2h")}
    h2d_latency, h2d = _fit(samples["h2d"])
    d2h_latency, d2h = _fit(samples["d2h"])
    duplex = link.sample("duplex", LINK_SIZES[-1], device, host, short=2, long=8,
                         repeats=3, chained=False).bytes_per_s
    spec = DeviceSpec(
        name=f"measured-{slug}", memory_bytes=total_memory_bytes(physical_index(device)),
        peak_flops=matmul_flops(device), memory_bandwidth_bytes_per_s=memory_bandwidth(device),
        h2d_bytes_per_s=h2d, d2h_bytes_per_s=d2h, duplex_bytes_per_s=max(duplex, h2d, d2h),
        copy_latency_s=max(h2d_latency, d2h_latency),
        host_memory_bandwidth_bytes_per_s=HOST_CPU_BYTES_PER_S)
    how = f"measured on this machine in {time.monotonic() - started:.1f} s"
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spec.to_json())
        how += f" (cached in {path})"
    return spec, how


def _fit(samples) -> tuple[float, float]:
    """:func:`tfswap.tf.link.fit`, or where noise left fewer than two sizes with a
    positive time, no latency and the largest copy's rate."""
    from tfswap.tf import link

    try:
        return link.fit(samples)
    except ValueError:
        largest = max(samples, key=lambda s: s.nbytes)
        if largest.per_copy_s <= 0:
            raise RuntimeError(f"the link measurement timed no copy above its noise: "
                               f"{samples}; pass device_spec=") from None
        return 0.0, largest.bytes_per_s


def _differential(fn_short, fn_long, extra: int, repeats: int = 5) -> float:
    """Seconds per unit of work: (t_long - t_short) / extra, median of ``repeats``;
    each call is read back as one scalar (compute timing, not a copy's)."""
    fn_short().numpy()
    fn_long().numpy()
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn_short().numpy()
        t1 = time.perf_counter()
        fn_long().numpy()
        t2 = time.perf_counter()
        per.append(((t2 - t1) - (t1 - t0)) / extra)
    return max(statistics.median(per), 1e-12)


def _chain(device: str, start, op, result):
    """``count`` -> a function that applies ``op`` ``count`` times in a row on
    ``device``, from ``start``, and returns ``result`` of the last value (one
    small read, so timing it times the chain)."""
    import tensorflow as tf

    def chain(count):
        @tf.function(autograph=False)
        def run():
            with tf.device(device):
                x = start
                for _ in range(count):
                    x = op(x)
                return result(x)
        return run
    return chain


def matmul_flops(device: str, n: int = 4096) -> float:
    """FLOP/s of a chain of float32 ``n`` x ``n`` matmuls (TensorFloat-32 where
    TensorFlow enables it, as for the user's own float32 kernels). GPU-only."""
    import tensorflow as tf

    with tf.device(device):
        a = tf.random.stateless_normal([n, n], seed=(0, 0)) / float(n) ** 0.5
    chain = _chain(device, a, lambda x: tf.matmul(x, a), lambda x: tf.reduce_sum(x[:1, :1]))
    return 2.0 * n ** 3 / _differential(chain(4), chain(20), 16)


def memory_bandwidth(device: str, nbytes: int = 256 << 20) -> float:
    """Bytes/s an elementwise op moves (each ``sin(x)`` reads and writes ``nbytes``;
    not ``x + 1``, whose chain Grappler's constant push-down folds into one add).
    GPU-only."""
    import tensorflow as tf

    with tf.device(device):
        a = tf.zeros([nbytes // 4], tf.float32)
    chain = _chain(device, a, tf.math.sin, lambda x: x[0])
    return 2.0 * nbytes / _differential(chain(2), chain(10), 8)


def cached_specs() -> dict[str, dict]:
    """The measured GPU figures cached on this machine, by file name."""
    found = {}
    for path in sorted(_cache_dir().glob("gpu-*.json")):
        try:
            found[path.name] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    return found


__all__ = ["LINK_SIZES", "cached_specs", "device_name", "matmul_flops", "measured_spec",
           "memory_bandwidth", "physical_index", "spec_for_gpu", "total_memory_bytes"]
