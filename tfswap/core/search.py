"""SwapAdvisor's genetic search (paper §5) over schedules and memory allocations.

An individual is a schedule (a topological order of the ops), a size-class
map CLS and object counts CNT (§5.3); its fitness is the step time the
swap planner and the simulator give it.  Each generation pairs random
parents; one crossover makes two schedules (Fig. 4) and two allocations
(Fig. 5), hence four children, which are mutated (ready-set mutation for the
schedule, ±1 class moves for CLS, Gaussian for CNT, each element with
probability P) and refitted to the budget (inverse-proportional repair).
Survivors are drawn by softmax over normalised time (eq. 1); the best
``elite`` individuals always survive.

The first population holds TF's order (``initial_schedule``) with the
default allocation -- exactly the plan :func:`~tfswap.core.planner.plan_swaps`
makes without a search -- and a memory-greedy order, then mutants of the two
with random mutation rates and random class maps.  The result is the best
individual ever evaluated, so the search never returns a plan slower than
that heuristic one (``SearchResult.heuristic_time_s``).

All randomness comes from one ``numpy`` Generator seeded with
``SearchConfig.seed``, drawn in this process; evaluation is pure, so a
seed gives the same plan whatever the worker count or executor (a stop on
``time_budget_s`` depends on the machine's speed, generation and patience
stops do not).

Example::

    cfg = SearchConfig(population_size=32, time_budget_s=60.0, seed=0)
    result = plan(graph, budget_bytes=6 << 30, spec=device_spec("v100-16g-pcie3"),
                  config=cfg)
    result.plan.prediction.step_time_s, result.history[-1].best_time_s
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from deap import base

from tfswap.core import genetics, shared_search
from tfswap.core.allocation import class_sizes, repair_counts
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec, check_planner_arguments
from tfswap.core.evaluation import Evaluator
from tfswap.core.graph import DataflowGraph
from tfswap.core.infeasible import Infeasible
from tfswap.core.native import evaluate
from tfswap.core.plan import Allocation
from tfswap.core.planner import default_allocation, default_classes, plan_swaps
from tfswap.core.search_config import (  # noqa: F401 (re-exported)
    BYTES_PLANNER_NAME, MODES, PLANNER_NAME, POOL_LAYOUTS, GenerationStats, SearchConfig,
    SearchResult)
from tfswap.core.simulator import PlanError

FINALISTS = 16   # best candidates kept in case the reference planner rejects one


class Fitness(base.Fitness):
    weights = (-1.0,)   # minimise the simulated step time


class Individual:
    """A chromosome: schedule (op ids), CLS, CNT; ``fitness`` set once evaluated."""

    __slots__ = ("schedule", "cls", "cnt", "allocation", "fitness")

    def __init__(self, schedule: np.ndarray, cls: tuple[int, ...], cnt: tuple[int, ...],
                 allocation: Allocation | None):
        self.schedule, self.cls, self.cnt, self.allocation = schedule, cls, cnt, allocation
        self.fitness = Fitness()

    @property
    def time_s(self) -> float:
        return self.fitness.values[0] if self.fitness.valid else math.inf


class _SmallPool:
    """The small-tensor pool's peak for any schedule, vectorised
    (equals ``CompiledGraph.small_pool_peak``; it runs once per child)."""

    def __init__(self, cg: CompiledGraph):
        pers = cg.small_persistent.astype(bool)
        self.fixed = int(cg.small_bytes[pers].sum())
        idx = np.flatnonzero(~pers)
        self.bytes = cg.small_bytes[idx]
        self.first = cg.small_first_op[idx].astype(np.int64)
        counts = (cg.small_use_ptr[idx + 1] - cg.small_use_ptr[idx]).astype(np.int64)
        self.has_uses = counts > 0
        self.uses = np.concatenate([cg.small_use[cg.small_use_ptr[s]:cg.small_use_ptr[s + 1]]
                                    for s in idx]).astype(np.int64) if len(idx) else \
            np.zeros(0, np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(idx) else counts
        self.starts = starts[self.has_uses]

    def peak(self, order: np.ndarray) -> int:
        n = len(order)
        if not len(self.bytes):
            return self.fixed
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        a = pos[self.first]
        b = a.copy()
        if len(self.uses):
            last = np.maximum.reduceat(pos[self.uses], self.starts)
            b[self.has_uses] = np.maximum(a[self.has_uses], last)
        delta = np.zeros(n + 1, dtype=np.int64)
        np.add.at(delta, a, self.bytes)
        np.add.at(delta, b + 1, -self.bytes)
        return self.fixed + int(np.cumsum(delta).max())


class _Problem:
    """The graph-side arrays the operators need, built once per search."""

    def __init__(self, cg: CompiledGraph, dag: genetics.Precedence, budget_bytes: int):
        self.cg, self.dag, self.budget = cg, dag, int(budget_bytes)
        self.small = _SmallPool(cg)
        self._need: dict[tuple[int, ...], np.ndarray] = {}
        self._default_cls: tuple[int, ...] | None = None

    def default_cls(self, schedule: np.ndarray) -> tuple[int, ...]:
        """The default allocation's CLS (one class per size unless the floor does
        not fit), fixed by the first schedule asked about: the small pool it
        leaves out of the budget barely moves between schedules."""
        if self._default_cls is None:
            pool = max(self.budget - self.small.peak(schedule), 0)
            self._default_cls = default_classes(self.cg, pool)
        return self._default_cls

    def need(self, cls: tuple[int, ...]) -> np.ndarray:
        """Most objects of each class one op uses at once (the repair's floor)."""
        got = self._need.get(cls)
        if got is None:
            n_classes = max(cls) + 1
            got = self.cg.op_class_need(self.buf_class(cls), n_classes)
            self._need[cls] = got
        return got

    def buf_class(self, cls: Sequence[int]) -> np.ndarray:
        return np.asarray(cls, dtype=np.int32)[self.cg.buf_size_index]

    def fit(self, schedule: np.ndarray, cls: tuple[int, ...],
            cnt: Sequence[int]) -> Individual:
        """The individual with CNT cut to the budget left by its small-tensor pool
        (allocation None when even the floor does not fit: infeasible)."""
        small = self.small.peak(schedule)
        sizes = class_sizes(self.cg.ts, cls)
        try:
            cnt = repair_counts(sizes, cnt, self.budget - small, min_count=self.need(cls))
        except Infeasible:
            return Individual(schedule, cls, tuple(int(c) for c in cnt), None)
        alloc = Allocation(class_bytes=sizes, class_count=cnt, small_pool_bytes=small,
                           small_threshold_bytes=self.cg.small_threshold_bytes)
        return Individual(schedule, cls, cnt, alloc)

    def default(self, schedule: np.ndarray) -> Individual:
        """plan_swaps' allocation for ``schedule`` (CLS: :meth:`default_cls`)."""
        cls = self.default_cls(schedule)
        try:
            alloc = default_allocation(self.cg, schedule.astype(np.int32), self.budget, cls)
        except Infeasible:
            return Individual(schedule, cls, (0,) * (max(cls, default=-1) + 1), None)
        return Individual(schedule, cls, alloc.class_count, alloc)

    def demand_counts(self, schedule: np.ndarray, cls: tuple[int, ...]) -> tuple[int, ...]:
        """Objects of each class live at once under ``schedule`` without swapping."""
        n_classes = max(cls) + 1
        return tuple(int(c) for c in self.cg.class_demand(schedule.astype(np.int32),
                                                          self.buf_class(cls), n_classes))


class _Finalists:
    """The ``size`` best feasible individuals seen, in the order they ranked."""

    def __init__(self, size: int):
        self.size = size
        self.items: list[tuple[float, int, Individual]] = []
        self.seen = 0

    def offer(self, individuals: list[Individual]) -> None:
        for ind in individuals:
            self.seen += 1
            if ind.allocation is not None and math.isfinite(ind.time_s):
                self.items.append((ind.time_s, self.seen, ind))
        self.items.sort(key=lambda e: e[:2])
        del self.items[self.size:]

    def ranked(self) -> list[Individual]:
        return [e[2] for e in self.items]


def _toolbox(problem: _Problem, cfg: SearchConfig) -> base.Toolbox:
    tb = base.Toolbox()
    dag, p = problem.dag, cfg.mutation_probability
    tb.register("mate_schedules", genetics.crossover_schedules)
    tb.register("mate_allocations", genetics.crossover_allocations)
    tb.register("mutate_schedule", genetics.mutate_schedule, dag=dag, probability=p)
    tb.register("mutate_classes", genetics.mutate_classes, probability=p)
    tb.register("mutate_counts", genetics.mutate_counts, probability=p,
                relative_sigma=cfg.count_sigma)
    tb.register("select", genetics.softmax_select, temperature=cfg.selection_temperature)
    return tb


def _initial_population(problem: _Problem, cfg: SearchConfig, default_order: np.ndarray,
                        rng: np.random.Generator, tb: base.Toolbox) -> list[Individual]:
    heuristic = problem.default(default_order)
    if cfg.mode == "allocation":
        bases = [default_order]
    else:
        greedy = genetics.memory_greedy_schedule(problem.cg.graph, problem.dag,
                                                 tie_break=default_order)
        bases = [default_order, greedy]
    population = [problem.default(b) for b in bases]
    population[0] = heuristic
    k = 0
    while len(population) < cfg.population_size:
        population.append(_random_individual(problem, cfg.mode, bases[k % len(bases)],
                                             heuristic.cls, rng, tb))
        k += 1
    return population


def _random_individual(problem: _Problem, mode: str, base_order: np.ndarray,
                       start_cls: tuple[int, ...], rng: np.random.Generator,
                       tb: base.Toolbox) -> Individual:
    """A first-generation individual: ``base_order`` mutated at a random rate, a
    random class map, as many objects as its schedule keeps live, cut to the budget."""
    schedule = base_order if mode == "allocation" else tb.mutate_schedule(
        base_order, rng=rng, probability=float(rng.uniform(0.0, 1.0)))
    if mode == "schedule" or len(problem.cg.ts) == 0:
        return problem.default(schedule)
    cls = genetics.mutate_classes(start_cls, float(rng.uniform(0.0, 1.0)), rng)
    return problem.fit(schedule, cls, problem.demand_counts(schedule, cls))


def random_individuals(graph: DataflowGraph, budget_bytes: int, *,
                       initial_schedule: Sequence[str] | None = None, keep: Sequence[str] = (),
                       small_threshold_bytes: int = 1 << 20, seed: int = 0,
                       compiled: CompiledGraph | None = None, max_misses: int = 1000):
    """Endless (schedule op names, Allocation) pairs drawn as the search's first
    generation draws them (TF's order or the memory-greedy order, mutated at a
    random rate; a random class map; counts cut to ``budget_bytes``).  Pairs
    whose allocation cannot fit the budget are skipped; ``max_misses`` such
    draws in a row raise Infeasible (the budget is too small for random orders).
    For studies of the simulator against measurement (``benchmarks/fidelity.py``).

    Example::

        draws = random_individuals(graph, 6 << 30, initial_schedule=tf_order, seed=1)
        schedule, allocation = next(draws)
        plan_swaps(graph, 6 << 30, spec, schedule=schedule, allocation=allocation)
    """
    cg = compiled if compiled is not None else CompiledGraph.build(
        graph, small_threshold_bytes, keep)
    dag = genetics.Precedence.of(graph)
    problem = _Problem(cg, dag, budget_bytes)
    tb = _toolbox(problem, SearchConfig(time_budget_s=None, max_generations=0))
    rng = np.random.default_rng(seed)
    default_order = cg.order_of(initial_schedule).astype(np.int64)
    start_cls = problem.default(default_order).cls
    bases = [default_order, genetics.memory_greedy_schedule(graph, dag, tie_break=default_order)]
    if max_misses < 1:
        raise ValueError(f"max_misses must be >= 1, got {max_misses}")
    k = misses = 0
    while True:
        ind = _random_individual(problem, "joint", bases[k % len(bases)], start_cls, rng, tb)
        k += 1
        if ind.allocation is not None:
            misses = 0
            yield [graph.ops[int(o)].name for o in ind.schedule], ind.allocation
            continue
        misses += 1
        if misses >= max_misses:
            raise Infeasible(f"{misses} random individuals in a row do not fit "
                             f"{budget_bytes} bytes (their small-tensor pool and the "
                             "objects one op needs at once); give a larger budget")


def _offspring(problem: _Problem, cfg: SearchConfig, population: list[Individual],
               rng: np.random.Generator, tb: base.Toolbox) -> list[Individual]:
    children = []
    for _ in range(cfg.crossovers_per_generation):
        i, j = rng.choice(len(population), size=2, replace=False)
        a, b = population[int(i)], population[int(j)]
        if cfg.mode == "allocation":
            schedules = [a.schedule, a.schedule]
        else:
            schedules = list(tb.mate_schedules(a.schedule, b.schedule, rng))
        if cfg.mode == "schedule" or len(problem.cg.ts) == 0:
            allocations = [None, None]
        else:
            allocations = list(tb.mate_allocations((a.cls, a.cnt), (b.cls, b.cnt), rng))
        for s in schedules:
            for alloc in allocations:
                children.append(_mutant(problem, cfg, s, alloc, rng, tb))
    return children


def _mutant(problem, cfg, schedule, alloc, rng, tb) -> Individual:
    if cfg.mode != "allocation":
        schedule = tb.mutate_schedule(schedule, rng=rng)
    if alloc is None:
        return problem.default(schedule)
    cls, cnt = alloc
    new_cls = tb.mutate_classes(cls, rng=rng)
    if new_cls != cls:
        cnt = genetics.remap_counts(cls, cnt, new_cls)
    cnt = tb.mutate_counts(cnt, rng=rng)
    return problem.fit(schedule, new_cls, cnt)


def _evaluate(evaluator: Evaluator, individuals: list[Individual]) -> None:
    todo = [ind for ind in individuals if ind.allocation is not None]
    times = evaluator.map([(ind.schedule.astype(np.int32), ind.allocation) for ind in todo])
    for ind, t in zip(todo, times):
        ind.fitness.values = (t,)
    for ind in individuals:
        if ind.allocation is None:
            ind.fitness.values = (math.inf,)


def _select(population: list[Individual], cfg: SearchConfig, best_time: float,
            rng: np.random.Generator, tb: base.Toolbox) -> list[Individual]:
    times = np.array([ind.time_s for ind in population])
    elite = np.argsort(times, kind="stable")[:cfg.elite]
    rest = np.setdiff1d(np.arange(len(population)), elite)
    k = cfg.population_size - len(elite)
    drawn = rest[tb.select(times[rest], k, rng, best_time=best_time)] if k else rest[:0]
    return [population[int(i)] for i in np.concatenate([elite, drawn])]


def _stats(generation, start, evaluations, population) -> GenerationStats:
    times = np.array([ind.time_s for ind in population])
    finite = times[np.isfinite(times)]
    if len(finite):
        best, mean, worst = float(finite.min()), float(finite.mean()), float(finite.max())
    else:
        best = mean = worst = math.inf
    return GenerationStats(generation, time.monotonic() - start, evaluations, best, mean,
                           worst, int(len(times) - len(finite)))


def _show(stats: GenerationStats, end: str = "") -> None:
    sys.stderr.write(f"\rtfswap.ga gen {stats.generation:4d}  {stats.elapsed_s:7.1f} s  "
                     f"{stats.evaluations:7d} sims  best {stats.best_time_s:.6g} s  "
                     f"mean {stats.mean_time_s:.6g} s  worst {stats.worst_time_s:.6g} s"
                     f"  {end}")
    sys.stderr.flush()


def plan(graph: DataflowGraph, budget_bytes: int, spec: DeviceSpec, *,
         config: SearchConfig = SearchConfig(), initial_schedule: Sequence[str] | None = None,
         keep: Sequence[str] = (), recency_margin_s: float = 0.0,
         params_start_on_host: bool = False, small_threshold_bytes: int = 1 << 20,
         compiled: CompiledGraph | None = None, polish=None) -> SearchResult:
    """Search schedules and allocations for ``graph`` under ``budget_bytes`` on ``spec``.

    ``initial_schedule``: TF's default (executed) order, op names; None: the
    graph's topological order.  ``keep``, ``recency_margin_s``,
    ``params_start_on_host``, ``small_threshold_bytes`` and ``compiled`` mean
    what they mean for :func:`~tfswap.core.planner.plan_swaps`.
    ``polish(plan) -> plan``: a pass applied to the finished plan (the
    recomputation pass).  Returns the
    best individual's Plan (``planner="tfswap.ga"``), its Evaluation and the
    history (Fig. 9's best/mean/worst per generation).  Raises
    :class:`~tfswap.core.infeasible.Infeasible` when no individual fits the budget.

    Example::

        res = plan(graph, 6 << 30, device_spec("v100-16g-pcie3"),
                   config=SearchConfig(max_generations=50, time_budget_s=None))
        res.plan.prediction.step_time_s <= res.heuristic_time_s   # True
    """
    if not isinstance(config, SearchConfig):
        raise TypeError(f"config must be a SearchConfig, got {type(config).__name__}")
    check_planner_arguments(budget_bytes, spec)
    if compiled is None:
        compiled = CompiledGraph.build(graph, small_threshold_bytes, keep)
    elif compiled.graph is not graph:
        raise ValueError("compiled was built from another graph; pass "
                         "CompiledGraph.build(graph, ...) of this graph")
    if config.pool_layout == "shared":
        return shared_search.search_shared(_search, graph, budget_bytes, spec, config, compiled,
                              polish=polish,
                              initial_schedule=initial_schedule, keep=keep,
                              recency_margin_s=recency_margin_s,
                              params_start_on_host=params_start_on_host,
                              small_threshold_bytes=small_threshold_bytes)
    res = _search(graph, budget_bytes, spec, config, compiled, initial_schedule=initial_schedule,
                  keep=keep, recency_margin_s=recency_margin_s,
                  params_start_on_host=params_start_on_host,
                  small_threshold_bytes=small_threshold_bytes)
    return res if polish is None else replace(res, plan=polish(res.plan))


def _search(graph, budget_bytes, spec, config, cg, *, initial_schedule, keep, recency_margin_s,
            params_start_on_host, small_threshold_bytes) -> SearchResult:
    """The genetic search for a disjoint pool of ``budget_bytes``."""
    start = time.monotonic()
    rng = np.random.default_rng(config.seed)
    default_order = cg.order_of(initial_schedule).astype(np.int64)
    problem = _Problem(cg, genetics.Precedence.of(graph), budget_bytes)
    tb = _toolbox(problem, config)
    workers = config.workers if config.workers is not None else (os.cpu_count() or 1)

    with Evaluator(cg, spec, recency_margin_s=recency_margin_s,
                   params_start_on_host=params_start_on_host, workers=workers,
                   executor=config.executor) as evaluator:
        population = _initial_population(problem, config, default_order, rng, tb)
        _evaluate(evaluator, population)
        finalists = _Finalists(FINALISTS)
        finalists.offer(population)
        heuristic_time = population[0].time_s
        best = min(population, key=lambda ind: ind.time_s)
        history = [_stats(0, start, evaluator.evaluations, population)]
        if config.progress:
            _show(history[-1])
        since_better, generation, reason = 0, 0, ""
        while True:
            if config.max_generations is not None and generation >= config.max_generations:
                reason = "max generations"
                break
            if config.time_budget_s is not None and \
                    time.monotonic() - start >= config.time_budget_s:
                reason = "time budget"
                break
            if config.patience is not None and since_better >= config.patience:
                reason = "patience"
                break
            if config.stop_when is not None and config.stop_when():
                reason = "stopped"
                break
            generation += 1
            children = _offspring(problem, config, population, rng, tb)
            _evaluate(evaluator, children)
            finalists.offer(children)
            gen_best = min(children, key=lambda ind: ind.time_s)
            if gen_best.time_s < best.time_s:
                best, since_better = gen_best, 0
            else:
                since_better += 1
            population = _select(population + children, config, best.time_s, rng, tb)
            history.append(_stats(generation, start, evaluator.evaluations, population))
            if config.progress:
                _show(history[-1])
        evaluations = evaluator.evaluations
    if config.progress:
        _show(history[-1], end=f"  ({reason})\n")

    if best.allocation is None or not math.isfinite(best.time_s):
        raise Infeasible(f"no schedule and allocation fit the budget of {budget_bytes} bytes "
                         "(each op's inputs and outputs must fit at once, with the "
                         "small-tensor pool); raise the memory budget")
    rejected = 0
    for ind in finalists.ranked():
        order = ind.schedule.astype(np.int32)
        try:
            # The reference planner and simulator re-check what the native library scored.
            result_plan = plan_swaps(graph, budget_bytes, spec,
                                     schedule=[graph.ops[int(o)].name for o in order],
                                     allocation=ind.allocation, keep=keep,
                                     recency_margin_s=recency_margin_s,
                                     params_start_on_host=params_start_on_host,
                                     small_threshold_bytes=small_threshold_bytes, compiled=cg)
        except PlanError as err:
            rejected += 1
            warnings.warn(f"tfswap.ga: the reference simulator rejected the plan of a candidate "
                          f"scored {ind.time_s:.6g} s ({err}); trying the next best. This is a "
                          "planner bug: please report it with the graph", RuntimeWarning,
                          stacklevel=2)
            continue
        best_eval = evaluate(cg, order, ind.allocation, spec,
                             recency_margin_s=recency_margin_s,
                             params_start_on_host=params_start_on_host)
        return SearchResult(plan=replace(result_plan, planner=PLANNER_NAME),
                            best_evaluation=best_eval, history=tuple(history),
                            heuristic_time_s=heuristic_time, generations=generation,
                            evaluations=evaluations, stopped_because=reason, config=config,
                            plans_rejected=rejected)
    raise RuntimeError(f"the reference simulator rejected the plans of all {rejected} best "
                       "candidates (a planner bug); please report it with the graph")
