"""Control flow and odd ops (issue #9 part 2): each optimised at a budget that
forces swaps, training exactly like the unmodified step.

Each case is compared with ``assert_array_equal`` against the captured graph
run without swaps (tfswap's runtime on the graph Grappler made: a swap must
not change one bit) and against the user's own ``tf.function`` (also bit
for bit on these small models), except where TF itself is not deterministic
(the embedding's scatter update: said there).  ``len(plan.swaps) > 0`` is asserted, so no
case passes because nothing was moved.
"""

import re

import numpy as np
import pytest

import tfswap
from tfswap import zoo
from tfswap.core.budget import BudgetError
from tfswap.tf import capture, measure, runtime

from .equality import RTOL, run_steps, worst_relative_difference

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
L = keras.layers

BATCH, WIDTH, DEPTH = 1024, 128, 6


def optimize_with_swaps(step, fraction=0.6, generations=3, margin=1.3, safety_margin=None):
    """tfswap.optimize at ``fraction`` of the measured unmodified peak, or, if that
    is below the step's working set, at 30% above the smallest budget named (at 10%
    the model's estimate of a branch's saved state left too little room in some
    traced orders: a fresh-clone suite run measured the cond step over it)."""
    captured = capture.capture(step.concrete_fn)
    peak = measure.measure(captured, captured.graph_def, step.batch,
                           inter_op_threads=1).peak_bytes
    # Device-homed: the comparison runs the captured graph on the same variables.
    kwargs = dict(generations=generations, seed=0, workers=1, inputs=step.batch,
                  profile="trace", parameters="device")
    if safety_margin is not None:
        kwargs["safety_margin"] = safety_margin
    for _ in range(2):
        budget = int(fraction * peak)
        try:
            fast = tfswap.optimize(step.concrete_fn, budget, **kwargs)
        except BudgetError as err:
            minimum = int(re.search(r"about (\d+) bytes", str(err)).group(1))
            assert minimum < peak, str(err)
            budget = min(int(margin * minimum), int(0.95 * peak))
            fast = tfswap.optimize(step.concrete_fn, budget, **kwargs)
        if fast.plan.swaps:
            break
        # TensorFlow's executed order can differ between sessions (the embedding
        # step below), and optimize's own trace saw an order that fits this budget;
        # its plan pins that order.  Plan below that order's peak instead.
        peak = fast.plan.prediction.peak_bytes
    assert len(fast.plan.swaps) > 0, "the budget forced no swap: the test would be vacuous"
    after = measure.measure(fast.captured, fast.graph_def, step.batch)
    if after.peak_bytes > budget:
        # Known weakness (benchmarks/RESULTS.md, fuzzing): a plan optimize verified can
        # measure above its budget in a later session (the While-loop LSTM: 4027188 B
        # for 3801919 B in 2 of 5 runs of this test alone).  One fresh plan and
        # measurement is allowed, as in test_fuzz; a wrong result never is.
        fast = tfswap.optimize(step.concrete_fn, budget, **kwargs)
        after = measure.measure(fast.captured, fast.graph_def, step.batch)
    assert after.peak_bytes <= budget
    return captured, fast


def assert_trains_exactly(step, captured, fast, steps=3, exact=True):
    variables = fast.captured.variables
    initial = [v.numpy() for v in variables]
    unmodified = runtime.bind(captured, captured.graph_def)
    (plain_l, plain_v), (got_l, got_v), (user_l, user_v) = [
        run_steps(fn, variables, initial, step.batch, steps)
        for fn in (unmodified, fast, step.concrete_fn)]
    for var, value in zip(variables, initial):
        var.assign(value)
    if not exact:
        for ref_l, ref_v in ((plain_l, plain_v), (user_l, user_v)):
            np.testing.assert_allclose(got_l, ref_l, rtol=RTOL)
            worst, name = worst_relative_difference(ref_v, got_v, variables)
            assert worst <= RTOL, f"{name} differs by {worst:.3g} of its scale"
        return
    np.testing.assert_array_equal(got_l, plain_l)
    np.testing.assert_array_equal(got_l, user_l)
    for var, a, b, c in zip(variables, plain_v, got_v, user_v):
        np.testing.assert_array_equal(b, a, err_msg=f"{var.name} vs the captured graph")
        np.testing.assert_array_equal(b, c, err_msg=f"{var.name} vs the user's function")


