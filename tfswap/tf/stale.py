"""A moved variable's former handle: every use of it fails with tfswap's message.

When :mod:`tfswap.tf.homes` moves a variable (to host memory, or back with
``restore_parameters()``), the user's ``tf.Variable`` and every Python
function and variable object that held the former handle are re-pointed to
the new one (:func:`tfswap.tf.homes.follow`), and the former resource is
emptied to free its memory.  What holds the former handle and is no such
Python object cannot be re-pointed: a ``tf.data`` pipeline built before the
move (its dataset op copied the handle when it was built), a handle tensor
the user kept.  :func:`retire` makes every op that takes that handle (a
read, an assignment, a gather) fail with an error that quotes
:func:`moved_message` (or :func:`restored_message`): what happened and what
to do; none reads the emptied resource.  :func:`revive` makes the handle
usable again, as :meth:`tfswap.tf.homes.Relocation.undo` does for the
device handles before putting the values back.

Why the handle, and how (the op ``TfswapRetireHandle``, ``tfswap/ops/
handle_marks.cc``): every copy of a handle tensor shares one
``ResourceHandle``, and TensorFlow 2.21 offers no other way to make a stale
read fail with a message of ours (what was measured is in the op's source).

Example::

    identity = retire(old_handle, moved_message(variable))
    ...                                   # reads of old_handle raise, naming tfswap
    revive(old_handle, identity)          # old_handle reads the variable again
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class Identity:
    """What :func:`retire` replaced in a handle, for :func:`revive`."""

    name: bytes
    type_name: bytes
    hash_code: int


def _ops():
    from tfswap import ops

    return ops.load()


def ready() -> None:
    """Load the op library, so that a failure to build it comes before any move."""
    _ops()


def retire(handle: tf.Tensor, message: str) -> Identity:
    """Make every op taking ``handle`` (or a copy of it) fail with an error quoting
    ``message``, which TensorFlow prints where it would print the variable's
    name ("Could not find variable <message>. ...")."""
    name, type_name, hash_code = _ops().tfswap_retire_handle(handle, message)
    return Identity(name.numpy(), type_name.numpy(), int(hash_code.numpy()))


def revive(handle: tf.Tensor, identity: Identity) -> None:
    """Undo :func:`retire`: ``handle`` reaches its resource again."""
    _ops().tfswap_revive_handle(handle, identity.name, identity.type_name,
                                tf.constant(identity.hash_code, tf.int64))


def moved_message(variable) -> str:
    return (f"{variable.name} at a handle taken before tfswap moved it to host memory "
            "(tfswap.optimize or load_plan with parameters 'auto' or 'host'); this handle (a "
            "tf.data pipeline built before the move, a variable.handle kept from before) no "
            "longer holds the variable. Build the pipeline or take variable.handle again after "
            "tfswap.optimize, or call restore_parameters() on the OptimizedFunction that moved "
            "it")


def restored_message(variable) -> str:
    return (f"{variable.name} at a handle to the host copy that tfswap made of it, which "
            "restore_parameters() (or a plan that failed) has put back on the device; this "
            "handle (a tf.data pipeline built, or a variable.handle taken, while the variable "
            "was in host memory) no longer holds the variable. Build the pipeline or take "
            "variable.handle again")


__all__ = ["Identity", "moved_message", "ready", "restored_message", "retire", "revive"]
