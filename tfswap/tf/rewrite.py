"""Plan -> GraphDef with SwapOut/SwapIn ops, the schedule's control chain and devices.

For each swap (SwapAdvisor §4.2, Fig. 3):

* ``SwapOut`` reads the tensor on the device and runs after ``out_after``
  (control edge); its output is the host copy;
* ``SwapIn`` reads the SwapOut's output and runs after its trigger op
  ``in_after`` (none when it is empty) and after the swap-outs listed in
  ``in_wait_for``;
* the ops listed in ``out_before`` run after the SwapOut (they take the
  memory it frees);
* the listed consumers read the SwapIn's output; every other reader keeps
  reading the original;
* a tensor that leaves more than once leaves from its newest copy (the
  previous SwapIn's output), so each swap-out releases what is on the device.

A host-homed variable's read (a ``ReadVariableOp`` on the host) is a
parameter: a ``prefetch`` is a SwapIn of the read with no SwapOut; a
``drop`` or ``writeback`` adds nothing (the host variable is current: its
update ran on the host, and TF frees the device copy after its last reader);
a swap-in waiting for one waits for its ``out_after`` op.  Every op on the
device must read such a value through a SwapIn (tiny ones get one right after
the read; shape-only readers move to the host), or the rewrite refuses.

Consecutive ops of the schedule are chained with control edges so the
executor runs them in the planned order.  The function never mutates its
input.

Exceptions to the chain keep the step running, and computing, what the
unmodified one does where TensorFlow's oneDNN pass merges two ops into one
kernel when it instantiates the step (on CPU; :mod:`tfswap.tf.grappler`).  It
merges only ops with the same control inputs, so a chain edge of one alone
keeps them apart, and then the step computes differently (a convolution's
filter and bias gradients, :func:`~tfswap.tf.grappler.filter_and_bias_grads`);
and the merged node keeps the outgoing edges of both, so a chain edge out of
the first that leads to the second is a cycle (a Pad and the VALID
convolution reading it, :func:`~tfswap.tf.grappler.pads_into_convs`).  So
one op of each pair the unmodified step merges, the rider, leaves the chain
and takes the control inputs of the other, its anchor, and runs with it: a
bias gradient with its filter gradient, which the planner schedules before
it (:mod:`tfswap.tf.ir` orders them so), reading the copy of the output
gradient the filter gradient reads; a Pad with its convolution.  A swap the
plan triggers after a rider is triggered after the op the chain runs before
the rider's place instead (see :func:`_stand_ins`).

Example::

    rewritten = rewrite(captured, plan, device="/device:CPU:0", host="/device:CPU:1")
    rewritten.graph_def          # the GraphDef to bind with tfswap.tf.runtime
"""

from __future__ import annotations

import dataclasses
import numbers
from bisect import bisect_right
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2

from tfswap import ops
from tfswap.core.plan import Plan
from tfswap.tf import grappler
from tfswap.tf.capture import CapturedFunction, local_device, same_device
from tfswap.tf.ir import VARIABLE_READERS
from tfswap.tf.shapes import import_with_shapes

SWAP_OUT_OP = "SwapOut"
SWAP_IN_OP = "SwapIn"
SWAP_SCOPE = "tfswap"


class RewriteError(ValueError):
    """The plan does not fit the graph; the message names the op or tensor."""


@dataclass(frozen=True)
class SwapNodes:
    swap_id: str
    tensor: str
    swap_out: str   # node names in the rewritten GraphDef ("" for a prefetch: no swap-out)
    swap_in: str


@dataclass(frozen=True)
class RewrittenGraph:
    graph_def: graph_pb2.GraphDef
    swaps: tuple[SwapNodes, ...]
    schedule: tuple[str, ...]
    device: str
    host: str


def split_tensor_name(name: str) -> tuple[str, int]:
    op, _, index = name.partition(":")
    return op, int(index) if index else 0


def _input_ref(op: str, index: int) -> str:
    return op if index == 0 else f"{op}:{index}"


def _data_inputs(node) -> list[tuple[str, int]]:
    return [split_tensor_name(i) for i in node.input if not i.startswith("^")]


def _predecessors(node) -> list[str]:
    return [i.lstrip("^").partition(":")[0] for i in node.input]


# Ops whose output is a view of their first input (same buffer, same bytes).
# A consumer that reads such a view of a swapped tensor reads the same view
# of the swapped-in copy: the view ops are cloned onto the SwapIn.
VIEW_OPS = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                      "PreventGradient", "EnsureShape", "CheckNumerics", "Bitcast"})


# Ops that read only their inputs' shapes.
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def _view_chain(nodes: dict, ref: tuple[str, int], source: tuple[str, int]) -> list[str] | None:
    """View ops leading from ``source`` to tensor ``ref`` (first input only), or None."""
    chain = []
    while ref != source:
        node = nodes.get(ref[0])
        if node is None or node.op not in VIEW_OPS or ref[1] != 0 or not _data_inputs(node):
            return None
        chain.append(node.name)
        ref = _data_inputs(node)[0]
    return chain[::-1]


def _reads(nodes: dict, node, source: tuple[str, int]) -> bool:
    return any(_view_chain(nodes, ref, source) is not None for ref in _data_inputs(node))


def _repoint(graph_def, nodes: dict, node, source: tuple[str, int], swap_in: str, k: int) -> None:
    """Make ``node`` read ``swap_in`` (through cloned views) wherever it read ``source``."""
    for i, raw in enumerate(node.input):
        if raw.startswith("^"):
            continue
        chain = _view_chain(nodes, split_tensor_name(raw), source)
        if chain is None:
            continue
        current = swap_in
        for view in chain:
            clone_name = f"{SWAP_SCOPE}/swap_in_{k}/{view}"
            if clone_name not in nodes:
                clone = graph_def.node.add()
                clone.CopyFrom(nodes[view])
                clone.name = clone_name
                clone.input[0] = current
                nodes[clone_name] = clone
            current = clone_name
        node.input[i] = current


def _orders(nodes: dict, name: str) -> bool:
    """Whether a control edge from or to ``name`` orders anything.

    An argument or captured-variable ``Placeholder`` exists before the step
    starts, so an edge to or from it orders nothing; and ``import_graph_def``'s
    ``input_map`` remaps data inputs only, so an edge left on a placeholder
    would need it fed a second time ("You must feed a value for placeholder").
    """
    return bool(name) and nodes[name].op != "Placeholder"


