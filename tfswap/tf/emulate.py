"""The emulated accelerator: two logical CPU devices.

Without a GPU, ``/device:CPU:0`` plays the accelerator and ``/device:CPU:1``
the host; ``setup(replicas=N)`` adds ``/device:CPU:2`` ... ``/device:CPU:N``
as N - 1 more accelerators, for a ``tf.distribute.MirroredStrategy`` over
``EmulatedDevices.replicas`` (all of them share the one host).  TensorFlow passes tensors between the two without copying, so the
only bytes that move are the ones the swap ops copy, and allocations made by
nodes placed on CPU:0 are the "device memory" that :mod:`tfswap.tf.measure`
reports.

This changes TensorFlow's device list for the whole process, so it is never
done implicitly: call it once, right after ``import tensorflow``.

Example::

    import tensorflow as tf
    from tfswap.tf import emulate
    devices = emulate.setup()         # EmulatedDevices(device='/device:CPU:0', host='/device:CPU:1')

    devices = emulate.setup(replicas=2)
    strategy = tf.distribute.MirroredStrategy(devices.replicas)   # CPU:0 and CPU:2
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICE = "/device:CPU:0"
HOST = "/device:CPU:1"


@dataclass(frozen=True)
class EmulatedDevices:
    device: str = DEVICE
    host: str = HOST
    replicas: tuple[str, ...] = (DEVICE,)   # the accelerators, ``device`` first


class DevicesAlreadyInitialized(RuntimeError):
    pass


def is_active() -> bool:
    """True when the process has the two logical CPUs tfswap emulates with."""
    import tensorflow as tf

    return len(tf.config.list_logical_devices("CPU")) >= 2


def replica_devices(replicas: int) -> tuple[str, ...]:
    """The emulated accelerators of ``setup(replicas=replicas)``, ``DEVICE`` first."""
    return (DEVICE,) + tuple(f"/device:CPU:{k}" for k in range(2, replicas + 1))


def setup(replicas: int = 1) -> EmulatedDevices:
    """Split the physical CPU into the emulated device (CPU:0), the host (CPU:1)
    and, with ``replicas`` > 1, more emulated devices (CPU:2 on).

    Idempotent when the split is already in place (with at least as many
    devices).  Raises :class:`DevicesAlreadyInitialized` if TensorFlow created
    its devices before the call (any eager op, ``tf.Variable`` or device
    listing does that), or created fewer than ``replicas`` need.
    """
    import tensorflow as tf

    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an int >= 1 (emulated accelerators), got "
                         f"{replicas!r}")
    wanted = replicas + 1
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is not None and len(current) >= wanted:
        return EmulatedDevices(replicas=replica_devices(replicas))
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(wanted)])
    except RuntimeError as err:
        raise DevicesAlreadyInitialized(
            f"tfswap.tf.emulate.setup(replicas={replicas}) must run before TensorFlow creates "
            "its devices (before any tensor, variable, model or tf.config.list_logical_devices "
            f"call), and before any other setup asked for fewer devices; it needs {wanted} "
            "logical CPUs. Call it right after `import tensorflow`. TensorFlow said: "
            + str(err)) from err
    return EmulatedDevices(replicas=replica_devices(replicas))
