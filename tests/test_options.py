"""tfswap.Options: every setting of optimize and SwapCallback declared, defaulted and
checked in one place (no TensorFlow)."""

import subprocess
import sys
from dataclasses import fields

import pytest

import tfswap
from tfswap.options import Options


@pytest.mark.parametrize("setting, value, words", [
    ("memory_budget", None, "memory_budget must be"),
    ("memory_budget", True, "memory_budget must be"),
    ("profile", "traced", "profile must be one of"),
    ("parameters", "gpu", "parameters must be one of"),
    ("planner", "fastest", "planner must be one of the registered planners"),
    ("safety_margin", 1.0, "safety_margin must be a fraction"),
    ("search_time", 0, "search_time must be > 0 seconds"),
    ("search_time", True, "search_time must be > 0 seconds"),
    ("small_tensor_bytes", -1, "small_tensor_bytes must be an int"),
    ("recompute", "yes", "recompute must be True or False"),
    ("verify_rounds", -1, "verify_rounds must be an int"),
    ("generations", -1, "max_generations"),
    ("workers", 0, "workers"),
])
def test_a_bad_setting_is_refused_on_construction_naming_it(setting, value, words):
    settings = {"memory_budget": "1MiB", setting: value}
    with pytest.raises(ValueError, match=words):
        Options(**settings)
    if value is not None:   # replace(memory_budget=None) keeps the budget (below)
        with pytest.raises(ValueError, match=words):
            Options("1MiB").replace(**{setting: value})


def test_unknown_settings_are_named_with_the_ones_there_are():
    with pytest.raises(TypeError) as caught:
        Options.of("1MiB", generation=3, seeds=1)
    text = str(caught.value)
    assert "'generation'" in text and "'seeds'" in text
    assert all(f.name in text for f in fields(Options))


def test_replace_keeps_the_rest_and_a_missing_budget_keeps_the_budget():
    options = Options("12MiB", seed=3, generations=5)
    other = options.replace(memory_budget=None, generations=7)
    assert (other.memory_budget, other.seed, other.generations) == ("12MiB", 3, 7)
    assert options.generations == 5


def test_the_options_object_is_tfswaps_and_importing_it_needs_no_tensorflow():
    assert tfswap.Options is Options
    code = "import sys, tfswap; tfswap.Options('1MiB'); assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
