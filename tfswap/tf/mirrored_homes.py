"""A mirrored variable's one copy in host memory, read by every replica and updated once.

A ``tf.distribute.MirroredStrategy`` keeps one component of each variable per
replica's device, and every replica updates its own with the all-reduced
gradients.  Those gradients are the same bits on every replica, and so is each
component's update: the components stay equal, which is why the user's model
reads only the first (``get_weights``, checkpoints).  With the variables in
host memory one copy serves them all (ZeRO-Offload's choice: host memory for
the parameters and the optimizer state once, not once per replica):

* :func:`move_to_host` moves each variable's first component to the host as
  :func:`tfswap.tf.homes.move_to_host` moves a variable (the user's object
  keeps its identity; functions that only held that component follow it),
  empties and retires every other component, and guards every function that
  captured one of those (the unmodified replicated step): called while the
  variables are in host memory it raises :class:`~tfswap.tf.homes.MovedVariablesError`
  before anything runs, since it would apply each update once per replica to
  the one copy.  :meth:`MirroredRelocation.undo` puts every component back
  with the copy's value.
* :func:`one_copy` lowers a replicated step onto the copies: every replica's
  reads read the copy (each replica fetches what it reads, as for one
  device); the first replica's updates write it, and each other replica's
  update of it becomes a ``NoOp`` of the same name, ordered after the first
  replica's (what followed that replica's update follows the update of the
  copy) while its reads from before the update are ordered before it, so no
  replica reads a value its own step would not have read.  What only the
  dropped updates needed is no longer computed.  A step whose replicas update
  a variable differently, or whose order could only hold with a cycle, is
  refused with :class:`~tfswap.tf.capture.CaptureError`.

Example::

    moved = move_to_host(first_components, "/device:CPU:1")
    captured = one_copy(homes.rehomed(captured, moved), moved)
    moved.undo()
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass

import tensorflow as tf

from tfswap.tf import capture as capture_mod
from tfswap.tf import homes, host_copies, stale
from tfswap.tf.capture import CapturedFunction
from tfswap.tf.ir import VARIABLE_READERS


def mirrored_of(component):
    """The ``tf.distribute`` variable ``component`` is a replica's component of, or None."""
    container = getattr(component, "_distributed_container", None) or getattr(
        getattr(component, "handle", None), "_distributed_container", None)
    whole = container() if callable(container) else None
    return whole if isinstance(whole, tf.distribute.DistributedValues) else None


@dataclass(frozen=True)
class Other:
    """A component of a moved mirrored variable on another replica's device: emptied
    and its handle retired while the first component's copy serves every replica."""

    variable: tf.Variable
    device_handle: tf.Tensor
    retired: stale.Identity
    first: tf.Variable   # the first component, whose handle is the host copy's


@dataclass
class MirroredRelocation:
    """The mirrored variables :func:`move_to_host` moved: ``moved`` their first
    components (one copy each; :attr:`nbytes` counts host memory once),
    ``others`` the other components."""

    moved: tuple
    host: str
    others: tuple[Other, ...]
    active: bool = True

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.moved)

    def copy_of(self, variable):
        """The first component whose host copy serves ``variable`` (another
        component), or None."""
        return next((o.first for o in self.others if o.variable is variable), None)

    def undo(self) -> None:
        """Every component back on its device with the copy's value; the guarded
        functions run again."""
        if not self.active:
            return
        host_copies.unregister(self)
        values = {id(m.variable): m.variable.read_value() for m in self.moved
                  if m.variable.handle is m.host_handle}
        for o in self.others:
            if id(o.first) in values:
                stale.revive(o.device_handle, o.retired)
                tf.raw_ops.AssignVariableOp(resource=o.device_handle, value=values[id(o.first)],
                                            validate_shape=False)
        homes.Relocation(self.moved, self.host).undo()
        self.active = False

    def describe(self) -> str:
        copies = len({id(o.first) for o in self.others})
        return (f"moved {len(self.moved)} mirrored variable(s) ({self.nbytes} B) to host memory "
                f"({self.host}) between steps, one copy each for every replica ({copies} with "
                "other replicas' components emptied); the first replica's update writes it")


