"""tfswap: train and serve TensorFlow models larger than accelerator memory.

Importing ``tfswap`` does not import TensorFlow; ``tfswap.core`` never does.
TensorFlow-facing code lives in ``tfswap.tf`` and ``tfswap.ops`` and is
imported when :func:`optimize` or :func:`load_plan` first runs.

``tfswap.keras`` (the Keras callback) imports Keras, so it is loaded on
first use, not with ``tfswap``.

Example::

    fast = tfswap.optimize(concrete_fn, memory_budget="12GiB")
    fast(x, y)
    fast = tfswap.optimize(concrete_fn, "12GiB", background=True)   # starts at once
    model.fit(ds, callbacks=[tfswap.keras.SwapCallback(memory_budget="12GiB")])
"""

import importlib

from tfswap.core.budget import BudgetError
from tfswap.core.plan import Plan, Prediction, Swap
from tfswap.options import Options

__version__ = "0.1.0"

# What imports TensorFlow (or Keras) is loaded on first use: name -> its module.
_LAZY = {"optimize": "tfswap.api", "load_plan": "tfswap.api",
         "OptimizedFunction": "tfswap.api", "PlanMismatchError": "tfswap.api",
         "NoDeviceError": "tfswap.tf.device", "AnytimeFunction": "tfswap.anytime"}


def __getattr__(name):
    if name == "keras":
        return importlib.import_module("tfswap.keras")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tfswap' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"keras"})


__all__ = ["AnytimeFunction", "BudgetError", "NoDeviceError", "OptimizedFunction", "Options", "Plan", "PlanMismatchError",
           "Prediction", "Swap", "load_plan", "optimize", "__version__"]
