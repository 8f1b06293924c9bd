"""Adam (§5.3) against a hand computation, gradient clipping, and the Noam schedule."""

import math

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.engine.kernels import adam as adam_kernel
from tinyformer.model import optim
from tinyformer.model.nn import Parameter


def _params(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [Parameter(rng.standard_normal((3, 2)).astype(dtype)),
            Parameter(rng.standard_normal(4).astype(dtype))]


def _reference_adam(thetas, grads_per_step, lr_at, betas=(0.9, 0.98), eps=1e-9):
    """Adam written out step by step with bias correction, in float64."""
    b1, b2 = betas
    thetas = [t.astype(np.float64).copy() for t in thetas]
    m = [np.zeros_like(t) for t in thetas]
    v = [np.zeros_like(t) for t in thetas]
    for step, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1 ** step)
            v_hat = v[i] / (1 - b2 ** step)
            thetas[i] = thetas[i] - lr_at(step) * m_hat / (np.sqrt(v_hat) + eps)
    return thetas


@pytest.mark.parametrize("schedule", [False, True])
def test_adam_first_steps_equal_hand_computation(schedule):
    params = _params()
    start = [p.data.copy() for p in params]
    lr = optim.NoamSchedule(16, warmup_steps=3, factor=2.0) if schedule else 0.01
    adam = optim.Adam(params, lr=lr)
    rng = np.random.default_rng(1)
    history = []
    for _ in range(5):
        grads = [rng.standard_normal(p.shape) for p in params]
        history.append(grads)
        for p, g in zip(params, grads):
            p.grad = g.copy()
        adam.step()
    expected = _reference_adam(start, history, lr if schedule else (lambda step: 0.01))
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.data, e, rtol=1e-12, atol=1e-14)


def test_adam_first_step_moves_each_weight_by_lr():
    """After one step m̂ = g and v̂ = g², so every weight moves by lr·sign(g) (ε aside)."""
    params = _params()
    before = [p.data.copy() for p in params]
    rng = np.random.default_rng(2)
    for p in params:
        p.grad = rng.standard_normal(p.shape)
    optim.Adam(params, lr=0.5).step()
    for p, b in zip(params, before):
        np.testing.assert_allclose(b - p.data, 0.5 * np.sign(p.grad), rtol=1e-7)


def test_adam_skips_parameters_without_gradient_and_keeps_dtype():
    params = _params(dtype=np.float32)
    before = params[1].data.copy()
    params[0].grad = np.ones(params[0].shape, np.float32)
    adam = optim.Adam(params, lr=0.1)
    adam.step()
    np.testing.assert_array_equal(params[1].data, before)
    assert params[0].data.dtype == np.float32
    assert adam.m[1] is None


def test_adam_weight_decay_adds_l2_term():
    params = _params()
    start = [p.data.copy() for p in params]
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(p.shape) for p in params]
    for p, g in zip(params, grads):
        p.grad = g.copy()
    optim.Adam(params, lr=0.01, weight_decay=0.1).step()
    expected = _reference_adam(start, [[g + 0.1 * s for g, s in zip(grads, start)]], lambda s: 0.01)
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.data, e, rtol=1e-12)


def test_clip_grad_norm_scales_to_the_global_norm():
    params = _params()
    rng = np.random.default_rng(4)
    for p in params:
        p.grad = rng.standard_normal(p.shape) * 10
    grads = [p.grad.copy() for p in params]
    total = math.sqrt(sum((g ** 2).sum() for g in grads))
    returned = optim.clip_grad_norm(params, 1.0)
    assert returned == pytest.approx(total)
    clipped = math.sqrt(sum((p.grad ** 2).sum() for p in params))
    assert clipped == pytest.approx(1.0, rel=1e-9)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad, g / total, rtol=1e-9)


def test_clip_grad_norm_of_float32_gradients_past_float32_range_is_computed_in_float64():
    params = [Parameter(np.zeros((3, 4), np.float32)), Parameter(np.zeros(5, np.float32))]
    params[0].grad = np.full((3, 4), 1e20, np.float32)  # Σ g² = 1.2e41 overflows float32
    params[1].grad = np.full(5, 2.0, np.float32)
    expected = math.sqrt(12 * float(np.float32(1e20)) ** 2 + 5 * 4.0)
    assert optim.clip_grad_norm(params, None) == pytest.approx(expected, rel=1e-12)


