"""What a BudgetError names when no plan fits (tfswap.budget_advice)."""

from types import SimpleNamespace

from tfswap.budget_advice import ABOVE_ESTIMATE, below_working_set
from tfswap.core.budget import BudgetError
from tfswap.core.infeasible import Infeasible


def test_a_refusal_above_the_estimated_smallest_budget_names_a_larger_one():
    # Fuzz seed 7147 (before the memory-greedy schedule planned it): the smallest
    # budget was estimated at 1,081,786 B and no plan fitted the 1,126,853 B
    # drawn.  Naming the estimate would send the user to a budget that fails too.
    prepared = SimpleNamespace(budget_bytes=1_126_853,
                               options=SimpleNamespace(memory_budget=1_126_853))
    error = below_working_set(prepared, None, 1_081_786, Infeasible("nothing fits"))
    assert isinstance(error, BudgetError)
    assert error.smallest_bytes == int(ABOVE_ESTIMATE * 1_126_853) + 1
    assert "not monotone" in str(error) and str(error.smallest_bytes) in str(error)