def _foldable(graph_def, reference: tf.Graph) -> frozenset:
    """The ops whose values TensorFlow's run-time constant folding may compute
    when it instantiates the step: stateless ops whose data inputs are all
    constants or foldable themselves (a mean loss's gradient seed, a ``Tile`` of
    ones scaled by a constant, where Grappler left it).  The folding replaces
    the data edges out of such an op with a constant, so a data edge alone does
    not keep its reader after it: the op then runs whenever its own inputs
    allow, holding its output (and an input it writes in place) where the plan
    counts it freed (fuzz seed 8263: a 256 KiB ``Tile`` still held when three
    swap-ins were made, 4.4% over the budget; seed 7055).  The schedule chain
    gives each such data edge a control edge of its own, which the folding
    keeps."""
    ops_by_name = {op.name: op for op in reference.get_operations()}
    nodes = {n.name: n for n in graph_def.node}
    constant: set[str] = set()   # Const nodes and the ops folded from them
    for name in topological_order(graph_def):   # inputs first; no recursion on deep steps
        node, op = nodes[name], ops_by_name.get(name)
        if node.op == "Const":
            constant.add(name)
        elif op is not None and node.op not in _NEVER_FOLDED and not op.op_def.is_stateful \
                and all(t.dtype != tf.resource for t in op.inputs):
            inputs = _data_inputs(node)
            if inputs and all(source in constant for source, _ in inputs):
                constant.add(name)
    return frozenset(name for name in constant if nodes[name].op != "Const")


def _shape_reads_first(graph_def, nodes: dict, position: dict, device: str) -> None:
    """Run each shape-only reader (``Shape``, ``Size``, ...) the schedule leaves out
    before the scheduled ops that read the same value: a control edge from it to
    each of them.

    The lowering drops these ops (TF folds most of them), so the schedule chain
    does not order them; one TF keeps runs when the executor gets to it, holding
    a reference to the value while it waits.  An op that the plan has writing
    its output into that value's buffer (TF forwards an input only when
    nothing else holds it) then allocates a new buffer instead: the Keras
    Transformer of tests/tf/test_keras.py at 50%, a GELU's gradient ``Mul`` run
    before the ``Shape`` of its ``Erfc`` input, 512 KiB more than planned, 5.62
    MB for a 5.69 MB budget in 1 of 40 runs (a plan predicted at 5.16 MB).  A
    shape reader that also waits for something (Keras's loss takes the
    logits' ``Shape`` after a label-shape ``Assert``) holds its value as long.

    An edge is added only where the shape reader comes before the op in one
    topological order of the graph (the unscheduled ops, shape readers and what
    they wait for, as early as they can run), so the edges cannot close a cycle."""
    readers: dict[tuple[str, int], list] = defaultdict(list)
    for node in graph_def.node:
        if node.name in position:
            for ref in _data_inputs(node):
                readers[ref].append(node)
    shape_reads = [node for node in graph_def.node
                   if node.op in SHAPE_OPS and node.name not in position
                   and same_device(node.device, device)
                   and any(ref in readers for ref in _data_inputs(node))]
    if not shape_reads:
        return
    rank = _unscheduled_first(graph_def, position)
    for node in shape_reads:
        for ref in _data_inputs(node):
            for reader in readers.get(ref, ()):
                if rank[node.name] < rank[reader.name] and "^" + node.name not in reader.input:
                    reader.input.append("^" + node.name)


def _unscheduled_first(graph_def, position: dict) -> dict[str, int]:
    """Each node's place in a topological order that runs a ready node the
    schedule leaves out before any scheduled one."""
    nodes, indeg, succ = _in_degrees(graph_def)
    free = deque(name for name in nodes if indeg[name] == 0 and name not in position)
    chained = deque(name for name in nodes if indeg[name] == 0 and name in position)
    rank: dict[str, int] = {}
    while free or chained:
        name = free.popleft() if free else chained.popleft()
        rank[name] = len(rank)
        for s in succ[name]:
            indeg[s] -= 1
            if indeg[s] == 0:
                (chained if s in position else free).append(s)
    if len(rank) != len(nodes):
        topological_order(graph_def)   # raises, naming the cycle
    return rank


# Ops the run-time folding leaves alone however constant their inputs.
_NEVER_FOLDED = frozenset({"Placeholder", "Switch", "Merge", "Enter", "Exit", "NextIteration",
                           "LoopCond", "SwapIn", "SwapOut"})


def _in_degrees(graph_def) -> tuple[dict, dict[str, int], dict[str, list[str]]]:
    """The GraphDef's nodes by name, each one's count of distinct predecessors in
    the graph, and each one's successors."""
    nodes = {n.name: n for n in graph_def.node}
    indeg = {name: 0 for name in nodes}
    succ = defaultdict(list)
    for n in graph_def.node:
        for p in set(_predecessors(n)):
            if p in nodes:
                indeg[n.name] += 1
                succ[p].append(n.name)
    return nodes, indeg, succ


def topological_order(graph_def) -> list[str]:
    """A topological order of the GraphDef's nodes (ties kept in GraphDef order).

    Raises :class:`RewriteError` naming nodes on a cycle.
    """
    nodes, indeg, succ = _in_degrees(graph_def)
    ready = deque(name for name in nodes if indeg[name] == 0)
    order = []
    while ready:
        name = ready.popleft()
        order.append(name)
        for s in succ[name]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(order) != len(nodes):
        stuck = sorted(name for name, d in indeg.items() if d > 0)[:8]
        raise RewriteError(f"the rewritten graph has a cycle through {stuck}; the plan's "
                           "schedule or swap triggers contradict the graph's dependencies")
    return order


def _check_schedule(plan: Plan, nodes: dict) -> dict[str, int]:
    position = {}
    for i, op in enumerate(plan.schedule):
        if op not in nodes:
            raise RewriteError(f"scheduled op {op!r} is not in the graph")
        position[op] = i
    # Every scheduled op must come after its scheduled predecessors, or the
    # control chain would deadlock the step.
    for op in plan.schedule:
        for p in _predecessors(nodes[op]):
            if p in position and position[p] > position[op]:
                raise RewriteError(
                    f"schedule runs {op!r} (position {position[op]}) before its input "
                    f"{p!r} (position {position[p]}); a schedule must be a topological order")
    return position


