"""A planner's plan made ready for the captured graph (:func:`finish`): what the
rewrite runs and what :func:`tfswap.load_plan` checks before it applies a saved plan.

Example::

    plan = finish(result.plan, captured, step.lowered, budget_bytes, outside_bytes)
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfswap.core.plan import Plan, Prediction
from tfswap.tf import capture
from tfswap.tf.tensor_swaps import tensor_swaps


def finish(found: Plan, captured, lowered, budget_bytes: int, outside_bytes: int,
           update_places: tuple = ()) -> Plan:
    """A planner's plan as the rewrite takes it: swaps of the tensors TF holds, the
    user's budget, the graph's fingerprint, the variables in host memory and
    where their updates run, and a peak that counts the device bytes the
    planner does not see."""
    found = tensor_swaps(found, lowered.graph)
    return dataclasses.replace(found, budget_bytes=budget_bytes,
                               tensorflow_version=tf.__version__,
                               graph_fingerprint=capture.fingerprint(captured),
                               prediction=_with_outside(found.prediction, outside_bytes),
                               host_variables=captured.host_homed,
                               update_places=tuple(update_places))


def _with_outside(prediction: Prediction, outside: int) -> Prediction:
    if prediction.peak_bytes is None:
        return prediction
    return dataclasses.replace(prediction, peak_bytes=prediction.peak_bytes + outside)


__all__ = ["finish"]
