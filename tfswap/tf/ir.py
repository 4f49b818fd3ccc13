"""CapturedFunction (+ Profile) -> core.DataflowGraph for the planner.

Every GraphDef node that an output or a side effect needs becomes an op and
every output a tensor whose bytes are its static shape times its dtype size
(all shapes are known: capture rejects unknown dimensions).  Handles,
strings and variants are marked unswappable.

:func:`lower` adds what the planner needs beyond names and bytes:

* **times and scratch** from a :class:`~tfswap.core.profile.Profile`;
* **buffers**: ``alias_of`` from the profile's aliases (trace: TF's in-place
  forwarding as it happened), from views (Reshape, Identity, ...) otherwise;
  every read of one variable shares that variable's buffer;
* **kinds and phases** by reachability (:func:`tfswap.core.kinds.classify`);
* **merged pairs**: where TensorFlow's oneDNN pass merges two ops into the
  one kernel the unmodified step runs, every schedule leaves the rewrite free
  to keep them one (:mod:`tfswap.tf.rewrite`): a bias gradient merged with a
  filter gradient (:func:`tfswap.tf.grappler.filter_and_bias_grads`) runs
  after it, and the output of a Pad merged into a convolution
  (:func:`tfswap.tf.grappler.pads_into_convs`) is not swappable;
* **reduction**: bookkeeping nodes fold into the first op they feed, so the
  planner sees only what costs time or memory.  Folded are shape-only ops
  (Shape, ShapeN, Size, Rank, VariableShape, BroadcastGradientArgs), NoOps,
  variable-handle placeholders, and stateless ops whose data inputs are all
  folded and whose outputs are at most ``fold_bytes`` (constants and the
  arithmetic on them).  A folded node's time moves to its target; its data
  edges become control edges from its own unfolded predecessors, so the
  order is kept without lengthening any tensor's life.  Nodes nothing
  needs are ``pruned`` (the function runtime never runs them either).
  Functional control flow (While, If, PartitionedCall, ...) is one opaque
  op with its measured time, never dropped.

``LoweredGraph.node_map`` sends every needed GraphDef node to the IR op it
is or was folded into; with ``pruned`` it covers the whole GraphDef.

Example::

    graph = to_dataflow_graph(captured)            # names and bytes only
    low = lower(captured, profile.trace(captured, inputs))
    low.graph.op("conv1/Conv2D").time_s, low.node_map["Shape_1"]
    low.predicted_peak(low.schedule())             # device bytes, TF's order
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import tensorflow as tf

from tfswap.core import kinds as kinds_mod
from tfswap.core import liveness
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.profile import Profile
from tfswap.tf import grappler
from tfswap.tf.capture import (CapturedFunction, collective_calls, collective_key,
                                collective_params, same_device)
from tfswap.tf.recomputable import merged, refusal
from tfswap.tf.shapes import import_with_shapes

_UNSWAPPABLE = (tf.resource, tf.variant, tf.string)

# Ops that return (a view of) their first input without touching the data.
VIEW_OPS = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                      "PreventGradient", "EnsureShape", "CheckNumerics", "Bitcast"})
# Reference-typed ops (what Grappler's memory optimiser makes of a large AddN:
# TemporaryVariable -> Assign -> AssignAdd... -> DestroyTemporaryVariable)
# return the buffer their first input refers to, whatever profiled them.
REF_FORWARDING_OPS = frozenset({"Assign", "AssignAdd", "AssignSub", "RefIdentity",
                                "DestroyTemporaryVariable"})
ALWAYS_FOLD = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape",
                         "BroadcastGradientArgs", "NoOp"})
# Ops that read a variable without writing it; any other op taking a
# variable's handle is a writer (Assign*VariableOp, ResourceApply*, ...).
VARIABLE_READERS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd",
                              "VariableShape", "VarIsInitializedOp"})
DEFAULT_FOLD_BYTES = 1024
# Ops whose bodies are functions they run themselves (loops, branches, calls).
FUNCTIONAL_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                            "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"})
# Kernels that write into an input's buffer when they hold its only reference
# (TF's forward_input_or_allocate_output): unary and binary elementwise ops.
FORWARDING_OPS = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "Exp", "Log", "Neg", "Abs", "Square",
    "Sqrt", "Rsqrt", "Reciprocal", "Softplus", "Erf", "Cast", "AddV2", "Add", "Sub", "Mul",
    "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum", "SquaredDifference", "Pow",
    "BiasAdd", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "SigmoidGrad", "TanhGrad",
    "RsqrtGrad", "SqrtGrad", "LeakyRelu", "LeakyReluGrad", "Gelu", "GeluGrad", "AddN"})


def _swappable(tensor: tf.Tensor) -> bool:
    # Reference tensors (Grappler's AddN accumulators) stay swappable as
    # before: marking them resident made the cnn step of test_optimize need
    # more than its budget.  Whether the rewrite can swap one is untested.
    return tensor.dtype not in _UNSWAPPABLE and tensor.shape.is_fully_defined()


def tensor_bytes(tensor: tf.Tensor) -> int:
    """Bytes of a tensor's buffer (0 where the size is not a plain product)."""
    if tensor.dtype in _UNSWAPPABLE or not tensor.shape.is_fully_defined():
        return 0
    return int(np.prod(tensor.shape.as_list(), dtype=np.int64)) * tensor.dtype.size


def _import(captured: CapturedFunction) -> tf.Graph:
    """The captured graph, every tensor's static shape known (variables included)."""
    return import_with_shapes(captured, captured.graph_def)


