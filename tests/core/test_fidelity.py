"""Error and ordering statistics of simulated against measured (benchmarks/fidelity.py)."""

import numpy as np
import pytest

from research import fidelity


def test_relative_errors_sign_says_who_was_optimistic():
    err = fidelity.relative_errors([1.0, 2.0], [1.25, 1.6])
    np.testing.assert_allclose(err, [0.2, -0.25])


def test_relative_errors_refuses_mismatched_or_nonpositive():
    with pytest.raises(ValueError, match="one length"):
        fidelity.relative_errors([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        fidelity.relative_errors([1.0], [0.0])


def test_orders_kept_one_swapped_neighbour_pair_costs_one_point():
    sim = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert fidelity.orders_kept(sim, [1.1, 2.1, 3.1, 4.1, 5.1]) == 5
    # The paper's Fig. 11 case: the last two swap places -> 4 of 5.
    assert fidelity.orders_kept(sim, [1.1, 2.1, 3.1, 5.2, 5.1]) == 4
    # Input order does not matter, only the simulated ranking.
    assert fidelity.orders_kept(sim[::-1], [5.1, 5.2, 3.1, 2.1, 1.1]) == 4
    assert fidelity.orders_kept([], []) == 0


def test_pairs_kept_counts_concordant_pairs():
    assert fidelity.pairs_kept([1, 2, 3], [1, 2, 3]) == (3, 3)
    assert fidelity.pairs_kept([1, 2, 3], [3, 2, 1]) == (0, 3)
    assert fidelity.pairs_kept([1, 1, 3], [2, 1, 3]) == (3, 3)   # a simulated tie keeps


def test_spread_and_summary():
    assert fidelity.spread([1.0, 1.0, 1.0]) == 0.0
    assert fidelity.spread([0.9, 1.0, 1.1, 1.0]) == pytest.approx(0.05)
    s = fidelity.summary([1.0, 2.0, 3.0], [1.1, 1.8, 3.3])
    assert s["n"] == 3 and s["orders_kept"] == 3 and s["pairs_kept"] == 3
    assert s["median_abs_error"] == pytest.approx(0.1 / 1.1)
    assert s["max_abs_error"] == pytest.approx(0.2 / 1.8)
