"""Profilers: GraphDef (+ inputs) -> :class:`tfswap.core.profile.Profile`.

Three sources, one result type (DESIGN.md "Profiles"):

* :func:`trace` runs the whole step on the emulated device under
  FULL_TRACE with one inter-op thread, ``warmup`` untimed runs then ``runs``
  traced ones; per node it keeps the median kernel time, the bytes of each
  output, which outputs share an input's buffer (same address: TF forwarded
  the buffer in place or made a view) and the kernel's scratch bytes (its
  allocations beyond its outputs while it ran).  Also the executed order
  and the measured device peak.  The times are calibrated by untraced runs
  of the same step (``Profile.time_scale``): tracing slows the kernels, and
  the executor's and session's own work is in no kernel's time.
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

import dataclasses
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
from tfswap.tf.shapes import import_with_shapes
from tfswap.tf.capture import CapturedFunction
from tfswap.tf.emulate import DEVICE
from tfswap.tf.ir import REF_FORWARDING_OPS, VIEW_OPS, tensor_bytes
from tfswap.tf.runtime import grappler_config



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


FUNCTIONAL_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                            "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"})


def _records(members) -> list[tuple[int, int]]:
    return sorted((r.alloc_micros, r.alloc_bytes) for node in members for m in node.memory
                  for r in m.allocation_records)


def _span(members) -> tuple[int, int]:
    start = min(n.all_start_micros for n in members)
    return start, max(n.all_start_micros + n.all_end_rel_micros for n in members)


def _scratch_and_retained(members, fresh_output_bytes: int) -> tuple[int, int]:
    """(scratch, retained): bytes allocated beyond the fresh outputs while the
    node (or a lowered function's nodes) ran, and bytes still held at its end."""
    start, end = _span(members)
    live = peak = 0
    for _, delta in (r for r in _records(members) if start <= r[0] <= end):
        live += delta
        peak = max(peak, live)
    return max(0, peak - fresh_output_bytes), max(0, live)


def _owner(name: str, nodes: dict) -> str | None:
    """The GraphDef node a traced node belongs to: itself, or the functional op
    (While, If, function call) that TF lowered or inlined into it."""
    if name in nodes:
        return name
    rest = name[len("Func/"):] if name.startswith("Func/") else name
    while "/" in rest:
        rest = rest.rpartition("/")[0]
        if rest in nodes and nodes[rest].op in FUNCTIONAL_OPS:
            return rest
    return None


def ops_from_step_stats(graph_def, step_stats_list) -> tuple[list[OpProfile], list[str]]:
    """Per-node profiles (median over runs) and the executed order of the last run.

    A functional op that TF lowered or inlined (While into Enter/Exit/...,
    function calls into their bodies) gets the summed time of its nodes, and
    as scratch their peak allocation beyond its outputs; bytes its nodes still
    hold when it ends (While's saved-for-backward accumulators, which are
    variant tensors of no static size) are spread over its variant outputs.
    Nodes that did not run as themselves (folded to constants by the
    session's graph optimiser) are absent.
    """
    nodes = {n.name: n for n in graph_def.node}
    times = defaultdict(lambda: defaultdict(int))
    groups = defaultdict(list)          # owner -> NodeExecStats of the last run
    starts = {}
    for run, stats in enumerate(step_stats_list):
        last_run = run == len(step_stats_list) - 1
        for dev in stats.dev_stats:
            for node in dev.node_stats:
                owner = _owner(node.node_name, nodes)
                if owner is None:
                    continue
                start, duration = _node_nanos(node)
                times[owner][run] += duration
                if last_run:
                    groups[owner].append(node)
                    starts[owner] = min(starts.get(owner, start), start)
    buffers = {}
    for owner, members in groups.items():
        own = [n for n in members if n.node_name == owner]
        buffers[owner] = _output_buffers(own[0]) if own else {}
    profiles = []
    for name, members in groups.items():
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
        n_out = max(max(outs, default=-1) + 1, _declared_outputs(nd))
        output_bytes = [outs.get(s, (0, 0))[1] for s in range(n_out)]
        fresh = sum(b for s, (_, b) in outs.items() if s not in aliased)
        scratch, retained = _scratch_and_retained(members, fresh)
        if len(members) > 1 or name not in {n.node_name for n in members}:
            variant = [s for s in range(n_out) if _output_dtype(nd, s) == "variant"]
            for s in variant:
                output_bytes[s] = retained // len(variant)
        profiles.append(OpProfile(
            name=name, type=nd.op, time_s=statistics.median(times[name].values()) * 1e-9,
            output_bytes=tuple(output_bytes), aliases=tuple(sorted(aliases)),
            scratch_bytes=scratch, source="trace"))
    order = sorted((start, name) for name, start in starts.items())
    return profiles, [name for _, name in order]


def _declared_outputs(node) -> int:
    """Outputs a functional node declares (its ``T`` / ``Tout`` list attr); 0 otherwise."""
    for key in ("T", "Tout"):
        if key in node.attr and node.attr[key].list.type:
            return len(node.attr[key].list.type)
    return 0


def _output_dtype(node, slot: int) -> str:
    for key in ("T", "Tout"):
        if key in node.attr and len(node.attr[key].list.type) > slot:
            return tf.dtypes.as_dtype(node.attr[key].list.type[slot]).name
    return ""


def trace(captured: CapturedFunction, inputs, runs: int = 5, warmup: int = 2,
          graph_def=None, device: str = DEVICE, calibrate: bool = True) -> Profile:
    """Profile the whole step by running it (it must fit on the device).

    ``inputs``: the flat argument values.  ``graph_def``: defaults to the
    captured one.  Times are the median of ``runs`` traced runs.
    ``calibrate``: also time ``runs`` untraced runs (alternating with the
    traced ones) and scale every op's time by one factor so that the times add
    up to the untraced step's median wall time (``Profile.time_scale``; those
    runs' threads: :func:`calibration_threads`).  Under
    FULL_TRACE the kernels run slower (ResNet-style convolutions ~1.4x here)
    while the executor's own per-node work and the session's per-step work are
    not in any kernel's time (half the step of a small unrolled LSTM): the
    trace gives the ops' shares, the untraced runs the step's length.
    """
    return trace_devices(captured, inputs, (device,), runs, warmup, graph_def, calibrate)[0]


def trace_devices(captured: CapturedFunction, inputs, devices, runs: int = 5,
                  warmup: int = 2, graph_def=None, calibrate: bool = True) -> tuple[Profile, ...]:
    """:func:`trace`'s profile for each of ``devices``, from the same runs.

    A traced run times every node of the step, whichever device runs it, so
    the profiles of a replicated step's devices (each replica's ops on its
    own) differ only in their device and its measured peak: the step is
    traced once for all of them, not once per replica.
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"trace needs runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    gd = captured.graph_def if graph_def is None else graph_def
    t0 = time.perf_counter()
    threads = calibration_threads(devices[0])
    traced = measure.run_traced(captured, gd, inputs, runs=runs, warmup=warmup,
                                device=devices[0], inter_op_threads=1,
                                untraced_runs=runs if calibrate and threads == 1 else 0)
    untraced = traced.untraced_times_s
    if calibrate and threads != 1:
        untraced = measure.run_traced(captured, gd, inputs, runs=0, warmup=warmup,
                                      device=devices[0], inter_op_threads=threads,
                                      untraced_runs=runs).untraced_times_s
    stats = [md.step_stats for md in traced.metadata]
    ops, order = ops_from_step_stats(gd, stats)
    scale = 1.0
    kernels = sum(op.time_s for op in ops)
    if calibrate and kernels > 0:
        scale = statistics.median(untraced) / kernels
        ops = [dataclasses.replace(op, time_s=op.time_s * scale) for op in ops]
    elapsed = time.perf_counter() - t0
    # The peak of the run whose order is kept, so the two describe one execution.
    return tuple(Profile(source="trace", device=device, ops=tuple(ops),
                         executed_order=tuple(order),
                         peak_bytes=measure.transient_peak(stats[-1], device)
                         + measure.variable_bytes_on(captured, device),
                         runs=runs, warmup=warmup, profiling_time_s=elapsed, time_scale=scale)
                 for device in devices)


def calibration_threads(device: str) -> int | None:
    """The executor threads of the untraced runs that give a traced profile its
    length (:func:`trace`): as the step runs where its ops' times add up.

    On the emulated device one thread, the trace's: its kernels share the CPU's
    cores, and the rewritten step's compute ops run one at a time as traced.  On a
    GPU TensorFlow's default: the kernels run one at a time on the GPU's stream
    whatever the threads, while one thread also serialises the host's launches,
    about 10 us an op. Calibrated so, the H200 rows' profiles added up to
    1.16-1.77x the unmodified step (ResNet-50 b64 97.5 ms, 9,530 ops, against
    60.5-65.8 ms; BERT-style 35.8 ms against 21.9), and the plans were predicted
    at 0.73-1.12x what they measured (2026-11-28, issue #41)."""
    return None if tf.DeviceSpec.from_string(device).device_type == "GPU" else 1


def _plain_attrs(op: tf.Operation) -> dict:
    """The op's scalar and int-list attrs as plain Python values (for the cost model)."""
    attrs = {}
    for key, value in op.node_def.attr.items():
        kind = value.WhichOneof("value")
        if kind in ("b", "i", "f"):
            attrs[key] = getattr(value, kind)
        elif kind == "s":
            attrs[key] = value.s.decode("utf-8", "replace")
        elif kind == "list" and value.list.i:
            attrs[key] = tuple(value.list.i)
    return attrs


def _signature(tensors) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(d if d is not None else 1 for d in t.shape.as_list())
             if t.shape.rank is not None else (), t.dtype.name) for t in tensors]


