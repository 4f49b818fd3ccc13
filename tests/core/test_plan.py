import pytest

from tfswap.core.plan import Plan, PlanFormatError, Prediction, Swap


def make_plan():
    return Plan(schedule=("a", "b", "c", "d"),
                swaps=(Swap("a:0", out_after="b", in_after="c", consumers=("d",), bytes=64),),
                budget_bytes=1024, prediction=Prediction(peak_bytes=512))


def test_json_round_trip(tmp_path):
    plan = make_plan()
    path = tmp_path / "p.json"
    plan.save(path)
    assert Plan.load(path) == plan


def test_rejects_duplicate_schedule_entries():
    with pytest.raises(ValueError, match="twice"):
        Plan(schedule=("a", "a"))


def test_rejects_unknown_wait():
    with pytest.raises(ValueError, match="unknown swaps"):
        Plan(schedule=("a",), swaps=(Swap("a:0", "a", "a", ("a",), in_wait_for=("x",)),))


def test_swap_needs_a_consumer():
    with pytest.raises(ValueError, match="freed, not swapped"):
        Swap("a:0", "a", "b", consumers=())


@pytest.mark.parametrize("text, message", [
    ("{not json", "invalid JSON"),
    ('{"kind": "other"}', "missing kind"),
    ('{"kind": "tfswap.plan", "format_version": 99}', "version 99"),
    ('{"kind": "tfswap.plan", "format_version": 1, "schedule": [], "bogus": 1}', "corrupted"),
])
def test_bad_plan_files_say_what_is_wrong(text, message):
    with pytest.raises(PlanFormatError, match=message):
        Plan.from_json(text)
