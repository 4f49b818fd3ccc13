"""The whole suite's emulated device runs TensorFlow's oneDNN CPU kernels.

TF 2.21's Linux x86 wheel turns oneDNN on by itself only on CPUs with
AVX-512 VNNI / BF16 / AMX; elsewhere (an AVX2-only AMD EPYC, say) the step
runs TF's own kernels, whose convolution gradients take a scratch buffer
sized from the CPU's L3 cache (26.8 MB on a 32 MiB L3, even for an 8x8x4
image), so the small steps the tests plan at 50-70% of their peak cannot
fit at all, and the runtime merges differ (:mod:`tfswap.tf.grappler`).  The
tests' figures were made on the oneDNN kernels, so the fixture asks for
them on every machine; a run that sets ``TF_ENABLE_ONEDNN_OPTS`` itself
keeps its choice.  Child processes (the benchmarks' tests) inherit it.

``tfswap.keras.SwapCallback`` keeps plans under the user's cache directory by
default; each test module, and each test, gets a cache directory of its own
(``XDG_CACHE_HOME``), so that no test loads a plan another one saved (a
module-scoped fixture's callback uses its module's), and nothing is left in
``~/.cache``.  Child processes inherit the variable.
"""

import os

import pytest

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


@pytest.fixture(scope="module", autouse=True)
def _module_plan_cache(tmp_path_factory):
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if previous is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.fixture(autouse=True)
def _test_plan_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