def _static_aliases(op: tf.Operation) -> tuple[tuple[int, int], ...]:
    if op.type in VIEW_OPS or op.type in REF_FORWARDING_OPS:
        return ((0, 0),)
    if op.type == "IdentityN":
        return tuple((k, k) for k in range(len(op.outputs)))
    return ()


def _output_nbytes(op: tf.Operation) -> tuple[int, ...]:
    return tuple(tensor_bytes(t) for t in op.outputs)


def analytic(captured: CapturedFunction, spec: str | DeviceSpec, graph_def=None,
             fusion: bool = False) -> Profile:
    """Times from shapes for ``spec`` (a preset name or a DeviceSpec); runs no kernel.

    Every node gets the roofline time of :func:`tfswap.core.costmodel.op_cost`
    (ops outside its explicit rules get its documented default).  ``fusion``:
    price the step as a loop-fusing compiler (XLA) would run it, with
    elementwise chains keeping their intermediates out of memory and sibling
    readers of one tensor sharing a read (:func:`tfswap.core.costmodel.fusible_edge`,
    :func:`tfswap.core.costmodel.memory_reads`); off by default, because
    TensorFlow without XLA runs every op as its own kernel.
    """
    spec = device_spec(spec)
    t0 = time.perf_counter()
    gd = captured.graph_def if graph_def is None else graph_def
    graph = import_with_shapes(captured, gd)
    operations = graph.get_operations()
    signatures = {op.name: (_plain_attrs(op), _signature(op.inputs), _signature(op.outputs))
                  for op in operations}
    rules = {op.name: costmodel.op_cost(op.type, *signatures[op.name]).rule for op in operations}

    def output_fused(tensor) -> bool:
        return fusion and costmodel.fusible_edge(
            rules[tensor.op.name], [rules[c.name] for c in tensor.consumers()])

    reads: dict[str, dict[str, bool]] = {}   # tensor -> reader -> reads it from memory

    def input_fused(tensor, reader) -> bool:
        if not fusion:
            return False
        if tensor.name not in reads:
            readers = tensor.consumers()
            flags = costmodel.memory_reads(rules[tensor.op.name],
                                           [rules[c.name] for c in readers])
            reads[tensor.name] = {}
            for c, flag in zip(readers, flags):
                reads[tensor.name].setdefault(c.name, flag)   # first listing of a reader
        return not reads[tensor.name][reader.name]

    ops = []
    for op in operations:
        attrs, ins, outs = signatures[op.name]
        cost = costmodel.op_cost(op.type, attrs, ins, outs,
                                 fused_inputs=[input_fused(t, op) for t in op.inputs],
                                 fused_outputs=[output_fused(t) for t in op.outputs])
        ops.append(OpProfile(name=op.name, type=op.type, time_s=costmodel.op_time_s(cost, spec),
                             output_bytes=_output_nbytes(op), aliases=_static_aliases(op),
                             source="analytic"))
    return Profile(source="analytic", device=spec.name, ops=tuple(ops),
                   profiling_time_s=time.perf_counter() - t0)


