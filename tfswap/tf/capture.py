"""ConcreteFunction -> CapturedFunction: the graph, its feeds, fetches and variables.

The GraphDef of a ``tf.function`` holds one ``Placeholder`` per argument
tensor followed by one per captured tensor (variable handles and captured
constants).  Everything downstream -- IR, rewrite, runtime -- works on this
value and never on the ConcreteFunction again.

By default the graph captured is the one Grappler makes of the function
(:mod:`tfswap.tf.grappler`), because that is what TensorFlow would run and
what tfswap must reproduce bit for bit with Grappler off.

Example::

    step = tf.function(train_step)
    cf = step.get_concrete_function(tf.TensorSpec([32, 224, 224, 3]), tf.TensorSpec([32], tf.int32))
    captured = tfswap.tf.capture.capture(cf)
    captured.feeds      # ('x:0', 'y:0')
    captured.fetches    # ('Identity:0',)
"""

from __future__ import annotations

import functools
import gc
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest

from tfswap.tf import grappler, host_copies


class CaptureError(ValueError):
    """The function cannot be captured as given; the message says what to change."""


@dataclass(frozen=True)
class ArgSpec:
    """One flat argument of the function."""

    name: str           # placeholder tensor name in the GraphDef, e.g. "x:0"
    path: str           # where it sits in the call signature, e.g. "args[0]['image']"
    dtype: tf.DType
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CapturedTensor:
    """A tensor the function closes over (a variable handle or a constant)."""

    name: str           # placeholder tensor name in the GraphDef
    value: Any          # the live eager tensor (for a variable: its resource handle)
    variable: tf.Variable | None  # the variable owning the handle, if any
    host_homed: bool = False  # a variable that lives in host memory (see capture())


