"""The genetic search for a shared pool layout.

With ``SearchConfig(pool_layout="shared")`` pool objects that are never busy
together share memory (:mod:`tfswap.core.layout`), so the arena a searched
plan needs is well below its pool.  :func:`search_shared` repeats the
disjoint search for larger pools until the fastest plan whose arena fits
the budget is found.  (The byte-cap planner's plans are compared with it by
the default planner, :mod:`tfswap.core.best_of`.)

Example::

    result = search.plan(graph, budget, spec, config=SearchConfig(pool_layout="shared"))
"""

from __future__ import annotations

import math
from dataclasses import replace

from tfswap.core import layout, simulator
from tfswap.core.infeasible import Infeasible
from tfswap.core.search_config import SearchResult


def search_shared(search, graph, budget_bytes, spec, config, cg, polish=None,
                  **options) -> SearchResult:
    """Searches for pools of ``f x budget_bytes`` and lays each best plan out shared.

    The shared arena of a plan searched for a disjoint pool of ``P`` bytes is
    well below ``P`` (ResNet-50 b256: 15.5 GB for 23.1 GB of objects), so the
    search is repeated for larger pools: ``f`` starts at 1 (whose plan always
    fits: its arena is at most its pool), and each next ``f`` scales the last
    by ``budget / arena`` (kept between the largest ``f`` that fit and the
    smallest that did not).  Returns the fastest plan that fits.

    ``search(graph, pool_bytes, spec, config, cg, **options)``: the genetic search
    for a disjoint pool (:func:`tfswap.core.search.plan`'s own), passed in so that
    this module does not import the one that calls it.  ``polish(plan) -> plan``:
    a pass that improves the finished plan (the recomputation pass,
    :func:`tfswap.core.recompute.with_recomputes`).
    """
    polish = polish or (lambda plan: plan)

    rounds = config.layout_rounds
    each = replace(config, pool_layout="disjoint",
                   time_budget_s=None if config.time_budget_s is None
                   else config.time_budget_s / rounds)
    lo, hi, f = 1.0, math.inf, 1.0
    best = None
    generations = evaluations = searched = 0
    heuristic = None
    for _ in range(rounds):
        searched += 1
        try:
            res = search(graph, int(budget_bytes * f), spec, each, cg, **options)
        except Infeasible:
            if best is None:
                raise
            hi, fits, proposal = f, False, lo
        else:
            generations += res.generations
            evaluations += res.evaluations
            heuristic = res.heuristic_time_s if heuristic is None else heuristic
            sim = simulator.simulate(graph, res.plan, spec, events=True, compiled=cg)
            shared = layout.shared_layout(sim, res.plan.allocation)
            need = shared.total_bytes
            fits = need <= budget_bytes
            if fits:
                lo = max(lo, f)
                if best is None or res.plan.prediction.step_time_s < \
                        best[0].plan.prediction.step_time_s:
                    best = (res, shared)
            else:
                hi = min(hi, f)
            proposal = f * budget_bytes / need
        if best is None or (config.stop_when is not None and config.stop_when()):
            break
        if fits and abs(proposal / f - 1) < 0.01:
            break          # this pool's arena fills the budget
        if not fits:
            # From above, the secant step can land within a percent of the pool
            # that did not fit: then step 3% down instead (not below the middle).
            proposal = max((lo + hi) / 2, proposal if proposal < 0.99 * f else 0.97 * f)
        elif math.isfinite(hi) and not lo < proposal < hi:
            proposal = (lo + hi) / 2
        elif not proposal > lo:
            proposal = lo * 1.25
        if hi / lo < 1.02:
            break
        f = proposal
    if best is None:
        raise Infeasible(f"no plan's shared pool fits the budget of {budget_bytes} bytes; "
                         "raise the memory budget")
    res, shared = best
    planned = polish(replace(res.plan, allocation=shared, budget_bytes=int(budget_bytes)))
    return replace(res, plan=planned, generations=generations, evaluations=evaluations,
                   heuristic_time_s=heuristic, config=config, pool_rounds=searched)
