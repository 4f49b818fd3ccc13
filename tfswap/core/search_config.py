"""The genetic search's configuration and result types (:mod:`tfswap.core.search`
runs it; :mod:`tfswap.core.shared_search` repeats it for the shared pool layout).

Example::

    SearchConfig(population_size=32, max_generations=50, time_budget_s=None, seed=0)
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from tfswap.core.native import Evaluation
from tfswap.core.plan import Plan

MODES = ("joint", "schedule", "allocation")
POOL_LAYOUTS = ("disjoint", "shared")
PLANNER_NAME = "tfswap.ga"
# The byte-cap planner (tfswap.core.byte_planner) as registered.
BYTES_PLANNER_NAME = "tfswap.bytes"


@dataclass(frozen=True)
class SearchConfig:
    """Hyper-parameters and stopping rules of the genetic search.

    ``population_size`` (Np): individuals that survive each generation.
    ``crossovers_per_generation``: parent pairs crossed per generation; each
    gives 4 children.  ``mutation_probability`` (P): chance that a schedule
    step picks a random ready op, that a CLS entry moves, that a count is
    redrawn.  ``count_sigma``: standard deviation of a count's Gaussian
    mutation, relative to the count.  ``selection_temperature``: divides eq.
    1's normalised time (1.0 = the paper).  ``elite``: best individuals that
    always survive.  Stops at the first of ``time_budget_s`` (seconds of
    search), ``max_generations`` and ``patience`` (generations without a
    better best); at least one must be set.  ``workers``: threads of this
    process (None: all cores, 1: no pool; the native simulator releases the
    GIL, and no process is started, so the caller's script is never imported
    again) or, with ``executor`` (a
    ``concurrent.futures.Executor``, e.g. Dask's ``Client.get_executor()``),
    chunks per batch.  ``mode``: "joint", "schedule" (the allocation is
    plan_swaps' default for each schedule) or "allocation" (the schedule
    stays ``initial_schedule``): the ablations of the paper's Fig. 10.
    ``progress``: one self-updating line on stderr.
    ``pool_layout``: "disjoint" (the paper's pool: every object has memory of
    its own, so the objects must fit the budget) or "shared" (objects never
    in use together share memory, :mod:`tfswap.core.layout`: the search then
    plans pools larger than the budget and keeps the fastest plan whose
    shared arena fits; ``layout_rounds`` searches, the time budget split
    between them).
    ``stop_when``: a callable asked between generations; when it returns True
    the search ends with the best plan so far (``stopped_because``
    "stopped"): a search running in the background while the step trains
    on an earlier plan (:mod:`tfswap.anytime`) is ended this way.
    The search is one planner among tfswap's; the plan users get is the
    fastest of them all (:mod:`tfswap.core.best_of`, registered ``tfswap``).
    """

    population_size: int = 32
    crossovers_per_generation: int = 8
    mutation_probability: float = 0.02
    count_sigma: float = 0.25
    selection_temperature: float = 0.05
    elite: int = 1
    time_budget_s: float | None = 60.0
    max_generations: int | None = None
    patience: int | None = None
    seed: int = 0
    workers: int | None = None
    executor: Executor | None = field(default=None, compare=False)
    mode: str = "joint"
    progress: bool = False
    pool_layout: str = "disjoint"
    layout_rounds: int = 5
    stop_when: Callable[[], bool] | None = field(default=None, compare=False)

    def __post_init__(self):
        def positive_int(name, value, allow_none=False, minimum=1):
            if value is None and allow_none:
                return
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) \
                    or value < minimum:
                raise ValueError(f"SearchConfig.{name} must be an int >= {minimum}"
                                 f"{' or None' if allow_none else ''}, got {value!r}")

        positive_int("population_size", self.population_size, minimum=2)
        positive_int("crossovers_per_generation", self.crossovers_per_generation)
        positive_int("elite", self.elite, minimum=0)
        positive_int("max_generations", self.max_generations, allow_none=True, minimum=0)
        positive_int("patience", self.patience, allow_none=True)
        positive_int("workers", self.workers, allow_none=True)
        positive_int("seed", self.seed, minimum=0)
        if self.elite > self.population_size:
            raise ValueError(f"SearchConfig.elite ({self.elite}) cannot exceed "
                             f"population_size ({self.population_size})")
        if not 0.0 <= self.mutation_probability <= 1.0:
            raise ValueError("SearchConfig.mutation_probability must be in [0, 1], got "
                             f"{self.mutation_probability}")
        if not self.count_sigma >= 0:
            raise ValueError(f"SearchConfig.count_sigma must be >= 0, got {self.count_sigma}")
        if not self.selection_temperature > 0:
            raise ValueError("SearchConfig.selection_temperature must be > 0, got "
                             f"{self.selection_temperature}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"SearchConfig.time_budget_s must be > 0 seconds or None, got "
                             f"{self.time_budget_s}")
        if self.time_budget_s is None and self.max_generations is None and self.patience is None:
            raise ValueError("SearchConfig: set at least one of time_budget_s, max_generations "
                             "and patience, or the search never stops")
        positive_int("layout_rounds", self.layout_rounds)
        if self.pool_layout not in POOL_LAYOUTS:
            raise ValueError(f"SearchConfig.pool_layout must be one of {POOL_LAYOUTS}, got "
                             f"{self.pool_layout!r}")
        if self.mode not in MODES:
            raise ValueError(f"SearchConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.stop_when is not None and not callable(self.stop_when):
            raise TypeError(f"SearchConfig.stop_when must be a callable returning a bool, got "
                            f"{type(self.stop_when).__name__}")
        if self.executor is not None and not isinstance(self.executor, Executor):
            raise TypeError("SearchConfig.executor must be a concurrent.futures.Executor "
                            "(for Dask: distributed.Client(...).get_executor()), got "
                            f"{type(self.executor).__name__}")


@dataclass(frozen=True)
class GenerationStats:
    """One point of the paper's Fig. 9: the living population after selection.

    Times are simulated step times in seconds over feasible individuals
    (``infeasible`` counts the others); ``elapsed_s`` is search time so far,
    ``evaluations`` the simulations so far.
    """
    generation: int
    elapsed_s: float
    evaluations: int
    best_time_s: float
    mean_time_s: float
    worst_time_s: float
    infeasible: int


@dataclass(frozen=True)
class SearchResult:
    """The best plan found, its simulation, and how the search went."""
    plan: Plan
    best_evaluation: Evaluation
    history: tuple[GenerationStats, ...]
    heuristic_time_s: float    # plan_swaps on initial_schedule with the default allocation
    generations: int
    evaluations: int
    stopped_because: str       # "time budget", "max generations", "patience" or "stopped"
    config: SearchConfig
    # Best candidates skipped because the reference simulator rejected their plan.
    plans_rejected: int = 0
    # Pool sizes searched (the shared layout repeats the search; ``generations`` and
    # ``evaluations`` count them all, ``history`` is the chosen pool size's search).
    pool_rounds: int = 1
