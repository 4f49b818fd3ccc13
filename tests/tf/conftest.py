"""TF-level tests run on the emulated device (CPU:0 device, CPU:1 host; CPU:2 a second
device for replicated steps)."""

import pytest

tf = pytest.importorskip("tensorflow")

from tfswap.tf import emulate  # noqa: E402

emulate.setup(replicas=2)  # before any test creates a tensor
