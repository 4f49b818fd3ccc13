"""The one "does not fit" exception of every planner.

It is deliberately not a ``ValueError``: a bad argument (a ``ValueError``)
must never be read as "raise your budget", so code that decides feasibility
catches :class:`Infeasible` and nothing broader.

Example::

    from tfswap.core.infeasible import Infeasible
    try:
        result = planners.run("tfswap.order", problem, budget_bytes, spec)
    except Infeasible as err:
        print("needs at least", err.need_bytes, "bytes")
"""

from __future__ import annotations


class Infeasible(Exception):
    """The step cannot be planned within the budget.

    ``need_bytes``: the bytes the planner found it needed (None where it does
    not know).
    """

    def __init__(self, message: str, need_bytes: int | None = None):
        super().__init__(message)
        self.need_bytes = need_bytes


class InfeasibleAllocation(Infeasible):
    """An op needs more objects of a size class (or bytes) than the pool has."""


class UnsupportedProblem(Exception):
    """The planner cannot express this problem (e.g. parameters that start on the
    host, for a planner that keeps every parameter on the device)."""


__all__ = ["Infeasible", "InfeasibleAllocation", "UnsupportedProblem"]
