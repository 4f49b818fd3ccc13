"""The swap link measured with tfswap's own ops: per-copy latency and bandwidth.

A chain of ``n`` copies of one tensor of ``nbytes`` runs inside one
function: each copy waits (a control edge) for the previous one to
be done, so the copies never overlap and the function returns when the last
is done (an eager call waits for its asynchronous kernels; nothing is read
back with ``.numpy()``).  The host buffers are the swap ops' own: a GPU
``SwapOut`` allocates its output pinned (``on_host`` + ``gpu_compatible``, the
GPU host allocator), and the host-to-device chain copies from such a buffer,
made by one ``SwapOut`` at the start of the same function.

A chain's time less a shorter chain's, over the copies between them, is one
copy's time: the call's fixed cost (and the host-to-device chain's first
``SwapOut``) cancels.  ``chained=False`` drops the control edges: the copies,
all issued at once, queue on the direction's stream back to back, as a plan's
copies do, so one copy's time is what it holds the stream for (its bytes and
its issue), without waiting for the previous copy's completion to reach the
executor.  Directions: "d2h" (``SwapOut``), "h2d" (``SwapIn``), and
"duplex" (a d2h chain and an h2d chain in one function, independent of each
other, so both copy engines are busy; its per-copy time moves ``2 * nbytes``).

:func:`fit` takes per-copy times over several sizes to a latency (the line's
intercept, ``DeviceSpec.copy_latency_s``) and a bandwidth (1 / its slope).
Chained, each copy waits for the previous one's completion to reach the
executor, and the latency includes that hand-back: on an H200 (2026-11-26) a
chained copy of 256 KiB to 1 MiB took 94-112 us, and a spec with that
latency (120 us, fitted on chains) predicted a 4-layer LSTM's plan of 464
round trips at 113.6 ms, measured 40.4 ms; the same plans simulated at 13 us
came within -22% to +23% of every measured row.  ``DeviceSpec.copy_latency_s``
is what a copy holds its stream for, so :func:`tfswap.tf.gpu.measured_spec`
fits unchained copies.

On the emulated device (``device``/``host`` the two CPUs) the same chains run
the CPU kernels (memcpys, or an emulated link with ``link_bytes_per_s``).

Example::

    from tfswap.tf import link
    s = link.sample("d2h", 64 << 20, "/device:GPU:0", "/device:CPU:0")
    s.bytes_per_s
    latency, bandwidth = link.fit([link.sample("h2d", n, dev, host) for n in sizes])
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from tfswap import ops

DIRECTIONS = ("d2h", "h2d", "duplex")


@dataclass(frozen=True)
class LinkSample:
    direction: str
    nbytes: int            # bytes of one copy (each direction's, for "duplex")
    short: int             # copies in the shorter chain
    long: int              # copies in the longer chain
    per_copy_s: float      # median of (t_long - t_short) / (long - short)
    spread_s: float        # max - min of those per-copy times over the repeats
    chained: bool = True   # each copy waited for the previous one (else issued at once)

    @property
    def bytes_per_s(self) -> float:
        """The rate one copy moved its bytes at (both directions' bytes for "duplex")."""
        moved = 2 * self.nbytes if self.direction == "duplex" else self.nbytes
        return moved / self.per_copy_s if self.per_copy_s > 0 else float("inf")


def chain(direction: str, copies: int, device: str, host: str, nbytes: int,
          link_bytes_per_s: float = 0.0, chained: bool = True):
    """A function of two device tensors of ``nbytes`` running ``copies`` copies,
    each after the previous one (``chained``) or all at once.

    Built with ``tf.compat.v1.wrap_function``, as tfswap binds a rewritten step
    (:mod:`tfswap.tf.runtime`): a ``tf.function`` would add automatic control
    edges between all stateful ops in program order, which serialises the two
    chains of "duplex".
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an int >= 1, got {copies!r}")
    if not isinstance(chained, bool):
        raise ValueError(f"chained must be True or False, got {chained!r}")
    ops.load()
    del host   # the swap ops run on the device; their host side is their HostMemory

    def after(previous):
        return [previous] if chained and previous is not None else []

    def d2h_chain(x):
        made, last = [], None
        for _ in range(copies):
            with tf.control_dependencies(after(last)):
                last = ops.swap_out(x, link_bytes_per_s=link_bytes_per_s)
            made.append(last)
        return made

    def h2d_chain(x):
        # The host buffer: one SwapOut's pinned output (in both chain lengths).
        held = ops.swap_out(x, link_bytes_per_s=0.0)
        made, last = [], None
        for _ in range(copies):
            with tf.control_dependencies(after(last)):
                last = ops.swap_in(held, link_bytes_per_s=link_bytes_per_s)
            made.append(last)
        return made

    def run(x, y):
        with tf.device(device):
            if direction == "d2h":
                last = d2h_chain(x)
            elif direction == "h2d":
                last = h2d_chain(x)
            else:
                last = d2h_chain(x) + h2d_chain(y)
            # A scalar that depends on every copy, so the call returns only when
            # they are done (the ops are stateful and run anyway); no copy's
            # bytes are read back.
            with tf.control_dependencies(last):
                return tf.identity(tf.constant(0, tf.int32))

    spec = tf.TensorSpec([nbytes // 4], tf.float32)
    return tf.compat.v1.wrap_function(run, [spec, spec])


def device_tensor(nbytes: int, device: str, seed: int = 0):
    """A float32 tensor of ``nbytes`` (rounded down to whole floats) on ``device``."""
    if nbytes < 4:
        raise ValueError(f"nbytes must be >= 4, got {nbytes}")
    with tf.device(device):
        return tf.random.stateless_uniform([nbytes // 4], seed=(seed, 1), dtype=tf.float32)


def sample(direction: str, nbytes: int, device: str, host: str, *, short: int = 2,
           long: int = 10, repeats: int = 5, link_bytes_per_s: float = 0.0,
           chained: bool = True) -> LinkSample:
    """One copy's time for ``nbytes`` in ``direction``, chained or issued at once:
    module docstring.

    Each chain length runs once untimed (tracing, and the first pinned
    allocations of that size), then ``repeats`` times alternating with the
    other length.
    """
    if not 1 <= short < long:
        raise ValueError(f"need 1 <= short < long, got short={short}, long={long}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    x = device_tensor(nbytes, device, 0)
    y = device_tensor(nbytes, device, 1)
    fns = {n: chain(direction, n, device, host, nbytes, link_bytes_per_s, chained)
           for n in (short, long)}
    for fn in fns.values():
        fn(x, y)
    per_copy = []
    for _ in range(repeats):
        times = {}
        for n, fn in fns.items():
            start = time.perf_counter()
            fn(x, y)
            times[n] = time.perf_counter() - start
        per_copy.append((times[long] - times[short]) / (long - short))
    return LinkSample(direction, int(nbytes // 4 * 4), short, long,
                      float(statistics.median(per_copy)), float(max(per_copy) - min(per_copy)),
                      chained)


def fit(samples) -> tuple[float, float]:
    """(latency s, bytes/s) of the line per-copy time = latency + bytes / rate, by
    least squares on relative residuals (small copies count as much as large);
    the latency is clipped at 0 (a negative intercept is measurement noise)."""
    samples = [s for s in samples if s.per_copy_s > 0]
    if len({s.nbytes for s in samples}) < 2:
        raise ValueError("fit needs samples of at least two sizes with positive times")
    moved = np.array([2 * s.nbytes if s.direction == "duplex" else s.nbytes
                      for s in samples], dtype=np.float64)
    t = np.array([s.per_copy_s for s in samples], dtype=np.float64)
    a = np.stack([np.ones_like(moved), moved], axis=1) / t[:, None]
    (latency, slope), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if slope <= 0:   # latency-bound at every size: the largest copy's rate
        k = int(np.argmax(moved))
        return 0.0, float(moved[k] / t[k])
    return float(max(0.0, latency)), float(1.0 / slope)


__all__ = ["DIRECTIONS", "LinkSample", "chain", "device_tensor", "fit", "sample"]
