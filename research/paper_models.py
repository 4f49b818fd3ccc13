"""The benchmark models of SwapAdvisor §6 and Capuchin §5, as real TensorFlow steps.

Each model is Keras code (``keras.applications`` with ``weights=None``, or
Keras layers), trained by one Adam step in a ``tf.function``, captured with
:func:`tfswap.tf.capture.capture`, priced with the analytic profile of a
:class:`~tfswap.core.devices.DeviceSpec` (:func:`tfswap.tf.profile.analytic`)
and lowered with :func:`tfswap.tf.ir.lower`.  Nothing is executed: planning
needs shapes, not values.

Paper-scale models do not fit this machine's memory (WResNet-152-10 has 6e9
parameters, 24 GB before Adam's two slots), so every model is built with its
variables created as uninitialised resource handles
(``UninitializedVariable``: shape and dtype, no buffer).  The captured graph
is the same as with real variables -- the step reads and updates the same
variables -- only their values never exist.  The layers this module builds
itself (wide ResNets, LSTM stacks) use zeros initialisers so building them
does not draw billions of random numbers.

Lowered graphs are cached as pickles under ``cache_dir`` (default
``.bench_cache`` in the working directory); one model is built in a child
process so the TensorFlow state of one capture cannot grow the next.

Models (``MODELS``; ``PAPER_BATCHES`` are the batch sizes the benchmarks use):

* ``resnet50``, ``resnet152``: keras.applications, 224x224, 1000 classes.
* ``inception_v3``: keras.applications.InceptionV3, 299x299 (the paper used
  Inception-V4, which keras.applications does not have).
* ``nasnet_mobile``: keras.applications.NASNetMobile, 224x224 (the paper's
  NasNet-25 repeats the normal cell 75 times; NASNetMobile has R=4).
* ``bert_base``: :func:`tfswap.zoo.bert`'s encoder at BERT-base size (12
  layers, 768 wide, 12 heads, vocabulary 30522), sequence 512.
* ``rnn_L_XK`` / ``brnn_L_XK``: L unrolled LSTM layers (bidirectional for
  brnn, outputs concatenated) of X*1024 units over 32 steps, as the paper's
  RNN-L-XK / BRNN-L-XK.
* ``wresnet152_X``: ResNet-152 with every convolution's channels times X,
  224x224 (the paper's WResNet-152-X).

Example::

    graph, keep = paper_models.lowered("resnet50", batch=64, spec="v100-16g-pcie3")
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

CACHE_VERSION = 3   # 2: the Problem optimize plans (pinned parameters, TF order, threshold);
                    # 3: and the ops it may recompute
STEPS = 32          # unrolled time steps of the LSTM stacks
SEQ = 512           # BERT-base sequence length
_ALIVE: list = []
APPLICATIONS = {  # name: (keras.applications builder, image side)
    "resnet50": ("ResNet50", 224),
    "resnet152": ("ResNet152", 224),
    "inception_v3": ("InceptionV3", 299),
    "nasnet_mobile": ("NASNetMobile", 224),
}   # models and optimizers whose steps were built in this process

# Batches at which the step needs more than a 16 GB V100 (analytic profile; the
# ideal need of each is in benchmarks/RESULTS.md), about 1.5x and 3x where a
# build takes minutes.
PAPER_BATCHES = {
    "rnn_8_2k": (1024, 2048),
    "brnn_4_2k": (256, 512),
    "resnet50": (256, 512),
    "inception_v3": (256, 512),
    "bert_base": (32, 64),
    "nasnet_mobile": (512,),
    "resnet152": (128, 256),
    "wresnet152_4": (32,),
    "wresnet152_10": (16,),
}


def _shape_only_scope():
    """Variable creation that records shape and dtype and allocates nothing."""
    import tensorflow as tf
    from tensorflow.python.ops import resource_variable_ops

    def creator(next_creator, **kw):
        init = kw.get("initial_value")
        if callable(init):
            init = init()
        init = tf.convert_to_tensor(init, dtype=kw.get("dtype"))
        return resource_variable_ops.UninitializedVariable(
            shape=init.shape, dtype=init.dtype, name=kw.get("name") or "v",
            trainable=kw.get("trainable", True))

    return tf.variable_creator_scope(creator)


def _step(model, x_spec, y_spec, loss_fn):
    from tfswap import zoo

    fn, optimizer = zoo.step_function(model, (x_spec, y_spec), loss_fn)
    _ALIVE.append((model, optimizer))
    return fn


def _image_step(model, batch, image, classes=1000):
    import keras
    import tensorflow as tf

    return _step(model, tf.TensorSpec((batch, image, image, 3)), tf.TensorSpec((batch,), tf.int32),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _wide_resnet152(width: int, image: int = 224, classes: int = 1000):
    """ResNet-152 (bottleneck blocks 3, 8, 36, 3) with every conv's channels x ``width``."""
    import keras

    L = keras.layers
    z = dict(kernel_initializer="zeros", use_bias=False)

    def bn_relu(h, relu=True):
        h = L.BatchNormalization(epsilon=1.001e-5)(h)
        return L.Activation("relu")(h) if relu else h

    x = keras.Input((image, image, 3))
    h = bn_relu(L.Conv2D(64 * width, 7, strides=2, padding="same", **z)(x))
    h = L.MaxPooling2D(3, strides=2, padding="same")(h)
    for stage, (blocks, filters) in enumerate(zip((3, 8, 36, 3), (64, 128, 256, 512))):
        f = filters * width
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            shortcut = h
            if b == 0:
                shortcut = bn_relu(L.Conv2D(4 * f, 1, strides=stride, **z)(h), relu=False)
            y = bn_relu(L.Conv2D(f, 1, strides=stride, **z)(h))
            y = bn_relu(L.Conv2D(f, 3, padding="same", **z)(y))
            y = bn_relu(L.Conv2D(4 * f, 1, **z)(y), relu=False)
            h = L.Activation("relu")(L.Add()([shortcut, y]))
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(x, L.Dense(classes, kernel_initializer="zeros")(h),
                       name=f"wresnet152_{width}")


