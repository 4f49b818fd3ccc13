"""Plans kept per step signature, in memory and in a directory: what
:class:`tfswap.keras.SwapCallback` plans with, usable without Keras.

A :class:`PlanStore` holds one planned function per key (a step kind and a
batch signature): loaded from its plan file where the file was made for the
same graph, budget and variable homes, else planned with
:func:`tfswap.optimize` and saved (a background search's plan once the search
has ended, and only while that function is still the store's).  Plans that
would move a variable another planned step runs with on the device are not
loaded, so the plans in use agree on where each variable lives.  A plan that
moves variables to host memory makes the store forget the plans made with
them on the device (:meth:`PlanStore.function`), and plans bound to variables
the caller no longer uses are forgotten too (:meth:`PlanStore.forget_stale`).

Example::

    store = PlanStore("plans/", tfswap.Options("6GiB", generations=20), name="mlp")
    fast, path, planned = store.plan("train", key, concrete_fn, inputs)
    store.functions[key] is fast       # True
    store.function(key, lambda: (concrete_fn, inputs)) is fast   # True: planned already
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from tfswap import anytime, api
from tfswap.core.budget import parse_budget
from tfswap.options import Options


NEW_SHAPES = ("plan", "original")   # what a signature not seen before gets


class _UserCache:
    """``plan_path``'s default: the user's cache directory (:func:`default_plan_path`)."""

    def __repr__(self) -> str:
        return "tfswap.keras.USER_CACHE"


USER_CACHE = _UserCache()


def default_plan_path() -> Path:
    """Where plans are kept by default: ``tfswap`` under ``$XDG_CACHE_HOME`` (the
    XDG base directory rule), else ``~/.cache/tfswap``.

    Example::

        tfswap.keras.default_plan_path()     # PosixPath('/home/me/.cache/tfswap')
    """
    root = os.environ.get("XDG_CACHE_HOME") or ""
    # The XDG rule: a relative path there is to be ignored.
    base = Path(root) if os.path.isabs(root) else Path.home() / ".cache"
    return base / "tfswap"


def plan_directory(plan_path) -> Path | None:
    """``plan_path`` checked: :data:`USER_CACHE` (:func:`default_plan_path`), a
    directory (made when the first plan is saved), or None (no files)."""
    if plan_path is USER_CACHE:
        plan_path = default_plan_path()
    if plan_path is None:
        return None
    plan_path = Path(plan_path)
    if plan_path.exists() and not plan_path.is_dir():
        raise ValueError(f"plan_path must be a directory (plans are saved per step and "
                         f"batch shape), but {plan_path} is a file")
    return plan_path


class PlanStore:
    """One planned function per key, loaded from or saved to ``directory`` (None:
    no files) under a name made of ``name``, the kind and the key; planned with
    ``options`` (:class:`tfswap.Options`).  ``verbose`` >= 1 prints each plan
    made or loaded, each switch to a background search's plan and why a file
    is not used.  ``new_shapes``: what :meth:`function` gives a key not seen
    before ("plan": a plan of its own; "original": None, the caller's
    unmodified step, once a step of its kind is planned).  ``background``:
    each plan made by ``optimize(background=True)``.  ``functions``: key -> the
    planned function (None where the caller runs the unmodified step for that key)."""

    def __init__(self, directory: Path | None, options: Options, name: str = "step",
                 verbose: int = 1, new_shapes: str = "plan", background: bool = True):
        if new_shapes not in NEW_SHAPES:
            raise ValueError(f"new_shapes must be one of {NEW_SHAPES}, got {new_shapes!r}")
        if isinstance(verbose, bool) or not isinstance(verbose, int) or verbose < 0:
            raise ValueError(f"verbose must be an int >= 0, got {verbose!r}")
        if not isinstance(background, bool):
            raise ValueError(f"background must be True or False, got {background!r}")
        self.directory, self.options, self.name, self.verbose = directory, options, name, verbose
        self.new_shapes, self.background = new_shapes, background
        self.functions: dict = {}
        # key -> ids of the captured variables that were the caller's when the key
        # was planned (``live`` of :meth:`function`); absent: every captured one.
        self._owned: dict = {}

    def path(self, kind: str, key) -> Path | None:
        """The plan file of ``key`` (None without a directory)."""
        if self.directory is None:
            return None
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
        return self.directory / f"{self.name}-{kind}-{digest}.plan.json"

    def function(self, key, trace: Callable, saved: bool = True, what: str | None = None,
                 after_move: Callable[[], None] | None = None,
                 live: Callable[[], set] | None = None):
        """The function for ``key``, a (kind, signature) pair, planned (or loaded) on
        its first use: ``trace()`` gives the step's ConcreteFunction and sample
        inputs, called only then.  None where ``new_shapes`` is "original" and a
        step of this kind is planned already.  ``saved``: as for :meth:`plan`.
        ``what``: how the printed lines name the step.  ``live()``: the ids of
        the caller's variables once the step is traced (as :meth:`forget_stale`
        takes them); only those of the step's captured variables make its plan
        stale later: a step may capture variables that are not the caller's and
        that nothing replaces, such as the ordering tokens a ``MirroredStrategy``
        gives its collectives.  None: every captured variable must stay live.

        A plan that moves variables to host memory calls ``after_move()`` (the
        caller's own functions to adjust), then the store forgets every other
        plan: each was made with the variables on the device, where its reads
        no longer are (calling it raises
        :class:`tfswap.tf.homes.MovedVariablesError`), so each is planned again
        when next used."""
        if key in self.functions:
            return self.functions[key]
        kind = key[0]
        if self.new_shapes == "original" and any(
                k[0] == kind and f is not None for k, f in self.functions.items()):
            self.functions[key] = None
            return None
        concrete_fn, inputs = trace()
        fast, path, _ = self.plan(kind, key, concrete_fn, inputs, saved=saved)
        if live is not None:
            owned = live()
            self._owned[key] = {id(v) for v in fast.captured.variables if id(v) in owned}
        if fast.relocation is not None:
            if after_move is not None:
                after_move()
            self.forget([k for k, f in self.functions.items() if f is not None and k != key])
        self._announce(fast, what or f"{kind} step", path)
        return fast

    def plan(self, kind: str, key, concrete_fn, inputs, background: bool | None = None,
             saved: bool = True):
        """(the function for ``key``: loaded from its file or planned, its file or
        None, whether it was planned here).  ``background``: None, the store's.
        ``saved`` False: no file (a replicated step's plans, one per replica, are
        not saved yet)."""
        self._owned.pop(key, None)   # until function() says whose variables these are
        path = self.path(kind, key) if saved else None
        fast = self._load(path, concrete_fn) if path is not None and path.exists() else None
        planned = fast is None
        if planned:
            fast = api.optimize(concrete_fn, options=self.options, inputs=inputs,
                                background=self.background if background is None
                                else background)
        self.functions[key] = fast
        if planned and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(fast, anytime.AnytimeFunction):   # its search's best, once ended
                fast.add_done_callback(functools.partial(self._save_if_current, key, fast, path))
            else:
                fast.plan.save(path)
        return fast, path, planned

    def forget(self, keys) -> None:
        """Drop the functions of ``keys``, ending their background searches."""
        for key in keys:
            self._owned.pop(key, None)
            fast = self.functions.pop(key, None)
            if isinstance(fast, anytime.AnytimeFunction):
                fast.stop()

    def forget_stale(self, live: set) -> None:
        """Forget the functions bound to variables not in ``live`` (ids of the
        variables the caller's model uses now: after ``compile`` again, a new
        optimizer or metrics, or another model, running such a plan would update
        the wrong objects) and, where any was, the keys the caller ran
        unmodified, decided for the old model too."""
        stale = [key for key, fast in self.functions.items()
                 if fast is not None and not self.bound_to(key) <= live]
        if not stale:
            return
        if self.verbose >= 1:
            print(f"tfswap: {len(stale)} planned step(s) captured variables this model no "
                  "longer uses (compiled again, or another model); planning them again")
        self.forget(stale + [key for key, fast in self.functions.items() if fast is None])

    def bound_to(self, key) -> set:
        """The ids of the variables whose replacement makes ``key``'s plan stale:
        the caller's among those its step captured (see :meth:`function`)."""
        fast = self.functions[key]
        ids = {id(v) for v in fast.captured.variables}
        return ids & self._owned[key] if key in self._owned else ids

    def _announce(self, fast, what: str, path: Path | None) -> None:
        """Print the plan made or loaded for ``what``, and later each switch to a
        background search's plan."""
        if self.verbose < 1:
            return
        print(f"tfswap: {what}" + (f" (plan file {path})" if path is not None else ""))
        print(fast.report())
        if isinstance(fast, anytime.AnytimeFunction):
            fast.add_switch_callback(lambda old, new: print(
                f"tfswap: {what}: plan {new.plan.id} from the background search takes over "
                f"from {old.plan.id} (predicted step "
                f"{new.plan.prediction.step_time_s * 1e3:.3f} ms, was "
                f"{old.plan.prediction.step_time_s * 1e3:.3f} ms)"))

    def _save_if_current(self, key, fast, path: Path, final) -> None:
        """Save ``final``, the plan ``fast``'s background search ended on, unless
        ``fast`` was dropped meanwhile (its variables moved: the plan assumes
        homes they no longer have, and loading it would move them back and forth)."""
        if self.functions.get(key) is fast:
            final.plan.save(path)

    def _load(self, path: Path, concrete_fn):
        # The variables the steps planned so far run with on the device: a plan
        # file that would move one is not loaded (its step is planned again where
        # the variables are), so the plans in use agree on where each lives.
        on_device = [c.variable for fast in self.functions.values() if fast is not None
                     for c in fast.captured.captures
                     if c.variable is not None and not c.host_homed]
        try:
            fast = api.load_plan(path, concrete_fn, unmovable=on_device, options=self.options)
        except api.PlanMismatchError as err:
            if self.verbose >= 1:
                print(f"tfswap: {err}; planning again")
            return None
        wanted = parse_budget(self.options.memory_budget, fast.spec.memory_bytes)
        if fast.plan.budget_bytes != wanted:
            if self.verbose >= 1:
                print(f"tfswap: {path} was made for a budget of {fast.plan.budget_bytes} bytes, "
                      f"not {wanted}; planning again")
            return None
        return fast


__all__ = ["NEW_SHAPES", "PlanStore", "USER_CACHE", "default_plan_path", "plan_directory"]
