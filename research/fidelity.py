"""How well the simulator predicts what runs: error and ordering statistics.

SwapAdvisor §6.5 (Fig. 11) plots simulated against measured step time for
random individuals and counts the points that "keep the same relative
performance" (19 of 20; the one exception is the rightmost point, whose
neighbour in simulated order measured slower).  :func:`orders_kept` counts
the same way: sort by simulated time; the first point keeps its order, and
every later point keeps it when it measured no faster than the point just
before it in simulated order.  So one swapped neighbour pair costs one
point, as in the paper.

Example::

    errors = relative_errors(simulated=[1.0, 2.0], measured=[1.1, 1.9])  # [0.1, -0.05]
    orders_kept([1.0, 2.0, 3.0], [1.2, 1.1, 3.5])                          # 2 of 3
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _paired(simulated, measured) -> tuple[np.ndarray, np.ndarray]:
    sim = np.asarray(simulated, dtype=np.float64)
    got = np.asarray(measured, dtype=np.float64)
    if sim.shape != got.shape or sim.ndim != 1:
        raise ValueError(f"simulated and measured must be 1-D of one length, got shapes "
                         f"{sim.shape} and {got.shape}")
    return sim, got


def relative_errors(simulated: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """(measured - simulated) / measured for each point: > 0 when the simulator is
    optimistic (predicts less than ran)."""
    sim, got = _paired(simulated, measured)
    if np.any(got <= 0):
        raise ValueError("measured values must be > 0 (seconds or bytes)")
    return (got - sim) / got


def orders_kept(simulated: Sequence[float], measured: Sequence[float]) -> int:
    """Points that keep their order (module docstring): 1 + the neighbour pairs in
    simulated order whose measured values are in the same order (ties keep it)."""
    sim, got = _paired(simulated, measured)
    if len(sim) == 0:
        return 0
    ranked = got[np.argsort(sim, kind="stable")]
    return 1 + int(np.sum(ranked[1:] >= ranked[:-1]))


def pairs_kept(simulated: Sequence[float], measured: Sequence[float]) -> tuple[int, int]:
    """(pairs in the same order in both, all pairs): Kendall's concordance count,
    ties in either counted as kept."""
    sim, got = _paired(simulated, measured)
    i, j = np.triu_indices(len(sim), k=1)
    kept = np.sign(sim[i] - sim[j]) * np.sign(got[i] - got[j]) >= 0
    return int(kept.sum()), len(i)


def spread(times: Sequence[float]) -> float:
    """Interquartile range over median of repeated measurements of one thing:
    how noisy the machine was (0.1: the middle half of the runs within 10%)."""
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 1 or len(t) == 0 or np.any(t <= 0):
        raise ValueError("spread needs one or more positive measurements")
    q1, med, q3 = np.percentile(t, [25, 50, 75])
    return float((q3 - q1) / med)


def summary(simulated: Sequence[float], measured: Sequence[float]) -> dict:
    """Median and max |relative error|, median signed error, orders and pairs kept."""
    err = relative_errors(simulated, measured)
    kept, pairs = pairs_kept(simulated, measured)
    return {"n": len(err), "median_abs_error": float(np.median(np.abs(err))),
            "max_abs_error": float(np.max(np.abs(err))),
            "median_error": float(np.median(err)),
            "orders_kept": orders_kept(simulated, measured),
            "pairs_kept": kept, "pairs": pairs}
