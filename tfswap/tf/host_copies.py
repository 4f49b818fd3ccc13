"""The one host copies of mirrored variables in force (:mod:`tfswap.tf.mirrored_homes`
registers and removes them): what capturing a replicated step asks about them
without importing the module that moves them.

Example::

    register(relocation)              # mirrored_homes.move_to_host
    replica_device(component)         # its replica's device, though it holds the copy
    unregister(relocation)            # MirroredRelocation.undo
"""

from __future__ import annotations

# The relocations in force: a replicated step captured while they are (a function
# traced after the move, Keras's evaluation step) reads their copies.
_ACTIVE: list = []


def register(relocation) -> None:
    _ACTIVE.append(relocation)


def unregister(relocation) -> None:
    _ACTIVE[:] = [r for r in _ACTIVE if r is not relocation]


def active() -> tuple:
    """The relocations in force, oldest first."""
    return tuple(_ACTIVE)


def is_copy(variable) -> bool:
    """Whether ``variable`` is the first component of a mirrored variable whose one
    host copy it holds."""
    return any(m.variable is variable for r in _ACTIVE for m in r.moved)


def replica_device(component) -> str:
    """The device of ``component``'s replica: where it lived before it took the host
    copy's handle, else where it lives."""
    for r in _ACTIVE:
        for m in r.moved:
            if m.variable is component:
                return m.device_handle.device
    return component.device


__all__ = ["active", "is_copy", "register", "replica_device", "unregister"]
