"""The tfswap op library (``SwapOut`` / ``SwapIn``) and its loader.

``pip install .`` compiles ``swap_ops.cc`` next to this file.  If that build
is missing, or was made for another TensorFlow version, :func:`load` compiles
a matching copy into the user cache (about 15 s, once per TF version) and says
so, rather than failing with an undefined-symbol error.

Example::

    from tfswap import ops
    lib = ops.load()
    host = lib.swap_out(x)      # device -> host copy
    back = lib.swap_in(host)    # host -> device copy
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
import warnings
from pathlib import Path

from .build import HEADERS, SOURCE_DIR, SOURCES, compile_library

LIBRARY_MODULE = "tfswap.ops._tfswap_ops"
OP_TYPES = ("SwapOut", "SwapIn")

_lock = threading.Lock()
_loaded = None
_loaded_path: Path | None = None


def _version_stamp(library: Path) -> Path:
    return library.with_name(library.name + ".tfversion")


def installed_library() -> Path | None:
    """Path of the library built by ``pip install``, or None."""
    spec = importlib.util.find_spec(LIBRARY_MODULE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin)


def _cache_library(tf_version: str) -> Path:
    digest = hashlib.sha256()
    for src in SOURCES + HEADERS:
        digest.update((SOURCE_DIR / src).read_bytes())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "tfswap" / f"ops-tf{tf_version}-{digest.hexdigest()[:12]}" / "libtfswap_ops.so"


def write_version_stamp(library: Path, tf_version: str) -> None:
    _version_stamp(library).write_text(tf_version + "\n")


def load():
    """Load (once) and return the op library module (``swap_out``, ``swap_in``)."""
    global _loaded, _loaded_path
    with _lock:
        if _loaded is not None:
            return _loaded
        import tensorflow as tf

        lib_path = installed_library()
        stamp = _version_stamp(lib_path) if lib_path else None
        if lib_path is None or stamp is None or not stamp.exists() \
                or stamp.read_text().strip() != tf.__version__:
            cached = _cache_library(tf.__version__)
            if not cached.exists():
                warnings.warn(
                    f"tfswap: no op library built for TensorFlow {tf.__version__} "
                    f"(installed: {lib_path}); compiling one into {cached.parent} "
                    "(once, about 15 s). Reinstall tfswap after upgrading TensorFlow "
                    "to avoid this.", RuntimeWarning, stacklevel=2)
                compile_library(cached)
            lib_path = cached
        _loaded = tf.load_op_library(str(lib_path))
        _loaded_path = lib_path
        return _loaded


def library_path() -> Path:
    """Path of the loaded op library (loading it first); ctypes entry points live there."""
    load()
    return _loaded_path


def swap_out(tensor, name=None, link_bytes_per_s: float = 0.0):
    """Copy ``tensor`` to a new host buffer (stateful; never folded by Grappler).

    ``link_bytes_per_s`` > 0 (CPU kernel only, ignored on a GPU): the op completes
    when an emulated device-to-host link of that bandwidth would have moved the
    bytes (see ``swap_ops.cc``); 0: a plain memcpy."""
    return load().swap_out(tensor, link_bytes_per_s=link_bytes_per_s, name=name)


def swap_in(tensor, name=None, link_bytes_per_s: float = 0.0):
    """Copy a host tensor to a new device buffer (stateful); ``link_bytes_per_s``
    as in :func:`swap_out`, for the host-to-device direction."""
    return load().swap_in(tensor, link_bytes_per_s=link_bytes_per_s, name=name)