def _needed(graph: tf.Graph, captured: CapturedFunction) -> set[str]:
    """Like the function runtime: what an output or a side effect needs."""
    needed = set()
    stack = [graph.get_tensor_by_name(f).op for f in captured.fetches]
    stack += [graph.get_operation_by_name(n) for n in captured.control_outputs]
    while stack:
        op = stack.pop()
        if op.name in needed:
            continue
        needed.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return needed


def _plain_graph(graph: tf.Graph, needed: set[str]) -> tuple[list[Op], list[Tensor]]:
    ops, tensors = [], []
    for op in graph.get_operations():
        if op.name not in needed:
            continue
        ops.append(Op(
            name=op.name, type=op.type,
            inputs=tuple(t.name for t in op.inputs),
            control_inputs=tuple(c.name for c in op.control_inputs),
            device=op.device))
        for t in op.outputs:
            tensors.append(Tensor(
                name=t.name, nbytes=tensor_bytes(t), dtype=t.dtype.name,
                shape=tuple(t.shape.as_list()) if t.shape.rank is not None else (),
                swappable=_swappable(t)))
    return ops, tensors


def to_dataflow_graph(captured: CapturedFunction) -> DataflowGraph:
    """Names, types, edges and static bytes of every needed node; nothing folded."""
    graph = _import(captured)
    ops, tensors = _plain_graph(graph, _needed(graph, captured))
    return DataflowGraph.build(ops, tensors)


@dataclass(frozen=True)
class LoweredGraph:
    """The planner's graph and how it maps back to the GraphDef.

    ``node_map``: needed GraphDef node -> IR op (itself, or the op it was
    folded into).  ``pruned``: GraphDef nodes that nothing needs.
    ``fetches``: tensors live to the end of the step.  ``resident``: tensors
    holding device variables' values (on the device for the whole step; a
    host-homed variable's reads are parameters the plan swaps in).  ``updates``:
    ops updating a variable in place (AssignAdd/Sub, ResourceApply*) -> a
    tensor holding that variable's value.  ``assigned``: tensors that an
    AssignVariableOp makes a device variable's new value (held to the step's
    end).  ``writebacks``: updates of host-homed variables and other work
    placed on the host (they run there) -> bytes of the device values they
    read, which the rewrite copies to the host through swap-outs.
    ``host_ops``: ops computing on the host (:mod:`tfswap.tf.host_side`:
    gathers of a host table's rows, optimizer updates) -> bytes they read and
    write there, which prices them on a host slower than the device.
    ``recomputable``: IR ops that may run a second time
    (:func:`tfswap.tf.recomputable.refusal` finds no reason against).
    ``variable_bytes``: bytes of the captured variables homed on the device.  ``unprofiled``: IR
    ops the profile had no figures for, so time 0: the feeds, nodes TF folded
    to constants before running, and nodes its oneDNN rewrite merged into a
    neighbour (Conv2D + BiasAdd run as one kernel under the BiasAdd's name,
    which then carries the time of both).
    """

    graph: DataflowGraph
    node_map: dict
    pruned: tuple[str, ...]
    fetches: tuple[str, ...]
    resident: tuple[str, ...]
    variable_bytes: int
    unprofiled: tuple[str, ...]
    profile: Profile | None = None
    updates: dict = field(default_factory=dict)   # in-place variable update -> its variable's value
    assigned: tuple[str, ...] = ()                 # tensors AssignVariableOp makes a variable
    writebacks: dict = field(default_factory=dict)  # host variable's update -> bytes it reads
    host_ops: dict = field(default_factory=dict)    # op computing on the host -> bytes it touches
    recomputable: frozenset = frozenset()           # ops that may run again (tf.recomputable)
    before_updates: dict = field(default_factory=dict)  # update -> old-value readers put before it

    @property
    def folded(self) -> dict:
        """GraphDef node -> IR op, for the nodes that are not IR ops themselves."""
        return {n: o for n, o in self.node_map.items() if n != o}

    def schedule(self, observed: Sequence[str] | None = None) -> list[str]:
        """A complete schedule following ``observed`` (default: the profile's executed order)."""
        if observed is None:
            observed = self.profile.executed_order if self.profile is not None else ()
        order = self.graph.order_following(list(observed))
        return [self.graph.ops[i].name for i in order]

    def tf_schedule(self, observed: Sequence[str] | None = None) -> list[str]:
        """The order the unmodified step runs in: a complete order following
        ``observed`` (default: the profile's executed order) where only
        TensorFlow's own edges bind.  The graph's edges that order each
        in-place variable update after the readers of the old value
        (``before_updates``) are the plan's, not TensorFlow's: the unmodified
        step may run an update first and copy the variable
        (:meth:`predicted_peak` counts that copy)."""
        if observed is None:
            observed = self.profile.executed_order if self.profile is not None else ()
        if not self.before_updates:
            return self.schedule(observed)
        g = self.graph
        ops = [replace(op, outputs=(), control_inputs=tuple(
            c for c in op.control_inputs if c not in self.before_updates[op.name]))
            if op.name in self.before_updates else replace(op, outputs=()) for op in g.ops]
        free = DataflowGraph.build(ops, [replace(t, producer=-1, consumers=())
                                         for t in g.tensors])
        return [free.ops[i].name for i in free.order_following(list(observed))]

    def predicted_peak(self, schedule: Sequence[str] | None = None) -> int:
        """Device bytes at the peak of the unmodified step run in ``schedule``
        (default: :meth:`tf_schedule`): buffers live from producer to last
        reader (aliases once, scratch while its op runs), fetches and values
        assigned to variables to the end, every variable, and the copies
        in-place updates make of variables that are still being read
        (:func:`tfswap.core.liveness.variable_copies`)."""
        schedule = self.tf_schedule() if schedule is None else schedule
        read = {liveness.buffer_root(self.graph, t) for t in self.resident}
        read_bytes = sum(self.graph.tensor(t).nbytes for t in read)
        curve = liveness.live_bytes(self.graph, schedule, keep=self.fetches + self.assigned,
                                    resident=self.resident)
        for at, nbytes in liveness.variable_copies(self.graph, schedule, self.updates):
            curve[at:] += nbytes
        return int(curve.max()) - read_bytes + self.variable_bytes if len(curve) else 0


