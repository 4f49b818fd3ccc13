"""A step that runs at once on a first plan while the full search goes on in the background.

``tfswap.optimize(cf, budget, background=True)`` plans in seconds (each search
ends after its first generation: TensorFlow's order, its mutants, the
planners' plans of it), verifies that plan like any other, and returns an
:class:`AnytimeFunction` that runs on it.  The full search (``search_time``
less what the first plan took, or ``generations``) then runs in a background
thread: the genetic search is an anytime algorithm, and its native simulator
releases the GIL, so it uses the cores the step leaves idle.  Its plan is
verified between two calls (verification runs the step on the device, so
no call runs meanwhile) and, where the simulator predicts it faster, the
next call runs on it.  Every plan computes exactly what the user's step
computes, so a switch changes memory and time, never the results.

One background search runs at a time in the process (several signatures of
a Keras ``fit`` queue behind each other rather than share the cores the step
needs); each gets its own ``search_time`` from when it starts.  Each search
is a :class:`concurrent.futures.Future` (``search_future``) run in a daemon
thread of its own, which starts once the search started before it has
ended.  A plan that
fails (no plan, a verification over the budget after every remedy) is never
used: the function stays on the plan it has and says why in ``outcome``.  At
interpreter exit the searches still running are stopped.

Example::

    fast = tfswap.optimize(cf, "12MiB", background=True)
    for x, y in batches:
        fast(x, y)                 # the first plan at once, the searched one when ready
    fast.wait()                    # optional: until the search has ended
    print(fast.report())           # which plan ran for which calls
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, replace

# A searched plan takes over when predicted at least this much faster: the first
# call of a new graph pays for its set-up, which a smaller gain does not repay.
SWITCH_GAIN = 1e-3
# How long interpreter exit waits for a stopped search to end (it stops at its
# next generation or before its next verification; a rewrite under way finishes).
EXIT_WAIT_S = 30.0
# The background searches' threads are named so: what runs in them can tell.
THREAD_NAME = "tfswap-background-search"


@dataclass(frozen=True)
class PlanSpan:
    """Which calls of an :class:`AnytimeFunction` one plan ran (numbered from 1)."""

    plan_id: str
    planner: str
    predicted_step_s: float
    measured_peak_bytes: int | None   # its verification's (None: not measured here)
    first_call: int
    last_call: int | None = None   # None: the plan in use, or one no call ran yet
    # device -> measured peak, for each device measured (a replicated step's every one).
    measured_peaks: tuple = ()

    def describe(self) -> str:
        calls = "no call yet" if self.last_call is None and self.first_call == 0 else \
            f"calls {self.first_call}-" + ("" if self.last_call is None else str(self.last_call))
        measured = "" if self.measured_peak_bytes is None else \
            f", measured peak {self.measured_peak_bytes} B"
        if len(self.measured_peaks) > 1:
            measured += " (" + ", ".join(f"{d}: {b} B" for d, b in self.measured_peaks) + ")"
        return (f"plan {self.plan_id} ({self.planner}): {calls}, predicted step "
                f"{self.predicted_step_s * 1e3:.3f} ms{measured}")


class _Stopped(Exception):
    """The background search was stopped before its next verification."""


class AnytimeFunction:
    """A planned step whose plan may improve while it runs; call it like the original.

    ``first``: the :class:`tfswap.OptimizedFunction` it starts on.  ``search``:
    ``search(stop_when, between_calls) -> OptimizedFunction``, the background
    search (None: nothing to search, e.g. the step fits unmodified; ``outcome``
    then says why);
    ``stop_when()`` is True once :meth:`stop` was called, and whatever runs the
    step on the device (verification) runs inside ``between_calls()``, which no
    call of this function overlaps.  Attributes not defined here are the
    current plan's :class:`tfswap.OptimizedFunction`'s (``plan``, ``report``'s
    parts, ``measured_peak_bytes``...).  ``search_future``: the search as a
    :class:`concurrent.futures.Future`, whose result is the verified plan it
    ended on (the staged better one, else the running one), or None where it
    failed or was stopped.

    Example::

        fast = tfswap.optimize(cf, "12MiB", background=True)
        fast(x, y)
        fast.plans        # (PlanSpan(plan_id=..., first_call=1, ...), ...)
    """

    def __init__(self, first, search: Callable | None = None, outcome: str | None = None):
        self._current = first
        self._pending = None
        self._calls = 0
        self._spans = [_span(first, 0)]
        # One call, or one verification, at a time; reentrant, so that a switch
        # callback (run inside the call) may read the function (plans, report).
        self._lock = threading.RLock()
        self._stopped = False
        self._switch_callbacks: list[Callable] = []
        self.error: BaseException | None = None
        self.outcome = outcome or ("searching in the background" if search is not None
                                   else "nothing to search")
        if search is None:
            self.search_future: futures.Future = futures.Future()
            self.search_future.set_result(first)
        else:
            self.search_future = _in_the_background(self, search)

    # -- what a call does

    def __call__(self, *args, **kwargs):
        with self._lock:
            if self._pending is not None:
                self._switch()
            self._calls += 1
            if self._spans[-1].first_call == 0:
                self._spans[-1] = replace(self._spans[-1], first_call=self._calls)
            return self._current(*args, **kwargs)

    def _switch(self) -> None:
        old, new = self._current, self._pending
        self._spans[-1] = replace(self._spans[-1], last_call=self._calls)
        self._spans.append(_span(new, self._calls + 1))
        self._current, self._pending = new, None
        for callback in list(self._switch_callbacks):
            callback(old, new)
        # ``old`` goes with this frame: its bound graph, and on a GPU its pool
        # layout in the budget arena (removed when the binding is collected).

    # -- the background search, in its thread

    def _improve(self, search: Callable):
        """Run ``search`` and stage its plan where it is faster: the verified plan
        the search ended on (the staged one, else the running one), or None where
        it failed or was stopped."""
        if self._stopped:
            self.outcome = "stopped before it started"
            return None
        try:
            found = search(self._is_stopped, self._between_calls)
        except _Stopped:
            self.outcome = "stopped"
            return None
        except BaseException as err:   # the running plan stays; say why
            self.error = err
            self.outcome = f"failed, the first plan stays: {type(err).__name__}: {err}"
            return None
        now = self._current.plan
        if found is not None and found.plan.id != now.id and \
                found.plan.prediction.step_time_s < (1.0 - SWITCH_GAIN) * now.prediction.step_time_s:
            with self._lock:
                self._pending = found
            self.outcome = (f"plan {found.plan.id} verified, predicted "
                            f"{found.plan.prediction.step_time_s * 1e3:.3f} ms against "
                            f"{now.prediction.step_time_s * 1e3:.3f} ms: the next call runs on it")
            return found
        if found is not None:
            self.outcome = "the search found the plan already running" if found.plan.id == now.id \
                else (f"kept plan {now.id}: the search's best plan ({found.plan.id}) is not "
                      f"predicted {SWITCH_GAIN:.1%} faster")
        return None if self._stopped else self._current

    def _is_stopped(self) -> bool:
        return self._stopped

    @contextlib.contextmanager
    def _between_calls(self):
        with self._lock:
            if self._stopped:
                raise _Stopped()
            yield

    # -- public

    @property
    def current(self):
        """The :class:`tfswap.OptimizedFunction` the next call runs (a plan the
        search verified and staged takes over at that call)."""
        with self._lock:
            return self._pending or self._current

    @property
    def searching(self) -> bool:
        """Whether the background search is still running (or queued)."""
        return not self.search_future.done()

    @property
    def plans(self) -> tuple[PlanSpan, ...]:
        """Which plan ran for which calls, in order; a staged plan is listed with
        ``first_call`` the next call's number."""
        with self._lock:
            spans = list(self._spans)
            if self._pending is not None:
                spans[-1] = replace(spans[-1], last_call=self._calls)
                spans.append(_span(self._pending, self._calls + 1))
        return tuple(spans)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background search has ended (at most ``timeout``
        seconds); True if it has.  Its plan, if better, runs from the next call."""
        done, _ = futures.wait([self.search_future], timeout)
        return bool(done)

    def stop(self) -> None:
        """End the background search at its next generation (its best plan so far is
        still verified and used if faster) or skip its next verification."""
        self._stopped = True

    def add_done_callback(self, callback: Callable) -> None:
        """``callback(fast)`` once the search has ended with a verified plan (the
        staged better one, else the running one), in the background thread, or at
        once if it already has; not called when it failed or was stopped.
        (:class:`tfswap.plan_store.PlanStore` saves the plan file this way.)"""
        def ended(future: futures.Future) -> None:
            if future.result() is not None:
                callback(future.result())

        self.search_future.add_done_callback(ended)

    def add_switch_callback(self, callback: Callable) -> None:
        """``callback(old, new)`` (the :class:`tfswap.OptimizedFunction` switched
        from and to) at each switch, in the calling thread, before the call that
        runs the new plan."""
        self._switch_callbacks.append(callback)

    def report(self) -> str:
        """The current plan's report, then which plan ran for which calls and how
        the background search went.

        Example::

            print(fast.report())
        """
        lines = [self.current.report(), "", "plans of this function (anytime mode):"]
        lines += [f"  {span.describe()}" for span in self.plans]
        lines.append(f"  background search: {self.outcome}")
        return "\n".join(lines)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.current, name)


def _span(fast, first_call: int) -> PlanSpan:
    plan = fast.plan
    return PlanSpan(plan.id, plan.planner, plan.prediction.step_time_s,
                    fast.measured_peak_bytes, first_call,
                    measured_peaks=tuple(fast.measured_peaks.items()))


# The thread of the search started last: the next one starts when it has ended,
# so one search runs at a time, in the order they were started.
_last_thread: threading.Thread | None = None
_live: weakref.WeakSet | None = None   # the functions whose search exit stops
_started = threading.Lock()


def _in_the_background(fast: AnytimeFunction, search: Callable) -> futures.Future:
    """``fast``'s search as a future, run in a daemon thread (a search left running
    must not hold up interpreter exit) once the search started before it has
    ended.  The thread holds ``fast`` weakly while queued: a function nobody
    holds any more is not searched for."""
    global _last_thread, _live
    future: futures.Future = futures.Future()
    ref = weakref.ref(fast)

    def run(previous: threading.Thread | None) -> None:
        if previous is not None:
            previous.join()
        future.set_running_or_notify_cancel()
        target = ref()
        try:
            future.set_result(None if target is None else target._improve(search))
        except BaseException as err:
            future.set_exception(err)

    with _started:
        if _live is None:
            # At the first search, not at import: exit handlers run in reverse
            # order of registration, so this one runs before TensorFlow's.
            _live = weakref.WeakSet()
            atexit.register(_stop_at_exit)
        _live.add(fast)
        _last_thread = threading.Thread(target=run, args=(_last_thread,), name=THREAD_NAME,
                                        daemon=True)
        _last_thread.start()
    return future


def _stop_at_exit() -> None:
    """Stop every search and wait (at most :data:`EXIT_WAIT_S`) for them to end: a
    search left running while the interpreter exits could be inside TensorFlow."""
    running = list(_live or ())
    for fast in running:
        fast.stop()
    futures.wait([fast.search_future for fast in running], EXIT_WAIT_S)


__all__ = ["AnytimeFunction", "EXIT_WAIT_S", "PlanSpan", "SWITCH_GAIN", "THREAD_NAME"]
