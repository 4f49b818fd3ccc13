"""Run a step N times from the same starting variables and compare two callables."""

from __future__ import annotations

import numpy as np

# Where a swap gives a tensor a second reader, Grappler's remapper and oneDNN's
# graph pass may fuse its producer differently, which changes float32 results in
# the last bits.  Compared as ||expected - actual|| / max(||expected||, 1) per
# variable after the steps: relative for weights, absolute for near-zero ones.
RTOL = 1e-6


def run_steps(fn, variables, initial, batch, steps=3):
    for var, value in zip(variables, initial):
        var.assign(value)
    losses = [float(fn(*batch)["loss"]) for _ in range(steps)]
    return losses, [v.numpy() for v in variables]


def worst_relative_difference(expected, actual, variables=None) -> float:
    worst, name = 0.0, None
    for k, (a, b) in enumerate(zip(expected, actual)):
        if a.size == 0:
            continue
        a64 = a.astype(np.float64)
        diff = float(np.linalg.norm(a64 - b)) / max(1.0, float(np.linalg.norm(a64)))
        if diff > worst:
            worst, name = diff, variables[k].name if variables is not None else k
    return worst, name


def assert_same_training(reference, candidate, variables, batch, steps=3, exact=False,
                         rtol=RTOL):
    initial = [v.numpy() for v in variables]
    ref_losses, ref_vars = run_steps(reference, variables, initial, batch, steps)
    losses, vars_ = run_steps(candidate, variables, initial, batch, steps)
    for var, value in zip(variables, initial):
        var.assign(value)
    if exact:
        assert losses == ref_losses
        for var, a, b in zip(variables, ref_vars, vars_):
            assert np.array_equal(a, b), f"{var.name} differs"
    else:
        np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
        worst, name = worst_relative_difference(ref_vars, vars_, variables)
        assert worst <= rtol, f"{name} differs by {worst:.3g} of its scale"
    return ref_losses, losses