_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
# Seeds of the isolated profile's random stand-ins: explicit, so that the profile
# runs under op determinism (which refuses unseeded random ops) and gives the
# same stand-ins every time.
_STAND_IN_SEED = (1, 2)
_STATIC_VALUE_BYTES = 1024   # small known inputs (shapes, axes, scalars) are fed as constants


class _Unisolable(Exception):
    """An op whose inputs cannot be synthesised alone (variants, foreign resources)."""


def _static_value(tensor: tf.Tensor):
    """The value of a small tensor known before running (constants, shapes of
    static-shaped tensors and arithmetic on them); None if unknown."""
    op = tensor.op
    if op.type in ("Shape", "ShapeN", "Size", "Rank"):
        source = op.inputs[tensor.value_index if op.type == "ShapeN" else 0]
        if source.shape.is_fully_defined():
            dims = source.shape.as_list()
            value = {"Shape": dims, "ShapeN": dims, "Size": int(np.prod(dims, dtype=np.int64)),
                     "Rank": len(dims)}[op.type]
            return np.asarray(value, dtype=tensor.dtype.as_numpy_dtype)
    try:
        return tf.get_static_value(tensor)
    except (TypeError, ValueError, NotImplementedError):
        return None


def _const_node(name: str, value: np.ndarray, device: str):
    return tf.compat.v1.NodeDef(
        name=name, op="Const", device=device,
        attr={"dtype": attr_value_pb2.AttrValue(type=tf.as_dtype(value.dtype).as_datatype_enum),
              "value": attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(value))})


