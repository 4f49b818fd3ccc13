"""Where a step runs and what is known of that device before planning: the
device and host (:func:`placement`), the device's figures (:func:`choose_spec`),
the budget arena it may allocate from (:func:`check_arena`), sample inputs and
the step's profile (:func:`profile_step`; a replicated step's, one per device,
:func:`profile_replicas`).

Example::

    device, host = placement(None, None)      # the emulated device, or the first GPU
    spec, note = choose_spec(None, device)
    prof = profile_step(captured, "auto", spec, sample_inputs(captured, 0), device)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from tfswap.core.budget import BudgetError
from tfswap.core.devices import DeviceSpec, cpu_emulated, device_spec as resolve_spec
from tfswap.core.profile import Profile
from tfswap.ops import allocator
from tfswap.tf import emulate, gpu
from tfswap.tf import profile as profiler

class NoDeviceError(RuntimeError):
    """Neither a GPU nor the emulated device is there to run the step on."""


def placement(device: str | None, host: str | None,
              replicas: tuple[str, ...] = ()) -> tuple[str, str]:
    """Where the step runs and where swapped tensors wait: (device, host).

    ``replicas``: the devices a ``tf.distribute`` strategy replicates the step
    over (:func:`tfswap.tf.capture.strategy_devices`).  Where they are known the
    step's device need not be named: it is the strategy's first (each replica
    is planned on its own device), and ``host`` alone, or nothing, is enough.
    Without them, ``device`` and ``host`` go together: both, or neither (the
    emulated device and its host, else the first GPU and CPU:0).
    """
    if device is None and replicas:
        device = replicas[0]
        if host is None:
            host = emulate.HOST if emulate.is_active() else "/device:CPU:0"
        return this_worker(device), this_worker(host)
    if device is not None or host is not None:
        if device is None:
            raise ValueError(
                f"host={host!r} alone does not say where the step runs: this step is not "
                "replicated by a tf.distribute strategy (it has no collective op whose "
                "devices would be its replicas'). Pass device= as well (e.g. "
                "'/device:GPU:0'), or neither")
        if host is None:
            raise ValueError(
                f"device={device!r} alone does not say where swapped tensors wait: pass "
                "host= as well (e.g. '/device:CPU:0'), or neither")
        return device, host
    if emulate.is_active():
        return this_worker(emulate.DEVICE), this_worker(emulate.HOST)
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return this_worker(gpus[0].name), this_worker("/device:CPU:0")
    raise NoDeviceError(
        "tfswap found no GPU and the emulated device is not set up. On a machine without "
        "a GPU call tfswap.tf.emulate.setup() before TensorFlow creates its devices (before "
        "building models), or pass device= and host= explicitly.")


def this_worker(device: str) -> str:
    """``device`` of this process's worker: as given on one machine; with the job
    and task of this worker where the process is one of a cluster's
    (``MultiWorkerMirroredStrategy``), whose other workers have a device of the
    same name, which a bare name would not tell apart."""
    space = tf.DeviceSpec.from_string(context.context().host_address_space())
    if space.job in (None, "localhost"):
        return device
    return tf.DeviceSpec.from_string(device).make_merged_spec(space).to_string()


def spec_for(device_spec, device: str) -> DeviceSpec:
    """The device's figures (:func:`choose_spec`)."""
    return choose_spec(device_spec, device)[0]


def choose_spec(device_spec, device: str) -> tuple[DeviceSpec, str | None]:
    """(the device's figures, a note saying where they come from when not given).

    The given spec; on a CPU, the emulated device's; on a GPU, the preset for
    the GPU's name ("NVIDIA H100 80GB HBM3" -> "h100-80g-pcie5"), else the GPU's
    figures measured once and cached (:mod:`tfswap.tf.gpu`).
    """
    if device_spec is not None:
        return resolve_spec(device_spec), None
    if "CPU" in device.upper():
        return cpu_emulated(), None
    return gpu.spec_for_gpu(device)   # GPU-only


def sample_inputs(captured, seed: int) -> list:
    """Inputs of the right shapes and dtypes for profiling runs (never the user's data)."""
    rng = np.random.default_rng(seed)
    values = []
    for arg in captured.args:
        dtype = arg.dtype.as_numpy_dtype
        if arg.dtype.is_floating:
            values.append(rng.standard_normal(arg.shape).astype(dtype))
        else:  # integer ids and labels: zeros are in range for any vocabulary
            values.append(np.zeros(arg.shape, dtype=dtype))
    return values


