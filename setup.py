"""Build and install tfswap.

The C++ op library is compiled against the TensorFlow already installed in
the environment (its ABI must match), so install TensorFlow first and build
without isolation::

    pip install tensorflow-cpu        # or tensorflow[and-cuda] on a GPU machine
    pip install --no-build-isolation .

(``make test`` / ``make demo`` do both.)
"""

import hashlib
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
                "_tfswap_native_build", Path(__file__).parent / "tfswap" / "_native_build.py")
            native_build = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(native_build)
            out = Path(self.get_ext_fullpath(ext.name))
            native_build.compile_shared([Path(s) for s in ext.sources], out)
            digest = hashlib.sha256(Path(ext.sources[0]).read_bytes()).hexdigest()[:12]
            out.with_name(out.name + ".srchash").write_text(digest + "\n")
            return

        import tensorflow as tf

        # Import the build helper by path: the package itself is not importable
        # before it is installed.
        spec = importlib.util.spec_from_file_location(
            "_tfswap_ops_build", Path(__file__).parent / "tfswap" / "ops" / "build.py")
        build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build)
        out = Path(self.get_ext_fullpath(ext.name))
        build.compile_library(out)
        out.with_name(out.name + ".tfversion").write_text(tf.__version__ + "\n")


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
    package_data={"tfswap.ops": ["*.cc", "*.h", "*.tfversion"],
                  "tfswap.core.native": ["*.cc", "*.srchash"]},
    ext_modules=[Extension("tfswap.ops._tfswap_ops", sources=[
                     "tfswap/ops/swap_ops.cc", "tfswap/ops/pool_core.cc",
                     "tfswap/ops/pool_capi.cc", "tfswap/ops/pool_allocator.cc"]),
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
        "test": ["pytest>=8", "hypothesis>=6", "dask[distributed]"],
        "plot": ["matplotlib>=3.7"],   # plan.plot_memory / the demo's memory picture
        "bench": ["matplotlib>=3.7"],   # the bar charts of benchmarks/paper_fig6.py, `tfswap bench`
    },
    entry_points={"console_scripts": ["tfswap = tfswap.cli:main"]},
    zip_safe=False,
)