@dataclass(frozen=True)
class CapturedFunction:
    graph_def: tf.compat.v1.GraphDef
    args: tuple[ArgSpec, ...]
    captures: tuple[CapturedTensor, ...]
    fetches: tuple[str, ...]            # flat output tensor names
    control_outputs: tuple[str, ...]    # ops that must run though no output needs them
    structured_outputs: Any             # nest structure of the outputs, Tensors as leaves
    input_signature: Any                # cf.structured_input_signature
    name: str
    device: str = ""                    # where unplaced ops were put before Grappler ran
    grappler_optimized: bool = False
    # A step replicated by a tf.distribute strategy: the devices of its replicas,
    # ``device`` first (see :func:`replica_devices`); () for a step on one device.
    replicas: tuple[str, ...] = ()
    # Members of its collectives on other workers (MultiWorkerMirroredStrategy): the
    # step cannot run in a local session, only where every worker runs it.
    other_workers: bool = False

    @property
    def feeds(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return tuple(c.variable for c in self.captures if c.variable is not None)

    @property
    def host_homed(self) -> tuple[str, ...]:
        """Placeholders of the variables that live in host memory between steps."""
        return tuple(c.name for c in self.captures if c.host_homed)


def _is_concrete_function(obj) -> bool:
    return hasattr(obj, "graph") and hasattr(obj, "captured_inputs") \
        and hasattr(obj, "structured_input_signature")


def _signature_paths(signature) -> list[str]:
    args, kwargs = signature
    paths = []
    for prefix, tree in (("args", args), ("kwargs", kwargs)):
        for path, _ in nest.flatten_with_joined_string_paths(tree):
            paths.append(f"{prefix}/{path}" if path else prefix)
    return paths


@dataclass(frozen=True)
class SizedFunction:
    """A ConcreteFunction traced with unknown dimensions, planned for one set of shapes.

    Made by :func:`at_shapes`; :func:`capture` (so ``tfswap.optimize`` and
    ``tfswap.load_plan``) takes it where it takes a ConcreteFunction.
    """

    function: Any
    shapes: tuple[tuple[int, ...], ...]   # one per flat argument, fully known


def at_shapes(concrete_fn, shapes) -> SizedFunction:
    """``concrete_fn``, whose arguments may have unknown dimensions, to be planned
    and run for arguments of ``shapes`` (one shape per flat argument).

    Tracing again with static shapes is not the same step: Grappler folds what
    it then knows, e.g. a mean's gradient divided by the element count becomes
    a product with the count's rounded reciprocal, which differs in the last
    bit unless the count is a power of two.  Keras traces its step with the
    dataset's element spec, whose batch dimension is unknown when the last
    batch is smaller; capturing that trace computes what Keras computes.

    Example::

        cf = step.get_concrete_function(tf.TensorSpec([None, 784]))
        fast = tfswap.optimize(at_shapes(cf, [(100, 784)]), "1MiB")
    """
    return SizedFunction(concrete_fn, tuple(tuple(int(d) for d in shape) for shape in shapes))


def capture(concrete_fn, optimize: bool = True, device: str | None = None,
            other_workers: bool = False) -> CapturedFunction:
    """Capture a ``tf.function`` ConcreteFunction for planning and rewriting.

    ``optimize``: capture the graph Grappler produces for it (the default, and
    what makes the rewritten step compute exactly what the function computes);
    False keeps the traced graph as written.  ``device``: where the step will
    run (default: the first GPU, else CPU:0); Grappler fuses per device type.
    ``concrete_fn`` may be a :class:`SizedFunction` (:func:`at_shapes`): Grappler
    then runs on the graph as traced, unknown dimensions and all, as it does
    for the function itself, and the arguments get their shapes afterwards.

    ``other_workers``: accept a step whose collectives have members on other
    workers (``MultiWorkerMirroredStrategy``; ``CapturedFunction.other_workers``
    says so), which only runs where every worker runs it: the caller must not
    run it in a local session (profile or measure it), where it would wait
    for them.  Default: refused with :class:`CaptureError`.

    Raises :class:`CaptureError` for anything that is not a ConcreteFunction
    and for argument shapes with unknown dimensions (tfswap plans bytes, so
    every tensor size must be known; trace one concrete function per shape,
    or give the shapes with :func:`at_shapes`).
    """
    sizes = None
    if isinstance(concrete_fn, SizedFunction):
        concrete_fn, sizes = concrete_fn.function, concrete_fn.shapes
    if not _is_concrete_function(concrete_fn):
        if hasattr(concrete_fn, "get_concrete_function"):
            raise CaptureError(
                "tfswap needs a ConcreteFunction with fully known input shapes, got a "
                f"tf.function ({getattr(concrete_fn, '__name__', concrete_fn)!r}). Call "
                "`fn.get_concrete_function(tf.TensorSpec([batch, ...], dtype), ...)` and "
                "pass its result.")
        raise CaptureError(
            f"tfswap needs a ConcreteFunction, got {type(concrete_fn).__name__}. Wrap the "
            "step in `tf.function` and pass `tf.function(step).get_concrete_function(specs...)`.")

    graph = concrete_fn.graph
    captured_values = list(concrete_fn.captured_inputs)
    n_args = len(concrete_fn.inputs) - len(captured_values)
    arg_tensors = concrete_fn.inputs[:n_args]
    paths = _signature_paths(concrete_fn.structured_input_signature)
    if len(paths) != n_args:  # e.g. composite tensors flatten to several placeholders
        paths = [t.op.name for t in arg_tensors]

    if sizes is not None and len(sizes) != n_args:
        raise CaptureError(f"at_shapes gave {len(sizes)} shape(s) for a function of {n_args} "
                           "flat argument(s)")
    args = []
    for k, (tensor, path) in enumerate(zip(arg_tensors, paths)):
        shape = tensor.shape
        if sizes is not None:
            if not shape.is_compatible_with(sizes[k]):
                raise CaptureError(f"input {path} was traced with shape {shape}; at_shapes "
                                   f"gave {list(sizes[k])}, which it cannot take")
            shape = tf.TensorShape(sizes[k])
        if shape.rank is None:
            raise CaptureError(
                f"input {path} ({tensor.op.name}) has unknown rank; tfswap plans exact byte "
                "sizes, so trace the function with a fully defined TensorSpec.")
        for axis, dim in enumerate(shape.as_list()):
            if dim is None:
                raise CaptureError(
                    f"input {path} ({tensor.op.name}) has an unknown dimension {axis} in shape "
                    f"{shape}; tfswap plans exact byte sizes. Trace one concrete function per "
                    "shape, e.g. get_concrete_function(tf.TensorSpec([32, 224, 224, 3])).")
        if tensor.dtype == tf.resource or tensor.dtype == tf.variant:
            raise CaptureError(
                f"input {path} is a {tensor.dtype.name} tensor; pass variables by closure "
                "(capture them) rather than as arguments.")
        args.append(ArgSpec(tensor.name, path, tensor.dtype, tuple(shape.as_list())))

    try:
        variables = graph.variables
    except AssertionError as err:  # TF's message for weak references to collected variables
        raise CaptureError(
            "the function uses variables that no longer exist (the model or optimizer that "
            "owned them was garbage-collected after tracing). Keep them alive as long as the "
            "function: e.g. return the model and optimizer together with the concrete "
            "function, or store them on an object.") from err
    owner = {}
    for var in variables:
        owner[id(var.handle)] = var
    device = device or grappler.default_device()
    graph_def = graph.as_graph_def(add_shapes=True)
    replicas = replica_devices(graph_def, device, variables)
    if replicas:
        # A strategy's own variables (the collectives' ordering tokens) are captured
        # without being the graph's variables.
        owner.update(_owners_of(v for v in captured_values
                                if v.dtype == tf.resource and id(v) not in owner))
    captures = tuple(
        CapturedTensor(ph.name, value, owner.get(id(value)),
                       _elsewhere(owner.get(id(value)), device, replicas))
        for ph, value in zip(concrete_fn.inputs[n_args:], captured_values))
    remote = _other_members(graph_def, captures, replicas)
    if remote and not other_workers:
        name, op, size, local = remote[0]
        raise CaptureError(
            f"{op} {name!r} gathers {size} members and this step has {local} replica(s) "
            "here: the others are on other workers (MultiWorkerMirroredStrategy). tfswap "
            "profiles and verifies a step by running it in a local session, where the "
            "collective would wait for them; pass profile='analytic' and verify_rounds=0 "
            "to plan each worker's step from its shapes alone (the budget then rests on the "
            "memory model, unmeasured), or train with a MirroredStrategy on one machine.")

    structured = concrete_fn.structured_outputs
    fetches = tuple(t.name for t in tf.nest.flatten(structured) if isinstance(t, tf.Tensor))
    missing = [f for f in fetches if f not in {t.name for t in concrete_fn.outputs}]
    if missing:  # pragma: no cover - guards against TF changing output bookkeeping
        raise CaptureError(f"outputs {missing} are not among the function's outputs")

    control_outputs = tuple(op.name for op in graph.control_outputs)
    if replicas:
        _on_resource_devices(graph_def, captures)
    _describe_handles(graph_def, captures)
    if optimize:
        graph_def = grappler.optimize(graph_def, fetches, control_outputs, device)
    if sizes is not None:
        _set_arg_shapes(graph_def, args)
    place_on_variables(graph_def, captures)
    return CapturedFunction(
        graph_def=graph_def,
        args=tuple(args),
        captures=captures,
        fetches=fetches,
        control_outputs=control_outputs,
        structured_outputs=structured,
        input_signature=concrete_fn.structured_input_signature,
        name=getattr(concrete_fn, "name", "function"),
        device=device,
        grappler_optimized=optimize,
        replicas=replicas,
        other_workers=bool(remote),
    )


# Ops through which replicas of a tf.distribute step exchange values (all-reduce,
# gather, broadcast; NCCL's on GPUs).
COLLECTIVE_OPS = frozenset({
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveGather",
    "CollectiveGatherV2", "CollectiveBcastSend", "CollectiveBcastRecv",
    "CollectiveBcastSendV2", "CollectiveBcastRecvV2", "CollectiveAllToAllV2",
    "CollectiveAllToAllV3", "NcclAllReduce", "NcclReduce", "NcclBroadcast"})


def strategy_devices(concrete_fn) -> tuple[str, ...]:
    """The devices a ``tf.distribute`` strategy runs ``concrete_fn``'s replicas on
    (this worker's, without job and task), in the strategy's order (by device
    type, then index): those of its traced graph's collective ops, or, for a step
    with none (Keras's evaluation and prediction steps under a
    ``MirroredStrategy`` reduce nothing across replicas), those of the mirrored
    variables' components it reads; () for a step of neither kind.  What
    :func:`tfswap.tf.device.placement` takes the step's device from when none is
    given: under a strategy the user names the devices once, to the strategy.

    Example::

        strategy_devices(cf)        # ('/device:GPU:0', '/device:GPU:1')
    """
    if isinstance(concrete_fn, SizedFunction):
        concrete_fn = concrete_fn.function
    graph = getattr(concrete_fn, "graph", None)
    if graph is None:
        return ()
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node) + [n for fn in graph_def.library.function
                                    for n in fn.node_def]

    def order(device):
        spec = tf.DeviceSpec.from_string(device)
        return spec.device_type or "", spec.device_index or 0

    found = set(_collective_devices(nodes))
    if not found:
        try:
            variables = graph.variables
        except AssertionError:   # collected after tracing: capture() says so, not here
            variables = ()
        found = {local_device(host_copies.replica_device(c))
                 for c in _mirrored_components(variables)}
    return tuple(sorted(found, key=order))


