"""Build and install tfswap.

One line installs tfswap with TensorFlow::

    pip install ".[cpu]"              # or ".[gpu]": tensorflow[and-cuda]

The C++ op library must be compiled against the TensorFlow it is loaded into
(its ABI must match).  pip builds in an isolated environment without
TensorFlow, so then the op library is compiled at first use, into the user
cache (``tfswap.ops.load``, about 15 s once).  To compile it at install time
instead, install TensorFlow first and build without isolation::

    pip install tensorflow-cpu        # or tensorflow[and-cuda] on a GPU machine
    pip install --no-build-isolation .

(``make test`` / ``make demo`` do that, editable.)  The planner's native
library needs only g++ and is always built here.
"""

import hashlib
import os
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class BuildTfOps(build_ext):
    """Compile tfswap/ops/*.cc with g++ and tf.sysconfig flags, and the
    framework-free planner library (plain g++, no TensorFlow)."""

    def build_extension(self, ext):
        import importlib.util

        if ext.name.startswith("tfswap.core.native."):
            spec = importlib.util.spec_from_file_location(
                "_tfswap_native_build", Path(__file__).parent / "tfswap" / "core" / "native" / "build.py")
            native_build = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(native_build)
            out = Path(self.get_ext_fullpath(ext.name))
            native_build.compile_shared([Path(s) for s in ext.sources], out)
            digest = hashlib.sha256(Path(ext.sources[0]).read_bytes()).hexdigest()[:12]
            out.with_name(out.name + ".srchash").write_text(digest + "\n")
            return

        try:
            import tensorflow as tf
        except ImportError:
            # pip's isolated build (the default) never has TensorFlow.  The
            # library is then compiled at first use (tfswap.ops.load); optional
            # tells copy_extensions_to_source that it may be missing.
            ext.optional = True
            print("tfswap: TensorFlow is not importable in this build environment; the op "
                  "library will be compiled at first use (tfswap.ops.load, once, into the "
                  "user cache)")
            return

        # Import the build helper by path: the package itself is not importable
        # before it is installed.
        spec = importlib.util.spec_from_file_location(
            "_tfswap_ops_build", Path(__file__).parent / "tfswap" / "ops" / "build.py")
        build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build)
        out = Path(self.get_ext_fullpath(ext.name))
        build.compile_library(out)
        build.write_stamp(out, tf.__version__)

    def copy_extensions_to_source(self):
        """Editable installs and ``--inplace`` build into build/ and copy each library
        into the source tree; copy the stamps beside them too, as the loaders check
        them (without, an editable install's libraries looked stale and were
        rebuilt into the cache)."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace_file, regular_file = self._get_inplace_equivalent(build_py, ext)
            for suffix in (".tfversion", ".srchash"):
                if os.path.exists(regular_file + suffix):
                    self.copy_file(regular_file + suffix, inplace_file + suffix,
                                   level=self.verbose)


setup(
    name="tfswap",
    version="0.1.0",
    description="Train and serve TensorFlow models larger than accelerator memory "
                "by planned tensor swapping (SwapAdvisor).",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["tfswap", "tfswap.*"]),
    # The sources ship so that the loaders can rebuild into the cache; the
    # stamps are written into the build tree beside each library by build_ext.
    package_data={"tfswap.ops": ["*.cc", "*.h"], "tfswap.core.native": ["*.cc"]},
    ext_modules=[Extension("tfswap.ops._tfswap_ops",
                           sources=[
                               "tfswap/ops/swap_ops.cc", "tfswap/ops/pool_core.cc",
                               "tfswap/ops/pool_capi.cc", "tfswap/ops/pool_arena.cc",
                               "tfswap/ops/arena_capi.cc", "tfswap/ops/pool_allocator.cc",
                               "tfswap/ops/handle_marks.cc"]),
                 Extension("tfswap.core.native._planner_sim",
                           sources=["tfswap/core/native/planner_sim.cc"]),
                 Extension("tfswap.core.native._schedule_ops",
                           sources=["tfswap/core/native/schedule_ops.cc"])],
    cmdclass={"build_ext": BuildTfOps},
    install_requires=["numpy>=1.24", "deap>=1.4"],
    extras_require={
        # TensorFlow is not a hard requirement so that a GPU user's
        # `tensorflow[and-cuda]` is not shadowed by a second CPU wheel.
        "cpu": ["tensorflow-cpu>=2.21,<2.22"],
        "gpu": ["tensorflow[and-cuda]>=2.21,<2.22"],
        "test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6", "dask[distributed]", "scipy>=1.11"],
        "plot": ["matplotlib>=3.7"],   # plan.plot_memory / the demo's memory picture
        "bench": ["matplotlib>=3.7", "scipy>=1.11"],   # paper_fig6.py bar charts, `tfswap bench`; research/studies/fig6_bound.py LP
    },
    entry_points={"console_scripts": ["tfswap = tfswap.cli:main"]},
    zip_safe=False,
)
