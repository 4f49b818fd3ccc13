"""What :func:`tfswap.pipeline.plan` hands a planner for an attempt
(:func:`planner_settings`): the genetic search's settings (its share of the
call's deadline or its generations, seed, workers, and ``stop_when``, which
ends a background search early), the pool layout and the allocator that will
serve the step, each to the planners whose signature takes it.

Example::

    planners.run(name, problem, budget, spec, **planner_settings(name, prepared, attempt))
"""

from __future__ import annotations

import inspect
import time

from tfswap.budget_arena import allocator_of
from tfswap.core import planners
from tfswap.core.search_config import SearchConfig


def planner_settings(name: str, prepared, attempt, share: float = 1.0) -> dict:
    """The keyword arguments planner ``name`` takes of ``attempt`` (``prepared``,
    ``attempt``: :mod:`tfswap.pipeline`'s values): the genetic search's settings
    (``config``, :func:`search_config`), the pool layout (``layout``) and what
    serves the step's memory (``allocator``)."""
    takes = inspect.signature(planners.get(name)).parameters
    options = {}
    if "config" in takes:
        options["config"] = search_config(prepared, attempt, share)
    if "layout" in takes:
        options["layout"] = attempt.pool_layout
    if "allocator" in takes:
        # What must fit: the plan's pool where a budget arena serves the step,
        # else the bytes TensorFlow's allocator holds (each buffer its own).
        options["allocator"] = allocator_of(prepared, attempt)
    return options


def search_config(prepared, attempt, share: float = 1.0) -> SearchConfig:
    """The genetic search's settings for ``attempt``: ``options.generations``, or
    ``share`` of the time left before the call's deadline."""
    o = prepared.options
    limit: dict = {"time_budget_s": None, "max_generations": o.generations}
    if o.generations is None:
        left = (prepared.deadline - time.monotonic()) * share
        # Past the deadline: the first generation only (TF's order and its mutants).
        limit = {"time_budget_s": left, "max_generations": None} if left > 0 else \
            {"time_budget_s": None, "max_generations": 0}
    return SearchConfig(**limit, seed=o.seed, workers=o.workers, executor=o.executor,
                        progress=o.progress, pool_layout=attempt.pool_layout,
                        stop_when=prepared.stop_when)


__all__ = ["planner_settings", "search_config"]
