"""The whole suite's emulated device runs TensorFlow's oneDNN CPU kernels.

TF 2.21's Linux x86 wheel turns oneDNN on by itself only on CPUs with
AVX-512 VNNI / BF16 / AMX; elsewhere (an AVX2-only AMD EPYC, say) the step
runs TF's own kernels, whose convolution gradients take a scratch buffer
sized from the CPU's L3 cache (26.8 MB on a 32 MiB L3, even for an 8x8x4
image), so the small steps the tests plan at 50-70% of their peak cannot
fit at all, and the runtime merges differ (:mod:`tfswap.tf.grappler`).  The
tests' figures were made on the oneDNN kernels, so the fixture asks for
them on every machine; a run that sets ``TF_ENABLE_ONEDNN_OPTS`` itself
keeps its choice.  Child processes (the benchmarks' tests) inherit it.
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