def _after_merged_filter_grads(ops: list[Op], graph_def) -> list[Op]:
    """Make each bias gradient that TensorFlow merges with a filter gradient
    wait for it.

    At run time the two are one kernel, named as the filter gradient (whose
    profile then carries the time of both), and the rewrite can keep them one
    kernel only where the bias gradient is scheduled after the filter gradient
    (:func:`tfswap.tf.rewrite.rewrite`).  The edge costs a schedule that runs
    the bias gradient right after the filter gradient nothing (TF's order
    does): it reads only what the filter gradient reads, and its output is one
    value per channel.
    """
    names = {op.name for op in ops}
    after = {bias: filt for filt, bias in grappler.filter_and_bias_grads(graph_def)
             if filt in names and bias in names}
    return [replace(op, control_inputs=op.control_inputs + (after[op.name],))
            if op.name in after and after[op.name] not in op.control_inputs else op
            for op in ops]


def _keep_padded_tensors(tensors: list[Tensor], graph_def) -> list[Tensor]:
    """Make the output of each Pad that TensorFlow merges into a convolution
    unswappable.

    The merged kernel never makes the padded tensor; a swap of it would add a
    reader (the SwapOut), and TensorFlow merges a Pad only into the sole
    reader of its output, so the step would compute differently.  The model
    still counts the padded tensor from the Pad to the convolution, where the
    merged kernel holds the Pad's input, which is no larger.
    """
    padded = {f"{pad}:0" for pad, _ in grappler.pads_into_convs(graph_def)}
    return [replace(t, swappable=False) if t.name in padded else t for t in tensors]


def _hold_saved_state(ops: list[Op], tensors: list[Tensor]) -> list[Tensor]:
    """Account for the state a functional op saves for a later op.

    A While's TensorList accumulators and the Optionals that ``cond_v2`` makes
    of a branch's intermediates are variant outputs holding references to
    tensors the body saw, until the gradient op reads them.  Among those can
    be the op's own inputs and outputs (a branch computing ``relu(x)`` in
    place returns the buffer of ``x`` and saves it too: measured on TF 2.21).
    Swapping such a tensor frees nothing while the saved state lives, so the
    op's non-variant inputs and outputs are not swappable.  The saved state's
    own allocations are in the variant outputs' profiled bytes; a held input
    or output is not (it was allocated elsewhere, or is also an output), so
    the first variant output is charged the largest of them: one such tensor
    held to the gradient, an estimate (Keras's LSTM and cond branches hold one;
    a body could hold more, which the measured peak of the rewritten step,
    checked by ``tfswap.optimize`` on the emulated device, would show).
    Variable values are resident anyway and are not charged.
    """
    by_name = {t.name: k for k, t in enumerate(tensors)}
    producer_type = {op.name: op.type for op in ops}
    tensors = list(tensors)
    for op in ops:
        if op.type not in FUNCTIONAL_OPS:
            continue
        outputs = [k for k, t in enumerate(tensors) if t.name.rpartition(":")[0] == op.name]
        saved = [k for k in outputs if tensors[k].dtype == "variant"]
        if not saved:
            continue
        held = {by_name[n] for n in op.inputs if n in by_name} | set(outputs)
        charged = 0
        for k in sorted(held):
            t = tensors[k]
            if t.dtype in ("variant", "resource"):
                continue
            tensors[k] = replace(t, swappable=False)
            if producer_type.get(t.name.rpartition(":")[0]) != "ReadVariableOp":
                charged = max(charged, t.nbytes)
        tensors[saved[0]] = replace(tensors[saved[0]], nbytes=tensors[saved[0]].nbytes + charged)
    return tensors


def _static_forward(op: Op, tensors: dict, readers: dict, keep: set,
                    not_owned: set) -> tuple[tuple[int, int], ...]:
    """The static forwarding rule, for profiles that did not watch TF run.

    TF lets an elementwise kernel write into an input's buffer when nothing
    else holds that buffer: here, when this op is the input's only reader,
    the input is not a fetch, has the output's shape and dtype, and its
    buffer is produced by the step (not a variable read, constant or feed).
    An input with several readers may be forwarded by whichever runs last;
    that depends on the schedule, so it is left unaliased (the model then
    overestimates, never underestimates).
    """
    out = tensors.get(f"{op.name}:0")
    if out is None or out.nbytes == 0:
        return ()
    for k, name in enumerate(op.inputs):
        t = tensors[name]
        if (t.shape == out.shape and t.dtype == out.dtype and readers.get(name) == 1
                and name not in keep and name.rpartition(":")[0] not in not_owned):
            return ((0, k),)
    return ()


