"""Swapping for Keras: one callback, ``model.fit(..., callbacks=[SwapCallback(...)])``.

Keras 3 on the TensorFlow backend builds ``model.train_function`` (and the
test and predict functions) before it calls the callbacks' ``on_*_begin``.
:class:`SwapCallback` swaps that function for one that runs, per batch, a
step optimised by :func:`tfswap.optimize`, and puts Keras's own back at the
matching ``on_*_end``.  The optimised step is Keras's own ``train_step`` (or
``test_step`` / ``predict_step``) traced with the specs Keras traces it with
(see :func:`step_function`), planned for the batch's exact shapes and
bound to the model's live variables, so weights, optimizer state and metric
state stay the user's objects: logs, ``get_weights``, ``save`` and other
callbacks see what they would see without the callback.

Plans are made lazily, on the first batch of each input signature (shapes
and dtypes), because only then is the batch ``fit`` feeds known; a last,
smaller batch gets a plan of its own (or, with ``new_shapes="original"``,
runs Keras's step after one warning).  By default (``background=True``) each
signature starts on a first plan made in seconds and verified, and the full
search goes on in a background thread; its plan, verified, takes over at a
step boundary (:mod:`tfswap.anytime`).  Plans are kept under the user's
cache directory (``$XDG_CACHE_HOME/tfswap``, else ``~/.cache/tfswap``), so
the next ``fit`` of the same model and budget starts on the best plan found.

Example::

    import tfswap
    from tfswap.tf import emulate
    emulate.setup()                     # no GPU here: CPU:0 plays the device
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=2,
              callbacks=[tfswap.keras.SwapCallback(memory_budget="12MiB", search_time=30)])
"""

from __future__ import annotations

import warnings
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest

import tfswap
from tfswap import api
from tfswap.options import Options
from tfswap.plan_store import USER_CACHE, PlanStore, default_plan_path, plan_directory

KINDS = ("train", "test", "predict")
NEW_SHAPES = ("plan", "original")


def _require_tensorflow_backend() -> None:
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


