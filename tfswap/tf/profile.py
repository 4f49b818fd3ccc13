"""Profilers: GraphDef (+ inputs) -> :class:`tfswap.core.profile.Profile`.

Three sources, one result type (DESIGN.md "Profiles"):

* :func:`trace` runs the whole step on the emulated device under
  FULL_TRACE with one inter-op thread, ``warmup`` untimed runs then ``runs``
  traced ones; per node it keeps the median kernel time, the bytes of each
  output, which outputs share an input's buffer (same address: TF forwarded
  the buffer in place or made a view) and the kernel's scratch bytes (its
  allocations beyond its outputs while it ran).  Also the executed order
  and the measured device peak.
* :func:`isolated` times each distinct (op type, attrs, input shapes and
  dtypes) alone on the device, fed from random tensors, so it works for
  steps that do not fit on the device as a whole.  Views alias their input;
  in-place forwarding is left to the IR's static rule.
* :func:`analytic` computes times from shapes for a
  :class:`~tfswap.core.devices.DeviceSpec` with the roofline of
  :mod:`tfswap.core.costmodel`; no TensorFlow kernel runs.

Example::

    prof = trace(captured, inputs=step.batch, runs=3)
    prof.save("cnn.trace.json")
    v100 = analytic(captured, "v100-16g-pcie3")
    graph = tfswap.tf.ir.lower(captured, prof).graph
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2

from tfswap.core import costmodel
from tfswap.core.devices import DeviceSpec, device_spec
from tfswap.core.profile import OpProfile, Profile
from tfswap.tf import measure
from tfswap.tf.capture import CapturedFunction
from tfswap.tf.emulate import DEVICE
from tfswap.tf.runtime import grappler_config

# Ops that return (a view of) their first input without touching the data.
VIEW_OPS = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                      "PreventGradient", "EnsureShape", "CheckNumerics", "Bitcast"})


def _split_input(name: str) -> tuple[str, int] | None:
    """'op:1' -> ('op', 1), 'op' -> ('op', 0); None for control inputs '^op'."""
    if name.startswith("^"):
        return None
    op, _, index = name.partition(":")
    return op, int(index) if index else 0


def _node_nanos(node) -> tuple[int, int]:
    """(start, kernel duration) of one NodeExecStats in nanoseconds."""
    start = node.all_start_nanos or node.all_start_micros * 1000
    if node.op_end_rel_nanos:
        return start, max(0, node.op_end_rel_nanos - node.op_start_rel_nanos)
    return start, max(0, (node.op_end_rel_micros - node.op_start_rel_micros) * 1000)


def _output_buffers(node) -> dict[int, tuple[int, int]]:
    """Output slot -> (address, bytes) of its buffer, from one NodeExecStats."""
    out = {}
    for o in node.output:
        desc = o.tensor_description.allocation_description
        if desc.ptr and desc.requested_bytes:
            out[o.slot] = (desc.ptr, desc.requested_bytes)
    return out


def _scratch_bytes(node, fresh_output_bytes: int) -> int:
    """Bytes the kernel allocated beyond its fresh outputs while it ran."""
    start = node.all_start_micros
    end = start + node.all_end_rel_micros
    live = peak = 0
    records = sorted((r.alloc_micros, r.alloc_bytes) for m in node.memory
                     for r in m.allocation_records if start <= r.alloc_micros <= end)
    for _, delta in records:
        live += delta
        peak = max(peak, live)
    return max(0, peak - fresh_output_bytes)


def ops_from_step_stats(graph_def, step_stats_list) -> tuple[list[OpProfile], list[str]]:
    """Per-node profiles (median over runs) and the executed order of the last run.

    Nodes that did not run as themselves (folded to constants by the
    session's graph optimiser, or inlined function calls) are absent.
    """
    nodes = {n.name: n for n in graph_def.node}
    times = defaultdict(list)
    last = {}
    for stats in step_stats_list:
        for dev in stats.dev_stats:
            for node in dev.node_stats:
                if node.node_name in nodes:
                    times[node.node_name].append(_node_nanos(node)[1] * 1e-9)
                    last[node.node_name] = node
    buffers = {name: _output_buffers(node) for name, node in last.items()}
    profiles = []
    for name, node in last.items():
        nd = nodes[name]
        outs = buffers[name]
        aliases = []
        inputs = [_split_input(i) for i in nd.input]
        for slot, (ptr, nbytes) in outs.items():
            for k, ref in enumerate(i for i in inputs if i is not None):
                src = buffers.get(ref[0], {}).get(ref[1])
                if src is not None and src[0] <= ptr < src[0] + src[1]:
                    aliases.append((slot, k))
                    break
        aliased = {o for o, _ in aliases}
        n_out = max(outs, default=-1) + 1
        output_bytes = tuple(outs.get(s, (0, 0))[1] for s in range(n_out))
        fresh = sum(b for s, (_, b) in outs.items() if s not in aliased)
        profiles.append(OpProfile(
            name=name, type=nd.op, time_s=statistics.median(times[name]),
            output_bytes=output_bytes, aliases=tuple(sorted(aliases)),
            scratch_bytes=_scratch_bytes(node, fresh), source="trace"))
    order = sorted((_node_nanos(n)[0], name) for name, n in last.items())
    return profiles, [name for _, name in order]


def trace(captured: CapturedFunction, inputs, runs: int = 5, warmup: int = 2,
          graph_def=None, device: str = DEVICE) -> Profile:
    """Profile the whole step by running it (it must fit on the device).

    ``inputs``: the flat argument values.  ``graph_def``: defaults to the
    captured one.  Times are the median of ``runs`` traced runs.
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"trace needs runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    gd = captured.graph_def if graph_def is None else graph_def
    t0 = time.perf_counter()
    traced = measure.run_traced(captured, gd, inputs, runs=runs, warmup=warmup, device=device,
                                inter_op_threads=1)
    stats = [md.step_stats for md in traced.metadata]
    ops, order = ops_from_step_stats(gd, stats)
    peak = max(measure.transient_peak(s, device) for s in stats) + traced.variable_bytes
    return Profile(source="trace", device=device, ops=tuple(ops), executed_order=tuple(order),
                   peak_bytes=peak, runs=runs, warmup=warmup,
                   profiling_time_s=time.perf_counter() - t0)