def _set_aliases(ops: list[Op], tensors: list[Tensor], profile: Profile | None,
                 handle_of: dict[str, str], keep: Sequence[str] = ()) -> list[Tensor]:
    """Give every tensor sharing another's buffer ``alias_of`` = the buffer's owner."""
    index = {t.name: k for k, t in enumerate(tensors)}
    alias = {}
    use_trace = profile is not None and profile.source == "trace"
    by_name = {t.name: t for t in tensors}
    readers: dict[str, int] = {}
    for op in ops:
        for name in set(op.inputs):
            readers[name] = readers.get(name, 0) + 1
    producer_type = {op.name: op.type for op in ops}
    not_owned = {n for n, t in producer_type.items()
                 if t in ("ReadVariableOp", "Const", "Placeholder", "HostConst")}
    kept = set(keep)
    first_read = {}
    for op in ops:
        if op.type == "ReadVariableOp" and op.inputs and op.inputs[0] in handle_of:
            var = handle_of[op.inputs[0]]
            out = f"{op.name}:0"
            if var in first_read:
                alias[out] = first_read[var]
            else:
                first_read[var] = out
            continue
        pairs = ()
        if op.type in REF_FORWARDING_OPS:
            pairs = ((0, 0),)
        elif use_trace and op.name in profile:
            pairs = profile.op(op.name).aliases
        elif op.type in VIEW_OPS:
            pairs = ((0, 0),)
        elif op.type == "IdentityN":
            pairs = tuple((k, k) for k in range(len(op.inputs)))
        elif not use_trace and op.type in FORWARDING_OPS:
            pairs = _static_forward(op, by_name, readers, kept, not_owned)
        for out_slot, in_slot in pairs:
            out = f"{op.name}:{out_slot}"
            if out in index and in_slot < len(op.inputs):
                alias[out] = op.inputs[in_slot]

    def root(name: str) -> str:
        seen = set()
        while name in alias and name not in seen:
            seen.add(name)
            name = alias[name]
        return name

    return [replace(t, alias_of=root(t.name)) if t.name in alias and root(t.name) != t.name
            else t for t in tensors]


def _this_replica(ops: list[Op], tensors: list[Tensor], captured: CapturedFunction):
    """The part of a replicated step that runs on ``captured.device``, one of
    ``captured.replicas`` (a replica of a ``tf.distribute`` step plans as a
    step of its own; the device's memory is its own).

    Kept: the ops on the device (an op with no device runs on the first
    replica's) and the step's arguments.  A value another replica's op makes
    and an op here reads (a per-replica batch, a broadcast) arrives as a copy
    that lives on this device: its producer stays as a source of no cost that
    is never swapped.  What an op here makes and another replica reads
    (its loss, for the cross-replica sum) is kept to the step's end, as a
    fetch.  Returns (ops, tensors, fetches, control outputs) of this replica.
    """
    first, device = captured.replicas[0], captured.device

    def here(op) -> bool:
        return same_device(op.device or first, device)

    kept = {op.name for op in ops if here(op) or op.type == "Placeholder"}
    # Work on the host (the reads and updates of variables in host memory,
    # tfswap.tf.mirrored_homes) is this replica's where it exchanges values with
    # this replica's ops, directly or through other host work.
    on_host = {op.name for op in ops if op.device and op.type != "Placeholder" and not any(
        same_device(op.device, d) for d in captured.replicas)}
    if on_host:
        readers: dict[str, set] = {}
        for op in ops:
            for t in op.inputs:
                readers.setdefault(t.rpartition(":")[0], set()).add(op.name)
        inputs = {op.name: {t.rpartition(":")[0] for t in op.inputs} for op in ops}
        # Through the host's ops alone: every replica reads the same placeholders.
        mine = {op.name for op in ops if here(op) and op.type != "Placeholder"}
        stack = [n for n in on_host if (inputs[n] | readers.get(n, set())) & mine]
        while stack:
            name = stack.pop()
            if name in kept:
                continue
            kept.add(name)
            stack += [n for n in (inputs[name] | readers.get(name, set()))
                      if n in on_host and n not in kept]
    arriving = {t.rpartition(":")[0] for op in ops if op.name in kept for t in op.inputs} - kept
    leaving = [t for op in ops if op.name not in kept for t in op.inputs
               if t.rpartition(":")[0] in kept]
    names = kept | arriving
    by_name = {op.name: op for op in ops}
    reach: dict[str, frozenset] = {}
    keys = collective_keys(captured)
    together: dict = {}
    for name, key in keys.items():
        together.setdefault(key, []).append(name)

    def kept_before(name: str) -> frozenset:
        """The ops here that ``name`` (another replica's op) waits for: an order
        through another device (a strategy's cross-device control edges) is
        still an order here."""
        if name not in reach:
            reach[name] = frozenset()   # a cycle cannot close through here
            found = set()
            op = by_name[name]
            for p in [t.rpartition(":")[0] for t in op.inputs] + list(op.control_inputs):
                found |= {p} if p in kept else kept_before(p)
            # Another replica's collective ends with this replica's of the same
            # instance: what waits for it waits for that one too.
            found |= {c for c in together.get(keys.get(name), ()) if c in kept}
            reach[name] = frozenset(found)
        return reach[name]

    # What waits for another replica's op runs after this replica's collectives:
    # that op may follow its own replica's collective in the order the rewrite
    # gives that replica, and a collective ends only once every replica's has
    # started.  (Not what a collective here needs: that would be a cycle.)
    collectives = [op.name for op in ops if op.name in kept and op.name in keys]
    feeds_collective, stack = set(), list(collectives)
    while stack:
        name = stack.pop()
        if name in feeds_collective or name not in by_name:
            continue
        feeds_collective.add(name)
        stack += [t.rpartition(":")[0] for t in by_name[name].inputs]
        stack += list(by_name[name].control_inputs)

    def orders(op) -> tuple[str, ...]:
        data = {t.rpartition(":")[0] for t in op.inputs}
        found = [c for c in op.control_inputs if c in kept]
        across = [c for c in op.control_inputs if c not in kept] + \
            [p for p in data if p not in kept]
        for p in across:
            if p not in arriving:
                found += sorted(kept_before(p))
        if across and op.name not in feeds_collective:
            found += collectives
        return tuple(c for c in dict.fromkeys(found) if c not in data and c != op.name)

    new_ops = []
    for op in ops:
        if op.name in kept:
            new_ops.append(replace(op, control_inputs=orders(op)))
        elif op.name in arriving:
            new_ops.append(replace(op, type="Placeholder", inputs=(), device=device,
                                   control_inputs=tuple(sorted(kept_before(op.name)))))
    new_tensors = [replace(t, swappable=False) if t.name.rpartition(":")[0] in arriving else t
                   for t in tensors if t.name.rpartition(":")[0] in names]
    fetches = tuple(dict.fromkeys(
        [f for f in captured.fetches if f.rpartition(":")[0] in kept] + leaving))
    controls = tuple(c for c in captured.control_outputs if c in kept)
    return new_ops, new_tensors, fetches, controls