def _mirrored_components(variables):
    """The components of distributed variables among ``variables``: what a
    replica of a ``tf.distribute`` step reads (one per replica's device)."""
    for v in variables:
        # TF's DistributedVariable marks each component (its handle, where the
        # component is a CompositeTensor) with a weak reference to itself; no
        # public API says whether a variable is one's component.
        container = getattr(v, "_distributed_container", None) or getattr(
            getattr(v, "handle", None), "_distributed_container", None)
        whole = container() if callable(container) else None
        if isinstance(whole, tf.distribute.DistributedValues):
            yield from whole.values


def _collective_devices(nodes):
    return (local_device(n.device) for n in nodes if n.op in COLLECTIVE_OPS and n.device)


def replica_devices(graph_def, device: str, variables=()) -> tuple[str, ...]:
    """The devices a step is replicated on (``strategy.run`` under a
    ``tf.distribute`` strategy), ``device`` first, then by name; () for a step
    on one device.  A replica is told by its collective ops (all-reduce,
    gather, broadcast) and by the mirrored variables' components among
    ``variables`` (the step's), one per replica: a step that reduces nothing
    across replicas (Keras's evaluation step) has no collective.  On a CPU
    device the host is a CPU too, so a CPU op elsewhere says nothing; on a GPU,
    ops on another GPU also make a replica.
    Raises :class:`CaptureError` when ``device`` is not one of them."""
    def functions_too():
        yield from graph_def.node
        for fn in graph_def.library.function:
            yield from fn.node_def

    kind = tf.DeviceSpec.from_string(device).device_type
    found = set(_collective_devices(functions_too())) | {
        local_device(host_copies.replica_device(c)) for c in _mirrored_components(variables)}
    if kind != "CPU":
        found |= {local_device(n.device) for n in graph_def.node if n.device
                  and tf.DeviceSpec.from_string(n.device).device_type == kind}
    others = sorted(d for d in found if not same_device(d, device))
    if not others:
        return ()
    if len(others) == len(found):
        raise CaptureError(
            f"the step is replicated over {sorted(found)} (a tf.distribute strategy's "
            f"strategy.run), but not on {device}, the device given; pass device= one of them")
    return (local_device(device),) + tuple(others)