def _guard_message(variable) -> str:
    return (f"tfswap: this replicated function was traced on every replica's component of "
            f"{variable.name}, and tfswap now keeps one copy of that mirrored variable in host "
            "memory for all replicas (parameters='auto'): run as traced, it would apply each "
            "update more than once to that copy. Call the optimized function instead, or put "
            "the variables back with restore_parameters() on the OptimizedFunction that moved "
            "them (this function then runs again).")


def _guard(relocation: MirroredRelocation) -> None:
    """Every live function that captured another component's former handle raises
    :class:`~tfswap.tf.homes.MovedVariablesError` while ``relocation`` is active."""
    from tensorflow.python.eager.polymorphic_function.concrete_function import \
        ConcreteFunction

    held = {id(o.device_handle): o for o in relocation.others}

    def guarded(handle, variable):
        def capture():
            if not relocation.active:
                return handle
            raise homes.MovedVariablesError(_guard_message(variable))

        return capture

    for fn in gc.get_objects():
        if not issubclass(type(fn), ConcreteFunction):
            continue
        inputs = fn._captured_inputs
        if any(id(c) in held for c in inputs):
            fn.set_external_captures([guarded(c, held[id(c)].first) if id(c) in held else c
                                      for c in inputs])


def move_to_host(firsts, host: str) -> MirroredRelocation:
    """Move the mirrored variables whose first components are ``firsts`` to one copy
    each in host memory (see the module doc)."""
    stale.ready()
    others, wholes = [], []
    for first in firsts:
        whole = mirrored_of(first)
        if whole is None or whole.values[0] is not first:
            raise TypeError(f"{first.name} is not the first component of a mirrored variable")
        wholes.append(whole)
    relocation = homes.move_to_host(list(firsts), host)
    try:
        for first, whole in zip(firsts, wholes):
            for component in whole.values[1:]:
                old = component.handle
                tf.raw_ops.AssignVariableOp(resource=old, value=tf.zeros([0], component.dtype),
                                            validate_shape=False)
                others.append(Other(component, old, stale.retire(old, _retired(component)),
                                    first))
    except BaseException:
        for o in others:
            stale.revive(o.device_handle, o.retired)
        relocation.undo()
        raise
    moved = MirroredRelocation(relocation.moved, host, tuple(others))
    _guard(moved)
    host_copies.register(moved)
    return moved


def onto_copies(captured: CapturedFunction) -> CapturedFunction:
    """``captured`` lowered onto the copies of every relocation in force whose
    mirrored variables it reads (:func:`one_copy`); as it is if none."""
    for relocation in host_copies.active():
        ids = {id(o.variable) for o in relocation.others}
        if any(c.variable is not None and id(c.variable) in ids for c in captured.captures):
            captured = one_copy(captured, relocation)
    return captured


def _retired(component) -> str:
    return (f"tfswap moved the mirrored variable of {component.name} to one copy in host memory "
            "(parameters='auto' on a replicated step): this replica's component is empty until "
            "restore_parameters() on the OptimizedFunction that moved it. Read the variable "
            "itself (its first component is the copy), or call the optimized function.")