_DIVISIONS = frozenset({"FloorDiv", "FloorMod", "Div", "TruncateDiv", "TruncateMod", "Mod"})


def _input_nodes(prefix: str, tensor: tf.Tensor, variables: dict, device: str,
                 consumer_type: str = "") -> list:
    """NodeDefs producing a stand-in for ``tensor``, the last one named ``prefix``."""
    dtype = tensor.dtype
    if dtype == tf.resource:
        var = variables.get(tensor.name)
        if var is None:
            raise _Unisolable(f"resource input {tensor.name} is not a captured variable")
        handle = tf.compat.v1.NodeDef(name=prefix, op="VarHandleOp", device=device, attr={
            "dtype": attr_value_pb2.AttrValue(type=var.dtype.as_datatype_enum),
            "shape": attr_value_pb2.AttrValue(shape=var.shape.as_proto()),
            "shared_name": attr_value_pb2.AttrValue(s=prefix.encode()),
            "container": attr_value_pb2.AttrValue(s=b""),
            "allowed_devices": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue())})
        return [handle]
    if dtype._is_ref_dtype:
        raise _Unisolable(f"input {tensor.name} refers to another op's buffer ({dtype.name})")
    if dtype in (tf.variant, tf.string) or not tensor.shape.is_fully_defined():
        raise _Unisolable(f"input {tensor.name} ({dtype.name}) cannot be synthesised")
    shape = tensor.shape.as_list()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.size
    value = _static_value(tensor) if nbytes <= _STATIC_VALUE_BYTES else None
    if value is not None:
        return [_const_node(prefix, np.asarray(value, dtype=dtype.as_numpy_dtype), device)]
    shape_node = _const_node(prefix + "/shape", np.asarray(shape, dtype=np.int64), device)
    if dtype.name in _FLOATS:
        gen = tf.compat.v1.NodeDef(name=prefix, op="RandomUniform", device=device,
                                   input=[shape_node.name], attr={
            "dtype": attr_value_pb2.AttrValue(type=dtype.as_datatype_enum),
            "T": attr_value_pb2.AttrValue(type=tf.int64.as_datatype_enum),
            # A fixed, non-zero seed: under tf.config.experimental.enable_op_determinism()
            # a random op whose seeds are both 0 refuses to run.
            "seed": attr_value_pb2.AttrValue(i=_STAND_IN_SEED[0]),
            "seed2": attr_value_pb2.AttrValue(i=_STAND_IN_SEED[1])})
        return [shape_node, gen]
    # Integers and booleans of unknown value (labels, indices): zeros are valid
    # indices for every gather, segment and label op; divisors get ones.
    fill_value = 1 if consumer_type in _DIVISIONS and dtype.is_integer else 0
    zero = _const_node(prefix + "/zero", np.asarray(fill_value, dtype=dtype.as_numpy_dtype),
                       device)
    fill = tf.compat.v1.NodeDef(name=prefix, op="Fill", device=device,
                                input=[shape_node.name, zero.name], attr={
        "T": attr_value_pb2.AttrValue(type=dtype.as_datatype_enum),
        "index_type": attr_value_pb2.AttrValue(type=tf.int64.as_datatype_enum)})
    return [shape_node, zero, fill]


