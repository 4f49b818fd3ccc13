"""Work that runs where host-homed variables live: gathers of their rows, and their updates.

A variable in host memory (:mod:`tfswap.tf.homes`) is fetched before each use
on the device.  Two kinds of use would fetch far more than they need:

* **A gather** (Keras 3 ``Embedding``, ``tf.gather``): TensorFlow traces a
  ``ReadVariableOp`` of the whole table and a ``GatherV2`` of some rows.
  :func:`gathers_on_host` runs the gather on the host, next to the table, so
  only the ids travel to the host and only the gathered rows to the device.
* **The optimizer's update.**  Computed on the device
  (:func:`tfswap.tf.homes.updates_on_device`) it needs the variable, its
  optimizer slots and the gradient there at once; for a table of a fair
  share of the budget that cannot fit (Adam's update of a 5 MB table needs
  three table-sized tensors at once).  :func:`update_groups` finds each group
  of variables updated together (a table and its Adam slots) and the device
  ops that compute only their new values.  Such a group can run
  ``"device"`` (as traced), ``"host"`` (:func:`updates_on_host`: those ops run
  next to the variables, only the gradient's inputs travel) or ``"pieces"``
  (:func:`updates_in_pieces`: on the device, one slice of rows at a time, each
  slice fetched, updated and written back with ``ResourceStridedSliceAssign``).
  :mod:`tfswap.update_places` lets the simulator choose.

Every transformation computes what the original computes, bit for bit:
elementwise ops give the same value for a row wherever and in whichever slice
they run, and an ``UnsortedSegmentSum`` restricted to rows ``[s, e)`` (ids
shifted by ``s``; TensorFlow drops ids out of range) adds the same values in
the same order.

Sparse updates need nothing here: Keras 3's plain SGD applies an embedding's
gradient with ``ResourceScatterSub``, which takes the table's handle and so
already runs on the host with only the touched rows and their ids sent
there.  Adagrad scatters into its accumulator and then reads it whole
(``Sqrt`` over the table), and SGD with momentum and Adam densify the gradient
(``UnsortedSegmentSum``): those are update groups.

Example::

    captured = gathers_on_host(captured, device)
    for group in update_groups(captured, device):
        print(group.describe())
    captured, costs = updates_in_pieces(captured, device, groups[0], pieces=4)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from tfswap.tf.capture import CapturedFunction, local_device, same_device
from tfswap.tf.ir import VARIABLE_READERS, VIEW_OPS
from tfswap.tf.shapes import import_with_shapes

PLACES = ("device", "host", "pieces")
PIECE_SUFFIX = "/tfswap_piece_"
# Elementwise ops (and UnsortedSegmentSum, split by shifting its ids) whose
# result for a row depends on that row of their inputs alone: an update built
# of them can run on any device, or one slice of rows at a time.
UPDATE_ARITHMETIC = frozenset({
    "Add", "AddV2", "Sub", "Mul", "MulNoNan", "RealDiv", "Div", "DivNoNan", "Maximum",
    "Minimum", "SquaredDifference", "Pow", "Sqrt", "Rsqrt", "Square", "Neg", "Abs", "Sign",
    "Reciprocal", "Exp", "Log", "Cast", "Identity", "Select", "SelectV2", "ZerosLike",
    "OnesLike", "Sigmoid", "Tanh", "UnsortedSegmentSum"})


def _data(node) -> list[str]:
    return [i for i in node.input if not i.startswith("^")]


def _node_of(ref: str) -> str:
    return ref.lstrip("^").partition(":")[0]


def _copy(captured: CapturedFunction):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(captured.graph_def)
    return graph_def, {n.name: n for n in graph_def.node}


def _host_handles(captured: CapturedFunction) -> dict[str, tf.Variable]:
    return {c.name.partition(":")[0]: c.variable for c in captured.captures if c.host_homed}


def gathers_on_host(captured: CapturedFunction) -> tuple[CapturedFunction, tuple[str, ...]]:
    """``captured`` with each ``GatherV2`` of a host-homed variable's read run on the
    host, and the names of the gathers moved.

    The rewrite then sends the ids to the host and fetches the gathered rows
    (:func:`tfswap.tf.rewrite.rewrite`), instead of the whole table.
    """
    handles = _host_handles(captured)
    if not handles:
        return captured, ()
    graph_def, nodes = _copy(captured)

    def table_of(ref: str):
        node = nodes.get(_node_of(ref))
        while node is not None and node.op in VIEW_OPS and _data(node):
            node = nodes.get(_node_of(_data(node)[0]))
        if node is not None and node.op == "ReadVariableOp" and \
                _node_of(node.input[0]) in handles:
            return node
        return None

    moved = []
    for node in list(graph_def.node):
        if node.op != "GatherV2" or table_of(node.input[0]) is None:
            continue
        host = table_of(node.input[0]).device
        node.device = host
        axis = nodes.get(_node_of(node.input[2]))
        if axis is not None and axis.op == "Const":   # the axis is host memory anyway
            copy = graph_def.node.add()
            copy.CopyFrom(axis)
            copy.name = f"{node.name}/tfswap_axis"
            copy.device = host
            del copy.input[:]
            node.input[2] = copy.name
        moved.append(node.name)
    if not moved:
        return captured, ()
    return dataclasses.replace(captured, graph_def=graph_def), tuple(moved)


@dataclass(frozen=True)
class UpdateGroup:
    """Host-homed variables updated together and the device ops computing their new values.

    ``variables``: the handles' placeholder names (a table and its optimizer
    slots); ``names``: the variables' own names; ``writers``: the host ops that
    write them; ``ops``: device ops that compute nothing but their new values,
    in topological order; ``rows``: the variables' first dimension when they
    all share it and every op can run on a slice of rows (0: no pieces);
    ``device_bytes``: the most bytes one of ``ops`` needs at once on the
    device (inputs and outputs).
    """

    variables: tuple[str, ...]
    names: tuple[str, ...]
    writers: tuple[str, ...]
    ops: tuple[str, ...]
    rows: int
    device_bytes: int

    @property
    def name(self) -> str:
        return self.names[0]

    def describe(self) -> str:
        return (f"{', '.join(self.names)}: {len(self.ops)} update op(s) needing up to "
                f"{self.device_bytes} B at once on the device")


def _shapes(captured: CapturedFunction, graph_def) -> tf.Graph:
    return import_with_shapes(captured, graph_def)


def _bytes(t: tf.Tensor) -> int:
    if t.dtype in (tf.resource, tf.variant, tf.string) or not t.shape.is_fully_defined():
        return 0
    return int(np.prod(t.shape.as_list(), dtype=np.int64)) * t.dtype.size


def update_groups(captured: CapturedFunction, device: str) -> tuple[UpdateGroup, ...]:
    """The groups of host-homed variables whose updates compute on the device, the
    largest ``device_bytes`` first.

    An op belongs to a group's update when it is one of
    :data:`UPDATE_ARITHMETIC`, on ``device``, its output has the shape of a
    variable the step writes, it is no output of the step, and everything
    reading its output belongs to the update too (or writes the variable).
    So the gradient's own computation stays where it is, and so do the
    scalars the optimizer shares between variables (its step counter, the
    learning rate).
    """
    handles = _host_handles(captured)
    if not handles:
        return ()
    from tfswap.tf.rewrite import topological_order

    graph_def = captured.graph_def
    nodes = {n.name: n for n in graph_def.node}
    graph = _shapes(captured, graph_def)
    fetched = {_node_of(f) for f in captured.fetches}
    readers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for raw in _data(node):
            readers.setdefault(_node_of(raw), []).append(node.name)
    writers = {n.name: _node_of(n.input[0]) for n in graph_def.node
               if n.op not in VARIABLE_READERS and _data(n) and _node_of(n.input[0]) in handles}
    # The variables each update op's value ends in: a scalar shared by every
    # variable's update (the step counter's bias correction) has none of their
    # shapes, so it stays out and the groups stay apart.
    feeds: dict[str, set[str]] = {w: {h} for w, h in writers.items()}
    cone: set[str] = set()
    for name in reversed(topological_order(graph_def)):
        node = nodes[name]
        if node.op not in UPDATE_ARITHMETIC or not same_device(node.device, device) \
                or name in fetched or not readers.get(name) \
                or not all(r in cone or r in writers for r in readers[name]):
            continue
        out = graph.get_operation_by_name(name).outputs[0]
        ends = set().union(*(feeds[r] for r in readers[name]))
        if out.shape.is_fully_defined() and any(
                out.shape.as_list() == handles[h].shape.as_list() for h in ends):
            cone.add(name)
            feeds[name] = ends
    if not cone:
        return ()
    # Connected parts: cone ops with the writers they feed, joined through the
    # variables (a slot written by one writer and read by another's ops).
    parent: dict[str, str] = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        parent[find(a)] = find(b)

    for name in cone:
        for r in readers[name]:
            union(name, r)
        for raw in _data(nodes[name]):
            source = nodes.get(_node_of(raw))
            if source is not None and source.op == "ReadVariableOp" and \
                    _node_of(source.input[0]) in handles:
                union(name, "var:" + _node_of(source.input[0]))
    for writer, handle in writers.items():
        union(writer, "var:" + handle)
    members: dict[str, list[str]] = {}
    for name in cone | set(writers):
        members.setdefault(find(name), []).append(name)
    order = {n: k for k, n in enumerate(topological_order(graph_def))}
    groups = []
    for part in members.values():
        ops = sorted((n for n in part if n in cone), key=order.get)
        if not ops:
            continue   # a sparse or on-host update: nothing of it runs on the device
        part_writers = sorted((n for n in part if n in writers), key=order.get)
        variables = tuple(dict.fromkeys(writers[w] for w in part_writers))
        working = 0
        for name in ops:
            op = graph.get_operation_by_name(name)
            seen = {t.name: _bytes(t) for t in list(op.inputs) + list(op.outputs)}
            working = max(working, sum(seen.values()))
        groups.append(UpdateGroup(
            variables=variables,
            names=tuple(handles[h].name.partition(":")[0] for h in variables),
            writers=tuple(part_writers), ops=tuple(ops),
            rows=_rows(graph, nodes, ops, part_writers, handles, writers),
            device_bytes=working))
    return tuple(sorted(groups, key=lambda g: (-g.device_bytes, g.name)))


def _rows(graph: tf.Graph, nodes: dict, ops, writers, handles, written) -> int:
    """The first dimension every variable of the group shares, if each op can run on
    a slice of its rows (every input a slice, a broadcast along rows, or the
    data and ids of an UnsortedSegmentSum) and each writer assigns a whole new
    value; else 0."""
    fed = _fed_writers(nodes, ops, writers)
    shapes = {tuple(handles[written[w]].shape.as_list()) for w in fed}
    if len({s[0] if s else None for s in shapes}) != 1 or not next(iter(shapes)):
        return 0
    rows = next(iter(shapes))[0]
    if rows < 2 or any(nodes[w].op != "AssignVariableOp" for w in fed):
        return 0
    for name in ops:
        op = graph.get_operation_by_name(name)
        if op.type == "UnsortedSegmentSum":
            continue   # every piece reads its data whole and shifts its ids
        for t in op.inputs:
            if not t.shape.is_fully_defined():
                return 0
            if _slicing(t.shape.as_list(), op.outputs[0].shape.as_list(), rows) is None:
                return 0
    return rows


def _fed_writers(nodes: dict, ops, writers) -> list[str]:
    """The writers whose new value an update op computes (a scatter of the
    gradient's rows into a slot is a writer of the group that none feeds)."""
    ops = set(ops)
    return [w for w in writers if any(_node_of(i) in ops for i in _data(nodes[w])[1:])]


def _slicing(shape: list, out: list, rows: int):
    """How an input of ``shape`` is taken for a slice of ``rows`` of an output of
    ``out``: "slice" (its rows are the output's), "whole" (broadcast along
    rows), or None (it cannot be)."""
    if len(shape) == len(out) and shape and shape[0] == rows:
        return "slice"
    if len(shape) < len(out) or (shape and shape[0] == 1) or not shape:
        return "whole"
    return None


def updates_on_host(captured: CapturedFunction, group: UpdateGroup) -> CapturedFunction:
    """``captured`` with ``group``'s update ops on the host, next to its variables:
    only their inputs from the device (the gradient's parts, scalars) travel."""
    graph_def, nodes = _copy(captured)
    host = local_device(nodes[group.writers[0]].device)
    for name in group.ops:
        nodes[name].device = host
    return dataclasses.replace(captured, graph_def=graph_def)


def updates_in_pieces(captured: CapturedFunction, device: str, group: UpdateGroup,
                      pieces: int) -> tuple[CapturedFunction, dict]:
    """``captured`` with ``group``'s update run on the device in ``pieces`` slices of
    rows, and ``{new op: (op it takes a share of, share)}`` for its costs.

    For each slice ``[s, e)``: each input read from a variable is read on the
    host and sliced there (the rewrite fetches the slice), each input made on
    the device of the update's shape is sliced on the device, broadcast inputs
    are read whole, an ``UnsortedSegmentSum`` sums into ``e - s`` segments with
    its ids shifted by ``s``; each update op runs on the slice; each
    ``AssignVariableOp`` becomes a ``ResourceStridedSliceAssign`` of the rows
    on the host.  The former writer becomes a ``NoOp`` waiting for every
    slice, so whatever waited for it waits for the whole update.
    """
    if group.rows < 2:
        raise ValueError(f"the update of {group.name} cannot run in pieces (its ops do not "
                         "all work row by row, or its variables differ in rows)")
    if not 2 <= pieces <= group.rows:
        raise ValueError(f"pieces must be in [2, {group.rows}] for {group.name}, got {pieces}")
    graph_def, nodes = _copy(captured)
    graph = _shapes(captured, captured.graph_def)
    host = local_device(nodes[group.writers[0]].device)
    in_update = set(group.ops)
    bounds = np.linspace(0, group.rows, pieces + 1).astype(int)
    costs: dict[str, tuple[str, float]] = {}
    made: dict[tuple[str, int], str] = {}   # (input ref, piece) -> its slice's node

    def const(name: str, values, dtype, where: str) -> str:
        node = graph_def.node.add(name=name, op="Const", device=where)
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(values, dtype=dtype))
        return name

    def slice_of(ref: str, p: int, where: str, rank: int, dtype) -> str:
        key = (ref, p)
        if key not in made:
            s, e = int(bounds[p]), int(bounds[p + 1])
            base = f"{_node_of(ref)}{PIECE_SUFFIX}{p}/slice"
            node = graph_def.node.add(name=base, op="StridedSlice", device=where)
            node.input.extend([ref, const(base + "/begin", [s] + [0] * (rank - 1), tf.int32,
                                          where),
                               const(base + "/end", [e] + [0] * (rank - 1), tf.int32, where),
                               const(base + "/strides", [1] * rank, tf.int32, where)])
            node.attr["T"].type = dtype.as_datatype_enum
            node.attr["Index"].type = tf.int32.as_datatype_enum
            for mask in ("begin_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask"):
                node.attr[mask].i = 0
            node.attr["end_mask"].i = (1 << rank) - 2   # all but the first dimension whole
            made[key] = node.name
            costs[node.name] = (group.ops[0], 0.0)
        return made[key]

    def piece_input(op, k: int, ref: str, p: int) -> str:
        """What piece ``p`` of update op ``op`` reads for its input ``k`` (``ref``)."""
        source = nodes[_node_of(ref)]
        if source.name in in_update:
            return f"{source.name}{PIECE_SUFFIX}{p}" + _slot(ref)
        tensor = op.inputs[k]
        out = op.outputs[0].shape.as_list() if op.outputs else tensor.shape.as_list()
        if op.type == "UnsortedSegmentSum" and k == 0:
            return ref   # the rows of the gradient: each piece sums those of its ids
        if op.type == "UnsortedSegmentSum":
            s, e = int(bounds[p]), int(bounds[p + 1])
            base = f"{op.name}{PIECE_SUFFIX}{p}"
            if k == 2:
                return const(base + "/segments", e - s, tensor.dtype, device)
            # Ids of other pieces' rows become -1, which the sum drops (the CPU
            # kernel refuses ids past the last segment, so those cannot stay).
            shifted = graph_def.node.add(name=base + "/shifted", op="Sub", device=device)
            shifted.input.extend([ref, const(base + "/first", s, tensor.dtype, device)])
            inside = graph_def.node.add(name=base + "/inside", op="Less", device=device)
            inside.input.extend([shifted.name, const(base + "/count", e - s, tensor.dtype,
                                                     device)])
            ids = graph_def.node.add(name=base + "/ids", op="SelectV2", device=device)
            ids.input.extend([inside.name, shifted.name,
                              const(base + "/dropped", -1, tensor.dtype, device)])
            for node in (shifted, inside, ids):
                node.attr["T"].type = tensor.dtype.as_datatype_enum
                costs[node.name] = (op.name, 0.0)
            return ids.name
        if _slicing(tensor.shape.as_list(), out, group.rows) == "whole":
            return ref
        if source.op == "ReadVariableOp" and same_device(source.device, host):
            # A read of the variable: a read of its own per piece, sliced on the
            # host, so the rewrite fetches the slice (the whole read is not kept
            # alive while the slices are written back).
            name = f"{source.name}{PIECE_SUFFIX}{p}/read"
            if name not in costs:
                read = graph_def.node.add()
                read.CopyFrom(source)
                read.name = name
                costs[name] = (source.name, 0.0)
            return slice_of(name, p, host, len(out), tensor.dtype)
        where = host if not same_device(source.device, device) else device
        return slice_of(ref, p, where, len(out), tensor.dtype)

    for name in group.ops:
        op = graph.get_operation_by_name(name)
        original = nodes[name]
        for p in range(pieces):
            node = graph_def.node.add()
            node.CopyFrom(original)
            node.name = f"{name}{PIECE_SUFFIX}{p}"
            del node.input[:]
            data = _data(original)
            node.input.extend(piece_input(op, k, ref, p) for k, ref in enumerate(data))
            node.input.extend(i for i in original.input if i.startswith("^"))
            costs[node.name] = (name, 1.0 / pieces)
    for writer in _fed_writers(nodes, group.ops, group.writers):
        original = nodes[writer]
        value = _data(original)[1]
        rank = len(graph.get_tensor_by_name(_as_tensor(value)).shape)
        pieces_made = []
        for p in range(pieces):
            s, e = int(bounds[p]), int(bounds[p + 1])
            base = f"{writer}{PIECE_SUFFIX}{p}"
            node = graph_def.node.add(name=base, op="ResourceStridedSliceAssign", device=host)
            node.input.extend([original.input[0],
                               const(base + "/begin", [s] + [0] * (rank - 1), tf.int32, host),
                               const(base + "/end", [e] + [0] * (rank - 1), tf.int32, host),
                               const(base + "/strides", [1] * rank, tf.int32, host),
                               piece_input(graph.get_operation_by_name(writer), 1, value, p)])
            node.input.extend(i for i in original.input if i.startswith("^"))
            node.attr["T"].type = original.attr["dtype"].type
            node.attr["Index"].type = tf.int32.as_datatype_enum
            for mask in ("begin_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask"):
                node.attr[mask].i = 0
            node.attr["end_mask"].i = (1 << rank) - 2
            costs[base] = (writer, 1.0 / pieces)
            pieces_made.append(base)
        controls = [i for i in original.input if i.startswith("^")]
        original.Clear()
        original.name, original.op, original.device = writer, "NoOp", host
        original.input.extend(controls + ["^" + n for n in pieces_made])
    # Whatever waited for an update op waits for all its pieces.
    for node in graph_def.node:
        if any(_node_of(i) in in_update for i in node.input if i.startswith("^")):
            kept = [i for i in node.input if not (i.startswith("^") and _node_of(i) in in_update)]
            waits = [f"^{_node_of(i)}{PIECE_SUFFIX}{p}" for i in node.input
                     if i.startswith("^") and _node_of(i) in in_update for p in range(pieces)]
            del node.input[:]
            node.input.extend(kept + list(dict.fromkeys(waits)))
    remaining = [n for n in graph_def.node if n.name not in in_update]
    del graph_def.node[:]
    graph_def.node.extend(remaining)
    return dataclasses.replace(captured, graph_def=graph_def), costs


def _slot(ref: str) -> str:
    _, _, slot = ref.partition(":")
    return f":{slot}" if slot and slot != "0" else ""


def _as_tensor(ref: str) -> str:
    return ref if ":" in ref else ref + ":0"


__all__ = ["PLACES", "UPDATE_ARITHMETIC", "UpdateGroup", "gathers_on_host", "update_groups",
           "updates_in_pieces", "updates_on_host"]
