"""How each worker of a ``MultiWorkerMirroredStrategy`` plans its steps: what
:class:`tfswap.keras.SwapCallback` plans with when its model trains on several workers.

A multi-worker step's collectives (its gradient all-reduce) have members on the
other workers, so the step runs only where every worker runs it: tfswap cannot
run it alone in a local session to trace its profile or to measure a plan
(:func:`tfswap.tf.capture.capture` refuses it otherwise; the all-reduce would
wait for ever).  Each worker therefore plans its own step from its shapes
(``profile="analytic"``) and trusts the memory model (``verify_rounds=0``): the
budget is held by the memory model alone.  And it plans before the step's
first batch, in the caller's thread, never in the background: a background
search would end at a different step on each worker, each then switching
plans at its own step.  Planned in the foreground, every worker adopts its
plan at the same step (the first batch of each step signature).

:func:`worker_count` says whether a strategy spans several workers;
:func:`worker_options` turns the caller's :class:`tfswap.Options` into a
worker's, refusing with :class:`WorkerSettingsError` the settings that would
run the step here (a trace profile, verification); :func:`worker_notes` is
what the callback reports.

Example::

    workers = worker_count(model.distribute_strategy)          # 2 under TF_CONFIG's cluster
    options = worker_options(Options("12MiB"), explicit=set(), workers=workers)
    options.profile, options.verify_rounds                       # ('analytic', 0)
"""

from __future__ import annotations

from dataclasses import fields

import tensorflow as tf

from tfswap.options import Options

PROFILE = "analytic"    # a worker's steps are planned from their shapes
VERIFY_ROUNDS = 0       # and not measured: they cannot run alone
# The profiles a caller may leave to tfswap under several workers ("auto": choose).
ALLOWED_PROFILES = ("auto", PROFILE)


# Keras steps the callback leaves to Keras on several workers, and why.
LEFT_TO_KERAS = {
    "predict": "predict under a MultiWorkerMirroredStrategy over several workers runs Keras's "
               "own step, not held to the memory budget: it gathers every worker's outputs into "
               "tensors whose shapes are known only when it runs, which a plan from the step's "
               "shapes (the analytic profile) cannot count",
}


class WorkerSettingsError(ValueError):
    """A setting asks to run a multi-worker step alone (to profile or verify it),
    or to switch plans in the background; the message says what to pass instead."""


def worker_count(strategy) -> int:
    """The workers ``strategy`` trains on: the chief and worker tasks of a
    ``MultiWorkerMirroredStrategy``'s cluster (``TF_CONFIG``), else 1 (no
    strategy, a ``MirroredStrategy``, a ``MultiWorkerMirroredStrategy`` on one
    worker)."""
    if strategy is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 1
    spec = strategy.cluster_resolver.cluster_spec()
    return max(1, sum(spec.num_tasks(job) for job in spec.jobs if job in ("chief", "worker")))


def task_of(strategy) -> str:
    """This worker's task, as ``"worker 1"`` (``TF_CONFIG``'s type and index)."""
    resolver = strategy.cluster_resolver
    return f"{resolver.task_type} {resolver.task_id}"


def explicit_settings(options: Options | None, settings: dict) -> frozenset[str]:
    """The settings the caller chose: those given as keywords and, of an
    ``options`` object, the fields that differ from :class:`Options`'s
    defaults (a default value given in an ``Options`` cannot be told from
    one left unset)."""
    chosen = set(settings)
    if options is not None:
        defaults = Options(options.memory_budget)
        chosen |= {f.name for f in fields(Options) if f.name != "memory_budget"
                   and _differs(getattr(options, f.name), getattr(defaults, f.name))}
    return frozenset(chosen)


def _differs(a, b) -> bool:
    try:
        return bool(a != b)
    except (TypeError, ValueError):   # e.g. arrays in inputs
        return True


def worker_options(options: Options, explicit, workers: int) -> Options:
    """``options`` as one of ``workers`` workers plans with them: ``profile``
    "analytic" and ``verify_rounds`` 0.  Raises :class:`WorkerSettingsError` where
    ``explicit`` (:func:`explicit_settings`) names a setting that would run the
    step alone: a ``profile`` other than "auto" or "analytic" (a Profile object
    included: it may not be of this worker's step), ``verify_rounds`` above 0."""
    if not isinstance(options.profile, str) or (
            "profile" in explicit and options.profile not in ALLOWED_PROFILES):
        raise WorkerSettingsError(
            f"profile={_shown(options.profile)} under a MultiWorkerMirroredStrategy with "
            f"{workers} workers: profiling runs the step alone on this worker, where its "
            "all-reduce would wait for the other workers for ever. Each worker's steps are "
            f"planned from their shapes: leave profile unset, or pass profile='{PROFILE}'.")
    if "verify_rounds" in explicit and options.verify_rounds != VERIFY_ROUNDS:
        raise WorkerSettingsError(
            f"verify_rounds={options.verify_rounds} under a MultiWorkerMirroredStrategy with "
            f"{workers} workers: verifying a plan runs the step alone on this worker, where "
            "its all-reduce would wait for the other workers for ever. Each worker's plans "
            "rest on the memory model, unmeasured: leave verify_rounds unset, or pass "
            f"verify_rounds={VERIFY_ROUNDS}.")
    return options.replace(profile=PROFILE, verify_rounds=VERIFY_ROUNDS)


def background_error(workers: int) -> WorkerSettingsError:
    """Why ``background=True`` is refused under several workers."""
    return WorkerSettingsError(
        f"background=True under a MultiWorkerMirroredStrategy with {workers} workers: each "
        "worker's background search would end, and its plan take over, at a different step "
        "on each worker. Every worker plans each step before its first batch instead, so all "
        "adopt their plans at the same step: leave background unset, or pass False.")


def worker_notes(strategy, workers: int) -> tuple[str, ...]:
    """What :class:`tfswap.keras.SwapCallback` says about planning on ``workers`` workers."""
    return (
        f"MultiWorkerMirroredStrategy over {workers} workers, this one {task_of(strategy)}: "
        "each worker plans its own steps from their shapes (profile='analytic') and none is "
        "verified (verify_rounds=0): a multi-worker step cannot run alone, its all-reduce "
        "waits for the other workers, so the budget is held by the memory model alone",
        "each step signature is planned before its first batch, with no background search, "
        "so every worker adopts its plan at the same step; plans are not saved to plan_path",
    ) + tuple(LEFT_TO_KERAS.values())


def _shown(profile) -> str:
    return repr(profile) if isinstance(profile, str) else f"<{type(profile).__name__}>"


__all__ = ["ALLOWED_PROFILES", "LEFT_TO_KERAS", "PROFILE", "VERIFY_ROUNDS",
           "WorkerSettingsError", "background_error", "explicit_settings", "task_of",
           "worker_count", "worker_notes", "worker_options"]
