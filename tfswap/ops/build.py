"""Compile the tfswap op library against the installed TensorFlow.

Used by ``setup.py`` at install time and by :mod:`tfswap.ops` at first use
when there is no installed library matching the TensorFlow it is loaded into
(TensorFlow was absent at install time, as in pip's isolated build, or was
changed since).  Only g++ and TensorFlow's own
``tf.sysconfig`` flags are needed: no Bazel, no CUDA toolkit.  The GPU
kernels are plain C++ against ``DeviceContext``, so they compile here too.

Example::

    python -m tfswap.ops.build /tmp/libtfswap_ops.so
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

SOURCES = ("swap_ops.cc", "pool_core.cc", "pool_capi.cc", "pool_arena.cc", "arena_capi.cc",
           "pool_allocator.cc", "handle_marks.cc")
# Headers are hashed with the sources (cache key) and shipped in the package.
HEADERS = ("pool_core.h", "pool_capi.h", "pool_arena.h", "pool_stress.h", "pool_allocator.h")
SOURCE_DIR = Path(__file__).resolve().parent
# Beside each built library: "<TF version> <sources digest>".  A custom-op
# library only loads into the TensorFlow it was compiled against, and nothing
# in the .so says which one that was without loading it.
STAMP_SUFFIX = ".tfversion"


def source_digest() -> str:
    """Short hash of the op library's sources and headers."""
    digest = hashlib.sha256()
    for src in SOURCES + HEADERS:
        digest.update((SOURCE_DIR / src).read_bytes())
    return digest.hexdigest()[:12]


def stamp_path(library: str | os.PathLike) -> Path:
    library = Path(library)
    return library.with_name(library.name + STAMP_SUFFIX)


def write_stamp(library: str | os.PathLike, tf_version: str) -> Path:
    """Record beside ``library`` the TensorFlow and sources it was built from."""
    path = stamp_path(library)
    path.write_text(f"{tf_version} {source_digest()}\n")
    return path


def read_stamp(library: str | os.PathLike) -> tuple[str, str] | None:
    """(TF version, sources digest) recorded beside ``library``; None if unstamped
    (or stamped by an older tfswap, which recorded only the TF version)."""
    try:
        fields = stamp_path(library).read_text().split()
    except OSError:
        return None
    return (fields[0], fields[1]) if len(fields) == 2 else None


def tf_flags() -> tuple[list[str], list[str]]:
    """TensorFlow's compile and link flags for custom ops."""
    import tensorflow as tf  # build-time only

    return list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags())


def compile_library(output: str | os.PathLike, cxx: str = "g++") -> Path:
    """Build the op library into ``output`` and return its path.

    Raises ``RuntimeError`` with the compiler's output if the build fails.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    cflags, lflags = tf_flags()
    tmp = output.with_name(output.name + f".{os.getpid()}.tmp")
    cmd = [cxx, "-shared", "-fPIC", "-O2", "-Wall", "-Wno-sign-compare",
           *[str(SOURCE_DIR / s) for s in SOURCES], "-o", str(tmp), *cflags, *lflags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            "building the tfswap op library failed.\ncommand: "
            + " ".join(shlex.quote(c) for c in cmd) + "\n" + proc.stderr[-4000:])
    os.replace(tmp, output)  # atomic: a concurrent loader never sees half a file
    return output


if __name__ == "__main__":
    print(compile_library(sys.argv[1] if len(sys.argv) > 1 else SOURCE_DIR / "libtfswap_ops.so"))
