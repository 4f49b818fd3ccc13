"""Keras's steps as tfswap plans them, what :class:`tfswap.keras.SwapCallback`
installs them with: one step as a ConcreteFunction (:func:`step_function`), the
batch signature plans are kept under (:func:`batch_signature`), the model's
variables built first (:func:`build_for`), a ``MirroredStrategy``'s batch per
replica (:func:`per_replica`), the batches of one execution (:func:`batches`)
and the models the callback refuses (:func:`check_model`).

Example::

    cf = step_function(model, (x[:32], y[:32]))
    key = ("train", batch_signature((x[:32], y[:32])))
"""

from __future__ import annotations

import warnings

import keras
import tensorflow as tf
from tensorflow.python.util import nest

from tfswap.tf.capture import at_shapes
from tfswap.worker_plans import worker_count

KINDS = ("train", "test", "predict")
# The tf.distribute strategies whose steps the callback plans (a multi-worker
# one's per worker: tfswap.worker_plans).
SUPPORTED_STRATEGIES = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)


def require_tensorflow_backend() -> None:
    """Raise where Keras runs on another backend than TensorFlow."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"tfswap.keras needs Keras on the TensorFlow backend, this Keras uses "
            f"{keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow before importing keras.")


def batch_signature(data, spec=None) -> tuple:
    """The key plans are cached under: each tensor's place, shape, dtype and the
    shape Keras traces its step with (``spec``: the dataset's element spec, whose
    batch dimension is None when the last batch is smaller; None: the batch's
    own shapes).

    Raises TypeError naming the first leaf that is not a tensor or array.
    """
    leaves = nest.flatten_with_joined_string_paths(data)
    traced = [None] * len(leaves) if spec is None else [
        tuple(s.shape.as_list()) if s.shape.rank is not None else None
        for s in tf.nest.flatten(spec)]
    key = []
    for (path, leaf), shape in zip(leaves, traced):
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise TypeError(f"batch element {path or '<root>'} is a {type(leaf).__name__}, not a "
                            "tensor; tfswap plans steps over tensors only")
        key.append((path, tuple(leaf.shape), tf.as_dtype(leaf.dtype).name,
                    tuple(leaf.shape) if shape is None else shape))
    return tuple(key)


def _specs(data):
    return tf.nest.map_structure(
        lambda t: tf.TensorSpec(tuple(t.shape), tf.as_dtype(t.dtype)), data)


def element_spec(iterator):
    """The specs Keras's step is traced with when ``fit`` feeds it ``iterator``,
    or None where Keras traces the batches' own shapes."""
    if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
        spec = iterator.element_spec
        if all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec)):
            return spec
    return None


def build_for(model, data, kind: str = "train") -> None:
    """Create the model's (and for "train"/"test" the metrics' and optimizer's)
    variables for ``data`` if missing.

    Keras builds them while tracing its first step; a step tfswap captures
    must find them existing, so that they are captured, not created, by it.
    """
    if kind == "predict":  # no targets: build the layers only
        if not model.built:
            x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
            model(tf.nest.map_structure(lambda t: keras.KerasTensor(
                tuple(t.shape), keras.backend.standardize_dtype(t.dtype)), x))
        return
    # Keras's TF trainer builds this way itself under a distribution strategy.
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=data)


def per_replica(model, data):
    """The replicas' own batches, one structure per replica (this worker's, under a
    ``MultiWorkerMirroredStrategy``), where ``fit`` under a strategy feeds ``data``
    as distributed values; None where it feeds plain tensors."""
    if not any(isinstance(leaf, tf.distribute.DistributedValues)
               for leaf in tf.nest.flatten(data)):
        return None
    return tuple(model.distribute_strategy.experimental_local_results(data))


def step_function(model, data, kind: str = "train", spec=None, replicated: bool = False):
    """The ConcreteFunction of one Keras step for batches shaped like ``data``.

    ``kind``: "train" (``model.train_step``, which updates the weights, the
    optimizer and the metrics), "test" (``model.test_step``) or "predict"
    (``model.predict_step``).  ``data``: one batch as ``fit`` feeds it, e.g.
    ``(x, y)``.  ``spec``: the TensorSpecs Keras traces its step with, where
    they have unknown dimensions (``fit``'s dataset when its last batch is
    smaller: the batch dimension is None); the step is then traced as Keras
    traces it and returned as :func:`tfswap.tf.capture.at_shapes` of
    ``data``'s shapes, because a trace with static shapes is not bit for bit
    the same step (Grappler folds the batch size into constants).  This is
    what :class:`SwapCallback` hands to :func:`tfswap.optimize`; use it to
    measure the unmodified step.  ``replicated``: ``data`` is one batch per
    replica of the model's ``MirroredStrategy`` (or this worker's replicas of its
    ``MultiWorkerMirroredStrategy``: :func:`per_replica`), each replica steps on
    its own, and the outputs are reduced across replicas as Keras reduces them
    (:func:`reduce_outputs`)::

        cf = tfswap.keras.step_function(model, (x[:32], y[:32]))
        captured = tfswap.tf.capture.capture(cf)
        tfswap.tf.measure.measure(captured, captured.graph_def, [x[:32], y[:32]])
    """
    require_tensorflow_backend()
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    step = {"train": model.train_step, "test": model.test_step,
            "predict": model.predict_step}[kind]
    strategy = model.distribute_strategy

    build_for(model, data[0] if replicated else data, kind)

    def one_step(batch):
        if replicated:
            # The replica's id counts every worker's replicas; the batch holds this
            # worker's, in the same order.
            batch = strategy.experimental_distribute_values_from_function(
                lambda context: batch[context.replica_id_in_sync_group % len(batch)])
        outputs = strategy.run(step, args=(batch,))
        if strategy.num_replicas_in_sync > 1:   # as Keras's own step function
            outputs = reduce_outputs(outputs, strategy, kind)
        return outputs

    static = _specs(data)
    if spec is None or all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
        return tf.function(one_step, autograph=False).get_concrete_function(static)
    tf.nest.assert_same_structure(static, spec)
    traced = tf.nest.map_structure(lambda s, t: tf.TensorSpec(s.shape, t.dtype), spec, static)
    cf = tf.function(one_step, autograph=False).get_concrete_function(traced)
    return at_shapes(cf, [tuple(t.shape) for t in tf.nest.flatten(static)])


