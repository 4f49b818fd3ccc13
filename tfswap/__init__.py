"""tfswap: train and serve TensorFlow models larger than accelerator memory.

Importing ``tfswap`` does not import TensorFlow; ``tfswap.core`` never does.
TensorFlow-facing code lives in ``tfswap.tf`` and ``tfswap.ops``.
"""

from tfswap.core.plan import Plan, Prediction, Swap

__version__ = "0.1.0"
__all__ = ["Plan", "Prediction", "Swap", "__version__"]