def collective_keys(captured: CapturedFunction) -> dict[str, tuple]:
    """Collective op -> what one all-reduce (gather, broadcast) of all replicas
    shares: its type, group and instance keys
    (:func:`tfswap.tf.capture.collective_params`), an NCCL op's type and
    ``shared_name``; the op's own name where they are not known before the step
    runs.  An op calling functions that run collectives (a ``tf.cond`` holding an
    all-gather) is one too, keyed by theirs
    (:func:`tfswap.tf.capture.collective_calls`): a plan that ordered it after
    what waits for another replica would wait for that replica's, forever."""
    nodes = {n.name: n for n in captured.graph_def.node}
    found = {}
    for name, params in collective_params(captured.graph_def, captured.captures).items():
        key = collective_key(nodes[name], params)
        found[name] = (name,) if None in key else key
    for name, inner in collective_calls(captured.graph_def, captured.captures).items():
        found[name] = (name,) if inner is None else ("call",) + inner
    return found


def rendezvous(captured: CapturedFunction) -> tuple[tuple[str, ...], ...]:
    """The collectives of a replicated step that meet, one op per replica each
    (in ``captured.replicas``' order): the members of one all-reduce, gather or
    broadcast (:func:`collective_keys`), which start only together
    (:func:`tfswap.core.simulator.simulate_replicas`).  () for a step on one
    device; a collective whose keys are known only when the step runs meets
    nothing here.

    Example::

        rendezvous(captured)   # (('adam/CollectiveReduceV2', 'adam/CollectiveReduceV2_1'),)
    """
    if not captured.replicas:
        return ()
    nodes = {n.name: n for n in captured.graph_def.node}
    members: dict[tuple, dict[int, str]] = {}
    for name, key in collective_keys(captured).items():
        on = [k for k, d in enumerate(captured.replicas) if same_device(nodes[name].device, d)]
        if on:
            members.setdefault(key, {})[on[0]] = name
    n = len(captured.replicas)
    return tuple(tuple(group[k] for k in range(n)) for group in members.values()
                 if len(group) == n)


def _host_side(ops: list[Op], tensors: list[Tensor], device: str):
    """The work placed on the host, as the planner sees it.

    An op on the host (:mod:`tfswap.tf.host_side`) takes no device memory for
    what it reads from other host ops: those inputs become control inputs (the
    order stays).  What it reads from the device stays an input (live on the
    device until its swap-out).  Every output of an op computing on the host
    is a host value, like a host variable's read: a buffer that starts on the
    host and that the plan fetches before a device op reads it.

    Returns (ops, tensors, host values, {op computing on the host: bytes it
    reads and writes}).  Placeholders (the variables' handles) and variable
    reads are no work; writers of host variables keep their handles.
    """
    on_host = {op.name for op in ops if op.device and device
               and not same_device(op.device, device) and op.type != "Placeholder"}
    if not on_host:
        return ops, tensors, (), {}
    by_name = {t.name: t for t in tensors}
    outputs: dict[str, list[str]] = {}
    for t in tensors:
        outputs.setdefault(t.name.rpartition(":")[0], []).append(t.name)
    computing = {op.name for op in ops if op.name in on_host and op.type not in VARIABLE_READERS
                 and op.type not in ("Const", "NoOp")
                 and not any(by_name[t].dtype == "resource" for t in op.inputs)}
    new_ops, touched = [], {}
    for op in ops:
        if op.name not in on_host:
            new_ops.append(op)
            continue
        if op.name in computing:
            touched[op.name] = sum(by_name[t].nbytes for t in set(op.inputs)) + \
                sum(by_name[t].nbytes for t in outputs.get(op.name, ()))
        hosted = [t.rpartition(":")[0] for t in op.inputs if t.rpartition(":")[0] in on_host]
        controls = op.control_inputs + tuple(p for p in dict.fromkeys(hosted)
                                             if p not in op.control_inputs)
        new_ops.append(replace(op, inputs=tuple(t for t in op.inputs
                                                if t.rpartition(":")[0] not in on_host),
                               control_inputs=controls))
    values = tuple(t for op in computing for t in outputs.get(op, ())
                   if by_name[t].dtype not in ("resource", "variant"))
    made_on_host = {t for op in computing for t in outputs.get(op, ())}
    # A device op the profile saw write in place into what is now a host value
    # writes into that value's swapped-in copy, a buffer the plan knows nothing
    # of: count its output afresh.  Views stay views.
    types = {op.name: op.type for op in ops}
    tensors = [replace(t, alias_of="") if t.name in made_on_host or (
        t.alias_of in made_on_host and types.get(t.name.rpartition(":")[0]) not in VIEW_OPS)
        else t for t in tensors]
    return new_ops, tensors, values, touched