@dataclass(frozen=True)
class HostValue:
    """A value made on the host that device ops read through a swap-in."""

    shape: tf.TensorShape
    dtype: tf.DType
    device: str

    @property
    def nbytes(self) -> int:
        return (self.shape.num_elements() or 0) * self.dtype.size


def host_values_of(captured: CapturedFunction, graph_def) -> dict[tuple[str, int], HostValue]:
    """The values made on the host: reads of host-homed variables (ReadVariableOp
    outputs on the host) and the outputs of ops computing there
    (:mod:`tfswap.tf.host_side`) -> their shape, dtype and device."""
    handles = {c.name.partition(":")[0]: c.variable for c in captured.captures if c.host_homed}
    found = {(n.name, 0): HostValue(handles[n.input[0].partition(":")[0]].shape,
                                    handles[n.input[0].partition(":")[0]].dtype,
                                    handles[n.input[0].partition(":")[0]].device)
             for n in graph_def.node
             if n.op == "ReadVariableOp" and n.input and n.input[0].partition(":")[0] in handles}
    computing = [n for n in graph_def.node
                 if _computes_on_host(n, captured.device, handles, captured.replicas)]
    if computing:
        from tfswap.tf.shapes import import_with_shapes

        graph = import_with_shapes(captured, graph_def)
        for node in computing:
            for k, t in enumerate(graph.get_operation_by_name(node.name).outputs):
                if t.dtype not in (tf.resource, tf.variant, tf.string):
                    found[(node.name, k)] = HostValue(t.shape, t.dtype, node.device)
    return found


def _computes_on_host(node, device: str, handles, replicas=()) -> bool:
    """An op placed off the device (and off a replicated step's other devices)
    that computes (not a variable's read or write, a placeholder or a constant)."""
    return bool(node.device) and bool(device) \
        and not any(same_device(node.device, d) for d in (device,) + tuple(replicas)) \
        and node.op not in ("Placeholder", "Const", "NoOp") and node.op not in VARIABLE_READERS \
        and not any(i.partition(":")[0] in handles for i in node.input if not i.startswith("^"))


def _direct_host_reads(graph_def, nodes: dict, host_values, device: str) -> dict:
    """Host-homed value -> the ops on the device that read it (through views)
    other than by a SwapIn."""
    def origin(ref):
        while ref[0] in nodes and nodes[ref[0]].op in VIEW_OPS and ref[1] == 0 \
                and _data_inputs(nodes[ref[0]]):
            ref = _data_inputs(nodes[ref[0]])[0]
        return ref

    found: dict = {}
    if not host_values:
        return found
    for node in graph_def.node:
        if node.op in VIEW_OPS or node.op == SWAP_IN_OP or not same_device(node.device, device):
            continue
        for ref in _data_inputs(node):
            value = origin(ref)
            if value in host_values and node not in found.setdefault(value, []):
                found[value].append(node)
    return found


def _fetch_unplanned_host_reads(graph_def, nodes: dict, host_values, device: str,
                                small_bytes: int, link: float | None = None) -> None:
    """The host-homed values the plan does not fetch: move their shape-only
    readers to the host, and give each small one (an iteration counter, a
    bias: small tensors live in the plan's small pool and are never planned)
    that device ops read directly one SwapIn, right after the read."""
    direct = _direct_host_reads(graph_def, nodes, host_values, device)
    for k, value in enumerate(sorted(direct)):
        made = host_values[value]
        for reader in direct[value]:
            if reader.op in SHAPE_OPS:   # needs the shape, not the bytes: ask the host
                reader.device = local_device(made.device)
        direct[value] = [r for r in direct[value] if r.op not in SHAPE_OPS]
        if not direct[value]:
            continue
        if made.nbytes >= small_bytes:
            continue
        name = f"{SWAP_SCOPE}/small_in_{k}"
        node = graph_def.node.add(name=name, op=SWAP_IN_OP, device=device)
        node.input.append(_input_ref(*value))
        node.attr["T"].type = made.dtype.as_datatype_enum
        if link is not None:   # a copy over the emulated link too (the simulator has no
            node.attr["link_bytes_per_s"].f = link   # small-pool copies: a few bytes)
        node.attr["_output_shapes"].list.shape.add().CopyFrom(made.shape.as_proto())
        nodes[name] = node
        for reader in direct[value]:
            _repoint(graph_def, nodes, reader, value, name, f"small_{k}")


def _write_back_host_updates(graph_def, captured: CapturedFunction, reference: tf.Graph,
                             device: str, link: float | None) -> None:
    """Give each update of a host-homed variable (it runs on the host, where the
    variable lives), and each other op computing on the host
    (:mod:`tfswap.tf.host_side`), the device values it reads through a SwapOut.

    The copy is then one of tfswap's, started as soon as the value is made,
    instead of one TensorFlow makes behind the plan's back when the update
    runs (on the emulated device such a copy is free and unmeasured).
    ``tfswap.tf.ir.lower`` lists the same bytes as the update's writebacks.
    ``reference``: the captured graph imported, for the values' dtypes.
    """
    handles = {c.name.partition(":")[0] for c in captured.captures if c.host_homed}
    if not handles:
        return
    nodes = {n.name: n for n in graph_def.node}   # the swap ops added so far too
    made: dict[str, str] = {}
    for node in list(graph_def.node):
        if node.op in VARIABLE_READERS or same_device(node.device, device):
            continue
        if not (_computes_on_host(node, device, handles, captured.replicas) or any(
                i.partition(":")[0] in handles for i in node.input if not i.startswith("^"))):
            continue
        for slot, raw in enumerate(node.input):
            if raw.startswith("^") or raw.partition(":")[0] in handles:
                continue
            op, index = split_tensor_name(raw)
            producer = nodes[op]
            if not same_device(producer.device, device):
                continue
            if raw not in made:
                name = f"{SWAP_SCOPE}/write_back_{len(made)}"
                out = graph_def.node.add(name=name, op=SWAP_OUT_OP, device=device)
                out.input.append(raw)
                try:   # a value of the captured graph
                    out.attr["T"].type = \
                        reference.get_tensor_by_name(f"{op}:{index}").dtype.as_datatype_enum
                except KeyError:   # a copy the rewrite made (a SwapIn, a cloned view)
                    out.attr["T"].CopyFrom(producer.attr["T"])
                if link is not None:
                    out.attr["link_bytes_per_s"].f = link
                made[raw] = name
            node.input[slot] = made[raw]


