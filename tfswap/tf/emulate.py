"""The emulated accelerator: two logical CPU devices.

Without a GPU, ``/device:CPU:0`` plays the accelerator and ``/device:CPU:1``
the host.  TensorFlow passes tensors between the two without copying, so the
only bytes that move are the ones the swap ops copy, and allocations made by
nodes placed on CPU:0 are the "device memory" that :mod:`tfswap.tf.measure`
reports.

This changes TensorFlow's device list for the whole process, so it is never
done implicitly: call it once, right after ``import tensorflow``.

Example::

    import tensorflow as tf
    from tfswap.tf import emulate
    devices = emulate.setup()         # EmulatedDevices(device='/device:CPU:0', host='/device:CPU:1')
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICE = "/device:CPU:0"
HOST = "/device:CPU:1"


@dataclass(frozen=True)
class EmulatedDevices:
    device: str = DEVICE
    host: str = HOST


class DevicesAlreadyInitialized(RuntimeError):
    pass


def is_active() -> bool:
    """True when the process has the two logical CPUs tfswap emulates with."""
    import tensorflow as tf

    return len(tf.config.list_logical_devices("CPU")) >= 2


def setup() -> EmulatedDevices:
    """Split the physical CPU into the emulated device (CPU:0) and host (CPU:1).

    Idempotent when the split is already in place.  Raises
    :class:`DevicesAlreadyInitialized` if TensorFlow created its devices before
    the call (any eager op, ``tf.Variable`` or device listing does that).
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is not None and len(current) >= 2:
        return EmulatedDevices()
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration(),
                      tf.config.LogicalDeviceConfiguration()])
    except RuntimeError as err:
        raise DevicesAlreadyInitialized(
            "tfswap.tf.emulate.setup() must run before TensorFlow creates its devices "
            "(before any tensor, variable, model or tf.config.list_logical_devices call). "
            "Call it right after `import tensorflow`. TensorFlow said: " + str(err)) from err
    return EmulatedDevices()