def _consistent_positions(ops: list[Op], tensors: list[Tensor],
                          executed_order: Sequence[str]) -> dict[str, int]:
    """Each traced op's rank in the topological order nearest the traced one.

    The trace's order is by start microsecond, and it is not always a
    topological order: a ``While``'s node stats start before those of its
    inputs' producers (measured: the LSTM loop's TensorListFromTensor), and a
    consumer can start in its producer's microsecond and sort before it by
    name (CI failure: "the graph has a cycle" in ``_reduce``).  Ranks taken
    from a topological order of the graph that follows the trace agree with
    it wherever it agrees with the graph, and edges that follow them cannot
    close a cycle.  Ops the trace did not see get no rank.
    """
    traced = set(executed_order)
    order = DataflowGraph.build(ops, tensors).order_following(list(executed_order))
    names = [ops[i].name for i in order if ops[i].name in traced]
    return {name: k for k, name in enumerate(names)}


def _keep_traced_forwards(ops: list[Op], tensors: list[Tensor],
                          executed_order: Sequence[str],
                          updates: dict[str, str] | None = None) -> list[Op]:
    """Order every other reader of a buffer that the trace saw an op write in
    place before that op.

    TF forwards an input's buffer to an op's output only when nothing else
    holds it, so in the traced run every other reader of that buffer had run
    before the forwarding op.  A schedule that moves one of them after it
    makes TF allocate the output afresh while the memory model counts it in
    the shared buffer (fuzz seed 1058: a Square whose input a later gradient
    still read needed 256 KiB more than planned).  Likewise an in-place
    variable update (``updates``: op -> the variable's value) copies the
    variable first if a reader of its value is still to run (fuzz seed 1029).
    Control edges keep every schedule the planner tries within the writes the
    model counts.  Views and slices (reads of the same buffer) need no edge.
    Only readers that ran before the writing op, of tensors produced before
    it, get an edge, so the edges follow one topological order and cannot
    close a cycle.
    """
    position = _consistent_positions(ops, tensors, executed_order)
    by_name = {t.name: t for t in tensors}
    op_type = {op.name: op.type for op in ops}
    op_inputs = {op.name: op.inputs for op in ops}
    written: dict[str, set[str]] = {}   # op -> roots of the buffers it writes in place
    for t in tensors:
        op_name = t.name.rpartition(":")[0]
        if not t.alias_of or op_type.get(op_name) in VIEW_OPS | REF_FORWARDING_OPS | {"IdentityN"}:
            continue
        # Same bytes as the input whose buffer it shares: written in place.
        # Fewer: a slice of it (Split, Unpack), read, not written.
        if any((by_name[i].alias_of or i) == t.alias_of and by_name[i].nbytes == t.nbytes
               for i in op_inputs.get(op_name, ())):
            written.setdefault(op_name, set()).add(t.alias_of)
    for op_name, value in (updates or {}).items():
        written.setdefault(op_name, set()).add(by_name[value].alias_of or value)
    # Buffer root -> (reader, producer of the tensor it reads) for every read.
    readers: dict[str, set[tuple[str, str]]] = {}
    for op in ops:
        for name in op.inputs:
            readers.setdefault(by_name[name].alias_of or name, set()).add(
                (op.name, name.rpartition(":")[0]))
    extra: dict[str, list[str]] = {}
    for op in ops:
        at = position.get(op.name)
        if at is None or op.name not in written:
            continue
        earlier = sorted({r for root in written[op.name] for r, p in readers.get(root, ())
                          if r != op.name and position.get(r, at) < at
                          and position.get(p, at) < at and r not in op.control_inputs},
                         key=position.get)
        if earlier:
            extra[op.name] = earlier
    return [replace(op, control_inputs=op.control_inputs + tuple(extra[op.name]))
            if op.name in extra else op for op in ops]


def _updates_after_old_readers(ops: list[Op], tensors: list[Tensor],
                               updates: dict[str, str]) -> tuple[list[Op], dict[str, tuple]]:
    """``ops`` with an edge from every reader of a variable's value to the
    variable's in-place update, where the reader does not come after the update
    anyway; and those edges (update -> readers).

    An update that finds the old value still to be read copies the variable
    first (TF's copy-on-write) and holds old and new until that reader ends;
    TensorFlow's own order can do that (an update run before a gradient MatMul
    still reading the old weight: plans measured a variable's size over their
    prediction, docs/lab-notes/fuzz.md).  A planned step runs every
    update after the readers of its old value, so it never copies; the
    unmodified step runs without these edges, and its prediction counts the
    copies TF's order makes (:meth:`LoweredGraph.tf_schedule`,
    :func:`tfswap.core.liveness.variable_copies`).  Each edge is added only
    where the update does not reach the reader, the edges added so far
    included, so none closes a cycle.
    """
    if not updates:
        return ops, {}
    by_name = {t.name: t for t in tensors}
    readers: dict[str, set[str]] = {}
    successors: dict[str, set[str]] = {op.name: set() for op in ops}
    predecessors: dict[str, set[str]] = {op.name: set() for op in ops}
    for op in ops:
        for name in op.inputs:
            readers.setdefault(by_name[name].alias_of or name, set()).add(op.name)
            producer = name.rpartition(":")[0]
            if producer in successors:
                successors[producer].add(op.name)
                predecessors[op.name].add(producer)
        for c in op.control_inputs:
            if c in successors:
                successors[c].add(op.name)
                predecessors[op.name].add(c)
    controls = {op.name: set(op.control_inputs) for op in ops}
    extra: dict[str, list[str]] = {}
    for update, value in updates.items():
        if update not in successors:
            continue
        root = by_name[value].alias_of or value
        old = {r for r in readers.get(root, ()) if r != update and r not in controls[update]}
        if not old:
            continue
        reached, todo = set(), [update]
        while todo:   # what runs after the update: its readers of the new value
            for nxt in successors[todo.pop()]:
                if nxt not in reached:
                    reached.add(nxt)
                    todo.append(nxt)
        needed, todo = set(), [update]
        while todo:   # what the update waits for already: no edge needed
            for prev in predecessors[todo.pop()]:
                if prev not in needed:
                    needed.add(prev)
                    todo.append(prev)
        for r in sorted(old - reached - needed):
            predecessors[update].add(r)
            extra.setdefault(update, []).append(r)
            successors[r].add(update)
    return ([replace(op, control_inputs=op.control_inputs + tuple(extra[op.name]))
             if op.name in extra else op for op in ops],
            {u: tuple(rs) for u, rs in extra.items()})


