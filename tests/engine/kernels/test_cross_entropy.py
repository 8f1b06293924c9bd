"""F.cross_entropy on its kernel path (kernels/cross_entropy.cu through the CPU emulation) against
its NumPy reference path: one forward launch that also reduces ("sum", "mean": the kept rows counted
on the device), one backward launch that reads the upstream gradients as they come (None, device
scalars, per-row arrays), float32, float16 and bfloat16 logits, and a reduction that gives the same
bits every time (its block counter back at 0 after each launch).
"""

import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import backend, functional as F, kernels
from tinyformer.engine.kernels import cross_entropy as cross_entropy_kernel
from tinyformer.testing.kernel_cases import rand

pytestmark = pytest.mark.usefixtures("cxx_compiler")  # skipped without g++ or clang++; failed in CI (compilers.py)

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": backend.bfloat16}
TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1e-2}  # relative, of the largest value


def _problem(dtype, ignore_index, seed=0, shape=(3, 7), vocab=300):
    rng = np.random.default_rng(seed)
    logits = rand(rng, *shape, vocab, scale=4.0).astype(DTYPES[dtype])
    target = rng.integers(0, vocab, shape)
    target.reshape(-1)[[i for i in (0, 4, 9) if i < target.size]] = 0 if ignore_index in (None, 0) else ignore_index
    return logits, target


def _run(path_is_kernel, monkeypatch, logits, target, smoothing, ignore_index, reduction, upstream):
    """(loss, nll, d logits, whether the kernel ran) for ``upstream`` = (g_loss, g_nll), either None."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: path_is_kernel)
    z = Tensor(logits.copy(), requires_grad=True)
    loss, nll = F.cross_entropy(z, target, smoothing, ignore_index, reduction, return_nll=True)
    grads = loss.grad_fn.backward(*upstream)
    return loss.data, nll.data, grads[0], loss.grad_fn.uses_kernel


def _upstreams(reduction, shape, rng):
    one = (lambda: np.float32(rng.uniform(0.5, 2.0)).reshape(())) if reduction != "none" else \
        (lambda: rand(rng, *shape).astype(np.float32))
    return {"both": (one(), one()), "loss only": (one(), None), "nll only": (None, one())}


def _close(actual, expected, dtype, what):
    actual, expected = (np.asarray(a, dtype=np.float64) for a in (actual, expected))
    scale = max(np.abs(expected).max(initial=0.0), 1e-3)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE[dtype] * scale, err_msg=what)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
@pytest.mark.parametrize("smoothing, ignore_index", [(0.0, None), (0.1, 0), (0.2, -100)])
def test_kernel_path_equals_the_reference(dtype, reduction, smoothing, ignore_index, monkeypatch):
    logits, target = _problem(dtype, ignore_index, seed=len(reduction))
    for name, upstream in _upstreams(reduction, target.shape, np.random.default_rng(1)).items():
        *expected, used = _run(False, monkeypatch, logits, target, smoothing, ignore_index, reduction, upstream)
        *actual, used_kernel = _run(True, monkeypatch, logits, target, smoothing, ignore_index, reduction, upstream)
        assert used_kernel and not used
        assert actual[0].dtype == actual[1].dtype == np.float32 and actual[2].dtype == logits.dtype
        assert actual[0].shape == expected[0].shape
        for what, a, e in zip(("loss", "nll", "grad"), actual, expected):
            _close(a, e, dtype, f"{what}, upstream {name}")


def test_mean_counts_the_kept_rows_on_the_device(monkeypatch):
    """"mean" of 3 kept rows out of 6 is their sum / 3, and every ignored row gets no gradient; with
    every row ignored the loss is 0 (no division by zero) and so is the gradient."""
    logits, target = _problem("float32", 0, shape=(6,))
    target[:] = [0, 5, 0, 7, 0, 9]
    g = (np.float32(1.0).reshape(()), None)
    total = _run(True, monkeypatch, logits, target, 0.0, 0, "sum", g)
    mean = _run(True, monkeypatch, logits, target, 0.0, 0, "mean", g)
    assert float(mean[0]) == pytest.approx(float(total[0]) / 3, rel=1e-6)
    np.testing.assert_allclose(mean[2] * 3, total[2], rtol=1e-5, atol=1e-7)
    assert not mean[2][[0, 2, 4]].any() and mean[2][[1, 3, 5]].any()
    target[:] = 0
    loss, nll, grad, _ = _run(True, monkeypatch, logits, target, 0.1, 0, "mean", g)
    assert float(loss) == float(nll) == 0.0 and not grad.any()


def test_reduction_is_deterministic_and_leaves_its_counter_at_zero(monkeypatch):
    """Many rows (the last block sums them all): the same bits on every call, and the block counter
    back at 0 after each launch (a counter left behind would make the next launch's sums garbage)."""
    logits, target = _problem("float32", 0, seed=5, shape=(40, 13), vocab=37)
    results = [_run(True, monkeypatch, logits, target, 0.1, 0, reduction, (np.float32(2.0).reshape(()), None))
               for reduction in ("mean", "sum", "mean", "sum")]
    assert int(cross_entropy_kernel._counters["host"][0][0]) == 0
    for first, again in zip(results[:2], results[2:]):
        for a, b in zip(first[:3], again[:3]):
            assert np.array_equal(a, b)
    expected = _run(False, monkeypatch, logits, target, 0.1, 0, "sum", (np.float32(2.0).reshape(()), None))
    for a, e in zip(results[1][:3], expected[:3]):
        _close(a, e, "float32", "sum of 520 rows")


def test_one_launch_each_way_and_no_array_operation(monkeypatch):
    """The forward and the backward are one kernel launch each, nothing else: the keep mask, the
    count, the weights and the upstream's broadcast all happen inside the kernels."""
    logits, target = _problem("float32", 0)
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)
    z = Tensor(logits, requires_grad=True)
    for reduction, upstream in (("mean", np.float32(3.0).reshape(())), ("none", np.ones(target.shape, np.float32))):
        with backend.counting_launches() as forward:
            loss, _ = F.cross_entropy(z, target, 0.1, 0, reduction, return_nll=True)
        with backend.counting_launches() as backward:
            loss.grad_fn.backward(upstream, None)
        assert dict(forward) == {"cross_entropy_forward": 1} and dict(backward) == {"cross_entropy_backward": 1}


def test_broadcast_upstream_is_read_in_place(monkeypatch):
    """A per-row upstream that is one value broadcast (stride 0, as a sum's backward gives) is read
    as one value, not copied; it equals the same values written out."""
    logits, target = _problem("float32", -100)
    broadcast = np.broadcast_to(np.float32(1.5), target.shape)
    written = np.full(target.shape, 1.5, np.float32)
    a = _run(True, monkeypatch, logits, target, 0.1, -100, "none", (broadcast, written))
    b = _run(True, monkeypatch, logits, target, 0.1, -100, "none", (written, broadcast))
    assert np.array_equal(a[2], b[2])


def test_backward_refuses_an_upstream_of_the_wrong_size():
    logits, target = _problem("float32", None)
    flat, t = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    _, _, lse = cross_entropy_kernel.cross_entropy_forward(flat, t)
    with pytest.raises(ValueError, match=r"cross_entropy_backward: grad_nll of shape \(5,\)"):
        cross_entropy_kernel.cross_entropy_backward(flat, t, lse, None, np.ones(5, np.float32))
