"""Measure a GraphDef on the emulated device: device peak bytes and step time.

Eager execution gives no step stats in TF 2.21, so the graph runs in a
``tf.compat.v1.Session`` with two CPU devices and ``FULL_TRACE``.  The
variables are copies of the captured ones (the user's are never touched).

Device peak = max over time of the bytes live in buffers allocated by nodes
placed on the device (allocation records of every node, in time order;
forwarded buffers are not new allocations and so are counted once), plus
the bytes of the variables homed on the device.  A ``SwapOut``'s output is
the host copy (host memory on a GPU), so its records are not counted.

Example::

    m = measure(captured, rewritten.graph_def, inputs=(x, y))
    m.peak_bytes, m.step_time_s
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from tfswap.tf.capture import CapturedFunction, same_device
from tfswap.tf.emulate import DEVICE
from tfswap.tf.rewrite import SWAP_OUT_OP
from tfswap.tf.runtime import grappler_config

# A traced run (FULL_TRACE) starts TensorFlow's profiler, of which a process runs
# one at a time (else "Another profiling session active"): a background search's
# verification (tfswap.anytime) and a profile or measurement in the caller's
# thread take turns, one traced run each.
TRACE_LOCK = threading.Lock()


@dataclass(frozen=True)
class Measurement:
    peak_bytes: int             # activations + temporaries + device-resident variables
    transient_peak_bytes: int   # the same without the variables
    variable_bytes: int
    step_time_s: float          # median wall time of the traced runs
    executed_ops: tuple[str, ...]   # node names in execution (start-time) order on all devices
    node_devices: dict              # node name -> device it ran on
    start_micros: dict              # node name -> start time of its last traced run
    executed_types: dict            # node name -> op type after Grappler (e.g. folded to Const)
    # Median wall time of the untraced runs (``measure(..., untraced_runs=N)``), the
    # step as users run it: FULL_TRACE adds a cost to every op (an unrolled LSTM's
    # step traced takes 3x its untraced time), so traced times favour plans with
    # fewer ops.  None: no untraced run.
    untraced_step_time_s: float | None = None

    def ran_before(self, first: str, second: str) -> bool:
        """True if ``second`` did not start before ``first`` (equal microseconds pass)."""
        return self.start_micros[first] <= self.start_micros[second]


def _device_suffix(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"device:{spec.device_type}:{spec.device_index or 0}"


def transient_peak(step_stats, device: str = DEVICE) -> int:
    """Peak of live bytes allocated during the step by nodes on ``device``."""
    return live_at_peak(step_stats, device)[0]


def live_at_peak(step_stats, device: str = DEVICE) -> tuple[int, dict[str, int], str]:
    """(:func:`transient_peak`, node name -> the bytes its allocations hold at that
    peak, the node whose allocation reached it): what was live when the step held
    the most, by the node that allocated it, to set beside the memory model's live
    set at the same op (a GPU row whose measured peak the model missed, issue #44).
    (0, {}, "") where ``device`` allocated nothing."""
    suffix = _device_suffix(device)
    events = []
    for dev in step_stats.dev_stats:
        if not dev.device.endswith(suffix):
            continue
        for node in dev.node_stats:
            if _op_type(node) == SWAP_OUT_OP:
                continue   # its output is the host copy (host memory on a GPU too)
            for mem in node.memory:
                for rec in mem.allocation_records:
                    events.append((rec.alloc_micros, rec.alloc_bytes, node.node_name))
    # At equal timestamps apply frees first: the executor frees inputs before
    # the next kernel allocates.
    events.sort(key=lambda e: (e[0], e[1]))
    live = peak = 0
    at = -1
    for k, (_, delta, _) in enumerate(events):
        live += delta
        if live > peak:
            peak, at = live, k
    held = defaultdict(int)
    for _, delta, name in events[:at + 1]:
        held[name] += delta
    return peak, {name: b for name, b in held.items() if b}, events[at][2] if at >= 0 else ""


def _op_type(node_stats) -> str:
    """The op type in a traced node's timeline label ("[...] name = Type(inputs)")."""
    _, _, rest = node_stats.timeline_label.partition(" = ")
    return rest.partition("(")[0]


def executed_order(step_stats) -> list[tuple[int, str, str]]:
    """(start micros, node name, device) for every executed node, sorted by start."""
    rows = []
    for dev in step_stats.dev_stats:
        for node in dev.node_stats:
            rows.append((node.all_start_micros, node.node_name, dev.device))
    rows.sort()
    return rows


@dataclass(frozen=True)
class TracedRuns:
    """The raw result of :func:`run_traced`: one RunMetadata per timed run."""

    metadata: tuple            # RunMetadata (step stats, partition graphs) per run
    times_s: tuple[float, ...]  # wall time of each traced run
    variable_bytes: int         # bytes of the captured variables homed on the device
    untraced_times_s: tuple[float, ...] = ()  # wall time of each untraced run, if asked for
    reference_times_s: tuple[float, ...] = ()  # the reference graph's, run after each of those


def run_traced(captured: CapturedFunction, graph_def, inputs, runs: int = 3,
               warmup: int = 1, device: str = DEVICE, config=None,
               inter_op_threads: int = 2, untraced_runs: int = 0,
               reference_graph_def=None, timeout_s: float | None = None) -> TracedRuns:
    """Run ``graph_def`` (with copies of the captured variables) under FULL_TRACE.

    ``inputs`` are the flat argument values, in ``captured.args`` order.
    ``inter_op_threads``: the executor's thread count; 1 runs one op at a
    time, so the trace's order is a schedule; None, TensorFlow's default (one
    per core), as a ``tf.function`` runs.  ``untraced_runs``: runs timed
    without tracing, alternating with the traced ones; their wall time is the
    step's own (under FULL_TRACE the kernels themselves run slower).  ``runs``
    may be 0 where ``untraced_runs`` is not: the untraced runs alone.
    ``reference_graph_def``: another graph of the same step (e.g. the
    unmodified one), run untraced right after each untraced run, in the same
    session on the same variables: the ratio of the two times cancels most of
    a shared machine's changing load.  ``timeout_s``: each run's limit; past it
    the run raises ``tf.errors.DeadlineExceededError`` (a replicated step whose
    replicas wait for each other would otherwise never return).
    """
    if timeout_s is not None and not 0 < timeout_s < float("inf"):
        raise ValueError(f"timeout_s must be None or a finite number of seconds > 0, "
                         f"got {timeout_s!r}")
    if len(inputs) != len(captured.args):
        raise ValueError(f"measure needs {len(captured.args)} inputs "
                         f"({', '.join(a.path for a in captured.args)}), got {len(inputs)}")
    cfg = config_pb2.ConfigProto()
    cfg.CopyFrom(config if config is not None else grappler_config())
    # Every logical CPU: the emulated device and host, and a replicated step's
    # other emulated devices (tfswap.tf.emulate.setup(replicas=...)).
    cfg.device_count["CPU"] = max(2, len(tf.config.list_logical_devices("CPU")))
    # Two threads: the control chain serialises the compute ops anyway, and the
    # swap ops need a thread of their own to overlap, like a copy stream.
    if inter_op_threads is not None and inter_op_threads < 1:
        raise ValueError(f"inter_op_threads must be None or >= 1, got {inter_op_threads}")
    if runs < 0 or untraced_runs < 0 or runs + untraced_runs < 1:
        raise ValueError(f"run_traced needs runs >= 0 and untraced_runs >= 0, not both 0, "
                         f"got runs={runs}, untraced_runs={untraced_runs}")
    cfg.inter_op_parallelism_threads = inter_op_threads or 0   # 0: TensorFlow's default
    # A Session's inter-op pool is otherwise the process-wide one, sized by
    # whichever Session came first; a pool of its own makes the count hold.
    cfg.use_per_session_threads = True

    # Read the live values eagerly, before building the session graph.
    values = [cap.variable.numpy() if cap.variable is not None else cap.value.numpy()
              if cap.value.dtype != tf.resource else None for cap in captured.captures]
    graph = tf.Graph()
    init_feed = {}
    with graph.as_default(), tf.name_scope("tfswap_measure"):  # no clash with graph names
        input_map = {}
        init_ops = []
        for arg in captured.args:
            ph = tf.compat.v1.placeholder(arg.dtype, arg.shape)
            input_map[arg.name] = ph
        for k, (cap, value_np) in enumerate(zip(captured.captures, values)):
            if cap.variable is not None:
                var = cap.variable
                # A host-homed variable keeps its home (its bytes are not the device's),
                # as does each replica's variable of a replicated step.
                with tf.device(var.device if cap.host_homed or captured.replicas else device):
                    handle = tf.raw_ops.VarHandleOp(
                        dtype=var.dtype, shape=var.shape, shared_name=f"tfswap_measure_{k}")
                    value = tf.compat.v1.placeholder(var.dtype, var.shape)
                    init_ops.append(tf.raw_ops.AssignVariableOp(resource=handle, value=value))
                init_feed[value] = value_np
                input_map[cap.name] = handle
            elif cap.value.dtype == tf.resource:
                raise ValueError(f"captured resource {cap.name} is not a tf.Variable; "
                                 "tfswap can only measure steps whose resources are variables")
            else:
                input_map[cap.name] = tf.constant(value_np)
    def load(gd, prefix):
        present = {node.name for node in gd.node}  # Grappler may prune unused inputs
        with graph.as_default():
            outs = tf.graph_util.import_graph_def(
                gd, input_map={k: v for k, v in input_map.items()
                               if k.partition(":")[0] in present},
                return_elements=list(captured.fetches), name=prefix)
            # A Session runs only what its fetches need; the step's variable
            # updates are its control outputs.
            return outs, [graph.get_operation_by_name(f"{prefix}/{n}" if prefix else n)
                          for n in captured.control_outputs]

    variable_bytes = variable_bytes_on(captured, device)
    fetches, targets = load(graph_def, "")
    reference = load(reference_graph_def, "tfswap_reference") \
        if reference_graph_def is not None else None

    limit = int(timeout_s * 1000) if timeout_s is not None else 0
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                      output_partition_graphs=True, timeout_in_ms=limit)
    plain = tf.compat.v1.RunOptions(timeout_in_ms=limit)
    step_feed = {input_map[a.name]: np.asarray(v) for a, v in zip(captured.args, inputs)}
    with tf.compat.v1.Session(graph=graph, config=cfg) as sess:
        sess.run(init_ops, feed_dict=init_feed)
        for _ in range(warmup):
            sess.run((fetches, targets), feed_dict=step_feed, options=plain)
            if reference is not None:
                sess.run(reference, feed_dict=step_feed, options=plain)
        times, saved, untraced, paired = [], [], [], []
        # Traced and untraced runs alternate, so that a change in the machine's
        # load touches both alike.
        for k in range(max(runs, untraced_runs)):
            if k < runs:
                metadata = tf.compat.v1.RunMetadata()
                with TRACE_LOCK:
                    start = time.perf_counter()
                    sess.run((fetches, targets), feed_dict=step_feed, options=options,
                             run_metadata=metadata)
                    times.append(time.perf_counter() - start)
                saved.append(metadata)
            if k < untraced_runs:
                start = time.perf_counter()
                sess.run((fetches, targets), feed_dict=step_feed, options=plain)
                untraced.append(time.perf_counter() - start)
                if reference is not None:
                    start = time.perf_counter()
                    sess.run(reference, feed_dict=step_feed, options=plain)
                    paired.append(time.perf_counter() - start)
    return TracedRuns(tuple(saved), tuple(times), variable_bytes, tuple(untraced),
                      tuple(paired))


