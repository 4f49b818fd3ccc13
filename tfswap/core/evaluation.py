"""Parallel fitness evaluation for the genetic search.

A fitness is the simulated step time (seconds; infinite when the allocation
cannot run the schedule) of one candidate: a schedule (op ids) and an
:class:`~tfswap.core.plan.Allocation`, planned and simulated by the native
library.  Evaluation is a pure function of the candidate, so results do not
depend on which worker computed them; they come back in submission order.

Where the work runs:

* ``workers=1``: in the calling thread.
* ``workers=N`` (default: all cores): N threads of this process.  The native
  planner+simulator is called through ctypes, which releases the GIL, so
  threads run in parallel; and unlike worker processes they never import the
  caller's ``__main__`` again (a training script without a main guard would
  run its top level once per worker).
* ``executor=``: any :class:`concurrent.futures.Executor` you already run,
  e.g. a ``ProcessPoolExecutor`` or Dask's
  ``distributed.Client(...).get_executor()``.  Each task carries
  the graph's arrays (pickled once here; a worker unpickles them once and
  keeps them by content hash) and a chunk of candidates.  ``workers`` is then
  the number of chunks per batch.

Example::

    with Evaluator(cg, spec, workers=2) as ev:
        times = ev.map([(order, allocation), ...])
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec
from tfswap.core.plan import Allocation

Candidate = tuple[np.ndarray, Allocation]


@dataclass(frozen=True)
class _Context:
    """What every evaluation needs besides the candidate."""
    cg: CompiledGraph
    spec: DeviceSpec
    recency_margin_s: float
    params_start_on_host: bool


def _portable(cg: CompiledGraph) -> CompiledGraph:
    # The simulator reads only the arrays; the DataflowGraph and names would
    # triple what each task carries, and a copy made by ``replace`` drops the
    # ctypes pointers the native loader caches on the original.
    return replace(cg, graph=None, buf_names=())


def _evaluate_one(ctx: _Context, order: np.ndarray, allocation: Allocation) -> float:
    from tfswap.core import native

    ev = native.evaluate(ctx.cg, order, allocation, ctx.spec,
                         recency_margin_s=ctx.recency_margin_s,
                         params_start_on_host=ctx.params_start_on_host)
    return ev.step_time_s if ev.feasible else float("inf")


# Worker-side state: contexts by content hash (a worker may serve several searches).
_contexts: dict[str, _Context] = {}
_MAX_CONTEXTS = 4


def _install(token: str, payload: bytes) -> None:
    if token not in _contexts:
        while len(_contexts) >= _MAX_CONTEXTS:
            _contexts.pop(next(iter(_contexts)))
        _contexts[token] = pickle.loads(payload)


def _evaluate_local(ctx: _Context, chunk: Sequence[Candidate]) -> list[float]:
    return [_evaluate_one(ctx, order, allocation) for order, allocation in chunk]


def _evaluate_chunk(token: str, payload: bytes | None,
                    chunk: Sequence[Candidate]) -> list[float]:
    if payload is not None:
        _install(token, payload)
    return _evaluate_local(_contexts[token], chunk)


class Evaluator:
    """Maps candidates to simulated step times, locally or on an executor.

    ``workers``: threads of the local pool (None: ``os.cpu_count()``; 1: no
    pool), or chunks per batch with ``executor``.  Use as a context manager
    (or call :meth:`close`) so the local pool is shut down.
    """

    def __init__(self, cg: CompiledGraph, spec: DeviceSpec, *, recency_margin_s: float = 0.0,
                 params_start_on_host: bool = False, workers: int | None = None,
                 executor: Executor | None = None):
        if workers is None:
            workers = os.cpu_count() or 1
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers must be a positive int (or None for all cores), "
                             f"got {workers!r}")
        if executor is not None and not isinstance(executor, Executor):
            raise TypeError(f"executor must be a concurrent.futures.Executor (for Dask: "
                            f"distributed.Client(...).get_executor()), got {type(executor)}")
        self.workers = workers
        self._local = _Context(cg, spec, float(recency_margin_s), bool(params_start_on_host))
        self._payload = pickle.dumps(replace(self._local, cg=_portable(cg)),
                                     protocol=pickle.HIGHEST_PROTOCOL)
        self._token = hashlib.sha256(self._payload).hexdigest()[:16]
        self._executor = executor
        self._pool = None
        if executor is None and workers > 1:
            self._pool = ThreadPoolExecutor(max_workers=workers,
                                            thread_name_prefix="tfswap-evaluate")
        self.evaluations = 0

    def map(self, candidates: Sequence[Candidate]) -> list[float]:
        """Simulated step time of each candidate (inf: infeasible), in order."""
        candidates = list(candidates)
        self.evaluations += len(candidates)
        if not candidates:
            return []
        if self._pool is None and self._executor is None:
            return [_evaluate_one(self._local, o, a) for o, a in candidates]
        bounds = np.linspace(0, len(candidates), min(self.workers, len(candidates)) + 1)
        chunks = [candidates[int(a):int(b)] for a, b in zip(bounds[:-1], bounds[1:])]
        if self._pool is not None:
            # Threads share this process's context: nothing to send or unpickle.
            futures = [self._pool.submit(_evaluate_local, self._local, c) for c in chunks]
        else:
            futures = [self._executor.submit(_evaluate_chunk, self._token, self._payload, c)
                       for c in chunks]
        return [t for f in futures for t in f.result()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
