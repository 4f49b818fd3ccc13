"""DataflowGraph: the framework-free view of a step that planners work on.

Ops and tensors are numbered; a tensor has one producer and any number of
consumers; control edges order ops without carrying data.  Names are the
GraphDef's (op ``"conv1"``, tensor ``"conv1:0"``) so plans map straight back.

Example::

    g = DataflowGraph.build(
        ops=[Op("a", "Const"), Op("b", "Relu", inputs=("a:0",))],
        tensors=[Tensor("a:0", nbytes=1024), Tensor("b:0", nbytes=1024)])
    g.topological_order()      # [0, 1]
    g.tensor("a:0").consumers  # (1,)
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field, replace

# What a tensor is, as the planner sees it (issue #3).  "small" tensors live in
# the reserved small-tensor pool and are never swapped.
KINDS = ("input", "parameter", "optimizer_state", "activation", "gradient",
         "temporary", "small")
# Which part of the step an op belongs to, from reachability (not from names).
PHASES = ("", "forward", "backward", "update")


@dataclass(frozen=True)
class Tensor:
    name: str
    nbytes: int
    dtype: str = "float32"
    shape: tuple[int, ...] = ()
    swappable: bool = True           # False for handles, strings, variants
    producer: int = -1               # op index, filled by DataflowGraph.build
    consumers: tuple[int, ...] = ()  # op indices (an op reading it twice is listed once)
    kind: str = "activation"         # one of KINDS
    alias_of: str = ""               # tensor whose buffer this one shares (forwarding, views)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"tensor {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.nbytes < 0:
            raise ValueError(f"tensor {self.name!r}: nbytes must be >= 0, got {self.nbytes}")


@dataclass(frozen=True)
class Op:
    name: str
    type: str
    inputs: tuple[str, ...] = ()           # tensor names
    control_inputs: tuple[str, ...] = ()   # op names
    outputs: tuple[str, ...] = ()          # tensor names, filled by build if empty
    device: str = ""
    time_s: float = 0.0             # compute time on the target device
    scratch_bytes: int = 0          # kernel temporaries, live only while the op runs
    phase: str = ""                 # one of PHASES

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"op {self.name!r}: phase {self.phase!r} is not one of {PHASES}")
        if self.time_s < 0 or self.scratch_bytes < 0:
            raise ValueError(f"op {self.name!r}: time_s and scratch_bytes must be >= 0")


@dataclass(frozen=True)
class DataflowGraph:
    ops: tuple[Op, ...]
    tensors: tuple[Tensor, ...]
    _op_index: dict = field(default_factory=dict, repr=False, compare=False)
    _tensor_index: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(cls, ops, tensors) -> "DataflowGraph":
        """Link producers and consumers; validates that every name resolves."""
        op_index = {}
        for i, op in enumerate(ops):
            if op.name in op_index:
                raise ValueError(f"duplicate op name {op.name!r}")
            op_index[op.name] = i
        tensor_index = {}
        for i, t in enumerate(tensors):
            if t.name in tensor_index:
                raise ValueError(f"duplicate tensor name {t.name!r}")
            tensor_index[t.name] = i
        producer = {}
        for i, t in enumerate(tensors):
            op_name = t.name.rpartition(":")[0]
            if op_name not in op_index:
                raise ValueError(f"tensor {t.name!r} names no op (expected 'op:index')")
            producer[i] = op_index[op_name]
        consumers = {i: [] for i in range(len(tensors))}
        linked_ops = []
        outputs = {i: [] for i in range(len(ops))}
        for i, t in enumerate(tensors):
            outputs[producer[i]].append(t.name)
        for i, op in enumerate(ops):
            for name in op.inputs:
                if name not in tensor_index:
                    raise ValueError(f"op {op.name!r} reads unknown tensor {name!r}")
                c = consumers[tensor_index[name]]
                if not c or c[-1] != i:
                    c.append(i)
            for name in op.control_inputs:
                if name not in op_index:
                    raise ValueError(f"op {op.name!r} has unknown control input {name!r}")
            linked_ops.append(replace(op, outputs=tuple(op.outputs or outputs[i])))
        linked_tensors = tuple(
            replace(t, producer=producer[i], consumers=tuple(dict.fromkeys(consumers[i])))
            for i, t in enumerate(tensors))
        return cls(tuple(linked_ops), linked_tensors, op_index, tensor_index)

    def op(self, name: str) -> Op:
        return self.ops[self._op_index[name]]

    def op_id(self, name: str) -> int:
        return self._op_index[name]

    def tensor(self, name: str) -> Tensor:
        return self.tensors[self._tensor_index[name]]

    def tensor_id(self, name: str) -> int:
        return self._tensor_index[name]

    def predecessors(self, op_id: int) -> set[int]:
        op = self.ops[op_id]
        preds = {self.tensors[self._tensor_index[t]].producer for t in op.inputs}
        preds.update(self._op_index[c] for c in op.control_inputs)
        return preds

    def _in_degrees_and_successors(self) -> tuple[list[int], list[list[int]]]:
        indeg = [0] * len(self.ops)
        succ = [[] for _ in self.ops]
        for i in range(len(self.ops)):
            for p in self.predecessors(i):
                indeg[i] += 1
                succ[p].append(i)
        return indeg, succ

    def topological_order(self) -> list[int]:
        """Kahn's order, ties broken by op index.  Raises ValueError on a cycle."""
        indeg, succ = self._in_degrees_and_successors()
        ready = deque(i for i, d in enumerate(indeg) if d == 0)
        order = []
        while ready:
            i = ready.popleft()
            order.append(i)
            for s in succ[i]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        if len(order) != len(self.ops):
            raise ValueError("the graph has a cycle")
        return order

    def order_following(self, observed: list[str]) -> list[int]:
        """A topological order that keeps ``observed`` op names in their given order.

        Used to turn the order TensorFlow actually executed (which lacks the ops
        it fused or folded away) into a complete schedule; ops not observed run
        as soon as they are ready.
        """
        rank = {self._op_index[n]: k for k, n in enumerate(observed) if n in self._op_index}
        indeg, succ = self._in_degrees_and_successors()
        ready = [(rank.get(i, -1), i) for i, d in enumerate(indeg) if d == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, i = heapq.heappop(ready)
            order.append(i)
            for s in succ[i]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, (rank.get(s, -1), s))
        if len(order) != len(self.ops):
            raise ValueError("the graph has a cycle")
        return order

    def is_topological(self, schedule: list[int]) -> bool:
        position = {op: k for k, op in enumerate(schedule)}
        return len(position) == len(self.ops) and all(
            position[p] < position[i] for i in range(len(self.ops)) for p in self.predecessors(i))