def _on_resource_devices(graph_def, captures) -> None:
    """Put each unplaced op that takes a captured variable's handle on that
    variable's device, as TensorFlow's placer does (an op on a resource runs
    where it lives): a replica's reads of its own copy of a mirrored variable
    carry no device in the traced graph, and Grappler would put every
    unplaced op on the first replica's device."""
    homes = {c.name.partition(":")[0]: local_device(c.variable.device) for c in captures
             if c.variable is not None}
    for node in graph_def.node:
        if node.device:
            continue
        for raw in node.input:
            source = raw.partition(":")[0]
            if not raw.startswith("^") and source in homes:
                node.device = homes[source]
                break


_KEY_NAMES = ("group_size", "group_key", "instance_key")


def _scalar(value):
    value = np.asarray(value)
    return int(value) if value.size == 1 and value.dtype.kind in "iu" else None


def _const(node):
    """A scalar integer ``Const`` node's value; None for anything else."""
    if node is None or node.op != "Const" or \
            any(d.size > 1 for d in node.attr["value"].tensor.tensor_shape.dim):
        return None
    return _scalar(tf.make_ndarray(node.attr["value"].tensor))


def _step_values(graph_def, captures):
    """``raw input name -> its integer value`` where the step's graph knows it before
    running: a scalar constant or captured value; None otherwise."""
    nodes = {n.name: n for n in graph_def.node}
    values = {c.name.partition(":")[0]: c.value for c in captures
              if c.variable is None and c.value.dtype != tf.resource}

    def resolve(raw: str):
        name = raw.partition(":")[0]
        known = _const(nodes.get(name))
        if known is None and name in values and values[name].shape.num_elements() == 1:
            return _scalar(values[name].numpy())
        return known
    return resolve


