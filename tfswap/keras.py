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

from tfswap import api, worker_plans
from tfswap.keras_steps import (KINDS, batch_signature, batches, build_for, check_model,
                                element_spec, live_variables, per_replica,
                                require_tensorflow_backend, shapes_text, step_function,
                                without_xla)
from tfswap.options import Options
from tfswap.plan_store import (NEW_SHAPES, USER_CACHE, PlanStore, default_plan_path,
                               plan_directory)


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
    None: plans are not saved.  ``background``: True (what the default, None,
    means except on several workers, below) starts each step on a first plan
    made in seconds while the full search
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
    own argument of the planned step, and each device (the strategy's: pass
    ``host`` alone, or nothing) is planned for the budget (:func:`tfswap.optimize`
    on a replicated step); such plans are not saved to ``plan_path``.  Under a
    ``MultiWorkerMirroredStrategy`` over several workers
    (:mod:`tfswap.worker_plans`) each worker plans its own step from its shapes
    and does not verify it (``profile="analytic"``, ``verify_rounds=0``: the
    step's all-reduce waits for the other workers, so it cannot run alone; the
    budget is held by the memory model alone), before the step's first batch
    (no background search: every worker adopts its plan at the same step), and
    saves no plan; a ``profile``, ``verify_rounds`` or ``background=True`` asking
    otherwise is refused at ``fit`` with
    :class:`tfswap.worker_plans.WorkerSettingsError`; ``predict`` runs Keras's own
    step there, after a warning (its gathered outputs have shapes known only when
    it runs, which an analytic profile cannot count).  ``notes`` says how the
    callback plans under the model's strategy, and :meth:`report` lists each
    plan and whether it was verified.  Not supported (a clear error at
    ``fit``): other ``tf.distribute`` strategies and ``run_eagerly=True``.  With
    ``jit_compile=True`` (Keras's "auto" where a GPU exists) the planned steps
    run without XLA, after a warning.

    Example::

        cb = tfswap.keras.SwapCallback(memory_budget="6GiB", generations=20, seed=0,
                                       plan_path="plans/")
        model.fit(ds, epochs=3, callbacks=[cb])
        model.evaluate(test_ds, callbacks=[cb])     # plans the test step too
    """

    def __init__(self, memory_budget=None, *, options: Options | None = None,
                 plan_path=USER_CACHE, verbose: int = 1, new_shapes: str = "plan",
                 inference: bool = True, background: bool | None = None, **settings):
        super().__init__()
        require_tensorflow_backend()
        # The plans' settings: tfswap.Options, checked there (the same object
        # tfswap.optimize takes); on several workers, a worker's (_plan_here).
        self.options = self._requested = api.options_of(memory_budget, options, settings)
        self._explicit = worker_plans.explicit_settings(options, settings)
        self._background = background
        # The plans, per step kind and batch signature, and their files; it checks
        # verbose, new_shapes and background.
        self.store = PlanStore(plan_directory(plan_path), self.options, verbose=verbose,
                               new_shapes=new_shapes,
                               background=True if background is None else background)
        self.inference = inference
        # How the plans are made under the model's strategy (several workers: say so).
        self.notes: tuple[str, ...] = ()
        self._workers = 1
        self._saved: dict = {}    # kind -> Keras's function while ours is installed
        self._warned: set = set()

    @property
    def memory_budget(self):
        """The plans' budget, as given (``options.memory_budget``)."""
        return self.options.memory_budget

    @property
    def plan_path(self) -> Path | None:
        """The directory plans are saved to and loaded from (None: no files)."""
        return self.store.directory

    @property
    def functions(self) -> dict:
        """(kind, signature) -> the function that ran (see the class)."""
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

    def report(self) -> str:
        """The callback's notes, then each step it planned: its plan, the budget, the
        predicted peak and whether a measurement verified it.

        Example::

            model.fit(ds, epochs=2, callbacks=[cb])
            print(cb.report())
        """
        lines = [f"tfswap.keras.SwapCallback: {note}" for note in self.notes]
        for (kind, signature), fast in self.functions.items():
            what = f"{kind} step for batches shaped {shapes_text(signature)}"
            if fast is None:
                lines.append(f"{what}: Keras's own step (new_shapes='original')")
                continue
            plans = (fast.plan,) + tuple(fast.replica_plans)
            swaps = sum(len(p.swaps) for p in plans)
            peak = max(p.prediction.peak_bytes or 0 for p in plans)
            verified = (f"verified: measured peak {fast.measured_peak_bytes} B"
                        if fast.measured_peak_bytes is not None else
                        "no swaps needed" if swaps == 0 else
                        "not verified: its peak is the memory model's prediction")
            lines.append(f"{what}: plan {fast.plan.id} ({fast.plan.planner}), {swaps} swap(s), "
                         f"predicted peak {peak} B for a budget of {fast.budget_bytes} B; "
                         f"{verified}")
        return "\n".join(lines)

    def _install(self, kind: str) -> None:
        model = self.model
        check_model(model, self._warned)
        self._plan_here(model.distribute_strategy)
        if kind in worker_plans.LEFT_TO_KERAS and self._workers > 1:
            if kind not in self._warned:
                self._warned.add(kind)
                why = worker_plans.LEFT_TO_KERAS[kind]
                warnings.warn(f"tfswap.keras.SwapCallback: {why}", stacklevel=3)
            return
        self.store.name = model.name
        self.store.forget_stale(live_variables(model))
        attr = f"{kind}_function"
        self._saved[kind] = getattr(model, attr)
        setattr(model, attr, self._predict_runner() if kind == "predict" else self._runner(kind))

    def _plan_here(self, strategy) -> None:
        """The options and mode of the plans under ``strategy``: on several workers
        a worker's (:func:`tfswap.worker_plans.worker_options`: from shapes, not
        verified, in the foreground), else the caller's.  The same on every worker,
        decided before any step runs."""
        workers = worker_plans.worker_count(strategy)
        if workers > 1:
            options = worker_plans.worker_options(self._requested, self._explicit, workers)
            if self._background:
                raise worker_plans.background_error(workers)
            background, notes = False, worker_plans.worker_notes(strategy, workers)
        else:
            options, background, notes = self._requested, self._background is not False, ()
        if notes and notes != self.notes and self.store.verbose >= 1:
            for note in notes:
                print(f"tfswap: {note}")
        self._workers, self.notes = workers, notes
        self.options = self.store.options = options
        self.store.background = background

    def _restore(self, kind: str) -> None:
        if kind in self._saved:
            setattr(self.model, f"{kind}_function", self._saved.pop(kind))

    # -- What fit / evaluate / predict call instead of Keras's functions.

    def _runner(self, kind: str):
        def run(iterator):
            outputs = None
            spec = element_spec(iterator)
            for data in batches(iterator, self.model.steps_per_execution):
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

    def _step(self, kind: str, data, spec=None):
        original, replicas = data, per_replica(self.model, data)
        if replicas is not None:   # fit under a MirroredStrategy: a batch per replica
            data, spec = replicas, None
        try:
            key = (kind, batch_signature(data, spec))
        except TypeError as err:
            return self._keras_step(kind, original, f"{err}; Keras's own step runs it")

        def trace():
            return (step_function(self.model, data, kind, spec, replicas is not None),
                    [np.asarray(leaf) for leaf in tf.nest.flatten(data)])

        # A replicated step's plans (one per replica) are not saved to files yet, nor
        # a worker's of several (load_plan would capture it as a step that can run alone).
        fast = self.store.function(key, trace, saved=replicas is None and self._workers == 1,
                                   what=f"{kind} step for batches shaped {shapes_text(key[1])}",
                                   after_move=lambda: without_xla(self.model, self._saved),
                                   live=lambda: live_variables(self.model))
        if fast is None:
            return self._keras_step(
                kind, original, f"a {kind} batch shaped {shapes_text(key[1])} differs from the "
                "planned one; Keras's unmodified step runs it (new_shapes='original'), so it "
                "is not held to the memory budget")
        return fast(data)

    def _keras_step(self, kind: str, data, why: str):
        if (kind, why) not in self._warned:
            self._warned.add((kind, why))
            warnings.warn(f"tfswap.keras.SwapCallback: {why}", stacklevel=3)
        # Keras's own function, fed one batch the way train_on_batch feeds it.
        keras_function = self._saved[kind]
        return keras_function([data]) if kind == "predict" else keras_function(iter([data]))


__all__ = ["KINDS", "NEW_SHAPES", "SwapCallback", "USER_CACHE", "batch_signature", "build_for",
           "default_plan_path", "per_replica", "step_function"]