def one_copy(captured: CapturedFunction, relocation: MirroredRelocation) -> CapturedFunction:
    """``captured`` (its first components already host-homed, :func:`tfswap.tf.homes.rehomed`)
    lowered onto the one host copy of each moved mirrored variable: see the module doc."""
    firsts = {id(m.variable): m for m in relocation.moved}
    first_placeholder = {id(c.variable): c.name.partition(":")[0] for c in captured.captures
                         if c.variable is not None and id(c.variable) in firsts}
    captures, paired = [], {}   # another component's placeholder -> its first's
    for c in captured.captures:
        first = relocation.copy_of(c.variable) if c.variable is not None else None
        if first is None:
            captures.append(c)
            continue
        if id(first) not in first_placeholder:
            raise capture_mod.CaptureError(
                f"this replicated step reads {c.variable.name} but not the first replica's "
                f"component {first.name}: tfswap cannot tell which replica updates the one host "
                "copy. Pass parameters='device'.")
        paired[c.name.partition(":")[0]] = first_placeholder[id(first)]
        captures.append(dataclasses.replace(c, variable=first, value=firsts[id(first)].host_handle,
                                            host_homed=True))
    if not paired:
        return captured
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(captured.graph_def)
    nodes = {n.name: n for n in graph_def.node}
    order = {name: k for k, name in enumerate(homes._topological(graph_def))}
    on: dict[str, list] = {}
    for node in sorted(graph_def.node, key=lambda n: order[n.name]):
        data = [i.partition(":")[0] for i in node.input if not i.startswith("^")]
        if data and data[0] in set(paired) | set(paired.values()):
            on.setdefault(data[0], []).append(node)
    writes = {p: [n for n in ops if n.op not in VARIABLE_READERS] for p, ops in on.items()}
    consumed = {i.lstrip("^").partition(":")[0] for n in graph_def.node for i in n.input
                if not i.startswith("^")}
    ancestors = _ancestors(nodes)
    edges = []   # (node, control input): found on the graph as traced, added after
    drops = []   # (another replica's update, the first replica's it waits for)
    for other, first in paired.items():
        mine, kept = writes.get(other, []), writes.get(first, [])
        if [n.op for n in mine] != [n.op for n in kept]:
            raise capture_mod.CaptureError(
                f"the replicas of this step update {first!r} differently ({[n.op for n in kept]} "
                f"on the first, {[n.op for n in mine]} through {other!r}): tfswap keeps one host "
                "copy of a mirrored variable only where every replica updates it alike. Pass "
                "parameters='device'.")
        for n in mine:
            if n.name in consumed:
                raise capture_mod.CaptureError(
                    f"{n.op} {n.name!r} updates a mirrored variable and its output is read: "
                    "tfswap cannot keep one host copy of it. Pass parameters='device'.")
        for read in (n for n in on.get(other, []) if n.op in VARIABLE_READERS):
            # Its own replica's updates before it: it reads what the copy holds after
            # as many of the first replica's, and before the next one.
            after = sum(w.name in ancestors(read.name) for w in mine)
            if after:
                edges.append((read, kept[after - 1].name))
            if after < len(kept):
                edges.append((kept[after], read.name))
        drops += zip(mine, kept)
    for node, control in edges:
        node.input.append("^" + control)
    for n, writer in drops:
        name, device = n.name, n.device
        controls = [i for i in n.input if i.startswith("^")]
        n.Clear()
        n.name, n.op, n.device = name, "NoOp", device
        n.input.extend(controls + ["^" + writer.name])
    _drop_unneeded(graph_def, captured)
    try:
        homes._topological(graph_def)
    except Exception as err:   # RewriteError: the order cannot hold
        raise capture_mod.CaptureError(
            "keeping one host copy of the mirrored variables would order a replica's read "
            f"after the update it comes before ({err}). Pass parameters='device'.") from err
    capture_mod.place_on_variables(graph_def, captures)
    return dataclasses.replace(captured, graph_def=graph_def, captures=tuple(captures))


def _drop_unneeded(graph_def, captured: CapturedFunction) -> None:
    """Remove what only the dropped updates needed: what neither an output nor a
    control output of the step waits for (placeholders stay: the step's feeds)."""
    nodes = {n.name: n for n in graph_def.node}
    stack = [f.partition(":")[0] for f in captured.fetches] + list(captured.control_outputs)
    needed = set()
    while stack:
        name = stack.pop()
        if name in needed or name not in nodes:
            continue
        needed.add(name)
        stack += [raw.lstrip("^").partition(":")[0] for raw in nodes[name].input]
    kept = [n for n in graph_def.node if n.name in needed or n.op == "Placeholder"]
    if len(kept) < len(graph_def.node):
        library = graph_def.library
        del graph_def.node[:]
        graph_def.node.extend(kept)
        graph_def.library.CopyFrom(library)


def _ancestors(nodes: dict):
    """name -> the set of its ancestors (data and control), memoised."""
    memo: dict[str, frozenset] = {}

    def of(name: str) -> frozenset:
        if name in memo:
            return memo[name]
        stack, seen = [name], set()
        while stack:
            for raw in nodes[stack.pop()].input:
                p = raw.lstrip("^").partition(":")[0]
                if p in nodes and p not in seen:
                    seen.add(p)
                    stack.append(p)
        memo[name] = frozenset(seen)
        return memo[name]

    return of


__all__ = ["MirroredRelocation", "Other", "mirrored_of", "move_to_host", "one_copy",
           "onto_copies"]