def test_clip_grad_norm_leaves_small_and_non_finite_gradients_alone():
    params = _params()
    params[0].grad = np.full(params[0].shape, 0.01)
    params[1].grad = None
    assert optim.clip_grad_norm(params, 1.0) == pytest.approx(math.sqrt(6) * 0.01)
    np.testing.assert_array_equal(params[0].grad, 0.01)
    params[0].grad = np.array([[np.inf, 1], [1, 1], [1, 1]])
    assert math.isinf(optim.clip_grad_norm(params, 1.0))
    assert params[0].grad[1, 0] == 1


def test_adam_with_clipping_records_the_norm():
    params = _params()
    for p in params:
        p.grad = np.full(p.shape, 3.0)
    adam = optim.Adam(params, lr=0.1, max_grad_norm=1.0)
    norm = adam.step()
    assert norm == pytest.approx(3.0 * math.sqrt(10))
    assert adam.last_grad_norm == norm


def test_adam_state_dict_round_trip_continues_identically():
    rng = np.random.default_rng(5)
    grads = [[rng.standard_normal(p.shape) for p in _params()] for _ in range(6)]

    def run(params, adam, steps):
        for gs in steps:
            for p, g in zip(params, gs):
                p.grad = g.copy()
            adam.step()

    a = _params()
    adam_a = optim.Adam(a, lr=optim.NoamSchedule(8, warmup_steps=2))
    run(a, adam_a, grads)

    b = _params()
    adam_b = optim.Adam(b, lr=optim.NoamSchedule(8, warmup_steps=2))
    run(b, adam_b, grads[:3])
    state = adam_b.state_dict()
    c = [Parameter(p.data.copy()) for p in b]
    adam_c = optim.Adam(c, lr=optim.NoamSchedule(99, warmup_steps=7))
    adam_c.load_state_dict(state)
    assert adam_c.lr.d_model == 8 and adam_c.step_count == 3
    run(c, adam_c, grads[3:])
    for p, q in zip(a, c):
        np.testing.assert_array_equal(p.data, q.data)


def test_adam_load_state_dict_rejects_mismatches():
    adam = optim.Adam(_params(), lr=0.1)
    for p in adam.params:
        p.grad = np.ones(p.shape)
    adam.step()
    state = adam.state_dict()
    with pytest.raises(ValueError, match="moments for 2 parameters.*holds 1"):
        optim.Adam(_params()[:1], lr=0.1).load_state_dict(state)
    other = [Parameter(np.zeros((2, 3))), Parameter(np.zeros(4))]
    with pytest.raises(ValueError, match=r"moment 0 has shape \(3, 2\).*\(2, 3\)"):
        optim.Adam(other, lr=0.1).load_state_dict(state)


@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=-1.0), "lr"),
    (dict(lr=0.1, betas=(0.9, 1.0)), "betas"),
    (dict(lr=0.1, max_grad_norm=0.0), "max_grad_norm"),
])
def test_adam_rejects_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        optim.Adam(_params(), **kwargs)


def test_adam_rejects_empty_or_repeated_params():
    with pytest.raises(ValueError, match="empty"):
        optim.Adam([], lr=0.1)
    p = _params()
    with pytest.raises(ValueError, match="more than once"):
        optim.Adam(p + p[:1], lr=0.1)


def test_noam_peak_matches_the_paper():
    schedule = optim.NoamSchedule(512, warmup_steps=4000)
    step, peak = schedule.peak()
    assert step == 4000
    assert peak == pytest.approx(6.99e-4, abs=5e-7)
    assert schedule(4000) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    lrs = [schedule(s) for s in range(1, 20001, 50)]
    assert max(lrs) <= peak * (1 + 1e-12)


