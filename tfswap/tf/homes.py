"""Where the step's variables live between steps: the device, or host memory.

``tfswap.optimize(..., parameters=...)`` takes one of
:data:`tfswap.options.PARAMETERS`:

* ``"device"``: variables stay where the user created them (a device
  variable is pinned there for the whole step);
* ``"host"``: every variable of the step lives in host memory between
  steps; each value the step reads is fetched before its first use on the
  device (SwapAdvisor's parameter swapping);
* ``"auto"`` (default): the parameters stay on the device when the step can
  be planned within the budget with them there; otherwise the variables of
  at least the small-tensor threshold move to host memory (a smaller one is
  never swapped, so moving it would only add a copy).

Moving keeps the user's objects: each moved ``tf.Variable`` takes the handle
of a new variable in host memory holding its value, so Keras ``get_weights``,
``save``, checkpoints and callbacks read and write the host copy, and the
device buffer is released (the old resource is left holding an empty
tensor, and its handle retired: see below).  Every function traced before
the move follows the variables: each live ``ConcreteFunction`` in the
process (a ``tf.function``'s traces, Keras's train/test/predict functions,
their concrete functions) that captured an old handle is given the new
one, so it runs on the moved variables, its reads
and updates placed on the host by TensorFlow (an op on a resource runs where
the resource lives), unplanned: every read it makes copies the value in.
:meth:`Relocation.undo` does the reverse, so a function traced while the
variables were moved reads them on the device afterwards.  Two kinds of
function cannot follow, and raise :class:`MovedVariablesError` (naming the
variable and the remedy) when called while their variables are elsewhere: a
step tfswap planned, which is planned for where the variables were, and an
XLA-compiled function (``jit_compile=True``, or one calling such a function),
because XLA cannot read a variable in host memory.  Each runs again once the
variables are back where it was made for.
What cannot be followed, because it is not a Python ``ConcreteFunction`` or
variable object (a ``tf.data`` pipeline that captured a variable, a handle
tensor the user kept), holds a retired handle (:mod:`tfswap.tf.stale`):
every read or write through it raises TensorFlow's error quoting tfswap's
message (what moved, and to build the pipeline or take the handle again, or
``restore_parameters()``), never the emptied value.  :meth:`Relocation.undo`
revives the device handles, so such a pipeline runs again afterwards, and
retires the host ones.
A variable read inside a loop or branch body stays on the device: TensorFlow
would copy it in on every read, unplanned.

Example::

    moved = move_to_host([v for v in captured.variables], "/device:CPU:1")
    captured = rehomed(captured, moved)        # reads and updates now on the host
    moved.undo()                               # back on the device, values kept
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from tfswap.tf import capture as capture_mod
from tfswap.tf import stale
from tfswap.tf.capture import CapturedFunction


def _nbytes(variable) -> int:
    return int(np.prod(variable.shape.as_list(), dtype=np.int64)) * variable.dtype.size


class MovedVariablesError(RuntimeError):
    """A function was called that cannot run where tfswap has put its variables: a
    step tfswap planned for their former home, or an XLA-compiled function
    (``jit_compile=True``; XLA cannot read a variable in host memory).  The
    message names the variable and what to do."""


@dataclass(frozen=True)
class Moved:
    """One variable moved to the host: the user's object, its former device handle
    (retired while the variable is moved; ``retired`` is what it gave up) and the
    handle of its resource in host memory."""

    variable: tf.Variable
    device_handle: tf.Tensor
    host_handle: tf.Tensor
    retired: stale.Identity

    @property
    def nbytes(self) -> int:
        return _nbytes(self.variable)


@dataclass(frozen=True)
class Relocation:
    """The variables :func:`move_to_host` moved; :meth:`undo` puts them back."""

    moved: tuple[Moved, ...]
    host: str

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.moved)

    def undo(self) -> None:
        """Put every moved variable back on its device, with its current value.

        Functions holding a host handle (traced while the variables were moved,
        or traced before and re-pointed) are re-pointed to the device handles;
        the host resources are emptied and their handles retired, and the
        device handles revived (what kept one, a ``tf.data`` pipeline, reads
        the variable again).  A variable that no longer uses this relocation's
        host handle (undone already) is left as it is.
        """
        back = [m for m in self.moved if m.variable.handle is m.host_handle]
        for m in back:
            value = m.variable.read_value()
            stale.revive(m.device_handle, m.retired)
            # The device resource holds an empty tensor: assign the full shape back.
            tf.raw_ops.AssignVariableOp(resource=m.device_handle, value=value,
                                        validate_shape=False)
            _point(m.variable, m.device_handle)
            _retire(m.host_handle, m.variable.dtype, stale.restored_message(m.variable))
        if back:
            follow({id(m.host_handle): (m.host_handle, m.device_handle, m.variable)
                    for m in back}, to_host=False)

    def describe(self) -> str:
        return (f"moved {len(self.moved)} variable(s) ({self.nbytes} B) to host memory "
                f"({self.host}) between steps; they stay the model's objects")


def _point(variable, handle) -> None:
    """Make ``variable`` (a ResourceVariable) use the resource behind ``handle``."""
    variable._handle = handle
    variable._cached_value = None   # a caching_device's copy belongs to the old resource


def _retire(handle, dtype, message: str) -> stale.Identity:
    """Free the memory of the resource behind ``handle`` and retire the handle:
    whatever still uses it (nothing tfswap could re-point) raises an error quoting
    ``message``.  An emptied resource alone would be read as an empty tensor, a
    wrong value with no error (``reduce_sum`` of it is 0.0)."""
    tf.raw_ops.AssignVariableOp(resource=handle, value=tf.zeros([0], dtype),
                                validate_shape=False)
    return stale.retire(handle, message)


def _moved_since(variable) -> str:
    return (f"tfswap: this planned step was planned with {variable.name} on the device, and "
            "tfswap has since moved it to host memory (an optimize or load_plan with "
            "parameters 'auto' or 'host'), so the plan no longer applies. Plan this step again "
            "(tfswap.optimize), or first put the variables back with restore_parameters() on "
            "the OptimizedFunction that moved them.")


def _restored(variable) -> str:
    return (f"tfswap: this planned step ran with {variable.name} in host memory, and "
            "restore_parameters() (or a plan that failed) has put it back on the device, so "
            "the plan no longer applies. Plan again (tfswap.optimize), or load the saved plan "
            "(tfswap.load_plan), which moves the variables to host memory again.")


def _not_compilable(fn, variable) -> str:
    name = fn.graph.name if fn.graph is not None else fn.name
    return (f"tfswap: the tf.function {name!r} is compiled with XLA (jit_compile=True), and "
            f"tfswap moved {variable.name} to host memory (parameters 'auto' or 'host'), "
            "where XLA cannot read it. Call the optimized function instead, trace this one "
            "without jit_compile, pass parameters='device', or put the variables back with "
            "restore_parameters() on the OptimizedFunction that moved them (this function "
            "then runs again).")


def _guarded(variable, handle, message: str):
    """A deferred capture: ``handle`` while ``variable`` uses it, else the error."""
    def capture():   # called for the function's captured inputs, before it runs
        if variable.handle is handle:   # back where the function was made for
            return handle
        raise MovedVariablesError(message)

    return capture


def _compiled(fn) -> bool:
    """Whether ``fn`` is, or calls, a function compiled with XLA (Keras's train
    function calls its ``jit_compile`` step)."""
    def must(attrs) -> bool:
        value = (attrs or {}).get("_XlaMustCompile")
        return value is not None and value.b

    return must(getattr(fn, "_attrs", None)) or any(
        must(f.definition.attr) for f in getattr(fn.graph, "_functions", {}).values()
        if hasattr(f, "definition"))   # the graph's library: every function it calls


def follow(moves: dict, to_host: bool) -> int:
    """Make every live function and variable object in the process that holds a
    moved handle use the resource's new handle.

    ``moves``: ``{id(old handle): (old handle, new handle, variable)}``, the old
    handles alive (they key the map).  ``to_host``: the handles moved from the
    device to host memory (else back).  Returns how many functions and
    variable objects changed.

    One pass over ``gc.get_objects()`` finds them (0.13 s with TensorFlow and
    Keras imported, 0.2 s with ResNet-50 and a BERT-style model built too, on
    a 2-core machine); nothing else lists the ``ConcreteFunction``s alive.
    Each takes the new handle as its captured input, and its FuncGraph records
    it as the capture, so what reads the graph's record (a ConcreteFunction TF
    makes again from the graph, ``tf.saved_model.save``) sees the handle the
    function runs with.  Other ResourceVariable objects on the same resource
    (the ``_UnreadVariable`` an eager ``assign`` returns) take it too.  Two
    kinds of function cannot run on the new handle, and get instead a deferred
    capture that gives the old handle while the variable uses it again, else
    raises :class:`MovedVariablesError`: a step tfswap planned
    (:class:`tfswap.tf.runtime.BoundFunction`; its plan placed the ops on the
    variable's former home), and, moving to the host, an XLA-compiled one.

    Example::

        old = variable.handle
        ...                                   # variable now uses a new resource
        follow({id(old): (old, variable.handle, variable)}, to_host=True)
    """
    from tensorflow.python.eager.polymorphic_function.concrete_function import \
        ConcreteFunction
    from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

    from tfswap.tf.runtime import BoundFunction

    kinds = (ConcreteFunction, BoundFunction, BaseResourceVariable)
    functions, plans, changed = [], set(), 0
    for obj in gc.get_objects():
        # By type, not isinstance: isinstance may ask the object for its
        # __class__, and some objects refuse (numpy's NpzFile.f raises
        # AttributeError for every attribute).
        if not issubclass(type(obj), kinds):
            continue
        if isinstance(obj, ConcreteFunction):
            if any(id(c) in moves for c in obj._captured_inputs):
                functions.append(obj)
        elif isinstance(obj, BoundFunction):
            plans.add(id(obj._wrapped))
        elif id(getattr(obj, "_handle", None)) in moves:
            _point(obj, moves[id(obj._handle)][1])
            changed += 1
    for fn in functions:
        if id(fn) in plans:
            message = _moved_since if to_host else _restored
        elif to_host and _compiled(fn):
            message = functools.partial(_not_compilable, fn)
        else:
            message = None
        captures = []
        for c in fn._captured_inputs:
            if id(c) in moves:
                _, new, variable = moves[id(c)]
                c = new if message is None else _guarded(variable, c, message(variable))
            captures.append(c)
        fn.set_external_captures(captures)
        if message is None and fn.graph is not None:
            _record(fn.graph, moves)
    return changed + len(functions)


def _record(graph, moves: dict) -> None:
    """Make ``graph``'s capture record name the new handles, in the same order (the
    order of the function's captured inputs and of its placeholders)."""
    external = graph.external_captures
    if any(id(c) in moves for c in external):
        graph.function_captures.reset_captures(
            [moves[id(c)][1] if id(c) in moves else c for c in external],
            graph.internal_captures)


def _plain(variable) -> bool:
    """A variable whose resource handle tfswap can repoint: a plain (not
    distributed, not mirrored) resource variable, eager or made in a function."""
    from tensorflow.python.ops import resource_variable_ops

    return isinstance(variable, resource_variable_ops.BaseResourceVariable) and \
        hasattr(variable, "_handle") and not getattr(variable, "_in_graph_mode", False)


def _resource_variable(variable):
    if not _plain(variable):
        raise TypeError(
            f"tfswap can move only plain resource variables to the host; {variable.name} is a "
            f"{type(variable).__name__}. Pass parameters='device', or create it in host memory "
            "(under tf.device(host)) yourself")
    if not tf.executing_eagerly():
        raise RuntimeError("variables are moved eagerly; call tfswap.optimize outside a "
                           "tf.function or graph")
    return variable


def move_to_host(variables, host: str) -> Relocation:
    """Move ``variables`` (the user's ResourceVariables) to host memory in place.

    Each gets a new resource on ``host`` holding its value; its former device
    resource is emptied, which frees the device memory, and its former handle
    retired (:mod:`tfswap.tf.stale`).  Every function traced before that
    captured a former handle is re-pointed to the new one
    (:func:`follow`), so the user's ``tf.function`` keeps computing on the
    moved variables; a step tfswap planned with them on the device raises
    :class:`MovedVariablesError` instead.
    """
    stale.ready()
    moved = []
    try:
        for variable in variables:
            variable = _resource_variable(variable)
            with tf.device(host):
                # A new resource with the variable's value, owned by its handle.
                fresh = tf.Variable(variable.read_value(), trainable=False,
                                    name=variable.name.partition(":")[0] + "_host")
            old = variable.handle
            _point(variable, fresh.handle)   # first: should retiring fail, the value is kept
            moved.append(Moved(variable, old, fresh.handle,
                               _retire(old, variable.dtype, stale.moved_message(variable))))
        follow({id(m.device_handle): (m.device_handle, m.host_handle, m.variable)
                for m in moved}, to_host=True)
    except BaseException:
        Relocation(tuple(moved), host).undo()
        raise
    return Relocation(tuple(moved), host)


def movable(captured: CapturedFunction) -> tuple:
    """The captured device variables that can live on the host: plain resource
    variables the step reads and updates only through plain ops (not inside a
    loop, branch or call)."""
    handles = {c.name.partition(":")[0]: c for c in captured.captures
               if c.variable is not None and not c.host_homed and _plain(c.variable)}
    in_bodies = set()
    for node in captured.graph_def.node:
        if any(value.HasField("func") for value in node.attr.values()):
            in_bodies.update(raw.lstrip("^").partition(":")[0] for raw in node.input)
    return tuple(c for name, c in handles.items() if name not in in_bodies)


def chosen(captured: CapturedFunction, parameters: str, small_bytes: int) -> tuple:
    """The captures to move for ``parameters`` "host" (all) or "auto" (all of at
    least ``small_bytes``); raises CaptureError where "host" cannot move one."""
    candidates = movable(captured)
    if parameters == "host":
        names = {c.name for c in candidates}
        stuck = [c.variable.name for c in captured.captures
                 if c.variable is not None and not c.host_homed and c.name not in names]
        if stuck:
            raise capture_mod.CaptureError(
                f"parameters='host': {stuck[0]} cannot move: it is read inside a loop, branch "
                "or call body (where tfswap cannot fetch its reads before use) or it is not a "
                "plain resource variable (a distributed one). Pass parameters='auto' (it stays "
                "on the device), or unroll the loop.")
        return candidates
    return tuple(c for c in candidates if _nbytes(c.variable) >= small_bytes)


def rehomed(captured: CapturedFunction, relocation: Relocation) -> CapturedFunction:
    """``captured`` with the moved variables host-homed: their handles are the new
    ones, and the ops taking them run on the host."""
    moved = {id(m.variable) for m in relocation.moved}
    captures = tuple(
        dataclasses.replace(c, value=c.variable.handle, host_homed=True)
        if c.variable is not None and id(c.variable) in moved else c
        for c in captured.captures)
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(captured.graph_def)
    capture_mod.place_on_variables(graph_def, captures)
    return dataclasses.replace(captured, graph_def=graph_def, captures=captures)


# In-place updates whose arithmetic can run on the device: the new value is
# this op of the value read before the update and the update's operand.
IN_PLACE_UPDATES = {"AssignAddVariableOp": "AddV2", "AssignSubVariableOp": "Sub"}
UPDATE_SUFFIX = "/tfswap_new_value"


def updates_on_device(captured: CapturedFunction, device: str) -> tuple[CapturedFunction, dict]:
    """``captured`` with each in-place update of a host-homed variable made on the
    device: ``AssignAddVariableOp(v, d)`` becomes ``AssignVariableOp(v, r + d)``
    with the addition on the device, where ``r`` is the value the step read
    from ``v`` last before the update; reads of ``v`` after it (before any other
    write) read that new value instead of fetching it again.

    Only the final add moved: Keras's optimizers compute the delta on the
    device already.  The result is the same bit for bit (one IEEE addition of
    the same two values), the host only stores what the device computed (one
    copy back, as for the delta), and no second fetch follows.  Returns the
    new graph and ``{new device op: the update it came from}`` (its cost).
    An update whose value read cannot be proven current stays in place.
    """
    handles = {c.name.partition(":")[0] for c in captured.captures if c.host_homed}
    if not handles:
        return captured, {}
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(captured.graph_def)
    nodes = {n.name: n for n in graph_def.node}
    on_handle: dict[str, list] = {}
    for name in _topological(graph_def):
        node = nodes[name]
        data = [i.partition(":")[0] for i in node.input if not i.startswith("^")]
        if data and data[0] in handles:
            on_handle.setdefault(data[0], []).append(node)
    consumers: dict[str, list] = {}   # node -> (reader, slot) of its data readers
    for node in graph_def.node:
        for k, raw in enumerate(node.input):
            if not raw.startswith("^"):
                consumers.setdefault(raw.partition(":")[0], []).append((node, k))
    made = {}
    for handle, sequence in on_handle.items():
        value = None   # the node whose output 0 is the variable's current value
        for k, node in enumerate(sequence):
            if node.op == "ReadVariableOp":
                value = node.name if value is None or nodes[value].op == "ReadVariableOp" \
                    else value
                continue
            arithmetic = IN_PLACE_UPDATES.get(node.op)
            if arithmetic is None or value is None or not _after(nodes, node.name, value):
                value = None   # another writer: what the variable holds is not known here
                continue
            new = graph_def.node.add(name=node.name + UPDATE_SUFFIX, op=arithmetic,
                                     device=device)
            new.input.extend([value, node.input[1]])
            new.attr["T"].type = node.attr["dtype"].type
            nodes[new.name] = new
            node.op = "AssignVariableOp"
            node.input[1] = new.name
            node.attr["validate_shape"].b = False
            made[new.name] = node.name
            for later in sequence[k + 1:]:   # reads of the new value take it from the device
                if later.op != "ReadVariableOp" or not _after(nodes, later.name, node.name):
                    break
                for reader, slot in consumers.get(later.name, ()):
                    reader.input[slot] = new.name
            value = new.name
    return dataclasses.replace(captured, graph_def=graph_def), made


def _topological(graph_def) -> list[str]:
    from tfswap.tf.rewrite import topological_order

    return topological_order(graph_def)


def _after(nodes: dict, later: str, earlier: str) -> bool:
    """Whether ``earlier`` is an ancestor of ``later`` (by data or control edges)."""
    seen, stack = set(), [later]
    while stack:
        name = stack.pop()
        for raw in nodes[name].input:
            source = raw.lstrip("^").partition(":")[0]
            if source == earlier:
                return True
            if source not in seen and source in nodes:
                seen.add(source)
                stack.append(source)
    return False


@dataclass(frozen=True)
class Traffic:
    """What one host-homed variable moves in a step of a plan."""

    variable: str
    nbytes: int
    fetches: int              # prefetch swaps of its values
    fetched_bytes: int
    written_back_bytes: int   # new values copied to the host
    # What its work on the host reads from the device that is not a new value:
    # the indices of a gather run on the host next to the table.
    indices_bytes: int = 0

    def describe(self) -> str:
        indices = f", {self.indices_bytes} B of indices to the host" if self.indices_bytes \
            else ""
        return (f"{self.variable} ({self.nbytes} B): fetched {self.fetches}x "
                f"({self.fetched_bytes} B), {self.written_back_bytes} B written back{indices}")


def traffic(captured: CapturedFunction, plan, writebacks: dict) -> tuple[Traffic, ...]:
    """Per host-homed variable of ``captured``, what ``plan`` fetches and what its
    updates (``writebacks``: op -> bytes, :class:`tfswap.tf.ir.LoweredGraph`) copy
    back in one step, the most bytes first."""
    variables = {c.name.partition(":")[0]: c.variable for c in captured.captures
                 if c.host_homed}
    nodes = {n.name: n for n in captured.graph_def.node}
    readers: dict[str, list[str]] = {}
    for node in captured.graph_def.node:
        for raw in node.input:
            if not raw.startswith("^"):
                readers.setdefault(raw.partition(":")[0], []).append(node.name)

    def handle_of(name: str):
        node = nodes.get(name)
        data = [i for i in node.input if not i.startswith("^")] if node is not None else []
        return variables.get(data[0].partition(":")[0]) if data else None

    def variable_of(op: str):
        """The variable an op reads or writes: its own handle, else through the work on
        the host around it (a gather's table upstream, an update's variable downstream)."""
        if handle_of(op) is not None:
            return handle_of(op)
        device = nodes[op].device if op in nodes else ""
        for step in (lambda n: [i.partition(":")[0] for i in nodes[n].input
                                if not i.startswith("^")],
                     lambda n: readers.get(n, [])):
            seen, stack = {op}, [op]
            while stack:
                for near in step(stack.pop()):
                    if near in seen or near not in nodes or nodes[near].device != device:
                        continue
                    if handle_of(near) is not None:
                        return handle_of(near)
                    seen.add(near)
                    stack.append(near)
        return None

    moved: dict = {}
    for swap in plan.swaps:
        variable = variable_of(swap.tensor.partition(":")[0]) if swap.kind == "prefetch" \
            else None
        if variable is not None:
            row = moved.setdefault(id(variable), [variable, 0, 0, 0, 0])
            row[1] += 1
            row[2] += swap.bytes
    for op, nbytes in writebacks.items():
        variable = variable_of(op)
        if variable is not None:
            # A gather on the host reads its indices from the device, not a new value.
            gather = op in nodes and nodes[op].op in ("GatherV2", "ResourceGather")
            moved.setdefault(id(variable), [variable, 0, 0, 0, 0])[4 if gather else 3] += nbytes
    rows = [Traffic(v.name.partition(":")[0], _nbytes(v), n, f, b, i) for v, n, f, b, i in
            moved.values()]
    return tuple(sorted(rows, key=lambda r: (-(r.fetched_bytes + r.written_back_bytes),
                                             r.variable)))


__all__ = ["IN_PLACE_UPDATES", "Traffic", "traffic", "Moved", "Relocation", "MovedVariablesError",
           "chosen", "follow", "movable", "move_to_host", "rehomed", "updates_on_device"]