def _reduce(graph: DataflowGraph, tf_graph: tf.Graph, keep_ops: set[str],
            fold_bytes: int) -> tuple[DataflowGraph, dict]:
    order = graph.topological_order()
    folded = set()
    for i in order:
        op = graph.ops[i]
        if op.name in keep_ops:
            continue
        tf_op = tf_graph.get_operation_by_name(op.name)
        outputs = [graph.tensor(t) for t in op.outputs]
        is_handle = op.type == "Placeholder" and outputs and outputs[0].dtype == "resource"
        if op.type in ALWAYS_FOLD or is_handle:
            folded.add(i)
            continue
        if op.type == "Placeholder" or tf_op.op_def.is_stateful or not outputs:
            continue
        if all(t.nbytes <= fold_bytes for t in outputs) and all(
                graph.tensor(t).producer in folded for t in op.inputs) and all(
                graph.op_id(c) in folded for c in op.control_inputs):
            folded.add(i)
    # Each folded op goes to its first unfolded consumer (through folded ones).
    succ = [[] for _ in graph.ops]
    for i in range(len(graph.ops)):
        for p in graph.predecessors(i):
            succ[p].append(i)
    position = {op: k for k, op in enumerate(order)}
    target = {}
    for i in reversed(order):
        if i not in folded:
            target[i] = i
            continue
        candidates = [target[s] for s in succ[i] if target.get(s) is not None]
        if not candidates:
            folded.discard(i)   # feeds nothing that stays: it stays itself
            target[i] = i
            continue
        target[i] = min(candidates, key=position.get)
    # Unfolded predecessors standing in for a folded one (memoised, in order).
    anchors = {}
    for i in order:
        if i in folded:
            acc = set()
            for p in graph.predecessors(i):
                acc |= anchors[p] if p in folded else {p}
            anchors[i] = acc
    extra_time = {}
    for i in folded:
        extra_time[target[i]] = extra_time.get(target[i], 0.0) + graph.ops[i].time_s
    ops, tensors = [], []
    for i, op in enumerate(graph.ops):
        if i in folded:
            continue
        inputs = tuple(t for t in op.inputs if graph.tensor(t).producer not in folded)
        data_preds = {graph.tensor(t).producer for t in inputs}
        controls = []
        for p in sorted(graph.predecessors(i), key=position.get):
            for a in sorted(anchors[p], key=position.get) if p in folded else [p]:
                if a not in data_preds and a != i and graph.ops[a].name not in controls:
                    controls.append(graph.ops[a].name)
        ops.append(replace(op, inputs=inputs, control_inputs=tuple(controls), outputs=(),
                           time_s=op.time_s + extra_time.get(i, 0.0)))
        tensors.extend(graph.tensor(t) for t in op.outputs)
    kept_names = {t.name for t in tensors}
    tensors = [replace(t, alias_of="") if t.alias_of and t.alias_of not in kept_names else t
               for t in tensors]
    reduced = DataflowGraph.build(
        ops, [replace(t, producer=-1, consumers=()) for t in tensors])
    return reduced, {graph.ops[i].name: graph.ops[target[i]].name for i in range(len(graph.ops))}