def _check_host_reads(graph_def, nodes: dict, host_values, device: str) -> None:
    """Every op on the device reads a host-homed variable's value through a SwapIn.

    Reading it directly would make TF copy it in behind the plan's back (on
    the emulated device that copy is free and unmeasured, so the check keeps
    the measured peak honest).
    """
    for value, readers in _direct_host_reads(graph_def, nodes, host_values, device).items():
        raise RewriteError(
            f"op {readers[0].name!r} on the device reads {value[0]}, a host-homed variable's "
            "value, without a swap-in: the plan must fetch every read of a host variable "
            "(plan with tfswap.optimize, or add a prefetch swap for it)")


def _remake_positions(plan, nodes: dict, position: dict) -> dict[str, int]:
    """The position each recomputation runs before (swap id -> position): its first
    consumer, the op after its ``in_after`` where the plan names one, or that of an
    earlier recomputation whose ops read its tensor, dropped before it (a segment
    made again forward; :func:`tfswap.core.program.inputs_back` derives the same
    for the simulator)."""
    recs = [s for s in plan.swaps if s.kind == "recompute" and s.consumers
            and all(c in position for c in s.consumers)]
    need = {}
    for s in recs:
        need[s.id] = min(position[c] for c in s.consumers)
        if s.in_after:
            # At out_after itself too: made again right after the op it was
            # dropped after (from_plan's rule; the zoo LSTM-4 at 40%).
            if s.in_after not in position or not \
                    position.get(s.out_after, -1) <= position[s.in_after] < need[s.id]:
                raise RewriteError(f"swap {s.id!r}: in_after {s.in_after!r} is not a scheduled "
                                   f"op at or after {s.out_after!r} and before its first "
                                   "consumer")
            need[s.id] = position[s.in_after] + 1
    todo = list(recs)
    while todo:
        y = todo.pop()
        ops = y.ops or (split_tensor_name(y.tensor)[0],)
        inputs = [ref for op in ops if op in nodes
                  for ref in _data_inputs(nodes[op]) if ref[0] not in ops]
        for x in recs:
            if x is y or need[x.id] <= need[y.id] or \
                    position.get(x.out_after, need[y.id]) >= need[y.id]:
                continue
            source = split_tensor_name(x.tensor)
            if any(_view_chain(nodes, ref, source) is not None for ref in inputs):
                need[x.id] = need[y.id]
                todo.append(x)
    return need


def _recompute(graph_def, nodes: dict, swap, k: int, position: dict, reference,
               trigger, device: str, merged_ops: frozenset, first: int | None = None,
               original: dict | None = None, fetched=frozenset(),
               shared: dict | None = None) -> list[str]:
    """Add the copies of the ops that make ``swap.tensor`` again (``swap.ops``, or
    its producer), in order, each run after the op the schedule puts just
    before ``first`` (default: the first consumer); their names.

    A copy reads what its op reads in the captured step (``original``: its
    nodes; default ``nodes``), an earlier op of the chain's copy where the
    chain makes that value: not what an earlier swap or recomputation has
    repointed the op itself to since.  Copied from the repointed op, an LSTM
    gate's chain (MatMul, MatMul_1, Add, BiasAdd, Split, Sigmoid) whose Add
    the plan had fed a forward remake of its MatMul read that remake instead
    of the chain's own MatMul: the remake stayed on the device from the
    forward pass to the backward chain, where the memory model has it gone
    (the zoo LSTM-4 at 40% measured 1,394,704 B for a predicted 759,736 B).
    The rewrite's last pass points each input the chain does not make at the
    copy the plan has on the device then; a host value (``fetched``: a
    host-homed variable's read, or a value made on the host) is read from the
    copy its op reads.  Every copy waits for that op, not
    only the first: a chain op reading nothing the chain makes (the
    recurrent MatMul_1) would otherwise run as soon as its inputs exist,
    and hold its output from there.

    ``shared``: (position, op) -> the copy of that op a recomputation before the
    same position made (filled here): a chain reuses it instead of running the op
    again, as the simulator charges remakes that share ops there once (an LSTM
    cell's four gates remade through one Split)."""
    original = nodes if original is None else original
    from tfswap.tf.recomputable import refusal

    producer, _ = split_tensor_name(swap.tensor)
    ops = swap.ops or (producer,)
    if ops[-1] != producer:
        raise RewriteError(f"swap {swap.id!r}: its last op {ops[-1]!r} does not make "
                           f"{swap.tensor}")
    for op in ops:
        if op not in nodes:
            raise RewriteError(f"swap {swap.id!r}: op {op!r} is not in the graph")
        why = refusal(nodes[op], reference, device, merged_ops)
        if why:
            raise RewriteError(f"swap {swap.id!r}: {op!r} cannot be recomputed: {why}; "
                               "swap its output instead")
    for consumer in swap.consumers:
        if consumer not in nodes or consumer not in position:
            raise RewriteError(f"swap {swap.id!r}: consumer {consumer!r} is not a scheduled op")
        if not _reads(nodes, nodes[consumer], split_tensor_name(swap.tensor)):
            raise RewriteError(f"swap {swap.id!r}: {consumer!r} does not read {swap.tensor} "
                               "(or a view of it)")
    first = min(position[c] for c in swap.consumers) if first is None else first
    if position.get(swap.out_after, -1) >= first:
        raise RewriteError(f"swap {swap.id!r}: the copy is dropped after {swap.out_after!r}, "
                           "not before the consumers that read it recomputed")
    before = [op for op, at in position.items() if at == first - 1]
    made: dict[str, str] = {}
    for j, op in enumerate(ops):
        if shared is not None and (first, op) in shared:
            made[op] = shared[(first, op)]
            continue
        name = f"{SWAP_SCOPE}/recompute_{k}" + (f"_{j}" if j < len(ops) - 1 else "")
        clone = graph_def.node.add()
        clone.CopyFrom(nodes[op])
        clone.name = name
        del clone.input[:]
        now = [raw for raw in nodes[op].input if not raw.startswith("^")]
        for raw, then in zip((raw for raw in original[op].input if not raw.startswith("^")),
                             now):
            source, index = split_tensor_name(raw)
            if source in made:
                clone.input.append(_input_ref(made[source], index))
            elif (source, index) in fetched:   # a host value: the copy the plan fetched
                clone.input.append(then)
            else:
                clone.input.append(raw)
        if before and _orders(nodes, trigger(before[0])):
            clone.input.append("^" + trigger(before[0]))
        nodes[name] = clone
        made[op] = name
        if shared is not None:
            shared[(first, op)] = name
    return [made[op] for op in ops]


