"""The compiled schedule mutation: the genetic search's hot operator.

Built like the planner library (``pip install .`` compiles ``schedule_ops.cc``
next to this file; otherwise :func:`library` compiles a copy into
``~/.cache/tfswap/`` once).  :func:`mutate` takes its random draws as arrays,
so the Python reference in :mod:`tfswap.core.genetics` gives the same result
for the same draws.

Example::

    out = mutate(schedule, dag.indegree, dag.succ_start, dag.succ, 0.05,
                 rng.random(n), rng.random(n))
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from tfswap.core.native.build import NativeLibrary

def _configure(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    lib.tfswap_mutate_schedule.restype = ctypes.c_int
    lib.tfswap_mutate_schedule.argtypes = [ctypes.c_int64, p, p, p, p, ctypes.c_double,
                                           p, p, p]


_LIBRARY = NativeLibrary(Path(__file__).resolve().parent / "schedule_ops.cc",
                         "tfswap.core.native._schedule_ops", "schedule",
                         "libtfswap_schedule.so", _configure)


def library() -> ctypes.CDLL:
    """Load (once) the native library, compiling it into the cache if needed."""
    return _LIBRARY.load()


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def mutate(schedule: np.ndarray, indegree: np.ndarray, succ_start: np.ndarray,
           succ: np.ndarray, probability: float, draw: np.ndarray,
           pick: np.ndarray) -> np.ndarray:
    """Ready-set mutation of ``schedule`` (see ``genetics.mutate_schedule``).

    ``draw[k] < probability``: step ``k`` runs the ready op at index
    ``floor(pick[k] * len(ready))`` of the ready list; else the ready op
    earliest in ``schedule``.
    """
    n = len(indegree)
    schedule, indegree, succ_start, succ = (_i64(a) for a in (schedule, indegree, succ_start,
                                                              succ))
    draw = np.ascontiguousarray(draw, dtype=np.float64)
    pick = np.ascontiguousarray(pick, dtype=np.float64)
    if len(schedule) != n or len(draw) < n or len(pick) < n or len(succ_start) != n + 1:
        raise ValueError(f"mutate: schedule, draws and picks need {n} entries (one per op)")
    out = np.empty(n, dtype=np.int64)
    status = library().tfswap_mutate_schedule(
        n, schedule.ctypes.data, indegree.ctypes.data, succ_start.ctypes.data,
        succ.ctypes.data if len(succ) else None, float(probability), draw.ctypes.data,
        pick.ctypes.data, out.ctypes.data)
    if status == 1:
        raise ValueError("mutate: the precedence graph has a cycle; it must be a DAG")
    if status != 0:
        raise ValueError("mutate: the schedule names an op id outside the graph")
    return out
