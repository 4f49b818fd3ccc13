"""A rewritten GraphDef as a callable bound to the user's live variables.

The GraphDef is imported inside ``tf.compat.v1.wrap_function`` with every
captured-variable placeholder mapped to the live variable's handle, so the
callable reads and updates the user's own variables (DESIGN.md: editing a
ConcreteFunction's graph in place does not change what runs).

Grappler would undo parts of a rewrite (the dependency optimizer drops the
schedule's control edges, the memory optimizer adds swaps of its own, other
passes fold or bypass scheduled ops), so each call runs with a
``ConfigProto`` that turns it off -- for this function only, through the
per-call function options, never process-wide.

Example::

    fn = bind(captured, rewritten.graph_def)
    outputs = fn(x, y)             # same structure as the original function's
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context
from tensorflow.python.util import nest

from tfswap.tf.capture import CapturedFunction

_call_lock = threading.Lock()


def grappler_config() -> config_pb2.ConfigProto:
    """A ConfigProto under which Grappler leaves a tfswap rewrite exactly as planned.

    Tried and rejected (TF 2.21): Grappler on with only the memory and
    dependency optimizers off.  Its other passes still bypass or fold ops of
    the control chain, so large ops ran out of the planned order and the
    measured peak drifted from plan to plan.  With the meta optimizer off the
    executed order is the planned one; what Grappler would have fused or
    folded is already in the graph, because capture plans on Grappler's
    output (:mod:`tfswap.tf.grappler`).
    """
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.disable_meta_optimizer = True
    rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    return config


@contextlib.contextmanager
def function_config(config: config_pb2.ConfigProto):
    """Run tf.function calls in this block under ``config`` (this thread's calls only)."""
    ctx = context.context()
    with _call_lock:
        previous = ctx.function_call_options
        ctx.function_call_options = context.FunctionCallOptions(config_proto=config)
        try:
            yield
        finally:
            ctx.function_call_options = previous


class BoundFunction:
    """A GraphDef that runs like the original ConcreteFunction, on its live variables."""

    def __init__(self, captured: CapturedFunction, graph_def, config=None, memory_scope=None):
        self.captured = captured
        self.graph_def = graph_def
        self.config = config if config is not None else grappler_config()
        # A zero-argument callable giving a context manager each call runs in:
        # the budget arena's binding of the plan's pool (tfswap.ops.allocator).
        self.memory_scope = memory_scope
        specs = [tf.TensorSpec(a.shape, a.dtype, name=a.name.partition(":")[0])
                 for a in captured.args]

        # Grappler may have pruned the placeholder of an unused argument or capture.
        present = {node.name for node in graph_def.node}

        def body(*args):
            graph = tf.compat.v1.get_default_graph()
            input_map = {a.name: t for a, t in zip(captured.args, args)
                         if a.name.partition(":")[0] in present}
            for cap in captured.captures:
                if cap.name.partition(":")[0] in present:
                    input_map[cap.name] = graph.capture(cap.value)
            return tf.graph_util.import_graph_def(
                graph_def, input_map=input_map, return_elements=list(captured.fetches),
                name="")

        self._wrapped = tf.compat.v1.wrap_function(body, specs)

    @property
    def feeds(self) -> tuple[str, ...]:
        return self.captured.feeds

    @property
    def fetches(self) -> tuple[str, ...]:
        return self.captured.fetches

    def _flat_args(self, args, kwargs):
        sig_args, sig_kwargs = self.captured.input_signature
        try:
            nest.assert_same_structure(tuple(sig_args), tuple(args), check_types=False)
            nest.assert_same_structure(dict(sig_kwargs), dict(kwargs), check_types=False)
        except (ValueError, TypeError) as err:
            raise TypeError(f"{self.captured.name} expects arguments shaped like "
                            f"{sig_args} {sig_kwargs or ''}: {err}") from None
        return nest.flatten(tuple(args)) + nest.flatten(dict(kwargs))

    def __call__(self, *args, **kwargs):
        flat = self._flat_args(args, kwargs)
        memory = self.memory_scope() if self.memory_scope is not None else \
            contextlib.nullcontext()
        # The function call returns once every kernel was issued, so every
        # allocation of the step happens inside the scope.
        with function_config(self.config), memory:
            outputs = self._wrapped(*flat)
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]
        leaves = iter(outputs)
        return nest.map_structure(
            lambda t: next(leaves) if isinstance(t, tf.Tensor) else t,
            self.captured.structured_outputs)


def bind(captured: CapturedFunction, graph_def, config=None,
         memory_scope=None) -> BoundFunction:
    """Make ``graph_def`` (the captured graph, rewritten or not) callable;
    ``memory_scope`` (optional): a zero-argument callable whose context manager
    each call runs in."""
    return BoundFunction(captured, graph_def, config, memory_scope)
