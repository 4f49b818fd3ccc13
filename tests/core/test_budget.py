import pytest

from tfswap.core.budget import BudgetError, parse_budget

GiB = 2**30


@pytest.mark.parametrize("text,expected", [
    ("12GiB", 12 * GiB), ("12 gib", 12 * GiB), ("800MB", 800 * 10**6), ("2.5 GB", 2_500_000_000),
    ("1e3 KiB", 1000 * 1024), ("4096B", 4096)])
def test_strings_with_units(text, expected):
    assert parse_budget(text) == expected


def test_int_is_bytes_and_float_is_a_fraction_of_the_device():
    assert parse_budget(123456) == 123456
    assert parse_budget(0.5, device_memory_bytes=16 * GiB) == 8 * GiB
    assert parse_budget(1.0, device_memory_bytes=1000) == 1000


@pytest.mark.parametrize("bad,needle", [
    (0, "> 0"), (-5, "> 0"), ("0GiB", "> 0"), (0.0, "> 0"), (-0.5, "> 0"),
    ("twelve", "cannot read"), ("12 parsecs", "cannot read"), ("12", "no unit"),
    (1.5, "fraction"), (float("nan"), "> 0"), (None, "must be bytes"), (True, "must be bytes"),
    ([1], "must be an int")])
def test_bad_budgets_say_what_to_pass(bad, needle):
    with pytest.raises(BudgetError, match=needle):
        parse_budget(bad, device_memory_bytes=16 * GiB)


def test_fraction_needs_the_device_memory():
    with pytest.raises(BudgetError, match="device's memory is unknown"):
        parse_budget(0.5)


def test_budget_above_the_device_is_refused():
    with pytest.raises(BudgetError, match="more than the device has"):
        parse_budget("20GiB", device_memory_bytes=16 * GiB)
