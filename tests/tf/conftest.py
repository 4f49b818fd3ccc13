"""TF-level tests run on the emulated device (CPU:0 device, CPU:1 host)."""

import pytest

tf = pytest.importorskip("tensorflow")

from tfswap.tf import emulate  # noqa: E402

emulate.setup()  # before any test creates a tensor