def _params_of(node, resolve) -> dict:
    """A collective node's ``group_size``, ``group_key`` and ``instance_key``: the V1
    ops' attributes, the V2 ones' data inputs 1-3 through ``resolve``."""
    if "instance_key" in node.attr:
        return {k: node.attr[k].i for k in _KEY_NAMES}
    data = [i for i in node.input if not i.startswith("^")]
    return {k: resolve(data[j]) if len(data) > j else None for j, k in enumerate(_KEY_NAMES, 1)}


def collective_key(node, params: dict) -> tuple:
    """What the members of one collective share: an NCCL op's type and
    ``shared_name``, else its type, group and instance keys (``params``, from
    :func:`collective_params`); None in it where not known before the step runs."""
    if node.op.startswith("Nccl"):
        return (node.op, node.attr["shared_name"].s.decode() or None)
    return (node.op, params["group_key"], params["instance_key"])


def collective_params(graph_def, captures) -> dict[str, dict]:
    """Collective op -> its ``group_size``, ``group_key`` and ``instance_key``:
    attributes of the V1 ops, inputs 1-3 of the V2 ones where those are
    constants or captured values; None where not known before the step runs."""
    resolve = _step_values(graph_def, captures)
    return {node.name: _params_of(node, resolve) for node in graph_def.node
            if node.op in COLLECTIVE_OPS}


def collective_calls(graph_def, captures=()) -> dict[str, tuple | None]:
    """Op that calls functions running collectives -> those collectives' keys.

    A cond's branches, a loop's body or a called function can hold the
    collectives (``MirroredStrategy`` all-gathers an embedding's sparse
    gradient inside a ``tf.cond`` on whether every replica has as many rows);
    the calling op then meets the other replicas' like a collective does.  The
    keys: the sorted :func:`collective_key` of every collective in the op's
    functions, nested calls included, each key a constant there or passed in
    from one (a constant or captured value of the step); None where one is
    known only when the step runs.  Ops whose functions run no collective are
    left out::

        collective_calls(graph_def)   # {'adam/cond': (('CollectiveGatherV2', 1, 108), ...)}
    """
    library = {f.signature.name: f for f in graph_def.library.function}

    def called(node) -> list[str]:
        names = [node.op] if node.op in library else []
        for value in node.attr.values():
            if value.HasField("func"):
                names.append(value.func.name)
            names += [f.name for f in value.list.func]
        return [n for n in names if n in library]

    def passed(node, resolve) -> tuple:
        """What the call passes each of its function's arguments (the data inputs
        after a cond's predicate or a case's index)."""
        data = [i for i in node.input if not i.startswith("^")]
        if node.op in ("If", "StatelessIf", "Case", "StatelessCase"):
            data = data[1:]
        return tuple(resolve(raw) for raw in data)

    memo: dict[tuple, tuple | None] = {}

    def keys_in(fname: str, args: tuple) -> tuple | None:
        if (fname, args) in memo:
            return memo[fname, args]
        memo[fname, args] = ()   # a recursive call adds nothing
        fn = library[fname]
        body = {n.name: n for n in fn.node_def}
        bound = {a.name: v for a, v in zip(fn.signature.input_arg, args)}

        def resolve(raw: str):
            name = raw.partition(":")[0]
            return bound.get(name) if ":" not in raw and name in bound else _const(body.get(name))

        found, unknown = set(), False
        for node in body.values():
            if node.op in COLLECTIVE_OPS:
                key = collective_key(node, _params_of(node, resolve))
                unknown |= None in key
                found.add(key)
            for inner in called(node):
                sub = keys_in(inner, passed(node, resolve))
                unknown |= sub is None
                found |= set(sub or ())
        memo[fname, args] = None if unknown else tuple(sorted(found))
        return memo[fname, args]

    resolve_here = _step_values(graph_def, captures)
    calls = {}
    for node in graph_def.node:
        names = called(node)
        if not names:
            continue
        parts = [keys_in(n, passed(node, resolve_here)) for n in names]
        if any(p is None for p in parts):
            calls[node.name] = None
        elif any(parts):
            calls[node.name] = tuple(sorted({k for p in parts for k in p}))
    return calls


