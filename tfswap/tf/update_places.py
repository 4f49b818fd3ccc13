"""Where each update of host-homed variables runs: the device, the host, or in pieces.

An update computed on the device (the default, :func:`tfswap.tf.homes.updates_on_device`)
needs the variable, its optimizer slots and its gradient there at once.  A
group whose update needs more than :data:`DEVICE_SHARE` of the room the plan
may use is priced in each place that can hold it (the device if it fits at
all, the host, and :data:`PIECE_SHARE`-sized pieces) by the caller's
``price`` (the pipeline plans the whole step on TensorFlow's order with the
simulator), and runs where the step is predicted fastest.  Groups are
decided one after another, largest first, the others in the places already
chosen.

Example::

    placed = choose(captured, profile, device, room_bytes, price)
    placed.captured, placed.places        # the step as it will run; UpdatePlace per group
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from tfswap.core.plan import UpdatePlace
from tfswap.tf import host_side
from tfswap.tf.capture import CapturedFunction

# An update needing more than this share of the plan's room leaves too little
# for the rest of the step to be planned around it: it is priced elsewhere too.
DEVICE_SHARE = 0.5
# Pieces are cut so that one needs at most this share of the room.
PIECE_SHARE = 0.25


@dataclass(frozen=True)
class Placed:
    """The step with its updates placed, its profile for the new ops, and the places."""

    captured: CapturedFunction
    profile: object
    places: tuple[UpdatePlace, ...]


def with_derived_costs(prof, derived: dict):
    """``prof`` with each new op of ``derived`` (new op -> (op it takes a share of,
    share)) costing that share of the op's time and scratch (None: no profile)."""
    if not derived or prof is None:
        return prof
    from tfswap.core.profile import OpProfile

    ops = list(prof.ops)
    for new, (old, share) in derived.items():
        if old in prof and new not in prof:
            was = prof.op(old)
            ops.append(OpProfile(name=new, type=was.type, time_s=was.time_s * share,
                                 scratch_bytes=int(was.scratch_bytes * share), source=was.source))
    return dataclasses.replace(prof, ops=tuple(ops), _index={})


def place(captured: CapturedFunction, prof, device: str, group: host_side.UpdateGroup,
          where: str, pieces: int = 0):
    """``captured`` and ``prof`` with ``group``'s update run ``where``."""
    if where == "device":
        return captured, prof
    if where == "host":
        return host_side.updates_on_host(captured, group), prof
    moved, costs = host_side.updates_in_pieces(captured, device, group, pieces)
    return moved, with_derived_costs(prof, costs)


def _pieces(group: host_side.UpdateGroup, room: int) -> int:
    return int(min(group.rows, max(2, math.ceil(group.device_bytes / (PIECE_SHARE * room)))))


def choose(captured: CapturedFunction, prof, device: str, room: int,
           price: Callable[[CapturedFunction, object], float]) -> Placed:
    """Place every update group of ``captured`` (see the module doc); ``room``: the
    bytes the plan may use; ``price(captured, profile)``: the predicted step
    time (inf where no plan fits)."""
    if room <= 0:
        raise ValueError(f"room must be > 0 bytes, got {room}")
    groups = host_side.update_groups(captured, device)
    places: list[UpdatePlace] = []
    for group in groups:
        if group.device_bytes <= DEVICE_SHARE * room:
            continue
        # Each group is found again on the step as placed so far: names are stable,
        # and what the earlier choices changed is seen.
        current = next((g for g in host_side.update_groups(captured, device)
                        if g.variables == group.variables), None)
        if current is None:
            continue
        options = [("host", 0)]
        if current.rows >= 2:
            options.append(("pieces", _pieces(current, room)))
        if current.device_bytes <= room:
            options.insert(0, ("device", 0))
        priced = []
        for where, k in options:
            moved = place(captured, prof, device, current, where, k)
            priced.append((price(*moved), where, k, moved))
        best = min(priced, key=lambda p: p[0])
        seconds, where, k, (captured, prof) = best
        why = (f"its update needs {current.device_bytes} B at once on the device, "
               f"{current.device_bytes / room:.0%} of the {room} B the plan may use; "
               "simulated step: " + ", ".join(
                   f"{describe(w, n)} {_seconds(s)}" for s, w, n, _ in priced))
        places.append(UpdatePlace(current.variables, where, k, why))
    return Placed(captured, prof, tuple(places))


def describe(where: str, pieces: int = 0) -> str:
    """"on the host", "on the device", "on the device in 4 pieces"."""
    return {"device": "on the device", "host": "on the host"}.get(
        where, f"on the device in {pieces} pieces")


def _seconds(s: float) -> str:
    return "does not fit" if math.isinf(s) else f"{s * 1e3:.2f} ms"


def apply(captured: CapturedFunction, device: str, places) -> CapturedFunction:
    """``captured`` with the updates placed as a saved plan's ``places`` say."""
    for placed in places:
        group = next((g for g in host_side.update_groups(captured, device)
                      if g.variables == placed.variables), None)
        if group is None:
            raise ValueError(f"no update of {', '.join(placed.variables)} computes on the "
                             "device in this step: the plan was made for another step")
        captured, _ = place(captured, None, device, group, placed.place, placed.pieces)
    return captured


__all__ = ["DEVICE_SHARE", "PIECE_SHARE", "Placed", "apply", "choose", "describe", "place",
           "with_derived_costs"]