def variable_bytes_on(captured: CapturedFunction, device: str = DEVICE) -> int:
    """Bytes of the captured variables homed on ``device`` (the emulated device's
    measured peak adds them): every one not in host memory; of a replicated
    step, each replica's own (a mirrored variable's component on ``device``)."""
    total = 0
    for cap in captured.captures:
        var = cap.variable
        if var is not None and not cap.host_homed and (
                not captured.replicas or same_device(var.device, device)):
            total += int(np.prod(var.shape)) * var.dtype.size
    return total


def measure(captured: CapturedFunction, graph_def, inputs, runs: int = 3,
            warmup: int = 1, device: str = DEVICE, config=None,
            inter_op_threads: int = 2, timeout_s: float | None = None,
            untraced_runs: int = 0) -> Measurement:
    """Run ``graph_def`` (with copies of the captured variables) and measure it.

    ``inputs`` are the flat argument values, in ``captured.args`` order.
    ``inter_op_threads``: 2 by default; ``timeout_s``: each run's limit;
    ``untraced_runs``: runs timed without tracing, alternating with the traced
    ones (``untraced_step_time_s``; see :func:`run_traced`).
    """
    traced = run_traced(captured, graph_def, inputs, runs=runs, warmup=warmup, device=device,
                        config=config, inter_op_threads=inter_op_threads, timeout_s=timeout_s,
                        untraced_runs=untraced_runs)
    last = traced.metadata[-1]
    peaks = [transient_peak(md.step_stats, device) for md in traced.metadata]
    variable_bytes = traced.variable_bytes
    order = executed_order(last.step_stats)
    transient = max(peaks)
    return Measurement(
        peak_bytes=transient + variable_bytes,
        transient_peak_bytes=transient,
        variable_bytes=variable_bytes,
        step_time_s=statistics.median(traced.times_s),
        executed_ops=tuple(name for _, name, _ in order),
        node_devices={name: dev for _, name, dev in order},
        start_micros={name: start for start, name, _ in order},
        executed_types={n.name: n.op for g in last.partition_graphs for n in g.node},
        untraced_step_time_s=statistics.median(traced.untraced_times_s)
        if traced.untraced_times_s else None,
    )


