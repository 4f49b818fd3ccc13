"""The genetic search for a shared pool layout, and the byte-cap planner beside it.

With ``SearchConfig(pool_layout="shared")`` pool objects that are never busy
together share memory (:mod:`tfswap.core.layout`), so the arena a searched
plan needs is well below its pool.  :func:`search_shared` repeats the
disjoint search for larger pools until the fastest plan whose arena fits
the budget is found, and (``byte_planner=True``) compares it with the
byte-cap planner's plans.

Example::

    result = search.plan(graph, budget, spec, config=SearchConfig(pool_layout="shared"))
"""

from __future__ import annotations

import math
from dataclasses import replace

from tfswap.core import byte_planner, layout, simulator
from tfswap.core.infeasible import Infeasible
from tfswap.core.native import Evaluation
from tfswap.core.plan import Plan
from tfswap.core.program import from_plan
from tfswap.core.search_config import BYTES_PLANNER_NAME, SearchResult


# The byte-cap planner's prefetch rule, tried each way: as early as memory
# allows (None), and no earlier than 4 copy times before the reader, which
# leaves the early bytes to the buffers it makes again instead (BERT-base b64 on
# the simulated V100: 0.816 of ideal against 0.793 after the recomputation pass).
BYTE_LOOKAHEADS = (None, 4.0)


def search_shared(search, graph, budget_bytes, spec, config, cg, recomputable=(),
                  polish=None, **options) -> SearchResult:
    """Searches for pools of ``f x budget_bytes`` and lays each best plan out shared.

    The shared arena of a plan searched for a disjoint pool of ``P`` bytes is
    well below ``P`` (ResNet-50 b256: 15.5 GB for 23.1 GB of objects), so the
    search is repeated for larger pools: ``f`` starts at 1 (whose plan always
    fits: its arena is at most its pool), and each next ``f`` scales the last
    by ``budget / arena`` (kept between the largest ``f`` that fit and the
    smallest that did not).  Returns the fastest plan that fits.

    ``search(graph, pool_bytes, spec, config, cg, **options)``: the genetic search
    for a disjoint pool (:func:`tfswap.core.search.plan`'s own), passed in so that
    this module does not import the one that calls it.  ``recomputable``: the
    ops the byte-cap planner may run again (:func:`tfswap.core.byte_planner.plan`).
    ``polish(plan) -> plan``: a pass that improves a finished plan (the
    recomputation pass, :func:`tfswap.core.recompute.with_recomputes`), applied
    to every candidate before the fastest is chosen, since the candidate that
    is fastest before the pass need not be after it.
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
    if best is not None:
        res, shared = best
        best = (res, shared, polish(replace(res.plan, allocation=shared,
                                            budget_bytes=int(budget_bytes))))
    schedules = [options["initial_schedule"]] + ([best[0].plan.schedule] if best else [])
    by_bytes = _byte_planned(graph, budget_bytes, spec, cg, schedules, options, recomputable,
                             polish) if config.byte_planner else None
    if best is None and by_bytes is None:
        raise Infeasible(f"no plan's shared pool fits the budget of {budget_bytes} bytes; "
                         "raise the memory budget")
    if by_bytes is not None and (best is None or by_bytes.prediction.step_time_s
                                 < best[2].prediction.step_time_s):
        return replace(_byte_result(by_bytes, cg, spec, config, generations, evaluations,
                                    heuristic, best[0] if best else None), pool_rounds=searched)
    res, _, planned = best
    return replace(res, plan=planned, generations=generations, evaluations=evaluations,
                   heuristic_time_s=heuristic, config=config, pool_rounds=searched)


def _byte_result(plan: Plan, cg, spec, config, generations, evaluations, heuristic,
                 beaten: SearchResult | None) -> SearchResult:
    """A SearchResult for a byte-planned ``plan``: its evaluation from the simulator,
    the history and stopping reason of the genetic search it ``beaten`` (None: no
    pool of that search fitted)."""
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    sim = simulator.run_program(cg, prog, plan.allocation, spec)
    ev = Evaluation(feasible=True, step_time_s=sim.step_time_s, ideal_time_s=sim.ideal_time_s,
                    stall_s=sim.stall_s, peak_bytes=sim.peak_bytes, h2d_bytes=sim.h2d_bytes,
                    d2h_bytes=sim.d2h_bytes, n_swap_outs=sum(o.copy for o in prog.outs),
                    n_swap_ins=len(prog.ins), passes=1,
                    class_peak_objects=sim.class_peak_objects, program=prog)
    return SearchResult(plan=replace(plan, planner=BYTES_PLANNER_NAME), best_evaluation=ev,
                        history=beaten.history if beaten else (), heuristic_time_s=heuristic,
                        generations=generations, evaluations=evaluations,
                        stopped_because=beaten.stopped_because if beaten else
                        "no shared pool of the genetic search fitted", config=config)


def _byte_planned(graph, budget_bytes, spec, cg, schedules, options,
                  recomputable=(), polish=lambda plan: plan) -> Plan | None:
    """The fastest plan of :mod:`tfswap.core.byte_planner` on ``schedules`` (each
    way of :data:`BYTE_LOOKAHEADS`, each variant ``polish``-ed) whose shared
    arena fits, or None.

    The class planner evicts within a size class; with a shared arena what must
    fit is bytes, and on steps several times the device (Inception-V3 at batch
    512 on a 16 GiB V100) evicting across classes moves far less.  That planner
    keeps every parameter on the device, so it is not tried when parameters
    start the step in host memory.
    """
    if options["params_start_on_host"] and any(
            cg.buf_persistent[b] and not cg.buf_pinned[b] for b in range(cg.n_buffers)):
        return None
    best, seen, polished = None, set(), set()
    for schedule in schedules:
        order = cg.order_of(schedule).tobytes()
        if order in seen:    # the search's best schedule can be TF's order itself
            continue
        seen.add(order)
        for lookahead in BYTE_LOOKAHEADS:
            try:
                found = byte_planner.variants(graph, budget_bytes, spec, schedule=schedule,
                                              compiled=cg, memory="shared", lookahead=lookahead,
                                              recomputable=recomputable)
            except Infeasible:
                continue
            for plan in found:
                # The prefetch rules often agree (ResNet-50 b256: 4 distinct plans of 6),
                # and the pass costs many simulations: each plan is polished once.
                if (plan.schedule, plan.swaps) in polished:
                    continue
                polished.add((plan.schedule, plan.swaps))
                got = polish(plan)
                if best is None or got.prediction.step_time_s < best.prediction.step_time_s:
                    best = got
    return best
