"""The tfswap op library (``SwapOut`` / ``SwapIn``) and its loader.

``pip install`` compiles the library next to this file when TensorFlow is
importable at build time (``pip install --no-build-isolation`` after
installing TensorFlow, or ``make``).  Otherwise (pip's isolated build never
has TensorFlow, e.g. ``pip install ".[cpu]"``), or if the installed build was
made for another TensorFlow version or from other sources, :func:`load`
compiles a matching copy into the user cache at first use (about 15 s, once
per TensorFlow version) and says so in one line on the ``tfswap.ops`` logger.

Example::

    from tfswap import ops
    lib = ops.load()
    host = lib.swap_out(x)      # device -> host copy
    back = lib.swap_in(host)    # host -> device copy
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from pathlib import Path

from .build import compile_library, read_stamp, source_digest

try:
    from tensorflow import autograph as _autograph
except ImportError:
    # Without TensorFlow there is no tf.function to convert these; load() says
    # what to install.
    def _outside_autograph(fn):
        return fn
else:
    # A tf.function converts every Python function it calls with AutoGraph,
    # these included, and AutoGraph warns about the loader's internals
    # (importlib, locks) it cannot convert.  They build no graph control flow,
    # so they run as plain Python.
    _outside_autograph = _autograph.experimental.do_not_convert

log = logging.getLogger(__name__)

LIBRARY_MODULE = "tfswap.ops._tfswap_ops"
OP_TYPES = ("SwapOut", "SwapIn")

_lock = threading.Lock()
_loaded = None
_loaded_path: Path | None = None


def installed_library() -> Path | None:
    """Path of the library built by ``pip install``, or None."""
    spec = importlib.util.find_spec(LIBRARY_MODULE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin)


def cache_library(tf_version: str) -> Path:
    """Where :func:`load` builds the library for ``tf_version`` when the installed
    one does not match (``XDG_CACHE_HOME``, else ``~/.cache``)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "tfswap" / f"ops-tf{tf_version}-{source_digest()}" / "libtfswap_ops.so"


def _installed_mismatch(library: Path | None, tf_version: str) -> str | None:
    """Why the installed ``library`` cannot be loaded into ``tf_version``; None if it can."""
    if library is None:
        return "none was built at install time (TensorFlow was not importable there)"
    stamp = read_stamp(library)
    if stamp is None:
        return f"the installed {library.name} has no build stamp; reinstall tfswap"
    built_for, digest = stamp
    if built_for != tf_version:
        return (f"the installed one was built for TensorFlow {built_for}; reinstall tfswap "
                "after changing TensorFlow")
    if digest != source_digest():
        return "the installed one was built from other sources; reinstall tfswap"
    return None


def library_for(tf_version: str) -> Path:
    """The op library to load into TensorFlow ``tf_version``: the installed one if
    its stamp matches, else the cache's copy, compiled now if missing (with a
    one-line note on the ``tfswap.ops`` logger)."""
    installed = installed_library()
    why = _installed_mismatch(installed, tf_version)
    if why is None:
        return installed
    cached = cache_library(tf_version)
    if not cached.exists():
        # Expected after a plain `pip install` (isolated build, no TensorFlow), so
        # a one-line note for the pause rather than a RuntimeWarning; logged at
        # WARNING so it shows without any logging set up.
        log.warning("tfswap: compiling the op library for TensorFlow %s into %s "
                    "(once, about 15 s): %s", tf_version, cached.parent, why)
        compile_library(cached)
    return cached


@_outside_autograph
def load():
    """Load (once) and return the op library module (``swap_out``, ``swap_in``)."""
    global _loaded, _loaded_path
    with _lock:
        if _loaded is not None:
            return _loaded
        try:
            import tensorflow as tf
        except ImportError as err:
            raise ImportError("tfswap's ops need TensorFlow, which did not import (see "
                              "above): pip install tensorflow-cpu "
                              "(or 'tensorflow[and-cuda]' on a GPU machine), or install "
                              "tfswap as \"tfswap[cpu]\" / \"tfswap[gpu]\"") from err

        lib_path = library_for(tf.__version__)
        _loaded = tf.load_op_library(str(lib_path))
        _loaded_path = lib_path
        return _loaded


@_outside_autograph
def library_path() -> Path:
    """Path of the loaded op library (loading it first); ctypes entry points live there."""
    load()
    return _loaded_path


@_outside_autograph
def swap_out(tensor, name=None, link_bytes_per_s: float = 0.0):
    """Copy ``tensor`` to a new host buffer (stateful; never folded by Grappler).

    ``link_bytes_per_s`` > 0 (CPU kernel only, ignored on a GPU): the op completes
    when an emulated device-to-host link of that bandwidth would have moved the
    bytes (see ``swap_ops.cc``); 0: a plain memcpy."""
    return load().swap_out(tensor, link_bytes_per_s=link_bytes_per_s, name=name)


@_outside_autograph
def swap_in(tensor, name=None, link_bytes_per_s: float = 0.0):
    """Copy a host tensor to a new device buffer (stateful); ``link_bytes_per_s``
    as in :func:`swap_out`, for the host-to-device direction."""
    return load().swap_in(tensor, link_bytes_per_s=link_bytes_per_s, name=name)