def _copies_synchronous(device: str) -> bool:
    """Whether a swap op on ``device`` has copied its bytes when its kernel
    returns: a CPU device's plain memcpy (no emulated link).  A GPU's copy, and a
    throttled CPU copy, finish later, on their link."""
    return tf.DeviceSpec.from_string(device).device_type == "CPU"


def _copies_in_turn(graph_def, nodes: dict, plan, swap_out_node: dict, swap_in_node: dict,
                    riders, elsewhere, position: dict) -> None:
    """Where the copies are memcpys done when their kernels return, the scheduled
    op after the one each swap-out follows waits for it, and likewise the one
    after each swap-in's trigger, so both run where the plan puts them.

    Left free, TF's executor ran some swap-outs many ops late, each holding its
    buffer till then (a random step's ``Relu`` held 512 KiB six ops past its
    trigger beside a swap-in that took the room: 24% over its prediction and
    over the budget in about 1 session of 12, fuzz seed 8018; a Keras
    Transformer's up to 79 ops late, 1-2% over), and ordered alone they let it
    run an early swap-in late instead, 11% under the model, which holds a
    swap-in from its trigger (issue #44).  The edges cost nothing there (the
    copy is done when its kernel is); on a link the copy takes time and
    waiting would stall the compute ops, so they are not made.

    An edge is added only where the copy comes before the op in one topological
    order of the graph (:func:`_unscheduled_first`: the copies as early as they
    can run), so the edges cannot close a cycle: a swap-in that waits for a
    swap-out the plan puts later is left free.  An op that a rider runs with
    (:func:`_ride_with`) gets the edge only together with its riders, since
    oneDNN merges only ops with the same control inputs (a convolution's filter
    gradient apart from its bias gradient computes differently: the Keras CNN
    of ``test_batchnorm_dropout_rmsprop_grouped_steps_and_a_smaller_last_batch``
    trained 7e-5 off through RMSprop)."""
    chained = [op for op in plan.schedule if op not in riders and op not in elsewhere
               and nodes[op].input]
    at = [position[op] for op in chained]   # ascending: the schedule's order
    riding: dict[str, list[str]] = defaultdict(list)   # anchor -> its riders
    for rider, anchor in riders.items():
        riding[anchor].append(rider)
    rank = None
    for swap in plan.swaps:
        for copy, trigger_op in ((swap_out_node.get(swap.id), swap.out_after),
                                 (swap_in_node.get(swap.id), swap.in_after)):
            if copy is None or trigger_op not in position:
                continue
            k = bisect_right(at, position[trigger_op])
            if k == len(chained) or ("^" + copy.name) in nodes[chained[k]].input:
                continue
            if rank is None:
                rank = _unscheduled_first(graph_def, position)
            waiting = [chained[k], *riding.get(chained[k], ())]
            if all(rank[copy.name] < rank[op] for op in waiting):
                for op in waiting:
                    nodes[op].input.append("^" + copy.name)


def _remakes_in_turn(nodes: dict, recomputed, remade_at: dict, position: dict) -> None:
    """The remakes before one op run one after the other, in the order the
    simulator runs them (:func:`tfswap.core.program._recompute_order`: the
    position of the last op each runs again first): each copy of a remake that
    no remake before it there runs (they share copies) waits for the last copy
    of the one before.  Triggered together, their
    copies ran in any order, and which one's op could write into a buffer in
    place changed with it: BERT-style at 40% on a 50 MB/s link ran a GELU's
    ``Erfc`` copy before the ``Square`` copy of the remake before it, so the
    ``Erfc`` found the input they share still wanted and took 2 MiB of its own,
    10% over the predicted peak and over the budget (issue #44).  The one a
    remake's ops read comes first in that order, and a copy no earlier remake
    runs feeds none of theirs, so no edge closes a cycle."""
    at: dict[int, list] = {}
    for _, swap, clones in recomputed:
        ops = swap.ops or (split_tensor_name(swap.tensor)[0],)
        last = max((position.get(op, -1) for op in ops), default=-1)
        at.setdefault(remade_at[swap.id], []).append((last, swap.tensor, clones))
    for remakes in at.values():
        remakes.sort(key=lambda r: (r[0], r[1]))
        ran = set(remakes[0][2])
        for (_, _, previous), (_, _, clones) in zip(remakes, remakes[1:]):
            for clone in clones:
                if clone not in ran and ("^" + previous[-1]) not in nodes[clone].input:
                    nodes[clone].input.append("^" + previous[-1])
            ran.update(clones)