def _lstm_stack(layers: int, units: int, batch: int, bidirectional: bool, classes: int = 1000):
    import keras
    import tensorflow as tf

    L = keras.layers
    z = dict(kernel_initializer="zeros", recurrent_initializer="zeros")
    x = keras.Input((STEPS, units))
    h = x
    for k in range(layers):
        last = k == layers - 1
        cell = L.LSTM(units, return_sequences=not last, unroll=True, **z)
        h = L.Bidirectional(cell, merge_mode="concat")(h) if bidirectional else cell(h)
    model = keras.Model(x, L.Dense(classes, kernel_initializer="zeros")(h))
    return _step(model, tf.TensorSpec((batch, STEPS, units)), tf.TensorSpec((batch,), tf.int32),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _bert(batch: int, seq: int, dim: int, heads: int, layers: int, vocab: int):
    """:func:`tfswap.zoo.bert`'s encoder, with the position embedding a weight added in
    the step (zoo's looks it up when the model is built, which reads its value)."""
    import keras
    import tensorflow as tf

    L = keras.layers

    class AddPositions(L.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=(shape[1], shape[2]), initializer="zeros")

        def call(self, x):
            return x + self.table[None]

    from tfswap import zoo

    tokens = keras.Input((seq,), dtype="int32")
    h = AddPositions()(L.Embedding(vocab, dim, embeddings_initializer="zeros")(tokens))
    h = zoo.encoder_blocks(L.LayerNormalization(epsilon=1e-12)(h), layers, heads, dim)
    h = L.Dense(dim, activation="gelu")(h)
    logits = L.Dense(vocab)(L.LayerNormalization(epsilon=1e-12)(h))
    model = keras.Model(tokens, logits, name="bert_base")
    return _step(model, tf.TensorSpec((batch, seq), tf.int32), tf.TensorSpec((batch, seq), tf.int32),
                 keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _parse(name: str) -> tuple[str, tuple[int, ...]]:
    """``"rnn_8_2k"`` -> ("rnn", (8, 2)); ``"wresnet152_10"`` -> ("wresnet152", (10,))."""
    head, *rest = name.split("_")
    try:
        return head, tuple(int(r.rstrip("k")) for r in rest)
    except ValueError:
        return name, ()


def concrete_function(name: str, batch: int):
    """The ConcreteFunction of one Adam training step of model ``name`` at ``batch``.

    Variables are uninitialised handles (see the module doc): the function can
    be captured, profiled analytically and planned, not run.
    """
    import keras

    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    head, args = _parse(name)
    keras.utils.set_random_seed(0)
    with _shape_only_scope():
        if name in APPLICATIONS:
            builder, image = APPLICATIONS[name]
            model = getattr(keras.applications, builder)(weights=None,
                                                         classifier_activation=None)
            return _image_step(model, batch, image)
        if name == "bert_base":
            return _bert(batch, SEQ, dim=768, heads=12, layers=12, vocab=30522)
        if head in ("rnn", "brnn") and len(args) == 2:
            return _lstm_stack(args[0], args[1] * 1024, batch, bidirectional=head == "brnn")
        if head == "wresnet152" and len(args) == 1:
            return _image_step(_wide_resnet152(args[0]), batch, 224)
    raise ValueError(f"unknown benchmark model {name!r}; use one of {sorted(PAPER_BATCHES)} "
                     "or rnn_L_Xk / brnn_L_Xk / wresnet152_X")


def build_lowered(name: str, batch: int, spec: str):
    """Capture, price and lower model ``name`` in this process, as ``optimize`` lowers a
    step (:func:`tfswap.tf.lower.lower_default`): the arguments of its
    :class:`~tfswap.core.problem.Problem` (graph, keep, schedule, small threshold,
    where parameters start, the ops it may recompute)."""
    from tfswap import pipeline
    from tfswap.tf import lower as tf_lower
    from tfswap.core.devices import device_spec
    from tfswap.tf import capture, profile

    captured = capture.capture(concrete_function(name, batch))
    dev = device_spec(spec)
    problem = tf_lower.lower_default(captured, profile.analytic(captured, dev), dev).problem
    return (problem.graph, problem.keep, problem.schedule, problem.small_threshold_bytes,
            problem.params_start_on_host, tuple(sorted(problem.recomputable)))


def _cache_path(cache_dir: Path, name: str, batch: int, spec: str) -> Path:
    return Path(cache_dir) / f"{name}-b{batch}-{spec}-v{CACHE_VERSION}.pkl"


def lowered(name: str, batch: int, spec: str = "v100-16g-pcie3",
            cache_dir: str | os.PathLike = ".bench_cache"):
    """Model ``name`` at ``batch`` lowered with analytic times for ``spec``: the
    :class:`~tfswap.core.problem.Problem` ``optimize`` would plan.

    Built in a child process on first use (TensorFlow's graph state stays out of
    the caller) and cached under ``cache_dir``.

    Example::

        problem = lowered("rnn_8_2k", 256)
    """
    path = _cache_path(Path(cache_dir), name, batch, spec)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "research.paper_models", name, str(batch), spec, str(path)]
        root = str(Path(__file__).resolve().parent.parent)  # this tfswap, not an installed one
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"building {name} batch {batch} failed:\n{done.stderr[-3000:]}")
    from tfswap.core.problem import Problem

    with open(path, "rb") as f:
        graph, keep, schedule, small, on_host, recomputable = pickle.load(f)
    return Problem.of(graph, keep=keep, schedule=schedule, small_threshold_bytes=small,
                      params_start_on_host=on_host, recomputable=recomputable)


def _main(argv) -> int:
    name, batch, spec, out = argv
    built = build_lowered(name, int(batch), spec)
    tmp = Path(out).with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(built, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
