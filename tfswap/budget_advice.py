"""What a :class:`~tfswap.core.budget.BudgetError` tells the user: the smallest
budget that can work (:func:`smallest_budget`), what the step needs at once
(:func:`working_set_text`), and the errors :mod:`tfswap.pipeline` raises when
its remedies run out, each naming a budget to pass.

Example::

    raise below_working_set(prepared, attempt, smallest_budget(prepared, attempt), err)
"""

from __future__ import annotations

import numpy as np

from tfswap import budget_arena
from tfswap.core import planners, search
from tfswap.core.budget import BudgetError
from tfswap.core.infeasible import Infeasible
from tfswap.core.problem import Problem
from tfswap.replicas import replica_attempt

MINIMUM_SEARCH_DOUBLINGS = 6   # how far above the unconstrained peak a smallest budget is sought


def minimum_budget(prepared, attempt) -> int:
    """The smallest budget (with 5% headroom) whose planner budget a plan on TF's
    order fits (``prepared``, ``attempt``: :mod:`tfswap.pipeline`'s values): the
    swap planner's with its pool of size classes, or, where the byte-cap planner
    may plan the step, its plan held to the bytes the allocator that serves the
    step needs (:func:`tfswap.budget_arena.allocator_of`: with TensorFlow's own,
    each buffer its bytes).  The pool alone named 6.89 MiB for a GRU step whose
    unmodified peak is 4.0 MB and whose ``While`` needs 3.3 MB at once."""
    step = attempt.step
    need = _smallest_fit(step, prepared.spec, "tfswap.order")
    if not step.problem.host_parameters:
        memory = "live" if budget_arena.allocator_of(prepared, attempt) == "exact" else "shared"
        try:
            need = min(need, _smallest_fit(step, prepared.spec, search.BYTES_PLANNER_NAME,
                                           memory=memory))
        except Infeasible:
            pass
    # 5% headroom: the default schedule is TF's traced order, which varies from
    # run to run, and the bisection is for this run's order only.
    return int(1.05 * (need + attempt.outside_bytes) / (1.0 - prepared.options.safety_margin)) + 1


def _smallest_fit(step, spec, planner: str, **options) -> int:
    high = step.unconstrained.prediction.peak_bytes
    # The pool gives each size class the most objects one op uses at once, which
    # can exceed the unconstrained peak (parameters far larger than activations).
    for doubling in range(MINIMUM_SEARCH_DOUBLINGS + 1):
        try:
            need, _ = planners.fit_to_budget(planner, step.problem, spec, high=high, **options)
            return need
        except Infeasible:
            if doubling == MINIMUM_SEARCH_DOUBLINGS:
                raise
            high *= 2


def smallest_budget(prepared, attempt) -> int:
    """:func:`minimum_budget` of every replica's device (each must hold its part)."""
    return max([minimum_budget(prepared, attempt)] + [
        minimum_budget(prepared, replica_attempt(prepared, attempt, r))
        for r in prepared.replicas])


def working_set_text(problem: Problem) -> str:
    """Which op needs the most device memory at once, and what else is always there."""
    cg = problem.compiled
    per_op = cg.op_working_set()
    k = int(np.argmax(per_op))
    op = problem.graph.ops[k]
    pinned = problem.pinned_bytes
    small_peak = cg.small_pool_peak(cg.order_of(problem.schedule))
    return (f"op {op.name!r} ({op.type}) needs {int(per_op[k])} bytes at once for its inputs, "
            f"outputs and scratch, while the parameters that stay on the device take {pinned} "
            f"bytes and small tensors up to {small_peak} bytes")


def parameters_over(prepared, pinned: int, usable: int) -> BudgetError:
    """The device's parameters alone take more than the plan may use."""
    return BudgetError(
        f"memory_budget {prepared.options.memory_budget!r} ({prepared.budget_bytes} bytes): "
        f"the parameters that stay on the device take {pinned} bytes, more than the "
        f"{usable} bytes the plan may use; pass a budget well above {pinned} bytes.")


def measured_over(prepared, measured: int, err: Infeasible) -> BudgetError:
    """No plan fits the room left once a plan measured ``measured`` bytes."""
    return BudgetError(
        f"memory_budget {prepared.budget_bytes} bytes: the rewritten step measured "
        f"{measured} bytes on {prepared.device} (more than the memory model predicted), and "
        f"with that much less room no plan fits. Pass at least about {int(1.05 * measured) + 1} "
        f"bytes (what that plan measured, plus 5%), or raise safety_margin. (Planner: {err})")


# How much above a budget to suggest where no plan fits it though the estimate of
# the smallest budget is below it (fuzz seed 7147: estimated 1.08 MB, nothing
# fitted 1.13 MB): near that estimate the planners' fit is not monotone in the
# budget.
ABOVE_ESTIMATE = 1.1


def below_working_set(prepared, attempt, minimum: int, err: Infeasible) -> BudgetError:
    """No plan fits the budget; ``minimum`` is the smallest that can work (also
    the error's ``smallest_bytes``), or, where that estimate is not above the
    budget, :data:`ABOVE_ESTIMATE` times the budget."""
    if minimum <= prepared.budget_bytes:
        suggested = int(ABOVE_ESTIMATE * prepared.budget_bytes) + 1
        error = BudgetError(
            f"memory_budget {prepared.options.memory_budget!r} ({prepared.budget_bytes} "
            f"bytes): no plan fits it, though the smallest budget that can work is "
            f"estimated at about {minimum} bytes; near that estimate a plan's fit is not "
            f"monotone in the budget. Pass a somewhat larger budget, e.g. {suggested} bytes "
            f"({suggested / 2**20:.2f} MiB). (Planner: {err})")
        error.smallest_bytes = suggested
        return error
    error = BudgetError(
        f"memory_budget {prepared.options.memory_budget!r} ({prepared.budget_bytes} bytes) is "
        f"below what this step needs at once: {working_set_text(attempt.step.problem)}. The "
        f"smallest budget that can work is about {minimum} bytes ({minimum / 2**20:.2f} MiB); "
        f"pass at least that. (Planner: {err})")
    error.smallest_bytes = minimum
    return error


def still_over(replans: int, what: str, budget: int) -> BudgetError:
    """Every re-plan measured over the budget (``what``: how the last one did)."""
    return BudgetError(
        f"after {replans} re-plans {what} still exceeds memory_budget {budget} B "
        "or the device's free memory; pass a budget below the device's free memory, "
        "or raise the safety_margin")


__all__ = ["ABOVE_ESTIMATE", "MINIMUM_SEARCH_DOUBLINGS", "below_working_set", "measured_over",
           "minimum_budget", "parameters_over", "smallest_budget", "still_over",
           "working_set_text"]