def _check_link(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not 0 < value <= float(np.finfo(np.float32).max) \
            or float(np.float32(value)) <= 0:   # the attr is a float32
        raise ValueError(f"emulated_link_bytes_per_s must be None or a finite number of "
                         f"bytes per second > 0, got {value!r}")
    return float(value)


def _copy_node(graph_def, nodes: dict, name: str, op: str, device: str, source: str,
               after: str, dtype_attr, shapes, link: float | None):
    """Add a SwapOut/SwapIn node reading ``source``, started once ``after`` has run."""
    node = graph_def.node.add(name=name, op=op, device=device)
    node.input.append(source)
    if _orders(nodes, after):
        node.input.append("^" + after)
    node.attr["T"].CopyFrom(dtype_attr)
    if link is not None:
        node.attr["link_bytes_per_s"].f = link
    if shapes.list.shape:
        node.attr["_output_shapes"].CopyFrom(shapes)
    return node


def _riders(captured: CapturedFunction, plan: Plan, position: dict) -> dict[str, str]:
    """Rider -> its anchor, for the pairs TensorFlow merges in the captured step
    (so the unmodified step runs each as one kernel).

    A bias gradient rides with its filter gradient where the plan schedules it
    after the filter gradient: it reads nothing the filter gradient does not,
    and everything reading its output is scheduled later still.  Scheduled
    before, the merged kernel would come after ops the plan put between them
    that read the bias gradient or wait for it, so the pair runs apart (plans
    from ``tfswap.optimize`` never do that; a hand plan can).  A Pad rides
    with its convolution, the only reader of its output, unless the plan
    swaps that output (a SwapOut reads it too, so TensorFlow merges nothing);
    the merged kernel holds the Pad's input instead of the padded tensor,
    which is no smaller, so memory stays within the plan's.
    """
    riders = {bias: filt for filt, bias in grappler.filter_and_bias_grads(captured.graph_def)
              if filt in position and bias in position and position[filt] < position[bias]}
    swapped = {split_tensor_name(swap.tensor)[0] for swap in plan.swaps}
    riders.update({pad: conv for pad, conv in grappler.pads_into_convs(captured.graph_def)
                   if pad in position and conv in position and pad not in swapped})
    return riders


def _stand_ins(schedule, nodes: dict, riders) -> dict[str, str]:
    """Rider (or another op the chain leaves out) -> the op the chain runs just
    before the rider's place in the schedule ("" where none does: what waits
    for it may start with the step).

    What the plan triggers after a rider (a swap-out, a swap-in, a drop) is
    triggered after this op instead.  After the rider itself, a swap-in would
    start before the plan has freed its memory where the rider runs earlier
    than planned (a bias gradient, with its filter gradient), and where it runs
    later (a Pad, with its convolution) it would hold back a swap-in that an op
    scheduled before the convolution reads: a cycle.  Here, a swap-in finds
    the memory the plan gave it: what a bias gradient's last read would free,
    the merged kernel has freed already, and the merged convolution never
    makes the padded tensor that the Pad would have added.
    """
    stand_in, previous = {}, ""
    for op in schedule:
        if op in riders:
            stand_in[op] = previous
        elif nodes[op].input:       # what the chain orders (see the schedule chain)
            previous = op
    return stand_in


def _ride_with(nodes: dict, rider: str, anchor: str) -> None:
    """Give ``rider`` the control inputs of ``anchor`` so that TensorFlow's oneDNN
    pass merges them as in the unmodified step; a bias gradient also reads the
    copy of the output gradient its filter gradient reads (a plan may have
    swapped it in for one of them only, and the pass merges only readers of
    one node)."""
    rider_node, anchor_node = nodes[rider], nodes[anchor]
    data = [i for i in rider_node.input if not i.startswith("^")]
    if rider_node.op == grappler.BIAS_GRAD:
        anchor_data = [i for i in anchor_node.input if not i.startswith("^")]
        data[grappler.BIAS_GRAD_OUT_BACKPROP] = anchor_data[grappler.FILTER_GRAD_OUT_BACKPROP]
    del rider_node.input[:]
    rider_node.input.extend(data + [i for i in anchor_node.input if i.startswith("^")])


def rewrite(captured: CapturedFunction, plan: Plan, device: str, host: str, *,
            emulated_link_bytes_per_s: float | None = None,
            ordered_copies: bool = False, scope: str = SWAP_SCOPE) -> RewrittenGraph:
    """Apply ``plan`` to the captured graph; see the module docstring.

    ``scope``: the name scope of the nodes added (each replica of a replicated
    step is rewritten in turn, into the graph the previous one left, each with
    a scope of its own).

    ``emulated_link_bytes_per_s``: on the emulated device (CPU kernels), every
    SwapOut and SwapIn created here completes only when a link of that many
    bytes per second each way would have moved its bytes (one FIFO link per
    direction; ``swap_ops.cc``), so copies cost what they would on a slower,
    GPU-like link and overlap the compute ops (run with 2 or more executor
    threads).  Plan with ``cpu_emulated(link_bytes_per_s=...)`` at the same
    rate.  GPU kernels ignore it.  None (default): plain memcpys.

    ``ordered_copies``: chain the swap-outs with control edges in the order the
    simulator's device-to-host stream runs them (by the position of the op they
    follow), and the swap-ins in its host-to-device order (by their first
    reader's position; ``tfswap.core.program``), so each direction moves one
    copy at a time in the plan's order.  Off (default), the executor starts each
    copy when its own dependencies are done, which on a busy link can overtake
    a copy the plan put first."""
    link = _check_link(emulated_link_bytes_per_s)
    if not isinstance(ordered_copies, bool):
        raise ValueError(f"ordered_copies must be True or False, got {ordered_copies!r}")
    ops.load()  # the swap op types must be registered to import the result
    graph_def = graph_pb2.GraphDef()
    graph_def.CopyFrom(captured.graph_def)
    nodes = {n.name: n for n in graph_def.node}
    original = {n.name: n for n in captured.graph_def.node}   # inputs as captured
    position = _check_schedule(plan, nodes)
    riders = _riders(captured, plan, position)
    # A replica's plan schedules the values other replicas send it (as sources,
    # tfswap.tf.ir): their ops are not this device's to order.
    elsewhere = {op for op in plan.schedule if captured.replicas and nodes[op].device
                 and not same_device(nodes[op].device, device)
                 and any(same_device(nodes[op].device, d) for d in captured.replicas)}
    stand_in = _stand_ins(plan.schedule, nodes, set(riders) | elsewhere)

    def trigger(op: str) -> str:
        return stand_in.get(op, op)

    # The captured graph as the planner saw it, static shapes included: a Split
    # is offered for recomputation where its axis and rank are known
    # (recomputable.refusal), which a plain import may not say (fuzz seed 7176:
    # a planned remake of a Split refused here, a RewriteError out of optimize).
    reference = import_with_shapes(captured, captured.graph_def)

    # Both swap ops sit on the device, the swap-out's output being host memory
    # (HostMemory in the GPU kernel; on the emulated device measure counts it as
    # the host's).  A swap-out placed on the emulated host read the tensor
    # through a Send/Recv pair whose receive callback held the device buffer
    # until the executor thread that ran it returned, which could be several
    # ops after the swap-out (fuzz seed 1010: 560 us later, 256 KiB above the
    # budget in one run of eight), so when the memory came free was a matter
    # of thread timing instead of the plan's control edges.
    swap_out_device = device

    swap_nodes = []
    swap_out_name = {}
    swap_in_node = {}
    swap_out_node = {}
    # Device copies of each swapped tensor, oldest first: the original, then the
    # SwapIn of each round trip.  A tensor that leaves again leaves from its
    # newest copy; the original is gone after its first swap-out.
    copies: dict[tuple[str, int], list[tuple[str, int]]] = {}
    came_back: dict[tuple[str, int], str] = {}
    host_values = host_values_of(captured, graph_def)

    def at(swap) -> float:
        # A prefetch has no swap-out: it belongs just before its first reader.
        if swap.kind == "prefetch":
            return min((position.get(c, -1) for c in swap.consumers), default=-1) - 0.5
        return position.get(swap.out_after, -1)

    in_step_order = sorted(enumerate(plan.swaps), key=lambda e: at(e[1]))
    recomputed = []   # (k, swap, clone names): their inputs are pointed at after the loop
    merged_ops = remade_at = None
    shared_clones: dict[tuple[int, str], str] = {}   # remakes before one op share copies
    for k, swap in in_step_order:
        producer, index = split_tensor_name(swap.tensor)
        if swap.kind == "recompute":
            if merged_ops is None:   # the pairs TF merges in the step as captured
                from tfswap.tf.recomputable import merged

                merged_ops = merged(captured.graph_def)
            if remade_at is None:
                remade_at = _remake_positions(plan, nodes, position)
            clones = _recompute(graph_def, nodes, swap, k, position, reference, trigger,
                                device, merged_ops, remade_at.get(swap.id), original,
                                host_values, shared_clones)
            held = copies.setdefault((producer, index), [(producer, index)])
            for consumer in swap.consumers:
                for copy in held:
                    _repoint(graph_def, nodes, nodes[consumer], copy,
                             _input_ref(clones[-1], index), k)
            held.append((clones[-1], index))
            recomputed.append((k, swap, clones))
            swap_out_name[swap.id] = trigger(swap.out_after)
            swap_nodes.append((k, SwapNodes(swap.id, swap.tensor, "", clones[-1])))
            continue
        if swap.kind != "round_trip" and (producer, index) not in host_values:
            raise RewriteError(
                f"swap {swap.id!r} is a {swap.kind} of {swap.tensor}, which is not a read of a "
                "host-homed variable or a value made on the host: a device variable stays on the device (create the model "
                "and optimizer under tf.device(host) to keep parameters in host memory), so "
                "plan with its value resident (tfswap.pin_parameters)")
        if swap.kind in ("drop", "writeback"):
            # The host copy is current: reads see the host variable, and its
            # updates ran there.  The device copy is freed by TF after its last
            # reader, which runs before ``out_after``.
            if not _orders(nodes, swap.out_after):
                raise RewriteError(f"swap {swap.id!r}: {swap.kind} after {swap.out_after!r}, "
                                   "which is not an op of the step")
            swap_out_name[swap.id] = trigger(swap.out_after)
            continue
        if producer not in nodes:
            raise RewriteError(f"swap {swap.id!r}: tensor {swap.tensor!r} has no producer in the graph")
        try:
            tensor = reference.get_tensor_by_name(f"{producer}:{index}")
        except (KeyError, ValueError) as err:
            raise RewriteError(f"swap {swap.id!r}: {err}") from err
        if not tensor.dtype.is_numpy_compatible or tensor.dtype in (tf.string, tf.resource, tf.variant):
            raise RewriteError(f"swap {swap.id!r}: {swap.tensor} is a {tensor.dtype.name} tensor, "
                               "which cannot be swapped")
        for op in (swap.out_after, swap.in_after, *swap.out_before):
            if op and op not in nodes:
                raise RewriteError(f"swap {swap.id!r}: op {op!r} is not in the graph")
        held = copies.setdefault((producer, index), [(producer, index)])
        if swap.out_after in position and position.get(came_back.get((producer, index)),
                                                       -1) > position[swap.out_after]:
            raise RewriteError(
                f"swap {swap.id!r}: {swap.tensor} leaves after {swap.out_after!r}, before its "
                f"previous swap-in (after {came_back[(producer, index)]!r}) brought it back")
        for consumer in swap.consumers:
            if consumer not in nodes:
                raise RewriteError(f"swap {swap.id!r}: consumer {consumer!r} is not in the graph")
            if not any(_reads(nodes, nodes[consumer], copy) for copy in held):
                raise RewriteError(f"swap {swap.id!r}: {consumer!r} does not read {swap.tensor} "
                                   "(or a view of it)")
            if swap.in_after in position and consumer in position \
                    and position[consumer] <= position[swap.in_after]:
                raise RewriteError(
                    f"swap {swap.id!r}: consumer {consumer!r} is scheduled before the swap-in "
                    f"trigger {swap.in_after!r}; trigger the swap-in earlier")

        out_name = f"{SWAP_SCOPE}/swap_out_{k}"
        in_name = f"{SWAP_SCOPE}/swap_in_{k}"
        dtype_attr = attr_value_pb2.AttrValue(type=tensor.dtype.as_datatype_enum)
        shapes = attr_value_pb2.AttrValue()
        shape = host_values[(producer, index)].shape if (producer, index) in host_values \
            else tensor.shape
        if shape.is_fully_defined():
            shapes.list.shape.add().CopyFrom(shape.as_proto())
        if swap.kind == "prefetch":   # from the host variable's read: no swap-out
            source, out_name = _input_ref(producer, index), ""
        else:
            out_node = _copy_node(graph_def, nodes, out_name, SWAP_OUT_OP, swap_out_device,
                                  _input_ref(*held[-1]), trigger(swap.out_after), dtype_attr,
                                  shapes, link)
            source = out_name
            swap_out_name[swap.id] = out_name
            swap_out_node[swap.id] = out_node
        in_node = _copy_node(graph_def, nodes, in_name, SWAP_IN_OP, device, source,
                             trigger(swap.in_after), dtype_attr, shapes, link)
        swap_in_node[swap.id] = in_node
        swap_nodes.append((k, SwapNodes(swap.id, swap.tensor, out_name, in_name)))

        for consumer in swap.consumers:
            for copy in held:
                _repoint(graph_def, nodes, nodes[consumer], copy, in_name, k)
        held.append((in_name, 0))
        came_back[(producer, index)] = swap.in_after

    # A recomputation reads each input where the plan has it then: after the
    # input's latest swap-out before it, the copy that swap brings back (the
    # plan brings it back for the recomputation: core.program.inputs_back),
    # else the original.
    leaves: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for swap in plan.swaps:
        if swap.kind == "round_trip" and swap.id in swap_in_node:
            leaves.setdefault(split_tensor_name(swap.tensor), []).append(
                (position[swap.out_after], swap_in_node[swap.id].name))
    for k, swap, clones in recomputed:   # a value made again, read by a later recomputation
        source = split_tensor_name(swap.tensor)
        made_at = remade_at[swap.id] - 0.5   # just before its readers (or a later remake's)
        leaves.setdefault(source, []).append((made_at, _input_ref(clones[-1], source[1])))
    for k, swap, clones in recomputed:
        need = remade_at[swap.id]
        for source, left in leaves.items():
            gone = [name for at_, name in sorted(left) if at_ < need]
            for clone in clones:
                if gone and _reads(nodes, nodes[clone], source):
                    _repoint(graph_def, nodes, nodes[clone], source, gone[-1], k)

    if ordered_copies:   # each direction's copies one after the other, in stream order
        by_id = {sw.id: (k, sw) for k, sw in enumerate(plan.swaps)}
        outs = sorted((position.get(sw.out_after, -1), k, sw_id)
                      for sw_id, (k, sw) in by_id.items() if sw_id in swap_out_node)
        ins = sorted((min(position.get(c, -1) for c in sw.consumers), k, sw_id)
                     for sw_id, (k, sw) in by_id.items() if sw_id in swap_in_node)
        for (_, _, before), (_, _, after) in zip(outs, outs[1:]):
            swap_out_node[after].input.append("^" + swap_out_node[before].name)
        for (_, _, before), (_, _, after) in zip(ins, ins[1:]):
            swap_in_node[after].input.append("^" + swap_in_node[before].name)

    _remakes_in_turn(nodes, recomputed, remade_at, position)

    # The recomputations that run right before each scheduled position (their
    # copies, first op first): the plan's waits at that position hold them too.
    remade_before: dict[int, list[str]] = {}
    for k, swap, clones in recomputed:
        remade_before.setdefault(remade_at[swap.id], []).extend(clones)
    for swap in plan.swaps:  # after the loop: a swap may wait for a later-listed one
        if swap.id in swap_in_node:
            # (a drop after a rider that nothing chained precedes names "": nothing to wait for)
            swap_in_node[swap.id].input.extend("^" + swap_out_name[w] for w in swap.in_wait_for
                                               if swap_out_name[w])
        for op in swap.out_before:
            if swap_out_name.get(swap.id) and _orders(nodes, op) \
                    and op != swap_out_name[swap.id]:
                nodes[op].input.append("^" + swap_out_name[swap.id])
                # The plan's op at this position waits for the swap-out with the
                # recomputations it runs first (tfswap.core.simulator: a position's
                # waits gate its remakes), whose outputs are what take the memory
                # the swap-out frees: a copy anchored only after the op before ran
                # while the swap-out still held its buffer (the replicated CNN's
                # ReLU remade during a 1 MiB swap-out on a slow link: measured
                # 5.53 MB where 4.51 MB was predicted, issue #44).
                for clone in remade_before.get(position.get(op, -1), ()):
                    if ("^" + swap_out_name[swap.id]) not in nodes[clone].input:
                        nodes[clone].input.append("^" + swap_out_name[swap.id])

    for node in graph_def.node:
        if not node.device:
            node.device = device
    small = plan.allocation.small_threshold_bytes if plan.allocation is not None else 0
    _fetch_unplanned_host_reads(graph_def, nodes, host_values, device, small, link)
    _check_host_reads(graph_def, nodes, host_values, device)
    _write_back_host_updates(graph_def, captured, reference, device, link)

    _shape_reads_first(graph_def, nodes, position, device)

    # The schedule chain.  Source ops (no inputs: placeholders, constants)
    # cost nothing and are left free.  Riders stay out of it: each takes its
    # anchor's control inputs once those are final, in place of any edge it
    # got above as an ``out_before`` op (a bias gradient's output, one value
    # per channel, is no memory worth waiting for; a Pad's is never made).
    foldable = _foldable(captured.graph_def, reference)
    previous = None
    for op in plan.schedule:
        node = nodes[op]
        if op in riders or op in elsewhere:
            continue
        if previous is not None and node.input and (
                previous not in _predecessors(node)
                or previous in foldable and "^" + previous not in node.input):
            node.input.append("^" + previous)
        if node.input:
            previous = op
    for rider, anchor in riders.items():
        _ride_with(nodes, rider, anchor)
    if link is None and _copies_synchronous(device):
        _copies_in_turn(graph_def, nodes, plan, swap_out_node, swap_in_node, riders, elsewhere,
                        position)

    topological_order(graph_def)  # raises on a cycle
    swapped = tuple(n for _, n in sorted(swap_nodes, key=lambda e: e[0]))
    if scope != SWAP_SCOPE:
        renamed = _rescoped(graph_def, {n.name for n in captured.graph_def.node}, scope)
        swapped = tuple(dataclasses.replace(n, swap_out=renamed.get(n.swap_out, n.swap_out),
                                            swap_in=renamed.get(n.swap_in, n.swap_in))
                        for n in swapped)
    return RewrittenGraph(graph_def, swapped, plan.schedule, device, host)


def _rescoped(graph_def, before: set, scope: str) -> dict[str, str]:
    """Move the nodes this rewrite added (under SWAP_SCOPE) to ``scope``, and the
    inputs that name them; the renames."""
    prefix = SWAP_SCOPE + "/"
    renamed = {n.name: scope + "/" + n.name[len(prefix):] for n in graph_def.node
               if n.name not in before and n.name.startswith(prefix)}
    clash = set(renamed.values()) & {n.name for n in graph_def.node}
    if clash:
        raise RewriteError(f"scope {scope!r}: the graph already has {sorted(clash)[:3]}")
    for node in graph_def.node:
        if node.name in renamed:
            node.name = renamed[node.name]
        for i, raw in enumerate(node.input):
            control = raw.startswith("^")
            op, colon, slot = raw.lstrip("^").partition(":")
            if op in renamed:
                node.input[i] = ("^" if control else "") + renamed[op] + colon + slot
    return renamed