def _element_spec(iterator):
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
    """The replicas' own batches, one structure per replica, where ``fit`` under a
    ``MirroredStrategy`` feeds ``data`` as distributed values; None where it
    feeds plain tensors."""
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
    replica of the model's ``MirroredStrategy`` (:func:`per_replica`), each
    replica steps on its own, and the outputs are reduced across replicas as
    Keras reduces them::

        cf = tfswap.keras.step_function(model, (x[:32], y[:32]))
        captured = tfswap.tf.capture.capture(cf)
        tfswap.tf.measure.measure(captured, captured.graph_def, [x[:32], y[:32]])
    """
    _require_tensorflow_backend()
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    step = {"train": model.train_step, "test": model.test_step,
            "predict": model.predict_step}[kind]
    strategy = model.distribute_strategy

    build_for(model, data[0] if replicated else data, kind)

    def one_step(batch):
        if replicated:
            batch = strategy.experimental_distribute_values_from_function(
                lambda context: batch[context.replica_id_in_sync_group])
        outputs = strategy.run(step, args=(batch,))
        if strategy.num_replicas_in_sync > 1:   # as Keras's own step function
            from keras.src.backend.tensorflow.trainer import reduce_per_replica

            outputs = reduce_per_replica(outputs, strategy,
                                         reduction="concat" if kind == "predict" else "auto")
        return outputs

    static = _specs(data)
    if spec is None or all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
        return tf.function(one_step, autograph=False).get_concrete_function(static)
    tf.nest.assert_same_structure(static, spec)
    from tfswap.tf.capture import at_shapes

    traced = tf.nest.map_structure(lambda s, t: tf.TensorSpec(s.shape, t.dtype), spec, static)
    cf = tf.function(one_step, autograph=False).get_concrete_function(traced)
    return at_shapes(cf, [tuple(t.shape) for t in tf.nest.flatten(static)])


class SwapCallback(keras.callbacks.Callback):
    """Run ``fit`` (and ``evaluate`` / ``predict``) on steps that fit ``memory_budget``.

    ``memory_budget``: device bytes (int), a string such as "12GiB", or a
    fraction of the device's memory.  Every setting of the plans is a field
    of :class:`tfswap.Options`, given as a keyword (``search_time=30``,
    ``generations=20``, ``parameters="host"``, ...) or as ``options``, the
    object :func:`tfswap.optimize` takes (keywords override it); each plan is
    ``tfswap.optimize(step, options=callback.options, ...)``.
    Where a plan moves the model's variables to host memory (``parameters``
    "auto" or "host"), they stay the model's: ``get_weights``, ``save`` and
    checkpoints see every update, and Keras's own functions (and any other
    ``tf.function`` traced before) follow them to the host and keep working.
    ``plan_path``: a directory; each plan is saved there under a name made
    of the model's name, the step kind and the batch signature, and loaded
    from there next time if it was made for the same graph and budget (else
    re-planned and saved).  Default :data:`USER_CACHE`: :func:`default_plan_path`;
    None: plans are not saved.  ``background``: True (default) starts each
    step on a first plan made in seconds while the full search
    (``search_time`` or ``generations``) runs in a background thread, and
    switches to its plan at a step boundary where it is faster (plans are
    saved once their search has ended); False searches before the first
    step.  ``verbose``: 1 prints each plan's summary when it is made or
    loaded and each switch, 0 prints nothing.  ``new_shapes``: what a batch of a shape not
    seen before (a smaller last batch) gets: "plan" (a plan of its own,
    cached) or "original" (Keras's unmodified step, with one warning;
    only the first signature of each kind is planned).  ``inference``:
    also plan ``evaluate``/validation and ``predict`` steps when the
    callback is passed there (True), or leave them to Keras (False).

    After use, ``functions`` maps (kind, signature) to the
    :class:`tfswap.anytime.AnytimeFunction` that ran (its ``plans``: which plan
    ran for which of its steps; a :class:`tfswap.OptimizedFunction` where
    the plan was loaded from a file or ``background=False``; None where Keras's
    step ran).

    One log can differ from Keras's: for a model with several outputs, Keras
    weights each output's ``<name>_loss`` log by the batch size it reads
    when it traces its step, and the step it retraces for a smaller last
    batch reads an unknown size (weight 1).  Planned steps have static
    shapes, so every batch is weighted by its size.  The total ``loss``,
    the metrics and the weights are unaffected.

    Under a ``tf.distribute.MirroredStrategy`` each replica's batch is its
    own argument of the planned step, and each device is planned for the
    budget (:func:`tfswap.optimize` on a replicated step); such plans are not
    saved to ``plan_path``.  Not supported (a clear error at ``fit``): other
    ``tf.distribute`` strategies and ``run_eagerly=True``.  With ``jit_compile=True`` (Keras's "auto"
    where a GPU exists) the planned steps run without XLA, after a warning.

    Example::

        cb = tfswap.keras.SwapCallback(memory_budget="6GiB", generations=20, seed=0,
                                       plan_path="plans/")
        model.fit(ds, epochs=3, callbacks=[cb])
        model.evaluate(test_ds, callbacks=[cb])     # plans the test step too
    """

    def __init__(self, memory_budget=None, *, options: Options | None = None,
                 plan_path=USER_CACHE, verbose: int = 1, new_shapes: str = "plan",
                 inference: bool = True, background: bool = True, **settings):
        super().__init__()
        _require_tensorflow_backend()
        # The plans' settings: tfswap.Options, checked there (the same object
        # tfswap.optimize takes).
        self.options = api.options_of(memory_budget, options, settings)
        if new_shapes not in NEW_SHAPES:
            raise ValueError(f"new_shapes must be one of {NEW_SHAPES}, got {new_shapes!r}")
        if isinstance(verbose, bool) or not isinstance(verbose, int) or verbose < 0:
            raise ValueError(f"verbose must be an int >= 0, got {verbose!r}")
        if not isinstance(background, bool):
            raise ValueError(f"background must be True or False, got {background!r}")
        # The plans, per step kind and batch signature, and their files.
        self.store = PlanStore(plan_directory(plan_path), self.options, verbose=verbose)
        self.verbose = verbose
        self.new_shapes = new_shapes
        self.inference = inference
        self.background = background
        self._saved: dict = {}
        self._warned: set = set()

    @property
    def memory_budget(self):
        return self.options.memory_budget

    @property
    def plan_path(self) -> Path | None:
        return self.store.directory

    @property
    def functions(self) -> dict:
        return self.store.functions

    # -- Keras hooks: put our function in at begin, Keras's back at end.

    def on_train_begin(self, logs=None):
        self._install("train")

    def on_train_end(self, logs=None):
        self._restore("train")

    def on_test_begin(self, logs=None):
        if self.inference:
            self._install("test")

    def on_test_end(self, logs=None):
        self._restore("test")

    def on_predict_begin(self, logs=None):
        if self.inference:
            self._install("predict")

    def on_predict_end(self, logs=None):
        self._restore("predict")

    def _install(self, kind: str) -> None:
        model = self.model
        strategy = model._distribute_strategy or (tf.distribute.get_strategy()
                                                  if tf.distribute.has_strategy() else None)
        if strategy is not None and not isinstance(strategy, tf.distribute.MirroredStrategy):
            raise RuntimeError(
                "tfswap.keras.SwapCallback plans one machine's replicas: of the tf.distribute "
                f"strategies it supports MirroredStrategy, not {type(strategy).__name__}. Fit "
                "under a MirroredStrategy, or outside any strategy.")
        if getattr(model, "jit_compile", False) and "jit_compile" not in self._warned:
            # Keras turns XLA on by default where a GPU exists ("auto"); XLA would
            # lay out memory itself, so the planned step runs as a TF graph.
            self._warned.add("jit_compile")
            warnings.warn("tfswap.keras.SwapCallback: the model is compiled with jit_compile; "
                          "the planned steps run without XLA (compile with jit_compile=False "
                          "to compare like with like)", stacklevel=2)
        if model.run_eagerly:
            raise RuntimeError("tfswap.keras.SwapCallback plans graph steps; compile the model "
                               "with run_eagerly=False.")
        self._forget_stale_plans()
        attr = f"{kind}_function"
        self._saved[kind] = getattr(model, attr)
        runner = self._predict_runner() if kind == "predict" else self._runner(kind)
        setattr(model, attr, runner)

    def _restore(self, kind: str) -> None:
        if kind in self._saved:
            setattr(self.model, f"{kind}_function", self._saved.pop(kind))

    def _forget_stale_plans(self) -> None:
        """Drop steps bound to variables the model no longer uses.

        A plan runs on the variables it captured; after ``compile`` again (a
        new optimizer, new metrics) or with another model, running it would
        update the wrong objects, so those steps are planned again.
        """
        model = self.model
        state = list(model.variables) + list(model.metrics_variables)
        if model.optimizer is not None:
            state += list(model.optimizer.variables)
        live = {id(getattr(v, "_value", v)) for v in state}
        stale = [key for key, fast in self.functions.items() if fast is not None and any(
            id(v) not in live for v in fast.captured.variables)]
        if stale and self.verbose >= 1:
            print(f"tfswap: {len(stale)} planned step(s) captured variables this model no "
                  "longer uses (compiled again, or another model); planning them again")
        if stale:  # which signatures Keras's step ran was decided for the old model too
            self.store.forget(stale + [key for key, fast in self.functions.items()
                                       if fast is None])

    # -- What fit / evaluate / predict call instead of Keras's functions.

    def _runner(self, kind: str):
        def run(iterator):
            outputs = None
            spec = _element_spec(iterator)
            for data in self._batches(iterator):
                outputs = self._step(kind, data, spec)
            if outputs is None:
                raise StopIteration
            return outputs

        return self._restoring(kind, run)

    def _predict_runner(self):
        def run(data):
            # Keras hands predict a list of one-step batches, each a tuple (x,).
            outputs = [self._step("predict", batch) for batch in data]
            if len(outputs) == 1:
                return outputs[0]
            return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *outputs)

        return self._restoring("predict", run)

    def _restoring(self, kind: str, run):
        """``run``, putting Keras's function back if it fails: Keras calls no
        ``on_*_end`` then, and would keep calling ours in later fits without us."""
        def function(arg):
            try:
                return run(arg)
            except StopIteration:
                raise
            except BaseException:
                self._restore(kind)
                raise

        return function

    def _batches(self, iterator):
        """The batches of one execution: up to ``steps_per_execution`` of them."""
        steps = self.model.steps_per_execution
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            for _ in range(steps):
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    return
                yield optional.get_value()
        else:  # train_on_batch-style Python iterables
            for _, data in zip(range(steps), iterator):
                yield data

    def _step(self, kind: str, data, spec=None):
        original, replicas = data, per_replica(self.model, data)
        if replicas is not None:   # fit under a MirroredStrategy: a batch per replica
            data, spec = replicas, None
        try:
            key = (kind, batch_signature(data, spec))
        except TypeError as err:
            return self._keras_step(kind, original, f"{err}; Keras's own step runs it")
        if key not in self.functions:
            planned = [k for k in self.functions if k[0] == kind and self.functions[k]]
            if planned and self.new_shapes == "original":
                self.functions[key] = None
            else:
                self.functions[key] = self._prepare(kind, data, key, spec,
                                                    replicas is not None)
        fast = self.functions[key]
        if fast is None:
            return self._keras_step(
                kind, original, f"a {kind} batch shaped {_shapes(key[1])} differs from the planned "
                f"one; Keras's unmodified step runs it (new_shapes='original'), so it is not "
                f"held to the memory budget")
        return fast(data)

    def _keras_step(self, kind: str, data, why: str):
        if (kind, why) not in self._warned:
            self._warned.add((kind, why))
            warnings.warn(f"tfswap.keras.SwapCallback: {why}", stacklevel=3)
        # Keras's own function, fed one batch the way train_on_batch feeds it.
        keras_function = self._saved[kind]
        return keras_function([data]) if kind == "predict" else keras_function(iter([data]))

    # -- Planning.

    def _prepare(self, kind: str, data, key, spec=None, replicated: bool = False):
        cf = step_function(self.model, data, kind, spec, replicated)
        inputs = [np.asarray(leaf) for leaf in tf.nest.flatten(data)]
        self.store.name = self.model.name
        # A replicated step's plans (one per replica) are not saved to files yet.
        fast, path, _ = self.store.plan(kind, key, cf, inputs, self.background,
                                        saved=not replicated)
        if fast.relocation is not None:   # the plans made before the move no longer hold
            del self.functions[key]
            self._after_move()
            self.functions[key] = fast
        what = f"{kind} step for batches shaped {_shapes(key[1])}"
        if self.verbose >= 1:
            print(f"tfswap: {what}" + (f" (plan file {path})" if path is not None else ""))
            print(fast.report())
            if isinstance(fast, tfswap.AnytimeFunction):
                fast.add_switch_callback(lambda old, new: print(
                    f"tfswap: {what}: plan {new.plan.id} from the background search takes over "
                    f"from {old.plan.id} (predicted step "
                    f"{new.plan.prediction.step_time_s * 1e3:.3f} ms, was "
                    f"{old.plan.prediction.step_time_s * 1e3:.3f} ms)"))
        return fast

    def _after_move(self) -> None:
        """The model's variables moved to host memory.  Keras's own functions
        follow them (:func:`tfswap.tf.homes.follow` re-points every traced
        function), so they keep working unchanged, except XLA-compiled ones: XLA
        cannot read a variable in host memory, so the model runs without XLA
        from here on (its functions are traced again).  The steps planned before
        for other signatures were planned with the variables on the device:
        their plans no longer hold (the reads now come from the host,
        unplanned), and calling one raises
        :class:`tfswap.tf.homes.MovedVariablesError`, so each is planned again
        when next used."""
        model = self.model
        if getattr(model, "jit_compile", False):
            warnings.warn("tfswap.keras.SwapCallback: the model's variables moved to host "
                          "memory, where XLA cannot read them; the model's own functions "
                          "(evaluate, predict, fit) now run without XLA (model.jit_compile "
                          "is set to False)", stacklevel=2)
            model.jit_compile = False
            for kind in KINDS:
                ours = getattr(model, f"{kind}_function") if kind in self._saved else None
                setattr(model, f"{kind}_function", None)
                if kind in self._saved:   # Keras's function, the one our runner falls back to
                    getattr(model, f"make_{kind}_function")(force=True)
                    self._saved[kind] = getattr(model, f"{kind}_function")
                    setattr(model, f"{kind}_function", ours)
        # Their plans were for the variables on the device.
        self.store.forget([key for key, fast in self.functions.items() if fast is not None])


def _shapes(signature) -> str:
    return ", ".join(f"{list(shape)} {dtype}" for _, shape, dtype, _ in signature)


__all__ = ["SwapCallback", "USER_CACHE", "batch_signature", "build_for", "default_plan_path",
           "per_replica", "step_function"]