def keras_step(name, layers, x, y):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(layers, name=name)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return zoo._train_step(name, model, (x, y), loss)


def labels(n, classes=10):
    return np.random.default_rng(1).integers(0, classes, n).astype(np.int32)


def mlp_step(name, hook, final=None, seed=0):
    """``DEPTH`` matmuls of a (BATCH, WIDTH) batch on raw variables, each output
    passed through ``hook(k, h, saved)``; SGD on a squared error (+ ``final``)."""
    rng = np.random.default_rng(seed)
    weights = [tf.Variable((rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH))
                           .astype(np.float32), name=f"w{k}") for k in range(DEPTH)]

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h, saved = x, []
            for k, w in enumerate(weights):
                h = hook(k, tf.matmul(h, w), saved)
            loss = tf.reduce_mean(tf.square(h - y))
            if final is not None:
                loss = final(loss, h, saved)
        grads = tape.gradient(loss, weights)
        for w, g in zip(weights, grads):
            w.assign_sub(0.05 * g)
        return {"loss": loss}

    batch = tuple(rng.standard_normal((BATCH, WIDTH)).astype(np.float32) for _ in range(2))
    cf = step.get_concrete_function(*[tf.TensorSpec(b.shape, tf.float32) for b in batch])
    return zoo.TrainStep(name, weights, None, cf, batch)


def test_lstm_with_a_while_loop_trains_exactly_with_swaps():
    """Keras's LSTM, not unrolled: a While (and its gradient's While) stays one
    opaque op; tensors around it are swapped."""
    x = np.random.default_rng(0).standard_normal((64, 16, 128)).astype(np.float32)
    step = keras_step("lstm_loop", [keras.Input((16, 128))]
                      + [L.Dense(128, activation="relu") for _ in range(5)]
                      + [L.LSTM(16, unroll=False), L.Dense(10)], x, labels(64))
    # The While's body runs its iterations on the executor's threads as they come, which
    # the plan does not order: the same rewritten step measured 3.2 to 4.0 MB in
    # different sessions against a 3.8 MB budget, so keep 15% of it free.
    captured, fast = optimize_with_swaps(step, safety_margin=0.15)
    loops = [op for op in fast.graph.ops if op.type in ("While", "StatelessWhile")]
    assert len(loops) == 2
    assert_trains_exactly(step, captured, fast)


