"""Compile a plain C++ shared library with g++ (no Python or TensorFlow headers).

Used by ``setup.py`` at install time and by loaders that fall back to a
cached build when the installed library is missing.

Example::

    compile_shared([Path("planner_sim.cc")], Path("/tmp/libx.so"))
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shlex
import subprocess
import threading
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


class NativeLibrary:
    """One framework-free C++ library: the installed build if it matches its source,
    else a copy compiled into the cache; loaded once, then ``configure``d (ctypes
    signatures).

    Example::

        LIB = NativeLibrary(Path(__file__).with_name("x.cc"), "tfswap.core.native._x",
                            "x", "libtfswap_x.so", configure=set_argtypes)
        LIB.load().tfswap_x(...)
    """

    def __init__(self, source: Path, module: str, tag: str, filename: str, configure):
        self.source, self.module, self.tag, self.filename = Path(source), module, tag, filename
        self._configure = configure
        self._lock = threading.Lock()
        self._lib = None

    def source_hash(self) -> str:
        return hashlib.sha256(self.source.read_bytes()).hexdigest()[:12]

    def installed(self) -> Path | None:
        """The library ``pip install`` built, if it was built from this source."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or spec.origin is None:
            return None
        path = Path(spec.origin)
        stamp = path.with_name(path.name + ".srchash")
        if not stamp.exists() or stamp.read_text().strip() != self.source_hash():
            return None
        return path

    def load(self) -> ctypes.CDLL:
        with self._lock:
            if self._lib is None:
                path = self.installed()
                if path is None:
                    path = cache_path(self.tag, [self.source], self.filename)
                    if not path.exists():
                        compile_shared([self.source], path)
                lib = ctypes.CDLL(str(path))
                self._configure(lib)
                self._lib = lib
            return self._lib
