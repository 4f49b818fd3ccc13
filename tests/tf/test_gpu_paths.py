"""The GPU paths' CPU-side parts (issue #19): which figures a GPU gets, how a
device's peak is measured, the allocator measurement and the link chains.

What needs a GPU itself (the GPU's name from TensorFlow, the CUDA driver's
memory size, BFC's peak) is not run here; these tests run the same code on
the emulated device where it is device-agnostic, and the choices around it.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tfswap import budget_arena, pipeline, zoo
from tfswap import options as options_mod
from tfswap.tf import device as tf_device
from tfswap.core.devices import DeviceSpec, device_spec
from tfswap.tf import emulate, gpu, link, measure


@pytest.mark.parametrize("device, index", [("/device:GPU:0", 0), ("GPU:1", 1),
                                           ("/job:localhost/replica:0/task:0/device:GPU:3", 3)])
def test_a_gpu_device_name_gives_its_index(device, index):
    assert gpu.physical_index(device) == index


def test_a_cpu_device_has_no_gpu_index():
    with pytest.raises(ValueError, match="not a GPU device name"):
        gpu.physical_index("/device:CPU:0")


def test_a_named_gpu_gets_its_preset_not_the_v100s(monkeypatch):
    monkeypatch.setattr(gpu, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    spec, note = tf_device.choose_spec(None, "/device:GPU:0")
    assert spec == device_spec("h100-80g-pcie5")
    assert "h100-80g-pcie5" in note and "NVIDIA H100 80GB HBM3" in note
    # What optimize, load_plan and SwapCallback (device_spec=None) resolve to.
    assert tf_device.spec_for(None, "/device:GPU:0") == device_spec("h100-80g-pcie5")


def test_an_unknown_gpu_is_measured_and_the_note_says_so(monkeypatch):
    measured = dataclasses.replace(device_spec("h100-80g-pcie5"), name="measured-nvidia-h200")
    asked = []

    def fake_measure(device, name):
        asked.append((device, name))
        return measured, "measured on this machine in 9.0 s"

    monkeypatch.setattr(gpu, "device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(gpu, "measured_spec", fake_measure)
    spec, note = tf_device.choose_spec(None, "/device:GPU:0")
    assert spec is measured and asked == [("/device:GPU:0", "NVIDIA H200")]
    assert "no preset describes 'NVIDIA H200'" in note and "measured" in note


def test_a_given_spec_and_the_emulated_device_need_no_detection(monkeypatch):
    monkeypatch.setattr(gpu, "device_name", lambda device: pytest.fail("detected a GPU"))
    assert tf_device.choose_spec("a100-40g-pcie4", "/device:GPU:0") == (
        device_spec("a100-40g-pcie4"), None)
    spec, note = tf_device.choose_spec(None, emulate.DEVICE)
    assert spec.name == "cpu-emulated" and note is None


@pytest.mark.parametrize("device, emulated, method", [
    (emulate.DEVICE, True, measure.STEP_STATS),
    ("/job:localhost/replica:0/task:0/device:CPU:0", True, measure.STEP_STATS),
    ("/device:GPU:0", False, measure.ALLOCATOR),
    ("/device:GPU:1", True, measure.ALLOCATOR),
    (emulate.HOST, True, None),          # the emulated host is not the device
    (emulate.DEVICE, False, None),       # a plain CPU: its allocator holds the host's too
])
def test_how_a_device_peak_is_measured(device, emulated, method):
    assert measure.peak_method(device, emulated) == method


def _cpu_allocator_counting(captured, batch):
    """Make the emulated device's CPU allocator keep statistics, as a GPU's BFC
    always does: TensorFlow turns them on for its first traced Session run and
    has no other switch (without it ``reset_memory_stats("CPU:0")`` raises, so
    these tests passed only after another test had traced a run)."""
    measure.measure(captured, captured.graph_def, batch, runs=1, warmup=0)


def test_the_allocator_measurement_runs_the_step_and_restores_its_variables():
    # The GPU path's code on the emulated device's CPU allocator (which also
    # counts the host's tensors, so only its bookkeeping is checked here; it
    # leaves out small buffers, so the activations are a few MB).
    step = zoo.cnn(batch=32, image=32, channels=8, blocks=2)
    from tfswap.tf import capture

    captured = capture.capture(step.concrete_fn)
    _cpu_allocator_counting(captured, step.batch)
    before = [v.numpy() for v in captured.variables]
    m = measure.allocator_peak(step.concrete_fn, step.batch, captured, emulate.DEVICE,
                               runs=2, warmup=1)
    assert len(m.run_peaks) == 2 and m.transient_peak_bytes == max(m.run_peaks) > 0
    assert m.variable_bytes == measure.device_variable_bytes(captured) > 0
    assert m.peak_bytes == m.transient_peak_bytes + m.variable_bytes
    assert "CPU:0" in m.describe() and "allocator" in m.describe()
    for v, value in zip(captured.variables, before):
        assert np.array_equal(v.numpy(), value), f"{v.name} was not restored"


def test_verify_reports_what_it_measured_and_where(monkeypatch):
    step = zoo.cnn(batch=8, image=8, channels=4, blocks=3)
    options = options_mod.Options.of(1.0, generations=2, seed=0, workers=1, inputs=step.batch)
    prepared = pipeline.prepare(step.concrete_fn, options)
    prepared = pipeline.with_budget(prepared, int(0.7 * prepared.profile.peak_bytes))
    made = pipeline.materialize(pipeline.plan(prepared, pipeline.first_attempt(prepared),
                                              planner="tfswap.order"))
    stats = pipeline.verify(made)
    assert stats.measured_peak_bytes > 0 and "step stats of the emulated device" in \
        stats.measured_on
    # The GPU path, taken on the emulated device's allocator.
    monkeypatch.setattr(measure, "peak_method", lambda device, emulated: measure.ALLOCATOR)
    assert prepared.verifiable
    by_allocator = pipeline.verify(made)
    assert by_allocator.measured_peak_bytes > 0
    assert "allocator's peak on /device:CPU:0" in by_allocator.measured_on
    monkeypatch.setattr(measure, "peak_method", lambda device, emulated: None)
    assert not prepared.verifiable and pipeline.verify(made).measured_peak_bytes is None


def test_a_step_that_runs_out_of_device_memory_ends_the_measurement_as_a_lower_bound():
    step = zoo.cnn(batch=8, image=8, channels=4, blocks=3)
    from tfswap.tf import capture

    captured = capture.capture(step.concrete_fn)
    _cpu_allocator_counting(captured, step.batch)
    before = [v.numpy() for v in captured.variables]
    calls = []

    def second_run_fails(*args):   # the warm-up fits, the first measured run does not
        calls.append(args)
        out = step.concrete_fn(*args)
        if len(calls) == 2:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
        return out

    m = measure.allocator_peak(second_run_fails, step.batch, captured, emulate.DEVICE,
                               runs=3, warmup=1)
    assert m.out_of_memory and len(calls) == 2 and len(m.run_peaks) == 1
    assert m.peak_bytes == m.run_peaks[0] + m.variable_bytes
    assert "ran out of device memory" in m.describe() and "lower bound" in m.describe()
    for v, value in zip(captured.variables, before):
        assert np.array_equal(v.numpy(), value), f"{v.name} was not restored"


def test_out_of_device_memory_under_the_budget_is_not_within_it_and_plans_again(monkeypatch):
    """A budget above the device's free memory: the step runs out of memory at a
    peak below the budget; verify must not call that within the budget."""
    step = zoo.cnn(batch=8, image=8, channels=4, blocks=3)
    options = options_mod.Options.of(1.0, generations=2, seed=0, workers=1, inputs=step.batch)
    prepared = pipeline.prepare(step.concrete_fn, options)
    budget = int(0.7 * prepared.profile.peak_bytes)
    prepared = pipeline.with_budget(prepared, budget)
    attempt = pipeline.first_attempt(prepared)
    made = pipeline.materialize(pipeline.plan(prepared, attempt, planner="tfswap.order"))
    oom = measure.AllocatorMeasurement(budget // 2, budget // 2, 0, (budget // 2,),
                                       emulate.DEVICE, out_of_memory=True)
    monkeypatch.setattr(measure, "peak_method", lambda device, emulated: measure.ALLOCATOR)
    monkeypatch.setattr(measure, "allocator_peak", lambda *a, **k: oom)
    verified = pipeline.verify(made)
    assert verified.out_of_memory and verified.measured_peak_bytes < budget
    assert not verified.within_budget
    again = pipeline.refine(verified)
    assert again.replans == attempt.replans + 1
    assert "ran out of device memory" in again.notes[-1]


def test_the_report_says_where_the_peak_was_measured():
    import tfswap

    step = zoo.cnn(batch=8, image=8, channels=4, blocks=3)
    fast = tfswap.optimize(step.concrete_fn, 1.0, generations=1, workers=1, inputs=step.batch)
    assert fast.measured_on is None      # it fits: nothing to verify
    captured_peak = fast.profile.peak_bytes
    fast = tfswap.optimize(step.concrete_fn, int(0.7 * captured_peak), generations=2, workers=1,
                           inputs=step.batch)
    text = fast.report()
    assert fast.measured_peak_bytes is not None
    assert "measured peak: the step stats of the emulated device /device:CPU:0" in text
    assert any(n.startswith("verified on /device:CPU:0") for n in fast.notes)
    unverified = tfswap.optimize(step.concrete_fn, int(0.7 * captured_peak), generations=2,
                                 workers=1, inputs=step.batch, verify_rounds=0)
    assert unverified.measured_peak_bytes is None
    assert any("not verified: verify_rounds=0" in n for n in unverified.notes)


@pytest.mark.parametrize("direction", link.DIRECTIONS)
def test_a_chain_of_copies_takes_at_least_each_copy_at_the_emulated_rate(direction):
    """A lower bound, which a loaded machine cannot break: the chain is serial
    and each emulated copy completes no sooner than its bytes at the rate.  (A
    difference of two chains' times, as link.sample reports, is noise-bound;
    this suite's processes share two cores.)"""
    import time

    rate, nbytes, copies = 2e9, 1 << 20, 5
    fn = link.chain(direction, copies, emulate.DEVICE, emulate.HOST, nbytes, rate)
    x, y = link.device_tensor(nbytes, emulate.DEVICE, 0), link.device_tensor(nbytes,
                                                                             emulate.DEVICE, 1)
    fn(x, y)   # traced, and the first pinned allocations
    start = time.perf_counter()
    fn(x, y)
    assert time.perf_counter() - start >= copies * nbytes / rate
    s = link.sample(direction, nbytes, emulate.DEVICE, emulate.HOST, short=1, long=3,
                    repeats=1, link_bytes_per_s=rate)
    assert (s.nbytes, s.short, s.long) == (nbytes, 1, 3) and s.spread_s == 0.0


def test_the_link_line_fit_recovers_latency_and_rate():
    rate, latency = 10e9, 20e-6
    samples = [link.LinkSample("h2d", n, 2, 10, latency + n / rate, 0.0)
               for n in (64 << 10, 1 << 20, 16 << 20)]
    got_latency, got_rate = link.fit(samples)
    assert got_latency == pytest.approx(latency, rel=1e-6)
    assert got_rate == pytest.approx(rate, rel=1e-6)
    with pytest.raises(ValueError, match="two sizes"):
        link.fit(samples[:1])


def test_the_compute_figures_are_measured_rates():
    # Device-agnostic code that measures an unknown GPU, run small on the CPU.
    assert gpu.matmul_flops(emulate.DEVICE, n=128) > 0
    assert gpu.memory_bandwidth(emulate.DEVICE, nbytes=1 << 20) > 0


def test_measured_figures_are_read_back_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = dataclasses.replace(device_spec("a100-40g-pcie4"), name="measured-some-gpu")
    (tmp_path / "tfswap").mkdir()
    (tmp_path / "tfswap" / "gpu-some-gpu.pipelined.json").write_text(spec.to_json())
    got, how = gpu.measured_spec("/device:GPU:0", "Some GPU")
    assert got == spec and isinstance(got, DeviceSpec) and "cached" in how
    assert "gpu-some-gpu.pipelined.json" in gpu.cached_specs()


def test_an_unknown_gpu_is_measured_with_copies_queued_as_a_plan_queues_them(
        tmp_path, monkeypatch):
    """The link is timed with unchained copies (a chain's per-copy time includes
    each completion's hand-back, ~100 us on an H200, which a plan's queued copies
    do not pay); figures cached from chains are not read back."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "tfswap").mkdir()
    stale = dataclasses.replace(device_spec("a100-40g-pcie4"), name="measured-some-gpu",
                                copy_latency_s=120e-6)
    (tmp_path / "tfswap" / "gpu-some-gpu.json").write_text(stale.to_json())
    asked = []

    def fake_sample(direction, nbytes, device, host, *, chained=True, **kwargs):
        asked.append(chained)
        return link.LinkSample(direction, nbytes, 2, 8, 8e-6 + nbytes / 40e9, 0.0, chained)

    monkeypatch.setattr(link, "sample", fake_sample)
    monkeypatch.setattr(gpu, "total_memory_bytes", lambda index: 80 << 30)
    monkeypatch.setattr(gpu, "matmul_flops", lambda device: 400e12)
    monkeypatch.setattr(gpu, "memory_bandwidth", lambda device: 2e12)
    got, how = gpu.measured_spec("/device:GPU:0", "Some GPU")
    assert "measured on this machine" in how and asked and not any(asked)
    assert got.copy_latency_s == pytest.approx(8e-6) and got.h2d_bytes_per_s == pytest.approx(40e9)
    assert DeviceSpec.from_json((tmp_path / "tfswap" / "gpu-some-gpu.pipelined.json")
                                .read_text()) == got


@pytest.mark.parametrize("direction", link.DIRECTIONS)
def test_unchained_copies_are_issued_at_once_and_still_share_the_link(direction):
    """No control edge between the copies; on the emulated link they still cross
    one at a time (a lower bound on the time, which a loaded machine cannot break)."""
    import time

    rate, nbytes, copies = 2e9, 1 << 20, 4
    fn = link.chain(direction, copies, emulate.DEVICE, emulate.HOST, nbytes, rate,
                    chained=False)
    swaps = [op for op in fn.graph.get_operations() if op.type in ("SwapOut", "SwapIn")]
    assert swaps and all(not op.control_inputs for op in swaps)
    x, y = link.device_tensor(nbytes, emulate.DEVICE, 0), link.device_tensor(nbytes,
                                                                             emulate.DEVICE, 1)
    fn(x, y)
    start = time.perf_counter()
    fn(x, y)
    assert time.perf_counter() - start >= copies * nbytes / rate
    with pytest.raises(ValueError, match="chained must be True or False"):
        link.chain(direction, copies, emulate.DEVICE, emulate.HOST, nbytes, chained=1)


def test_duplex_uses_both_directions_at_once():
    rate = 1e9   # 4 ms a copy: far more than the memcpy behind it
    one_way = link.sample("d2h", 4 << 20, emulate.DEVICE, emulate.HOST, short=1, long=3,
                          repeats=2, link_bytes_per_s=rate)
    both = link.sample("duplex", 4 << 20, emulate.DEVICE, emulate.HOST, short=1, long=3,
                       repeats=2, link_bytes_per_s=rate)
    assert both.per_copy_s < 1.5 * one_way.per_copy_s   # not one chain after the other
    assert both.bytes_per_s > 1.3 * one_way.bytes_per_s


def test_under_a_budget_arena_the_plan_binds_its_pool_and_each_call_runs_in_it(monkeypatch):
    """The one-process pool flow (install_gpu_arena), its TensorFlow side on the
    emulated device: a host arena stands in for the GPU's, so what is checked is
    the binding -- which pool, when it serves -- and that the bound step still
    trains as the unmodified one; the GPU's allocations themselves need a GPU."""
    from tests.tf.equality import assert_same_training
    from tfswap.ops import allocator

    step = zoo.cnn(batch=8, image=8, channels=24, blocks=3)   # kernels above the small pool
    options = options_mod.Options.of(1.0, generations=2, seed=0, workers=1, inputs=step.batch)
    prepared = pipeline.prepare(step.concrete_fn, options)
    # What is checked is the binding, not a tight plan: at 70% of the peak the
    # small pool (the step's small variables counted all step) left the class
    # pool 0.2% short of what one op uses at once in a fresh-clone run.
    budget = int(0.8 * prepared.profile.peak_bytes)
    prepared = pipeline.with_budget(prepared, budget)
    planned = pipeline.plan(prepared, pipeline.first_attempt(prepared), planner="tfswap.order")

    arena = allocator.Arena.host(budget)
    seen = []
    real_active = arena.active

    def recording_active(layout_id):
        seen.append(("call", layout_id))
        return real_active(layout_id)

    monkeypatch.setattr(arena, "active", recording_active)
    monkeypatch.setattr(measure, "peak_method", lambda device, emulated: measure.ALLOCATOR)
    monkeypatch.setattr(allocator, "installed_gpu_arena", lambda device=None: arena)
    made = pipeline.materialize(planned)
    assert made.bound.memory_scope is not None
    # The pool registered is the plan's, less what the device variables hold.
    pool = budget_arena.arena_allocation(planned)
    assert pool.class_bytes == planned.plan.allocation.class_bytes
    assert sum(pool.class_count) < sum(planned.plan.allocation.class_count)
    stats = arena.layout_stats(0)
    assert not stats.carved
    assert_same_training(step.concrete_fn, made.bound, prepared.captured.variables,
                         step.batch, steps=2, exact=True)
    assert seen == [("call", 0)] * 2 and arena.stats().active_layout is None
    carved = arena.layout_stats(0)
    assert carved.carved and carved.pool.classes and carved.nbytes <= budget
    assert carved.pool.bytes_limit == allocator.replay(allocator.PoolAllocation(
        pool.class_bytes, pool.class_count, pool.small_pool_bytes, planned.plan.id,
        pool.small_threshold_bytes, pool.object_offsets), []).stats.bytes_limit
    # A budget above the arena cannot hold: prepare says so before any work.
    with pytest.raises(pipeline.BudgetError, match="more than the budget arena"):
        pipeline.prepare(step.concrete_fn, options_mod.Options.of(
            arena.stats().arena_bytes + 1, generations=2, seed=0, workers=1,
            inputs=step.batch))


def test_a_plan_pool_the_arena_cannot_hold_is_out_of_memory_and_planned_again(monkeypatch):
    from tfswap.ops import allocator

    step = zoo.cnn(batch=8, image=8, channels=24, blocks=3)
    options = options_mod.Options.of(1.0, generations=2, seed=0, workers=1, inputs=step.batch)
    prepared = pipeline.prepare(step.concrete_fn, options)
    prepared = pipeline.with_budget(prepared, int(0.7 * prepared.profile.peak_bytes))
    attempt = pipeline.first_attempt(prepared)
    planned = pipeline.plan(prepared, attempt, planner="tfswap.order")
    _cpu_allocator_counting(prepared.captured, step.batch)
    tiny = allocator.Arena.host(4096)
    monkeypatch.setattr(measure, "peak_method", lambda device, emulated: measure.ALLOCATOR)
    monkeypatch.setattr(allocator, "installed_gpu_arena", lambda device=None: tiny)
    before = [v.numpy() for v in prepared.captured.variables]
    verified = pipeline.verify(pipeline.materialize(planned))
    assert verified.out_of_memory and not verified.within_budget
    assert "budget arena of 4096 bytes" in verified.measured_on
    for v, value in zip(prepared.captured.variables, before):
        assert np.array_equal(v.numpy(), value), f"{v.name} changed"
    assert pipeline.refine(verified).replans == attempt.replans + 1
