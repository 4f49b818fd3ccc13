"""Compile a plain C++ shared library with g++ (no Python or TensorFlow headers).

Used by ``setup.py`` at install time and by loaders that fall back to a
cached build when the installed library is missing.

Example::

    compile_shared([Path("planner_sim.cc")], Path("/tmp/libx.so"))
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from pathlib import Path

# -ffp-contract=off: no fused multiply-add, so the native code does the same
# floating-point operations as the Python reference it is tested against.
CXXFLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-Wall")


def compile_shared(sources: list[Path], output: Path, cxx: str = "g++",
                   flags: tuple[str, ...] = CXXFLAGS) -> Path:
    """Build ``sources`` into the shared library ``output`` (atomically).

    Raises RuntimeError with the compiler's output if the build fails.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + f".{os.getpid()}.tmp")
    cmd = [cxx, *flags, *[str(s) for s in sources], "-o", str(tmp)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as err:
        raise RuntimeError(f"building {output.name} needs a C++ compiler ({cxx}); install "
                           "g++ or reinstall tfswap from a wheel that includes it") from err
    if proc.returncode != 0:
        raise RuntimeError(f"building {output.name} failed.\ncommand: "
                           + " ".join(shlex.quote(c) for c in cmd) + "\n" + proc.stderr[-4000:])
    os.replace(tmp, output)  # a concurrent loader never sees half a file
    return output


def cache_path(tag: str, sources: list[Path], name: str) -> Path:
    """``~/.cache/tfswap/<tag>-<hash of sources>/<name>`` (XDG_CACHE_HOME moves it)."""
    digest = hashlib.sha256()
    for src in sources:
        digest.update(Path(src).read_bytes())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "tfswap" / f"{tag}-{digest.hexdigest()[:12]}" / name