def profile_step(captured, kind, spec: DeviceSpec, feed, device: str):
    """The step's profile of ``kind`` (:data:`tfswap.options.PROFILES`; "auto": traced, else each op
    timed alone where the unmodified step does not fit), or ``kind`` itself where it
    is a :class:`~tfswap.core.profile.Profile` of this step made before."""
    if isinstance(kind, Profile):
        return given_profile(captured, kind)
    if kind == "analytic":
        return profiler.analytic(captured, spec)
    # An op the isolated profile cannot run alone is priced for this device (a GPU's
    # ops priced as the emulated CPU's made a BERT-style step's ideal 5.1 s for a 16 ms
    # step on an H200, 2026-11-26).
    if kind == "isolated":
        return profiler.isolated(captured, device=device, fallback=spec)
    try:
        return profiler.trace(captured, feed, device=device)
    except tf.errors.ResourceExhaustedError:
        if kind == "trace":
            raise
        # "auto": the unmodified step does not fit; time each op alone instead.
        return profiler.isolated(captured, device=device, fallback=spec)


def profile_replicas(captured, kind, spec: DeviceSpec, feed, devices) -> tuple[Profile, ...]:
    """:func:`profile_step` of a replicated step, one profile per device of
    ``devices`` (its replicas', the first's first), made once: a traced run
    times every replica's ops and measures each device's peak; an isolated or
    analytic profile prices every op of the step, whichever replica's it is."""
    if isinstance(kind, Profile) or kind in ("analytic", "isolated"):
        first = profile_step(captured, kind, spec, feed, devices[0])
        return (first,) + tuple(dataclasses.replace(first, device=d) if first.source == "isolated"
                                else first for d in devices[1:])
    try:
        return profiler.trace_devices(captured, feed, tuple(devices))
    except tf.errors.ResourceExhaustedError:
        if kind == "trace":
            raise
        return profile_replicas(captured, "isolated", spec, feed, devices)


# Nodes a profile does not time: the step's arguments and constants.
UNTIMED = ("Placeholder", "_Arg", "Const", "NoOp")


def given_profile(captured, prof: Profile) -> Profile:
    """``prof``, checked to time every op of ``captured`` (a profile of another
    step would plan this one on wrong costs)."""
    missing = [n.name for n in captured.graph_def.node
               if n.op not in UNTIMED and n.name not in prof]
    if missing:
        raise ValueError(
            f"the profile given has no op {', '.join(map(repr, missing[:3]))}"
            f"{f' (and {len(missing) - 3} more)' if len(missing) > 3 else ''}: it was made "
            "for another step or graph; profile this one (profile='auto') or pass its own "
            "(OptimizedFunction.profile, Profile.load of one saved for it)")
    return prof


def profile_note(prof, seconds: float, given: bool = False) -> str:
    """How the step was profiled; for an isolated profile, how many ops were timed
    alone and how many priced from the device spec instead."""
    note = f"profile: {prof.source}, " + ("the one given (not profiled again)" if given
                                          else f"{seconds:.1f} s")
    if prof.source != "isolated":
        return note
    priced = sum(op.source == "analytic" for op in prof.ops)
    return note + (f" ({len(prof.ops) - priced} of {len(prof.ops)} ops timed alone, {priced} "
                   "priced from the device spec: ops that launch no kernel or cannot run alone)")


def check_arena(budget: int, asked, device: str) -> None:
    """A budget above the budget arena the device allocates from cannot hold."""
    arena = allocator.installed_gpu_arena(device)
    arena_bytes = arena.stats().arena_bytes if arena is not None else None
    if arena_bytes is not None and budget > arena_bytes:
        raise BudgetError(
            f"memory_budget {asked!r} ({budget} bytes) is more than the budget arena "
            f"{device} allocates from ({arena_bytes} bytes, install_gpu_arena); "
            "pass at most that")


__all__ = ["NoDeviceError", "UNTIMED", "check_arena", "given_profile", "choose_spec", "placement",
           "profile_note", "profile_replicas", "profile_step", "sample_inputs", "spec_for",
           "this_worker"]