def _signature_key(op: tf.Operation) -> tuple:
    attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                         for k, v in op.node_def.attr.items() if not k.startswith("_")))
    inputs = []
    for t in op.inputs:
        shape = tuple(t.shape.as_list()) if t.shape.rank is not None else None
        small = t.shape.is_fully_defined() and t.dtype not in (tf.resource, tf.variant, tf.string) \
            and int(np.prod(t.shape.as_list(), dtype=np.int64)) * t.dtype.size <= _STATIC_VALUE_BYTES
        value = _static_value(t) if small else None
        inputs.append((t.dtype.name, shape, None if value is None else np.asarray(value).tobytes()))
    return op.type, attrs, tuple(inputs)


def isolated(captured: CapturedFunction, runs: int = 3, warmup: int = 1, device: str = DEVICE,
             graph_def=None, batch_bytes: int = 256 << 20, fallback: str | DeviceSpec = "cpu-emulated"
             ) -> Profile:
    """Time each distinct op signature alone on ``device``, fed from random tensors.

    Signature: op type, attrs, input dtypes and shapes, and the values of
    small inputs (shapes, axes).  Float inputs are uniform random, integer
    inputs of unknown value zeros, variable handles fresh variables of the
    captured variable's shape.  Signatures are run ``batch_bytes`` of inputs
    and outputs at a time (so the step itself never has to fit), one op at a
    time, ``warmup`` untimed then ``runs`` traced runs; each op's time is the
    median kernel time.  Ops that launch no kernel, and ops that cannot run
    alone (variant inputs such as TensorLists) or fail, get the analytic time
    for ``fallback`` and say so (``source="analytic"``).
    """
    if runs < 1 or warmup < 0 or batch_bytes <= 0:
        raise ValueError(f"isolated needs runs >= 1, warmup >= 0, batch_bytes > 0; got "
                         f"{runs}, {warmup}, {batch_bytes}")
    from tensorflow.core.protobuf import config_pb2

    spec = device_spec(fallback)
    t0 = time.perf_counter()
    gd = captured.graph_def if graph_def is None else graph_def
    src = import_with_shapes(captured, gd)
    variables = {c.name: c.variable for c in captured.captures if c.variable is not None}
    operations = src.get_operations()
    analytic_ops = {p.name: p for p in analytic(captured, spec, graph_def=gd).ops}

    groups: dict[tuple, list[tf.Operation]] = {}
    for op in operations:
        if op.type in costmodel.FREE_OPS or op.type == "Placeholder":
            continue
        groups.setdefault(_signature_key(op), []).append(op)

    iso = tf.Graph()
    targets = {}           # signature index -> (iso node name, bytes, variable inits)
    with iso.as_default():
        tf.graph_util.import_graph_def(graph_pb2.GraphDef(library=gd.library), name="")
    for k, members in enumerate(groups.values()):
        op = members[0]
        mini = graph_pb2.GraphDef()
        name = f"tfswap_iso/{k}"
        try:
            inputs = []
            for j, t in enumerate(op.inputs):
                nodes = _input_nodes(f"{name}/in{j}", t, variables, device, op.type)
                mini.node.extend(nodes)
                inputs.append(nodes[-1].name)
            node = mini.node.add()
            node.CopyFrom(op.node_def)
            node.name, node.device = name, device
            del node.input[:]
            node.input.extend(inputs)
            with iso.as_default():
                tf.graph_util.import_graph_def(mini, name="")
        except (_Unisolable, ValueError, TypeError, tf.errors.OpError):
            continue
        with iso.as_default(), tf.device(device):
            inits = []
            for j, t in enumerate(op.inputs):
                if t.dtype == tf.resource:
                    var = variables[t.name]
                    handle = iso.get_tensor_by_name(f"{name}/in{j}:0")
                    value = tf.random.stateless_uniform(
                        var.shape, seed=_STAND_IN_SEED, dtype=var.dtype) \
                        if var.dtype.name in _FLOATS else tf.zeros(var.shape, var.dtype)
                    inits.append(tf.raw_ops.AssignVariableOp(resource=handle, value=value))
        nbytes = sum(tensor_bytes(t) for t in list(op.inputs) + list(op.outputs))
        targets[k] = (name, nbytes, inits)

    cfg = config_pb2.ConfigProto()
    cfg.CopyFrom(grappler_config())
    cfg.device_count["CPU"] = 2
    cfg.inter_op_parallelism_threads = 1
    cfg.use_per_session_threads = True
    # Nothing may be folded away before it runs: every node is a stand-in.
    cfg.graph_options.optimizer_options.opt_level = config_pb2.OptimizerOptions.L0
    cfg.graph_options.optimizer_options.do_constant_folding = False
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    measured: dict[int, tuple[float, int]] = {}

    def run_batch(sess, batch: list[int]) -> None:
        ops = [iso.get_operation_by_name(targets[k][0]) for k in batch]
        name_to_k = {targets[k][0]: k for k in batch}
        inits = [i for k in batch for i in targets[k][2]]
        if inits:
            sess.run(inits)
        for _ in range(warmup):
            sess.run(ops)
        samples = defaultdict(list)
        nodes = {}
        for _ in range(runs):
            md = tf.compat.v1.RunMetadata()
            with measure.TRACE_LOCK:   # one profiler per process
                sess.run(ops, options=options, run_metadata=md)
            for dev in md.step_stats.dev_stats:
                for node in dev.node_stats:
                    if node.node_name in name_to_k:
                        samples[node.node_name].append(_node_nanos(node)[1] * 1e-9)
                        nodes[node.node_name] = node
        for node_name, times_s in samples.items():
            node = nodes[node_name]
            fresh = sum(b for _, b in _output_buffers(node).values())
            scratch, _ = _scratch_and_retained([node], fresh)
            measured[name_to_k[node_name]] = (statistics.median(times_s), scratch)

    batches, current, used = [], [], 0
    for k, (_, nbytes, _) in targets.items():
        if current and used + nbytes > batch_bytes:
            batches.append(current)
            current, used = [], 0
        current.append(k)
        used += nbytes
    if current:
        batches.append(current)
    with tf.compat.v1.Session(graph=iso, config=cfg) as sess:
        for batch in batches:
            try:
                run_batch(sess, batch)
            except tf.errors.OpError:
                for k in batch:           # find the op that fails alone; keep the rest
                    try:
                        run_batch(sess, [k])
                    except tf.errors.OpError:
                        pass

    profiles = {}
    for k, members in enumerate(groups.values()):
        for op in members:
            if k in measured:
                time_s, scratch = measured[k]
                profiles[op.name] = OpProfile(
                    name=op.name, type=op.type, time_s=time_s, output_bytes=_output_nbytes(op),
                    aliases=_static_aliases(op), scratch_bytes=scratch, source="isolated")
    ops = tuple(profiles.get(op.name, analytic_ops[op.name]) for op in operations)
    return Profile(source="isolated", device=device, ops=ops, runs=runs, warmup=warmup,
                   profiling_time_s=time.perf_counter() - t0)