def test_below_a_while_loops_working_set_the_budget_named_works():
    """A GRU's ``While`` needs most of the step's peak at once, so a budget at half
    of it is refused; the budget the error names (the smaller of the two
    parameter homes ``parameters="auto"`` tries, each as TensorFlow's allocator
    holds it, with the named minimum's 5% headroom and the safety margin) is
    close to the unmodified peak, not the 1.8x of it the pool's minimum alone
    named, and the step runs within it."""
    x = np.random.default_rng(0).standard_normal((24, 64, 16)).astype(np.float32)
    step = keras_step("gru_loop", [keras.Input((64, 16)), L.Conv1D(32, 3, activation="swish"),
                                   L.LayerNormalization(), L.GRU(48, return_sequences=True),
                                   L.GlobalMaxPooling1D(), L.Dense(5)], x, labels(24, 5))
    captured = capture.capture(step.concrete_fn)
    peak = measure.measure(captured, captured.graph_def, step.batch).peak_bytes
    kwargs = dict(generations=2, seed=0, workers=1, inputs=step.batch)
    with pytest.raises(BudgetError, match="While") as refused:
        tfswap.optimize(step.concrete_fn, peak // 2, **kwargs)
    minimum = int(re.search(r"about (\d+) bytes", str(refused.value)).group(1))
    assert peak // 2 < minimum < 1.2 * peak
    fast = tfswap.optimize(step.concrete_fn, minimum, **kwargs)
    assert measure.measure(fast.captured, fast.graph_def, step.batch).peak_bytes <= minimum
    variables = fast.captured.variables
    initial = [v.numpy() for v in variables]
    got = run_steps(fast, variables, initial, step.batch)
    fast.restore_parameters()   # the unmodified step reads them on the device again
    want = run_steps(step.concrete_fn, variables, initial, step.batch)
    np.testing.assert_array_equal(got[0], want[0])
    for var, a, b in zip(variables, want[1], got[1]):
        np.testing.assert_array_equal(b, a, err_msg=var.name)


def test_dropout_trains_exactly_with_swaps():
    """Keras 3 Dropout: a seed-generator variable and stateless random ops."""
    x = np.random.default_rng(0).standard_normal((BATCH, 256)).astype(np.float32)
    blocks = [[L.Dense(WIDTH, activation="relu"), L.Dropout(0.3)] for _ in range(DEPTH)]
    step = keras_step("dropout", [keras.Input((256,))] + sum(blocks, []) + [L.Dense(10)],
                      x, labels(BATCH))
    captured, fast = optimize_with_swaps(step)
    assert any("StatelessRandom" in n.op for n in captured.graph_def.node)
    assert_trains_exactly(step, captured, fast)


def test_tf_cond_trains_exactly_with_swaps():
    def hook(k, h, saved):
        if k == 3:
            return tf.cond(tf.reduce_mean(h) > 0, lambda: tf.nn.relu(h), lambda: tf.tanh(h))
        return tf.nn.relu(h)

    step = mlp_step("cond", hook)
    captured, fast = optimize_with_swaps(step)
    ifs = [op for op in fast.graph.ops if op.type in ("If", "StatelessIf")]
    assert ifs
    # The If saves its branch's intermediate (an Optional) for its gradient: the
    # tensors going in and out of it are held by that state, so none is swapped.
    held = {t for op in ifs for t in op.inputs + op.outputs}
    assert not held & {s.tensor for s in fast.plan.swaps}
    assert_trains_exactly(step, captured, fast)


def test_legacy_stateful_random_ops_warn_and_draw_a_fresh_stream():
    def hook(k, h, saved):
        return tf.nn.relu(h) + 0.01 * tf.random.uniform(h.shape, seed=k + 1)

    step = mlp_step("random", hook)
    with pytest.warns(RuntimeWarning, match="legacy stateful random op"):
        captured, fast = optimize_with_swaps(step)
    # Neither fast nor the user's function has run yet: both start their stream.
    assert_trains_exactly(step, captured, fast)


def test_tf_print_still_prints_what_the_users_function_prints(tmp_path):
    out = tmp_path / "printed.txt"

    def hook(k, h, saved):
        if k == 2:
            tf.print("layer", k, tf.reduce_mean(h), output_stream=f"file://{out}")
        return tf.nn.relu(h)

    step = mlp_step("print", hook)
    captured, fast = optimize_with_swaps(step)
    variables = fast.captured.variables
    initial = [v.numpy() for v in variables]
    printed = []
    for fn in (step.concrete_fn, fast):
        out.write_text("")
        run_steps(fn, variables, initial, step.batch, steps=2)
        printed.append(out.read_text().splitlines())
    assert len(printed[0]) == 2 and printed[1] == printed[0]
    assert_trains_exactly(step, captured, fast)


def test_assertions_still_run_and_still_fail():
    def hook(k, h, saved):
        tf.debugging.assert_less(tf.reduce_max(tf.abs(h)), 1e6, message="too large")
        return tf.nn.relu(tf.debugging.assert_all_finite(h, "not finite"))

    step = mlp_step("assert", hook)
    captured, fast = optimize_with_swaps(step)
    assert_trains_exactly(step, captured, fast)
    x, y = step.batch
    with pytest.raises(tf.errors.InvalidArgumentError, match="too large"):
        fast(np.full_like(x, 1e6), y)
    # NaN fails both checks (NaN < 1e6 is false); whichever runs first reports.
    with pytest.raises(tf.errors.InvalidArgumentError, match="not finite|too large"):
        fast(np.full_like(x, np.nan), y)


def test_embedding_gathers_train_exactly_with_swaps():
    """tf.nn.embedding_lookup on a variable (ResourceGather) and its sparse
    gradient applied with a scatter update.  (Keras 3's Embedding gathers from
    the read value instead, GatherV2: the Transformer of test_optimize.)"""
    rng = np.random.default_rng(0)
    table = tf.Variable(rng.standard_normal((1000, WIDTH)).astype(np.float32) * 0.1)
    # 12 layers: with 4, the gather's 4.7 MB set the floor, and in some sessions' executed
    # order (TF's order differs between sessions) the step peaked at 6.3 MB instead of
    # 10.2 MB, where no plan goes below the unmodified peak and 60% of it "fits".
    weights = [tf.Variable((rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH))
                           .astype(np.float32)) for _ in range(12)]

    @tf.function
    def step_fn(ids, y):
        with tf.GradientTape() as tape:
            h = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
            for w in weights:
                h = tf.nn.relu(tf.matmul(h, w))
            loss = tf.reduce_mean(tf.square(h - y))
        grads = tape.gradient(loss, [table] + weights)
        table.scatter_sub(tf.IndexedSlices(0.05 * grads[0].values, grads[0].indices))
        for w, g in zip(weights, grads[1:]):
            w.assign_sub(0.05 * g)
        return {"loss": loss}

    batch = (rng.integers(0, 1000, (BATCH, 8)).astype(np.int32),
             rng.standard_normal((BATCH, WIDTH)).astype(np.float32))
    cf = step_fn.get_concrete_function(*[tf.TensorSpec(b.shape, b.dtype) for b in batch])
    step = zoo.TrainStep("embedding", [table] + weights, None, cf, batch)
    captured, fast = optimize_with_swaps(step)
    assert any(n.op == "ResourceGather" for n in captured.graph_def.node)
    # Not bit for bit: TF's CPU scatter update with repeated ids sums in a
    # thread-dependent order (the user's function run twice from the same
    # start differs in a few elements by ~1e-9), so within equality.RTOL.
    assert_trains_exactly(step, captured, fast, exact=False)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_exactly_with_swaps(policy):
    """Per-layer dtype policies (a global policy would leak into other tests);
    float16 with Keras's LossScaleOptimizer, whose finite check is a tf.cond
    that updates variables in its branches."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((WIDTH,))]
                             + [L.Dense(WIDTH, activation="relu", dtype=policy)
                                for _ in range(DEPTH)] + [L.Dense(10, dtype="float32")])
    optimizer = keras.optimizers.Adam(1e-3)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    batch = (np.random.default_rng(0).standard_normal((BATCH, WIDTH)).astype(np.float32),
             labels(BATCH))
    cf = step_fn.get_concrete_function(*[tf.TensorSpec(b.shape, b.dtype) for b in batch])
    step = zoo.TrainStep(policy, model, optimizer, cf, batch)
    captured, fast = optimize_with_swaps(step)
    low_precision = "float16" if policy == "mixed_float16" else "bfloat16"
    swapped = {fast.graph.tensor(s.tensor).dtype for s in fast.plan.swaps}
    assert low_precision in swapped, swapped
    assert_trains_exactly(step, captured, fast)


def test_a_step_with_integer_math_trains_exactly_with_swaps():
    def hook(k, h, saved):
        if k == 1:   # an int32 tensor made early and read at the very end, the
            # largest long-lived tensor, so that a budget near the smallest moves it
            saved.append(tf.cast(tf.round(tf.tile(h, [1, 4]) * 8.0), tf.int32))
        return tf.nn.relu(h)

    def final(loss, h, saved):
        late = saved[0] + tf.cast(tf.round(tf.tile(h, [1, 4])), tf.int32)   # after the forward
        return loss + 1e-3 * tf.reduce_mean(
            tf.cast(tf.math.floormod(late, 3), tf.float32) * tf.tile(h, [1, 4]))

    step = mlp_step("integers", hook, final)
    # Whether the GA moves the int32 tensor depends on the traced order (a
    # fresh-clone suite run once moved only float32 ones), so the int32 round
    # trip itself is forced in tests/tf/test_rewrite.py; here the step with
    # integer math trains exactly under a plan that swaps.
    captured, fast = optimize_with_swaps(step, fraction=0.2)
    assert_trains_exactly(step, captured, fast)
