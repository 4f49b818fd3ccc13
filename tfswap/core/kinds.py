"""Tensor kinds and op phases from the graph's structure (issue #3).

Which part of the step an op belongs to is decided by reachability along
data edges (control edges are ordering only), never by op or scope names (TF names backward ops ``gradient_tape/...`` under a
GradientTape and ``gradients/...`` otherwise; Grappler renames fused ops).

Rules, given the step's ``loss`` tensors (what the step returns), its
``inputs`` (argument tensors), the tensors holding ``variables``' values and
the ops that write variables (``writers``):

* **forward**: ops the loss depends on that are, or depend on, the producer
  of an input or of a variable value that the loss depends on.  Those
  variable values are **parameters**.
* **optimizer state**: variable values the loss does not depend on (Adam's
  moments, the iteration count, the learning-rate variable, and also
  batch-norm moving statistics, which like optimizer state are read only to
  be updated).
* **update**: the writers, and the ops from an optimizer-state read to a
  writer (the reads and the arithmetic of the update rule).
* **backward**: every other op that a writer depends on and that depends
  on a forward op (the gradient computation).
* Everything else (constant arithmetic, metrics off the loss path) keeps
  phase ``""``.

Tensor kinds: outputs of inputs' producers are ``input``; parameter and
optimizer-state values (and tensors aliasing them) are ``parameter`` /
``optimizer_state``; outputs of forward ops are ``activation``, of backward
ops ``gradient``, of the rest ``temporary``.  Any tensor below
``small_bytes`` (default 1 MiB) is ``small`` whatever its role: it lives in
the reserved small-tensor pool and is never swapped.

Example::

    g = classify(graph, loss=["loss:0"], inputs=["x:0"],
                 variables=["w/read:0", "m/read:0"], writers=["update_w"])
    g.op("conv").phase            # "forward"
    g.tensor("m/read:0").kind     # "optimizer_state" (unless small)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tfswap.core.graph import DataflowGraph

DEFAULT_SMALL_BYTES = 1 << 20


def _closure(start: Iterable[int], step) -> set[int]:
    seen = set(start)
    stack = list(seen)
    while stack:
        for nxt in step(stack.pop()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _check_names(graph: DataflowGraph, what: str, names, lookup) -> None:
    for name in names:
        try:
            lookup(name)
        except KeyError:
            raise ValueError(f"classify: {what} {name!r} is not in the graph") from None


def classify(graph: DataflowGraph, loss: Iterable[str], inputs: Iterable[str] = (),
             variables: Iterable[str] = (), writers: Iterable[str] = (),
             small_bytes: int = DEFAULT_SMALL_BYTES) -> DataflowGraph:
    """A copy of ``graph`` with every op's ``phase`` and every tensor's ``kind`` set.

    ``loss``, ``inputs``, ``variables``: tensor names; ``writers``: op names.
    """
    loss, inputs, variables, writers = list(loss), list(inputs), list(variables), list(writers)
    if small_bytes < 0:
        raise ValueError(f"small_bytes must be >= 0 bytes, got {small_bytes}")
    if not loss:
        raise ValueError("classify needs at least one loss tensor (what the step returns)")
    _check_names(graph, "loss tensor", loss, graph.tensor)
    _check_names(graph, "input tensor", inputs, graph.tensor)
    _check_names(graph, "variable tensor", variables, graph.tensor)
    _check_names(graph, "writer op", writers, graph.op)

    # Data edges only: tf.function's automatic control dependencies make the
    # returned tensors wait for every side effect, which says nothing about
    # what computes what.
    preds = [{graph.tensors[graph.tensor_id(t)].producer for t in op.inputs} for op in graph.ops]
    succ = [[] for _ in graph.ops]
    for i, ps in enumerate(preds):
        for p in ps:
            succ[p].append(i)
    up = lambda i: preds[i]       # noqa: E731
    down = lambda i: succ[i]      # noqa: E731

    loss_ancestors = _closure((graph.tensor(t).producer for t in loss), up)
    variable_producer = {t: graph.tensor(t).producer for t in variables}
    parameters = {t for t, p in variable_producer.items() if p in loss_ancestors}
    optimizer_state = set(variables) - parameters
    sources = {graph.tensor(t).producer for t in inputs} | {variable_producer[t] for t in parameters}
    forward = loss_ancestors & _closure(sources, down)

    writer_ids = {graph.op_id(w) for w in writers}
    writer_ancestors = _closure(writer_ids, up)
    state_ops = {variable_producer[t] for t in optimizer_state}
    update = writer_ids | (writer_ancestors & _closure(state_ops, down))
    after_forward = _closure(forward, down)
    backward = (writer_ancestors & after_forward) - forward - update

    def phase(i: int) -> str:
        if i in forward:
            return "forward"
        if i in update:
            return "update"
        if i in backward:
            return "backward"
        return ""

    input_set = set(inputs)
    role = {}
    for t in graph.tensors:
        p = phase(t.producer)
        if t.name in input_set:
            role[t.name] = "input"
        elif t.name in parameters:
            role[t.name] = "parameter"
        elif t.name in optimizer_state:
            role[t.name] = "optimizer_state"
        else:
            role[t.name] = {"forward": "activation", "backward": "gradient"}.get(p, "temporary")
    # A tensor sharing a parameter's or a state's buffer is that parameter or state.
    for t in graph.tensors:
        root, seen = t.name, set()
        while graph.tensor(root).alias_of and root not in seen:
            seen.add(root)
            root = graph.tensor(root).alias_of
        if role[root] in ("parameter", "optimizer_state", "input"):
            role[t.name] = role[root]

    ops = tuple(replace(op, phase=phase(i)) for i, op in enumerate(graph.ops))
    tensors = tuple(replace(t, kind="small" if t.nbytes < small_bytes else role[t.name])
                    for t in graph.tensors)
    return DataflowGraph.build(ops, tensors)
