"""Compile the tfswap op library against the installed TensorFlow.

Used by ``setup.py`` at install time and by :mod:`tfswap.ops` when the
installed library does not match the TensorFlow it is loaded into (a wheel
built against another TF version).  Only g++ and TensorFlow's own
``tf.sysconfig`` flags are needed: no Bazel, no CUDA toolkit.  The GPU
kernels are plain C++ against ``DeviceContext``, so they compile here too.

Example::

    python -m tfswap.ops.build /tmp/libtfswap_ops.so
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

SOURCES = ("swap_ops.cc", "pool_core.cc", "pool_capi.cc", "pool_allocator.cc")
# Headers are hashed with the sources (cache key) and shipped in the package.
HEADERS = ("pool_core.h", "pool_allocator.h")
SOURCE_DIR = Path(__file__).resolve().parent


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