def test_noam_rises_linearly_then_decays_as_inverse_sqrt():
    schedule = optim.NoamSchedule(512, warmup_steps=4000, factor=2.0)
    assert schedule(2000) == pytest.approx(schedule(1000) * 2)
    assert schedule(16000) == pytest.approx(schedule(8000) / math.sqrt(2))
    assert schedule(1) == pytest.approx(2.0 * 512 ** -0.5 * 4000 ** -1.5)


def test_noam_state_dict_round_trip_and_errors():
    schedule = optim.NoamSchedule(256, warmup_steps=100, factor=3.0)
    other = optim.NoamSchedule(8).load_state_dict(schedule.state_dict())
    assert [other(s) for s in (1, 50, 500)] == [schedule(s) for s in (1, 50, 500)]
    with pytest.raises(ValueError, match="steps count from 1"):
        schedule(0)
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.NoamSchedule(512, warmup_steps=0)
    with pytest.raises(ValueError, match="d_model"):
        optim.NoamSchedule(0)


def test_adam_uses_the_schedule_per_step():
    schedule = optim.NoamSchedule(64, warmup_steps=10)
    adam = optim.Adam(_params(), lr=schedule)
    assert adam.current_lr() == schedule(1)
    for p in adam.params:
        p.grad = np.ones(p.shape)
    adam.step()
    assert adam.current_lr() == schedule(2)


def test_adam_trains_a_linear_regression():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 3))
    w_true = np.array([[1.5], [-2.0], [0.5]])
    y = x @ w_true
    w = Parameter(np.zeros((3, 1)))
    adam = optim.Adam([w], lr=0.05, betas=(0.9, 0.999), eps=1e-8)
    for _ in range(400):
        adam.zero_grad()
        residual = tf.Tensor(x) @ w - tf.Tensor(y)
        (residual * residual).mean().backward()
        adam.step()
    np.testing.assert_allclose(w.data, w_true, atol=1e-2)


def test_adam_in_parallel_blocks_equals_one_block(monkeypatch, set_threads):
    from tinyformer.engine import backend

    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 1)
    rng = np.random.default_rng(3)
    start = [rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal(7).astype(np.float32)]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in start] for _ in range(3)]
    results = []
    for threads in (1, 3):
        set_threads(threads)
        params = [Parameter(a.copy()) for a in start]
        adam = optim.Adam(params, lr=0.01, weight_decay=0.1)
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.copy()
            adam.step()
        results.append([p.data for p in params])
    for one, many in zip(*results):
        np.testing.assert_array_equal(many, one)


# ------------------------------------------------------------------ the step on the device, on NumPy arrays
def _float32_adams(count=2, **kwargs):
    """``count`` Adams over equal float32 parameters (lr a schedule, weight decay on)."""
    out = []
    for _ in range(count):
        params = _params(seed=11, dtype=np.float32)
        out.append(optim.Adam(params, lr=optim.NoamSchedule(16, warmup_steps=3), weight_decay=0.01, **kwargs))
    return out


def _grads(rng, params, scale=1.0):
    return [(rng.standard_normal(p.shape) * scale).astype(np.float32) for p in params]


