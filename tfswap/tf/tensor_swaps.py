"""The planner's buffer swaps as swaps of the tensors TensorFlow holds (see
:func:`tensor_swaps`); the rewrite turns each into a SwapOut/SwapIn pair.

Example::

    plan = tensor_swaps(plan, lowered.graph)
"""

from __future__ import annotations

import dataclasses

from tfswap.core import liveness
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Plan
from tfswap.tf.rewrite import VIEW_OPS


def tensor_swaps(plan: Plan, graph: DataflowGraph) -> Plan:
    """The planner's buffer swaps as swaps of the tensors TensorFlow holds.

    The planner moves buffers; a buffer can hold several tensors in turn (TF
    forwards a dead input's buffer to an op's output) or at once (views, or
    the slices an Unpack or Split makes of one buffer).  Each consumer after
    the gap is sent the copy of the value it actually reads: the member it
    reads, or the member that a chain of views it reads starts from.  A
    member produced after the gap was written by an op that ran on the copy,
    so reading it needs nothing.  One value read: the swap carries it, as
    planned.  Several (slices, or a forward that this schedule breaks
    because a later reader still holds the earlier value): one swap per
    value, each of that value's bytes, and a swap-in that waited for this
    swap-out waits for all of them.
    """
    position = {name: k for k, name in enumerate(plan.schedule)}
    groups = liveness.buffers(graph)
    swaps, parts_of = [], {}
    for swap in plan.swaps:
        if swap.kind not in ("round_trip", "recompute"):
            swaps.append(swap)
            continue
        members = {graph.tensors[m].name for m in groups[liveness.buffer_root(graph, swap.tensor)]}
        if swap.kind == "recompute" and swap.ops:
            # Its last op makes the member its readers read (the planner chose
            # the ops so: tfswap.core.recompute), a view of the buffer included.
            made = [t for t in graph.op(swap.ops[-1]).outputs if t in members]
            value = next((t for t in made if any(t in graph.op(c).inputs
                                                 for c in swap.consumers)), None)
            if value is None:
                raise RuntimeError(f"recompute {swap.id!r}: its last op {swap.ops[-1]!r} makes "
                                   f"none of the values its readers read ({made}); this is a "
                                   "tfswap bug")
            swaps.append(dataclasses.replace(swap, tensor=value, consumers=tuple(
                c for c in swap.consumers if value in graph.op(c).inputs)))
            continue
        out_at = position[swap.out_after]
        readers: dict[str, list[str]] = {}
        for consumer in swap.consumers:
            for name in graph.op(consumer).inputs:
                if name not in members or _produced_at(graph, name, position) > out_at:
                    continue
                value = _viewed_value(graph, name, members, VIEW_OPS)
                if consumer not in readers.setdefault(value, []):
                    readers[value].append(consumer)
        if not readers:
            raise RuntimeError(f"swap {swap.id!r}: no consumer after the gap reads a value its "
                               "buffer held before the swap-out; this is a tfswap bug")
        if swap.kind == "recompute":   # its ops make the one value its readers read
            if len(readers) > 1:
                raise RuntimeError(f"recompute {swap.id!r}: its readers read several values of "
                                   "the buffer; this is a tfswap bug")
            value = next(iter(readers))
            swaps.append(dataclasses.replace(swap, tensor=value, consumers=tuple(readers[value])))
            continue
        # A value of the buffer that a later trip reads but no reader of this one
        # would keep the whole buffer (the Unpack's slices share it) on the device
        # through the gap, which the plan counts as free: it leaves and comes back
        # with the others, its readers reading that copy (a later trip leaves from
        # it).  Zoo LSTM, 4 layers, at 40%: two 64 KiB stacks held so (issue #44).
        for member in members:
            if _produced_at(graph, member, position) > out_at:
                continue
            value = _viewed_value(graph, member, members, VIEW_OPS)
            if value in readers:
                continue
            later = [graph.ops[c].name for c in graph.tensor(member).consumers
                     if position.get(graph.ops[c].name, -1) > out_at]
            for consumer in sorted(later, key=position.get):
                if consumer not in readers.setdefault(value, []):
                    readers[value].append(consumer)
        split = len(readers) > 1
        values = sorted(readers, key=lambda v: (_produced_at(graph, v, position),
                                                graph.tensor_id(v)))
        parts = [dataclasses.replace(swap, tensor=v, consumers=tuple(readers[v]),
                                     id=f"{swap.id}|{v}" if split else swap.id,
                                     bytes=graph.tensor(v).nbytes if split else swap.bytes)
                 for v in values]
        parts_of[swap.id] = tuple(p.id for p in parts)
        swaps.extend(parts)
    # A swap-in waiting for a split swap-out waits for every part: the buffer is
    # free only once all its values have left.
    swaps = [dataclasses.replace(s, in_wait_for=tuple(
        i for w in s.in_wait_for for i in parts_of.get(w, (w,)))) for s in swaps]
    return dataclasses.replace(plan, swaps=tuple(swaps))


def _produced_at(graph: DataflowGraph, tensor: str, position: dict) -> int:
    return position[graph.ops[graph.tensor(tensor).producer].name]


def _viewed_value(graph: DataflowGraph, tensor: str, members: set, view_ops) -> str:
    """The member of the buffer whose value ``tensor`` is (through views of it)."""
    while True:
        op = graph.ops[graph.tensor(tensor).producer]
        if op.type not in view_ops or not op.inputs or op.inputs[0] not in members:
            return tensor
        tensor = op.inputs[0]


__all__ = ["tensor_swaps"]