def _other_members(graph_def, captures, replicas) -> list[tuple[str, str, int, int]]:
    """(name, op, group size, local replicas) of each collective with more members
    than the step has replicas here (``MultiWorkerMirroredStrategy``: the others
    are on other workers)."""
    local = max(1, len(replicas))
    nodes = {n.name: n for n in graph_def.node}
    return [(name, nodes[name].op, params["group_size"], local)
            for name, params in collective_params(graph_def, captures).items()
            if params["group_size"] is not None and params["group_size"] > local]


def _owners_of(handles) -> dict:
    """``{id(handle): variable}`` for the live resource variables whose handle is
    one of ``handles`` (one pass over the process's objects, by type)."""
    from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

    wanted = {id(h) for h in handles}
    if not wanted:
        return {}
    return {id(obj.handle): obj for obj in gc.get_objects()
            if issubclass(type(obj), BaseResourceVariable)
            and id(getattr(obj, "_handle", None)) in wanted}


def _describe_handles(graph_def, captures) -> None:
    """Give each captured variable's placeholder the shape and dtype of the value
    behind its handle, as the function runtime gives its resource ``_Arg``.

    :func:`tfswap.tf.grappler.optimize` builds from them the stand-in through
    which Grappler infers the shapes of the variable's reads, as the function
    runtime does (see ``_stand_in_for_arguments`` there).
    """
    described = {c.name.partition(":")[0]: c.variable for c in captures
                 if c.variable is not None}
    for node in graph_def.node:
        variable = described.get(node.name)
        if variable is None or node.op != "Placeholder":
            continue
        node.attr["_handle_dtypes"].list.type[:] = [variable.dtype.as_datatype_enum]
        del node.attr["_handle_shapes"].list.shape[:]
        node.attr["_handle_shapes"].list.shape.add().CopyFrom(variable.shape.as_proto())


def _set_arg_shapes(graph_def, args) -> None:
    """Give the argument placeholders their planned shapes, after Grappler has run
    (Grappler never runs on the graph again, so nothing folds them in later)."""
    by_name = {a.name.partition(":")[0]: a for a in args}
    for node in graph_def.node:
        arg = by_name.get(node.name)
        if arg is None or node.op != "Placeholder":
            continue
        proto = tf.TensorShape(arg.shape).as_proto()
        node.attr["shape"].shape.CopyFrom(proto)
        if "_output_shapes" in node.attr:
            del node.attr["_output_shapes"].list.shape[:]
            node.attr["_output_shapes"].list.shape.add().CopyFrom(proto)


