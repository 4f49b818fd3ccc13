"""The allocation encoding of SwapAdvisor §5.3 (TS, CLS, CNT) and its repair."""

import pytest

from tfswap.core import allocation as al
from tfswap.core.infeasible import Infeasible

MB = 1 << 20


def test_fig1_encodings():
    ts = (MB, 2 * MB)
    coarse = al.from_encoding(ts, cls=(0, 0), cnt=(5,))
    fine = al.from_encoding(ts, cls=(0, 1), cnt=(8, 1))
    assert coarse.class_bytes == (2 * MB,) and coarse.pool_bytes == 10 * MB
    assert fine.class_bytes == (MB, 2 * MB) and fine.pool_bytes == 10 * MB
    assert al.size_class_of(fine, MB) == 0 and al.size_class_of(coarse, MB) == 0


def test_fig5_crossover_repairs():
    # CLS_C1 = [1,2,1,1] (1-based) is repaired to [1,2,2,2].
    assert al.repair_classes((0, 1, 0, 0)) == (0, 1, 1, 1)
    assert al.repair_classes((0, 0, 1, 1)) == (0, 0, 1, 1)
    assert al.repair_classes((3, 5, 9, 2)) == (0, 1, 2, 2)
    # CNT_EXT of CNT2 = [8, 1] under CLS2 = [1,2,2,2] is [8,1,1,1].
    assert al.expand_counts((0, 1, 1, 1), (8, 1)) == (8, 1, 1, 1)
    assert al.expand_counts((0, 0, 0, 0), (4,)) == (4, 4, 4, 4)
    # CNT_EXT_C1 = [8,1,4,4] under CLS_C1 = [1,2,2,2] averages to [8, 3] ...
    assert al.collapse_counts((0, 1, 1, 1), (8, 1, 4, 4)) == (8, 3)
    # ... which takes 20 MB of a 12 MB device and is repaired to [4, 2].
    sizes = al.class_sizes((MB, 2 * MB, 3 * MB, 4 * MB), (0, 1, 1, 1))
    assert sizes == (MB, 4 * MB)
    assert al.repair_counts(sizes, (8, 3), 12 * MB) == (4, 2)


def test_repair_counts_respects_minimum_and_budget():
    assert al.repair_counts((1, 4), (8, 3), 100) == (8, 3)  # fits: unchanged
    out = al.repair_counts((1, 4), (20, 10), 16, min_count=(2, 3))
    assert out[1] >= 3 and out[0] >= 2 and out[0] * 1 + out[1] * 4 <= 16
    with pytest.raises(Infeasible, match="raise the memory budget"):
        al.repair_counts((1, 4), (8, 3), 10, min_count=(0, 3))


def test_bad_encodings_say_what_to_do():
    with pytest.raises(ValueError, match="repair_classes"):
        al.from_encoding((1, 2), (0, 2), (1, 1, 1))
    with pytest.raises(ValueError, match="one class per size"):
        al.class_sizes((1, 2), (0,))
    with pytest.raises(ValueError, match="no size class holds"):
        al.size_class_of(al.from_encoding((1, 2), (0, 0), (3,)), 5)


def test_fitting_classes_merges_neighbours_until_the_floor_fits():
    import numpy as np
    usage = np.array([[2, 0], [0, 2]])  # op 0: two 1-byte objects, op 1: two 2-byte
    assert al.fitting_classes((1, 2), usage, (0, 0), budget_bytes=6) == (0, 1)  # 2 + 4 fits
    assert al.fitting_classes((1, 2), usage, (0, 0), budget_bytes=5) == (0, 0)  # one 2-byte class: 4
    # Nothing fits 1 byte: the lowest floor found comes back (merged: 2 * (2 + 3) = 10
    # against 1 * 2 + 2 * (2 + 3) = 12) for the repair to reject with its message.
    assert al.fitting_classes((1, 2), usage, (0, 3), budget_bytes=1) == (0, 0)
    # A merge that raises the floor is not taken: one op uses both sizes at once.
    assert al.fitting_classes((1, 2), np.array([[1, 1]]), (0, 0), budget_bytes=1) == (0, 1)
    assert al.fitting_classes((), np.zeros((0, 0)), (), budget_bytes=0) == ()