def lower(captured: CapturedFunction, profile: Profile | None = None, *, reduce: bool = True,
          classify: bool = True, small_bytes: int = kinds_mod.DEFAULT_SMALL_BYTES,
          fold_bytes: int = DEFAULT_FOLD_BYTES) -> LoweredGraph:
    """The planner's graph of ``captured`` with ``profile``'s costs (see module doc).

    ``reduce``: fold bookkeeping nodes.  ``classify``: set kinds and phases.
    ``small_bytes``: tensors below this are kind ``small``.  ``fold_bytes``:
    largest output of a constant-derived node that still folds.
    """
    if small_bytes < 0 or fold_bytes < 0:
        raise ValueError(f"small_bytes and fold_bytes must be >= 0 bytes, got "
                         f"{small_bytes} and {fold_bytes}")
    tf_graph = _import(captured)
    needed = _needed(tf_graph, captured)
    ops, tensors = _plain_graph(tf_graph, needed)
    fetches, control_outputs = captured.fetches, captured.control_outputs
    if captured.replicas:
        ops, tensors, fetches, control_outputs = _this_replica(ops, tensors, captured)
    ops = _after_merged_filter_grads(ops, captured.graph_def)
    tensors = _keep_padded_tensors(tensors, captured.graph_def)
    unprofiled = []
    if profile is not None:
        timed = []
        for op in ops:
            if op.name in profile:
                p = profile.op(op.name)
                timed.append(replace(op, time_s=p.time_s, scratch_bytes=p.scratch_bytes))
            else:
                unprofiled.append(op.name)
                timed.append(op)
        ops = timed
        # Tensors of no static size (a While's TensorList accumulators) take
        # the bytes the profile saw them hold.
        sized = []
        for t in tensors:
            op_name, _, slot = t.name.rpartition(":")
            if t.nbytes == 0 and op_name in profile:
                measured = profile.op(op_name).output_bytes
                if int(slot) < len(measured):
                    t = replace(t, nbytes=measured[int(slot)])
            sized.append(t)
        tensors = sized
    tensors = _hold_saved_state(ops, tensors)
    handle_of = {c.name: c.name for c in captured.captures if c.variable is not None}
    # A device variable's reads share its buffer, which in-place updates
    # write.  A host-homed variable's reads are values on the host, each a
    # parameter buffer of its own that the plan swaps in (a read after an
    # update holds the new value, so it is not the earlier read's buffer).
    host_homed = set(captured.host_homed)
    on_device = {h: v for h, v in handle_of.items() if h not in host_homed}
    tensors = _set_aliases(ops, tensors, profile, on_device, keep=fetches)
    ops, tensors, host_values, host_ops = _host_side(ops, tensors, captured.device)
    reads = {f"{op.name}:0": op.inputs[0] for op in ops
             if op.type == "ReadVariableOp" and op.inputs and op.inputs[0] in handle_of}
    variables = list(reads) + [v for v in host_values if v not in reads]
    writers = [op.name for op in ops if op.type not in VARIABLE_READERS
               and any(t in handle_of for t in op.inputs)]
    first_read = {}
    for value, handle in reads.items():
        if handle in on_device:
            first_read.setdefault(handle, value)
    updates, assigned, writebacks = {}, [], {}
    op_device = {op.name: op.device for op in ops}
    nbytes = {t.name: t.nbytes for t in tensors}
    for op in ops:
        handles = [t for t in op.inputs if t in handle_of]
        if op.name in host_ops:
            # Work placed on the host (tfswap.tf.host_side): what it reads from the
            # device leaves through a swap-out, as for an update.
            moved = sum(nbytes[t] for t in op.inputs)
            if moved:
                writebacks[op.name] = moved
            continue
        if op.name not in writers or not handles:
            continue
        if handles[0] in host_homed:
            # The update runs where the variable lives; what it reads from the
            # device leaves through a swap-out (tfswap.tf.rewrite), and the device
            # copy is freed then, not kept to the end.
            moved = sum(nbytes[t] for t in op.inputs if t not in handle_of
                        and not same_device(op_device[t.rpartition(":")[0]], op.device))
            if moved:
                writebacks[op.name] = moved
        elif op.type == "AssignVariableOp":
            assigned.extend(t for t in op.inputs[1:] if t not in handle_of)
        elif handles[0] in first_read:
            updates[op.name] = first_read[handles[0]]
    if profile is not None and profile.source == "trace":
        ops = _keep_traced_forwards(ops, tensors, profile.executed_order, updates)
    ops, before_updates = _updates_after_old_readers(ops, tensors, updates)
    # What an update allocated in the profiled run is the copy TF's order made
    # of its variable (copy-on-write): a planned step makes none (the edges
    # above), and the unmodified step's prediction counts it as a copy.
    root_bytes = {u: nbytes[v] for u, v in updates.items()}
    ops = [replace(op, scratch_bytes=op.scratch_bytes - root_bytes[op.name])
           if op.name in root_bytes and root_bytes[op.name] and
           op.scratch_bytes >= root_bytes[op.name] else op for op in ops]
    graph = DataflowGraph.build(ops, tensors)
    if classify:
        graph = kinds_mod.classify(
            graph, loss=fetches, variables=variables,
            # An argument the step never reads (Grappler pruned it) is no input.
            inputs=[f for f in captured.feeds if f.rpartition(":")[0] in needed],
            writers=writers, small_bytes=small_bytes)
    keep_ops = {f.rpartition(":")[0] for f in fetches} | set(control_outputs)
    if reduce:
        graph, node_map = _reduce(graph, tf_graph, keep_ops, fold_bytes)
    else:
        node_map = {op.name: op.name for op in graph.ops}
    pruned = tuple(n.name for n in captured.graph_def.node if n.name not in needed)
    nodes_by_name = {n.name: n for n in captured.graph_def.node}
    merged_ops = merged(captured.graph_def)
    variable_bytes = sum(int(np.prod(c.variable.shape)) * c.variable.dtype.size
                         for c in captured.captures if c.variable is not None
                         and not c.host_homed and (not captured.replicas or
                                                   same_device(c.variable.device,
                                                               captured.device)))
    return LoweredGraph(
        graph=graph, node_map=node_map, pruned=pruned, fetches=tuple(fetches),
        resident=tuple(v for v in reads if reads[v] in on_device and
                       node_map.get(v.rpartition(":")[0]) == v.rpartition(":")[0]),
        variable_bytes=variable_bytes,
        unprofiled=tuple(n for n in unprofiled if node_map.get(n) == n), profile=profile,
        updates={o: v for o, v in updates.items() if node_map.get(o) == o},
        before_updates={o: tuple(r for r in rs if node_map.get(r) == r)
                        for o, rs in before_updates.items() if node_map.get(o) == o},
        assigned=tuple(t for t in assigned if node_map.get(t.rpartition(":")[0]) ==
                       t.rpartition(":")[0]),
        writebacks={o: b for o, b in writebacks.items() if node_map.get(o) == o},
        host_ops={o: b for o, b in host_ops.items() if node_map.get(o) == o},
        recomputable=frozenset(op.name for op in graph.ops if not refusal(
            nodes_by_name[op.name], tf_graph, captured.device, merged_ops)))
