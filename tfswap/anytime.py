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
needs); each gets its own ``search_time`` from when it starts.  A plan that
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
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

# A searched plan takes over when predicted at least this much faster: the first
# call of a new graph pays for its set-up, which a smaller gain does not repay.
SWITCH_GAIN = 1e-3
# How long interpreter exit waits for a stopped search to end (it stops at its
# next generation or before its next verification; a rewrite under way finishes).
EXIT_WAIT_S = 30.0


@dataclass(frozen=True)
class PlanSpan:
    """Which calls of an :class:`AnytimeFunction` one plan ran (numbered from 1)."""

    plan_id: str
    planner: str
    predicted_step_s: float
    measured_peak_bytes: int | None   # its verification's (None: not measured here)
    first_call: int
    last_call: int | None = None   # None: the plan in use, or one no call ran yet

    def describe(self) -> str:
        calls = "no call yet" if self.last_call is None and self.first_call == 0 else \
            f"calls {self.first_call}-" + ("" if self.last_call is None else str(self.last_call))
        measured = "" if self.measured_peak_bytes is None else \
            f", measured peak {self.measured_peak_bytes} B"
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
    parts, ``measured_peak_bytes``...).

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
        self._stop = threading.Event()
        self._ended = threading.Event()
        self._done_callbacks: list[Callable] = []
        self._switch_callbacks: list[Callable] = []
        self.error: BaseException | None = None
        self.outcome = outcome or ("searching in the background" if search is not None
                                   else "nothing to search")
        self._final = None
        if search is None:
            self._final = first
            self._ended.set()
        else:
            _worker().submit(self, search)

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

    # -- the background search

    def _improve(self, search: Callable) -> None:
        if self._stop.is_set():
            self.outcome = "stopped before it started"
            self._end(None)
            return
        try:
            found = search(self._stop.is_set, self._between_calls)
        except _Stopped:
            self.outcome = "stopped"
            found = None
        except BaseException as err:   # the running plan stays; say why
            self.error = err
            self.outcome = f"failed, the first plan stays: {type(err).__name__}: {err}"
            found = None
        best = None
        if found is not None:
            now = self._current.plan
            if found.plan.id == now.id:
                self.outcome = "the search found the plan already running"
            elif found.plan.prediction.step_time_s < \
                    (1.0 - SWITCH_GAIN) * now.prediction.step_time_s:
                with self._lock:
                    self._pending = found
                best = found
                self.outcome = (f"plan {found.plan.id} verified, predicted "
                                f"{found.plan.prediction.step_time_s * 1e3:.3f} ms against "
                                f"{now.prediction.step_time_s * 1e3:.3f} ms: the next call "
                                "runs on it")
            else:
                self.outcome = (f"kept plan {now.id}: the search's best plan ({found.plan.id}) "
                                f"is not predicted {SWITCH_GAIN:.1%} faster")
        self._end(best or (self._current if self.error is None and not self._stop.is_set()
                           else None))

    @contextlib.contextmanager
    def _between_calls(self):
        with self._lock:
            if self._stop.is_set():
                raise _Stopped()
            yield

    def _end(self, final) -> None:
        self._final = final
        self._ended.set()
        for callback in list(self._done_callbacks):
            if final is not None:
                callback(final)

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
        return not self._ended.is_set()

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
        return self._ended.wait(timeout)

    def stop(self) -> None:
        """End the background search at its next generation (its best plan so far is
        still verified and used if faster) or skip its next verification."""
        self._stop.set()

    def add_done_callback(self, callback: Callable) -> None:
        """``callback(fast)`` once the search has ended with a verified plan (the
        staged better one, else the running one), in the background thread, or at
        once if it already has; not called when it failed or was stopped.
        (:class:`tfswap.keras.SwapCallback` saves the plan file this way.)"""
        self._done_callbacks.append(callback)
        if self._ended.is_set() and self._final is not None:
            callback(self._final)

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
                    fast.measured_peak_bytes, first_call)


class _Worker:
    """One daemon thread that runs the background searches of the process in turn."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.thread = threading.Thread(target=self._run, name="tfswap-background-search",
                                       daemon=True)
        self.thread.start()
        atexit.register(self.shutdown)

    def submit(self, fast: AnytimeFunction, search: Callable) -> None:
        self.live.add(fast)
        self.jobs.put((weakref.ref(fast), search))

    def _run(self) -> None:
        while True:
            ref, search = self.jobs.get()
            if ref is None:
                return
            fast = ref()
            if fast is not None:   # a function nobody holds any more is not searched for
                fast._improve(search)
            del fast

    def shutdown(self) -> None:
        """Stop every search and wait (at most :data:`EXIT_WAIT_S`) for the thread:
        a search left running while the interpreter exits could be inside TensorFlow."""
        for fast in list(self.live):
            fast.stop()
        self.jobs.put((None, None))
        self.thread.join(EXIT_WAIT_S)


_the_worker: _Worker | None = None
_worker_lock = threading.Lock()


def _worker() -> _Worker:
    global _the_worker
    with _worker_lock:
        if _the_worker is None or not _the_worker.thread.is_alive():
            _the_worker = _Worker()
        return _the_worker


__all__ = ["AnytimeFunction", "EXIT_WAIT_S", "PlanSpan", "SWITCH_GAIN"]