def reduce_outputs(outputs, strategy, kind: str):
    """A replicated step's outputs (``strategy.run``'s) reduced across the replicas
    as Keras reduces its own step's: the logs averaged over every replica, the
    predictions concatenated.  On several workers (``MultiWorkerMirroredStrategy``)
    the logs are averaged over every worker's replicas by an all-reduce in the
    step, as Keras means to: Keras 3.15's own step asks for that reduction along
    axis 0 of each log, which fails for a scalar (``reduce_per_replica``, with
    keras-team/keras#20585's failure in ``fit``'s first build)."""
    from keras.src.backend.tensorflow.trainer import reduce_per_replica

    if kind != "predict" and worker_count(strategy) > 1:
        return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), outputs)
    return reduce_per_replica(outputs, strategy,
                              reduction="concat" if kind == "predict" else "auto")


def batches(iterator, steps: int):
    """The batches of one execution: up to ``steps`` (``steps_per_execution``) of them."""
    if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
        for _ in range(steps):
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                return
            yield optional.get_value()
    else:  # train_on_batch-style Python iterables
        for _, data in zip(range(steps), iterator):
            yield data


def check_model(model, warned: set) -> None:
    """Raise where :class:`tfswap.keras.SwapCallback` cannot plan ``model``'s steps
    (a ``tf.distribute`` strategy other than :data:`SUPPORTED_STRATEGIES`,
    ``run_eagerly``);
    warn once (``warned`` remembers) that a model compiled for XLA runs its
    planned steps without it."""
    strategy = model._distribute_strategy or (tf.distribute.get_strategy()
                                              if tf.distribute.has_strategy() else None)
    if strategy is not None and not isinstance(strategy, SUPPORTED_STRATEGIES):
        raise RuntimeError(
            "tfswap.keras.SwapCallback plans each worker's replicas: of the tf.distribute "
            "strategies it supports MirroredStrategy and MultiWorkerMirroredStrategy, not "
            f"{type(strategy).__name__}. Fit under one of those, or outside any strategy.")
    if getattr(model, "jit_compile", False) and "jit_compile" not in warned:
        # Keras turns XLA on by default where a GPU exists ("auto"); XLA would
        # lay out memory itself, so the planned step runs as a TF graph.
        warned.add("jit_compile")
        warnings.warn("tfswap.keras.SwapCallback: the model is compiled with jit_compile; "
                      "the planned steps run without XLA (compile with jit_compile=False "
                      "to compare like with like)", stacklevel=3)
    if model.run_eagerly:
        raise RuntimeError("tfswap.keras.SwapCallback plans graph steps; compile the model "
                           "with run_eagerly=False.")


def live_variables(model) -> set:
    """The ids of the variables ``model`` uses now (its weights, metrics and
    optimizer): a plan bound to others is stale (:meth:`PlanStore.forget_stale`).
    Under a ``tf.distribute`` strategy a Keras variable holds a distributed
    variable whose components (one per replica) are what a step captures, so
    those count too."""
    state = list(model.variables) + list(model.metrics_variables)
    if model.optimizer is not None:
        state += list(model.optimizer.variables)
    live = set()
    for v in state:
        value = getattr(v, "_value", v)
        live.add(id(value))
        if isinstance(value, tf.distribute.DistributedValues):
            live.update(id(component) for component in value.values)
    return live


def without_xla(model, saved: dict) -> None:
    """After a plan moved ``model``'s variables to host memory: Keras's own
    functions follow them (:func:`tfswap.tf.homes.follow` re-points every traced
    function) and keep working, except XLA-compiled ones, since XLA cannot read
    a variable in host memory.  So a model compiled for XLA runs without it
    from here on, after a warning: its functions are traced again, ``saved``
    (kind -> Keras's function where the callback installed its own) gets the
    new ones, and the callback's stay installed."""
    if not getattr(model, "jit_compile", False):
        return
    warnings.warn("tfswap.keras.SwapCallback: the model's variables moved to host memory, "
                  "where XLA cannot read them; the model's own functions (evaluate, predict, "
                  "fit) now run without XLA (model.jit_compile is set to False)", stacklevel=2)
    model.jit_compile = False
    for kind in KINDS:
        ours = getattr(model, f"{kind}_function") if kind in saved else None
        setattr(model, f"{kind}_function", None)
        if kind in saved:
            getattr(model, f"make_{kind}_function")(force=True)
            saved[kind] = getattr(model, f"{kind}_function")
            setattr(model, f"{kind}_function", ours)


def shapes_text(signature) -> str:
    """A batch signature's shapes and dtypes, as messages name a batch."""
    return ", ".join(f"{list(shape)} {dtype}" for _, shape, dtype, _ in signature)


__all__ = ["KINDS", "SUPPORTED_STRATEGIES", "batch_signature", "batches", "build_for",
           "check_model", "element_spec", "live_variables", "per_replica", "reduce_outputs",
           "require_tensorflow_backend", "shapes_text", "step_function", "without_xla"]