# ---------------------------------------------------------------- how to measure a device

STEP_STATS = "step-stats"   # the emulated device: allocation records of a traced Session run
ALLOCATOR = "allocator"     # a GPU: the BFC allocator's peak (reset_memory_stats/get_memory_info)


def peak_method(device: str, emulated: bool, emulated_device: str = DEVICE) -> str | None:
    """How this process can measure ``device``'s peak: :data:`STEP_STATS` on the
    emulated device (``emulated``: :func:`tfswap.tf.emulate.is_active`),
    :data:`ALLOCATOR` on a GPU, None elsewhere (a CPU that is not the emulated
    device: its allocator also holds the host's tensors).

    Example::

        peak_method("/device:GPU:0", emulated=False)    # "allocator"
    """
    spec = tf.DeviceSpec.from_string(device)
    kind = (spec.device_type or "").upper()
    if emulated and _device_suffix(device) == _device_suffix(emulated_device):
        return STEP_STATS
    if kind == "GPU":
        return ALLOCATOR
    return None


@dataclass(frozen=True)
class AllocatorMeasurement:
    """The peak of a callable's runs from the device allocator's statistics."""

    peak_bytes: int              # worst run: transient + the step's device variables
    transient_peak_bytes: int    # worst run's peak less what was in use before it
    variable_bytes: int          # the captured variables homed on the device
    run_peaks: tuple[int, ...]   # each measured run's transient peak
    device: str
    # A run failed for want of device memory: peak_bytes is how far it got, a lower bound.
    out_of_memory: bool = False

    def describe(self) -> str:
        if self.out_of_memory:
            return (f"the allocator's peak on {self.device} when the step ran out of device "
                    "memory (a lower bound: the step needs more than the device had), less "
                    "the bytes in use before, plus the step's device-homed variables")
        return (f"the allocator's peak on {self.device} (tf.config.experimental."
                f"reset_memory_stats / get_memory_info), worst of {len(self.run_peaks)} runs "
                "after a warm-up, less the bytes in use before each run, plus the step's "
                "device-homed variables")