@pytest.mark.parametrize("max_grad_norm, grad_scale", [(None, 1.0), (0.5, 1.0), (None, 8.0), (0.5, 8.0)])
def test_fused_update_is_the_eager_step(max_grad_norm, grad_scale):
    """From the same state and gradients: the same parameters, moments and norm as ``Adam.step``,
    exactly without clipping and loss scale, else to float32 rounding (the norm is summed in
    float64 there, in float32 by the eager step)."""
    eager, reference = _float32_adams(max_grad_norm=max_grad_norm)
    rng = np.random.default_rng(2)
    for _ in range(3):
        grads = _grads(rng, eager.params, grad_scale)
        for p, g in zip(eager.params, grads):
            p.grad = g.copy()
        norm = eager.step(grad_scale=None if grad_scale == 1.0 else grad_scale)
        reference.write_step_scalars(grad_scale)
        m = [np.zeros_like(p.data) if a is None else a for a, p in zip(reference.m, reference.params)]
        v = [np.zeros_like(p.data) if a is None else a for a, p in zip(reference.v, reference.params)]
        reference.m, reference.v = m, v
        optim.adam.fused_update([p.data for p in reference.params], grads, m, v, reference.hyper,
                                           reference.result, reference.betas, reference.eps, reference.weight_decay)
        assert reference.finish_device_step() == (pytest.approx(norm, rel=1e-6), True)
        exact = max_grad_norm is None and grad_scale == 1.0
        for got, want in zip([p.data for p in reference.params] + m + v,
                             [p.data for p in eager.params] + eager.m + eager.v):
            if exact:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert reference.step_count == eager.step_count == 3


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:overflow:RuntimeWarning")
def test_device_step_calls_equal_eager_steps_with_a_skipped_one_in_the_middle():
    """write_step_scalars → step_on_device → finish_device_step on NumPy arrays (the reference
    path) over five steps, the third with an Inf gradient and the fourth with a NaN loss, against
    ``Adam.step(skip_nonfinite=True)`` skipping the same two: bit for bit (no clipping, scale 1)."""
    eager, device = _float32_adams()
    rng = np.random.default_rng(4)
    for step in range(5):
        grads = _grads(rng, eager.params)
        if step == 2:
            grads[1][0] = np.inf
        for p, g in zip(eager.params, grads):
            p.grad = g.copy()
        if step != 3:  # the eager step is not taken for a non-finite loss (the trainer skips it)
            eager.step(skip_nonfinite=True)
        for p, g in zip(device.params, grads):
            p.grad = g.copy()
        device.write_step_scalars()
        device.prepare_device_step()
        device.step_on_device(loss=tf.Tensor(np.array([np.nan if step == 3 else 2.0], np.float32)))
        norm, applied = device.finish_device_step()
        assert applied == (step not in (2, 3)) and (math.isinf(norm) if step == 2 else math.isfinite(norm))
        assert device.step_count == eager.step_count and device.last_grad_norm == norm
        for a, b in zip(device.params, eager.params):
            np.testing.assert_array_equal(a.data, b.data)
    assert device.step_count == 3


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_eager_step_without_skip_nonfinite_updates_through_a_nan_as_the_device_step_does():
    eager, device = _float32_adams()
    grads = _grads(np.random.default_rng(1), eager.params)
    grads[0][0, 0] = np.nan
    for adam in (eager, device):
        for p, g in zip(adam.params, grads):
            p.grad = g.copy()
    assert math.isnan(eager.step(skip_nonfinite=False))
    device.write_step_scalars(skip_nonfinite=False)
    device.step_on_device()
    norm, applied = device.finish_device_step()
    assert math.isnan(norm) and applied and device.step_count == eager.step_count == 1
    for a, b in zip(device.params, eager.params):
        np.testing.assert_array_equal(a.data, b.data)  # NaN where the eager step put NaN


def test_write_step_scalars_fills_one_persistent_buffer():
    adam = optim.Adam(_params(dtype=np.float32), lr=optim.NoamSchedule(16, warmup_steps=3), max_grad_norm=2.0)
    adam.write_step_scalars(grad_scale=4.0)
    hyper, result = adam.hyper, adam.result
    lr = adam.current_lr(1)
    np.testing.assert_array_equal(hyper, np.array([lr / (1 - 0.9), 1 - 0.98, 4.0, 2.0, 1.0], np.float32))
    adam.step_count = 6
    adam.write_step_scalars(skip_nonfinite=False)
    assert adam.hyper is hyper and adam.result is result
    np.testing.assert_array_equal(hyper, np.array([adam.current_lr(7) / (1 - 0.9 ** 7), 1 - 0.98 ** 7, 1.0, 2.0, 0.0],
                                                  np.float32))
    assert [name for name in adam_kernel.ADAM_HYPER] == ["step_size", "bias2", "grad_scale", "max_grad_norm",
                                                         "skip_nonfinite"]


def test_device_step_calls_in_the_wrong_order_say_what_is_missing():
    adam = optim.Adam(_params(dtype=np.float32))
    with pytest.raises(RuntimeError, match="call write_step_scalars"):
        adam.step_on_device()
    with pytest.raises(RuntimeError, match="no step ran on the device"):
        adam.finish_device_step()
