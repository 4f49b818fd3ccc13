"""Where the step's variables live between steps, as ``Options.parameters`` says:
which variables move to host memory (:func:`movable_parameters`), moving them
and lowering the step again (:func:`place_parameters`, on a
:class:`tfswap.pipeline.Prepared`), putting them back
(:func:`restore_parameters`), and the work next to host variables
(:func:`host_work`: gathers on the host, each update where it is fastest).

Example::

    prepared = place_parameters(prepared)       # "host", or "auto" when nothing fits
    try:
        ...
    finally:
        restore_parameters(prepared)            # where planning failed
"""

from __future__ import annotations

import dataclasses

from tfswap.core import planners
from tfswap.core.budget import BudgetError
from tfswap.core.devices import DeviceSpec
from tfswap.core.infeasible import Infeasible
from tfswap.core.profile import OpProfile
from tfswap.replicas import replica_of
from tfswap.tf import homes, host_side, mirrored_homes, update_places
from tfswap.tf.lower import lower, planner_budget


def place_parameters(prepared):
    """The step with variables moved to host memory as ``options.parameters`` says:
    "host" every variable, "auto" those of at least the small-tensor threshold
    (:mod:`tfswap.tf.homes`); "device" none.  The step is lowered again on the
    same profile: the ops are the same, only the moved variables' reads and
    updates run on the host.  :func:`tfswap.optimize` calls it first for
    "host", and for "auto" after no plan fitted with the parameters on the
    device.  Undo with :func:`restore_parameters` if planning fails.
    """
    picked = movable_parameters(prepared)
    if not picked:
        return prepared
    variables = [c.variable for c in picked]
    relocation = mirrored_homes.move_to_host(variables, prepared.host) if prepared.replicas \
        else homes.move_to_host(variables, prepared.host)
    unplaced, unplaced_profile = prepared.unplaced or (prepared.captured, prepared.profile)
    try:
        rehomed = homes.rehomed(unplaced, relocation)
        if prepared.replicas:
            rehomed = mirrored_homes.one_copy(rehomed, relocation)
        # Variables already in host memory (the user's, or moved by another plan) had
        # their updates made on the device before profiling: ``made`` holds the new ones.
        moved, made = homes.updates_on_device(rehomed, prepared.device)
        moved_profile = with_moved_costs(unplaced_profile, made)
        captured, prof, places = host_work(moved, moved_profile, prepared.spec, prepared.device,
                                           prepared.budget_bytes, prepared.options,
                                           prepared.step.small)
        step = lower(captured, prof, prepared.spec, prepared.step.small,
                     prepared.options.recompute)
        # Each other replica reads the copies; the first replica's updates write them.
        replicas = tuple(replica_of(captured, r.device, r.profile, prepared.options,
                                    prepared.spec, step) for r in prepared.replicas)
    except BaseException:
        relocation.undo()
        raise
    return dataclasses.replace(prepared, captured=captured, profile=prof, step=step,
                               replicas=replicas,
                               relocation=relocation, update_places=places,
                               unplaced=(moved, moved_profile),
                               notes=prepared.notes + (relocation.describe(),))


def host_work(captured, prof, spec: DeviceSpec, device: str, budget: int, options,
              small: int):
    """(captured, profile, update places): the gathers of host tables run on the host
    (:func:`tfswap.tf.host_side.gathers_on_host`) and each update of host variables
    placed where the simulator predicts the fastest step
    (:mod:`tfswap.tf.update_places`: the plan on TensorFlow's order, at this
    budget)."""
    captured, _ = host_side.gathers_on_host(captured)

    def price(candidate, candidate_profile) -> float:
        try:
            step = lower(candidate, candidate_profile, spec, small)
            usable, _ = planner_budget(budget, step.lowered, options.safety_margin)
            found = planners.run("tfswap.order", step.problem, usable, spec).plan
        except (Infeasible, BudgetError):
            return float("inf")
        return found.prediction.step_time_s

    placed = update_places.choose(captured, prof, device,
                                  int(budget * (1.0 - options.safety_margin)), price)
    return placed.captured, placed.profile, placed.places


def with_moved_costs(prof, moved: dict):
    """``prof`` with each op in ``moved`` (new op -> the op it took the work of)
    costing what that op cost, and that op nothing: the arithmetic of an
    in-place update profiled on the device, now done by a device op while the
    host only stores the result (:func:`tfswap.tf.homes.updates_on_device`)."""
    if not moved:
        return prof
    taken = set(moved.values())
    ops = [dataclasses.replace(op, time_s=0.0, scratch_bytes=0) if op.name in taken else op
           for op in prof.ops]
    ops += [OpProfile(name=new, type=prof.op(old).type, time_s=prof.op(old).time_s,
                      source=prof.op(old).source) for new, old in moved.items() if old in prof]
    return dataclasses.replace(prof, ops=tuple(ops), _index={})


def movable_parameters(prepared) -> tuple:
    """The captured device variables :func:`place_parameters` would move: of a
    replicated step, the first components of the mirrored variables of at least
    the small-tensor threshold whose every component the step reads and updates
    through plain ops (:mod:`tfswap.tf.mirrored_homes` keeps one copy of each)."""
    if prepared.options.parameters == "device":
        return ()
    chosen = homes.chosen(prepared.captured, prepared.options.parameters, prepared.step.small)
    if not prepared.replicas:
        return chosen
    present = {id(c.variable) for c in chosen}
    firsts = []
    for c in chosen:
        whole = mirrored_homes.mirrored_of(c.variable)
        if whole is not None and whole.values[0] is c.variable and \
                len(whole.values) == len(prepared.captured.replicas) and \
                all(id(v) in present for v in whole.values):
            firsts.append(c)
    return tuple(firsts)


def restore_parameters(prepared) -> None:
    """Put back on the device what :func:`place_parameters` moved (values kept)."""
    if prepared.relocation is not None:
        prepared.relocation.undo()


__all__ = ["host_work", "movable_parameters", "place_parameters", "restore_parameters",
           "with_moved_costs"]