def device_variable_bytes(captured: CapturedFunction) -> int:
    """Bytes of the captured variables that live on the device (not host-homed)."""
    return sum(int(np.prod(cap.variable.shape)) * cap.variable.dtype.size
               for cap in captured.captures if cap.variable is not None and not cap.host_homed)


def _allocator_name(device: str) -> str:
    """"GPU:0" for "/device:GPU:0" (what tf.config.experimental's memory calls take)."""
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.device_type}:{spec.device_index or 0}"


def allocator_peak(fn, inputs, captured: CapturedFunction, device: str, runs: int = 3,
                   warmup: int = 1, restore: bool = True) -> AllocatorMeasurement:
    """Run ``fn(*inputs)`` (e.g. a bound rewritten step) and measure ``device``'s
    peak from its allocator: before each run ``reset_memory_stats``, then the
    run, then ``get_memory_info(device)["peak"]`` less the bytes in use before
    it (what else the process holds), plus the step's device-homed variables
    (in use before, and part of the step's footprint as the plan counts it).

    The step updates the user's variables: ``restore`` puts back the values
    they had before (read into host memory first).  ``warmup`` runs are not
    measured (on a GPU the first run autotunes cuDNN with scratch memory of its
    own).  The function runs the step where it is bound, so this measures what
    the user's calls will do.  Used on a GPU (:func:`peak_method`); it also
    runs on a CPU device, whose allocator counts the host's tensors too.

    A run that fails with ``ResourceExhaustedError`` (the device is smaller
    than the step, e.g. a budget set to the card's free memory) ends the
    measurement: the result has ``out_of_memory`` set and the peak the run
    reached before it failed, so the caller can plan again with less.
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"need runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    name = _allocator_name(device)
    from tfswap.ops.allocator import ArenaFull

    # Out of memory: TF's error, or (budget arena) no room to carve the plan's pool.
    oom = (tf.errors.ResourceExhaustedError, ArenaFull)
    variables = captured.variables
    saved = [v.numpy() for v in variables] if restore else None
    peaks, out_of_memory = [], False
    try:
        for _ in range(warmup):
            try:
                _sync(fn(*inputs))
            except oom:
                break   # the measured run below fails again, and says how far it got
        for _ in range(runs):
            _sync(())   # nothing pending from before
            tf.config.experimental.reset_memory_stats(name)
            before = int(tf.config.experimental.get_memory_info(name)["current"])
            try:
                _sync(fn(*inputs))
            except oom:
                out_of_memory = True
            peaks.append(int(tf.config.experimental.get_memory_info(name)["peak"]) - before)
            if out_of_memory:
                break
    finally:
        if saved is not None:
            for v, value in zip(variables, saved):
                v.assign(value)
    variable_bytes = device_variable_bytes(captured)
    return AllocatorMeasurement(max(peaks) + variable_bytes, max(peaks), variable_bytes,
                                tuple(peaks), device, out_of_memory)


def _sync(outputs) -> None:
    """Wait until ``outputs`` are computed (one small read per output; the step's
    memory was allocated and freed by then)."""
    for t in tf.nest.flatten(outputs):
        if isinstance(t, tf.Tensor):
            tf.reduce_sum(tf.reshape(t, [-1])[:1]).numpy()
