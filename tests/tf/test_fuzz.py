"""The fuzz property on a few random steps (the long run: benchmarks/fuzz.py)."""

from tfswap.tf import fuzz

# Seeds whose random budget forces swaps (see the fuzz run in benchmarks/RESULTS.md).
SEEDS = (3, 4, 5, 15, 16)


def test_random_steps_are_reproducible_from_their_seed():
    a, b = fuzz.random_step(4), fuzz.random_step(4)
    assert a.ops == b.ops and [v.shape for v in a.variables] == [v.shape for v in b.variables]
    assert (a.batch[0] == b.batch[0]).all()
    assert fuzz.random_step(5).ops != a.ops


def test_optimize_at_random_feasible_budgets_is_exact_and_mostly_within_them():
    """Never a wrong result or an error.  The measured peak is held to the budget
    on most seeds only: the traced order and the swap thread's timing vary between
    runs, so a seed's outcome does too (benchmarks/RESULTS.md: 7 of 500 over the
    budget, 17 refused; not fixed)."""
    outcomes = [fuzz.check(seed) for seed in SEEDS]
    for outcome in outcomes:
        assert "results differ" not in outcome.detail, outcome.detail
        assert "Traceback" not in outcome.detail, outcome.detail
    passed = [o for o in outcomes if o.status == "passed"]
    assert len(passed) >= 2, [(o.seed, o.status, o.detail[:200]) for o in outcomes]
    assert all(o.swaps > 0 for o in passed)


def test_a_failure_is_reported_not_raised():
    outcome = fuzz.check(0, max_ops=0)
    assert outcome.status == "failed" and "max_ops must be >= 1" in outcome.detail