def _elsewhere(variable, device: str, replicas=()) -> bool:
    """Whether ``variable`` lives on another device than the step (or its
    replicas): in host memory.

    A user who creates the model and optimizer under ``tf.device(host)`` keeps
    their parameters in host memory between steps (SwapAdvisor's parameter
    swapping); tfswap then swaps each read in before its use on the device.
    """
    return variable is not None and not any(same_device(variable.device, d)
                                            for d in (device,) + tuple(replicas))


@functools.lru_cache(maxsize=256)   # asked once per GraphDef node, of a few distinct names
def same_device(a: str, b: str) -> bool:
    """Whether two device names name one device (type and index; job, task ignored)."""
    spec_a, spec_b = tf.DeviceSpec.from_string(a), tf.DeviceSpec.from_string(b)
    return (spec_a.device_type, spec_a.device_index or 0) == \
        (spec_b.device_type, spec_b.device_index or 0)


def local_device(device: str) -> str:
    """``device`` without job, replica and task, as a GraphDef node's device."""
    return tf.DeviceSpec.from_string(device).replace(job=None, replica=None,
                                                     task=None).to_string()


def place_on_variables(graph_def, captures) -> None:
    """Put every op that takes a host-homed variable's handle on that variable's device.

    Grappler placed the graph's unplaced ops on the step's device; an op on a
    resource must run where the resource lives (reads and updates of a host
    variable run on the host, and only the values read travel).
    """
    homes = {c.name.partition(":")[0]: c.variable.device for c in captures if c.host_homed}
    if not homes:
        return
    for node in graph_def.node:
        for raw in node.input:
            source = raw.lstrip("^").partition(":")[0]
            if raw.startswith("^") or source not in homes:
                continue
            if any(value.HasField("func") for value in node.attr.values()):
                raise CaptureError(
                    f"{node.op} {node.name!r} takes the host-homed variable {source!r} into a "
                    "function body (a loop, branch or call), where tfswap cannot fetch its "
                    "reads before use: TensorFlow would copy it in on every read, unplanned. "
                    "Create that variable on the device (outside tf.device(host)), or "
                    "unroll the loop.")
            node.device = local_device(homes[source])
            break


# Random ops whose stream is state inside the kernel instance (TensorFlow's
# legacy random ops, tf.random.uniform/normal/...): every function that holds
# one draws its own stream, from the start.
LEGACY_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2"})


def legacy_random_ops(captured: CapturedFunction) -> tuple[str, ...]:
    """Names of the step's legacy stateful random ops (library functions included).

    Example::

        legacy_random_ops(capture(cf))     # ('random_uniform/RandomUniform',)
    """
    gd = captured.graph_def
    nodes = list(gd.node) + [n for fn in gd.library.function for n in fn.node_def]
    return tuple(n.name for n in nodes if n.op in LEGACY_RANDOM_OPS)


def fingerprint(captured: CapturedFunction) -> str:
    """A hash of the captured graph's structure: node names, ops, inputs, argument shapes.

    Saved plans carry it, so a plan is never applied to another graph (another
    model, batch shape, or a TensorFlow that optimises the step differently).
    """
    digest = hashlib.sha256()
    for arg in captured.args:
        digest.update(f"{arg.name}|{arg.dtype.name}|{arg.shape}\n".encode())
    for node in sorted(captured.graph_def.node, key=lambda n: n.name):
        digest.update(f"{node.name}|{node.op}|{','.join(node.input)}\n".encode())
    return digest.hexdigest()[:16]


def warn_legacy_random(captured: CapturedFunction) -> None:
    """Say that legacy stateful random ops draw a stream of their own in a rewritten step."""
    import warnings

    found = legacy_random_ops(captured)
    if found:
        warnings.warn(
            f"this step uses {len(found)} legacy stateful random op(s) ({', '.join(found[:3])}"
            f"{' ...' if len(found) > 3 else ''}). Their random stream lives in the kernel of "
            "each function, so the optimized function draws its own stream from the start: its "
            "first call draws what the user's function drew on its first call, not what the "
            "user's function would draw next. For one shared stream use Keras layers (seed "
            "generators), tf.random.Generator or the tf.random.stateless_* ops.",
            RuntimeWarning, stacklevel=4)

