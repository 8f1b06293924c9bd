"""The sublayer's output bias folded into the post-LN residual node: F.residual_dropout_layer_norm's
y_bias (LayerNorm(x + dropout(y + y_bias)), d(y_bias) = Σ_rows dy summed beside dw and db), its
reference, its kernels through the CPU emulation, and the model leaving W_O's and W₂'s bias to it."""

import numpy as np
import pytest

import tinyformer as tf
from tinyformer import Tensor
from tinyformer.engine import amp, autograd, backend, kernels
from tinyformer.engine import functional as F
from tinyformer.engine.kernels import launch
from tinyformer.engine.kernels import residual_layer_norm as residual_kernel
from tinyformer.model.nn.output_bias import LeavesOutputBias, call_leaving_output_bias
from tinyformer.engine.gradcheck import gradcheck

HALF = {"bfloat16": backend.bfloat16, "float16": np.dtype(np.float16)}


def _leaves(shape=(2, 5, 16), dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [Tensor(rng.standard_normal(s).astype(dtype), requires_grad=True)
            for s in (shape, shape, shape[-1:], shape[-1:], shape[-1:])]


@pytest.mark.parametrize("p,training", [(0.3, True), (0.3, False), (0.0, True)])
def test_equals_layer_norm_of_x_plus_dropout_of_y_plus_bias(p, training):
    """The reference: the unfused ops' values, mask and draws bit for bit; d(y_bias) = Σ_rows dy."""
    g = np.random.default_rng(9).standard_normal((2, 5, 16)).astype(np.float32)
    results = []
    for fused in (True, False):
        x, y, w, b, c = _leaves()
        generator = np.random.default_rng(4)
        if fused:
            out = F.residual_dropout_layer_norm(x, y, w, b, p, training, generator, y_bias=c)
        else:
            out = F.layer_norm(x + F.dropout(y + c, p, training, generator), w, b)
        out.backward(Tensor(g))
        results.append([out.data, x.grad, y.grad, w.grad, b.grad, c.grad, generator.random()])
    for name, fused_value, unfused_value in zip(("out", "x", "y", "w", "b", "y_bias", "draw"), *results):
        if name == "y_bias":  # a sum over the rows in another order
            np.testing.assert_allclose(fused_value, unfused_value, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(fused_value, unfused_value, err_msg=name)
    np.testing.assert_allclose(results[0][5], results[0][2].reshape(-1, 16).sum(0), rtol=1e-6, atol=1e-6)


def test_gradients_pass_central_differences_in_float64():
    x, y, w, b, c = (Tensor(t.data.astype(np.float64), requires_grad=True) for t in _leaves(shape=(3, 7)))
    assert gradcheck(lambda x, y, w, b, c: F.residual_dropout_layer_norm(
        x, y, w, b, 0.4, True, np.random.default_rng(2), y_bias=c), [x, y, w, b, c])


def test_y_bias_alone_needs_a_gradient_and_bad_input_is_named():
    x, y, w, b, c = _leaves()
    for t in (x, y, w, b):
        t.requires_grad = False
    F.residual_dropout_layer_norm(x, y, w, b, 0.2, True, np.random.default_rng(0), y_bias=c).sum().backward()
    assert c.grad is not None and c.grad.shape == (16,) and not np.any(np.isnan(c.grad))
    with pytest.raises(ValueError, match=r"y_bias must have shape \(16,\) for 16 features, got \(15,\)"):
        F.residual_dropout_layer_norm(x, y, w, b, y_bias=Tensor(np.zeros(15, np.float32)))


@pytest.mark.parametrize("on_gpu", [False, True])
def test_d_y_bias_goes_into_the_held_gradient_without_the_engines_add(on_gpu, monkeypatch, cxx_compiler):
    """The reference adds its column sum, the kernel its reduction launch, into y_bias's .grad:
    the engine's store_grad never sees it; the values are float64's."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: on_gpu)
    stored = []
    original = autograd.store_grad
    monkeypatch.setattr(autograd, "store_grad", lambda tensor, grad: stored.append(tensor) or original(tensor, grad))
    x, y, w, b, c = _leaves(shape=(6, 24), seed=3)
    c.grad = np.full(24, 0.5, np.float32)
    g = np.random.default_rng(5).standard_normal((6, 24)).astype(np.float32)
    out = F.residual_dropout_layer_norm(x, y, w, b, 0.0, y_bias=c)
    assert out.grad_fn.uses_kernel == on_gpu
    out.backward(Tensor(g))
    assert not any(t is c for t in stored)
    exact = [Tensor(t.data.astype(np.float64), requires_grad=True) for t in (x, y, w, b, c)]
    reference = F.layer_norm(exact[0] + exact[1] + exact[4], exact[2], exact[3])
    reference.backward(Tensor(g.astype(np.float64)))
    np.testing.assert_allclose(out.data, reference.data, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c.grad, exact[4].grad + 0.5, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- the kernels, emulated
def _rows(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    x, y, g = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(3))
    w, b, c = (rng.standard_normal(cols).astype(np.float32) for _ in range(3))
    return x + 1.5, y, w, b, c, g


@pytest.mark.parametrize("in_shared", [True, False])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_the_kernels_equal_the_reference_and_sum_d_y_bias_beside_dw_db(p, in_shared, monkeypatch, cxx_compiler):
    """Against the NumPy reference (ResidualDropoutLayerNorm's, on the kernel's mask): h and out bit
    for bit at p = 0; d(y_bias) = Σ_rows dy in the same launches as without it (the chunks' sums in
    shared memory or in their rows of the partials), dx, dy, dw, db unchanged by it."""
    if not in_shared:
        monkeypatch.setattr(launch, "STATIC_SHARED_LIMIT", 0)
    x, y, w, b, c, g = _rows(23, 40, seed=1)
    scale = 1 / (1 - p)
    out, h, keep, mean, rstd = residual_kernel.residual_layer_norm_forward(x, y, w, b, p, seed=7, y_bias=c)
    biased = residual_kernel.residual_layer_norm_forward(x, y + c, w, b, p, seed=7)
    np.testing.assert_array_equal(keep, biased[2])
    for got, want in zip((out, h), biased[:2]):  # y + c rounded to float32, then the mask: bit for bit
        np.testing.assert_array_equal(got, want)
    if p == 0:
        np.testing.assert_array_equal(h, x + (y + c))
    with backend.counting_launches() as launches:
        got = residual_kernel.residual_layer_norm_backward(h, w, g, mean, rstd, keep, scale, rows_per_chunk=5,
                                                           need_y_bias=True)
    assert launches == {"residual_layer_norm_backward": 1, "layer_norm_reduce_params": 1}
    want = residual_kernel.residual_layer_norm_backward(h, w, g, mean, rstd, keep, scale, rows_per_chunk=5)
    assert len(got) == 5 and len(want) == 4
    for got_part, want_part in zip(got[:4], want):
        np.testing.assert_array_equal(got_part, want_part)
    np.testing.assert_allclose(got[4], got[1].astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    alone = residual_kernel.residual_layer_norm_backward(h, w, g, mean, rstd, keep, scale, rows_per_chunk=5,
                                                         need_params=False, need_y_bias=True)
    assert alone[2] is None and alone[3] is None
    np.testing.assert_array_equal(alone[4], got[4])
    held = np.linspace(-1, 1, 40).astype(np.float32)
    given = held.copy()
    added = residual_kernel.residual_layer_norm_backward(h, w, g, mean, rstd, keep, scale, rows_per_chunk=5,
                                                         need_y_bias=True, grad_y_bias=given)
    assert added[4] is given
    np.testing.assert_array_equal(given, held + got[4])


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_the_mixed_kernels_read_a_float32_y_bias_beside_the_half_y(dtype, cxx_compiler):
    """x, the parameters and y_bias float32, y half: the float32 kernels' values for y cast up, and
    d(y_bias) the column sums of the half dy as stored."""
    x, y, w, b, c, g = _rows(9, 70, seed=2)
    half = y.astype(HALF[dtype])
    mixed = residual_kernel.residual_layer_norm_forward(x, half, w, b, 0.3, seed=3, y_bias=c)
    plain = residual_kernel.residual_layer_norm_forward(x, half.astype(np.float32), w, b, 0.3, seed=3, y_bias=c)
    for got, want in zip(mixed, plain):
        np.testing.assert_array_equal(got, want)
    _, h, keep, mean, rstd = plain
    got = residual_kernel.residual_layer_norm_backward(h, w, g, mean, rstd, keep, 1 / 0.7, grad_y_dtype=half.dtype,
                                                       need_y_bias=True)
    assert got[1].dtype == half.dtype and got[4].dtype == np.float32
    np.testing.assert_allclose(got[4], got[1].astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"residual_layer_norm: y_bias must be a float32 array of shape \(70,\)"):
        residual_kernel.residual_layer_norm_forward(x, half, w, b, y_bias=c.astype(HALF[dtype]))


@pytest.mark.parametrize("on_gpu", [False, True])
@pytest.mark.parametrize("dtype", sorted(HALF))
def test_under_autocast_the_float32_y_bias_beside_a_half_y(dtype, on_gpu, monkeypatch, cxx_compiler):
    """The op as autocast's residual runs it: y half, y_bias the float32 parameter (no cast node), its
    gradient float32; the kernel and the reference agree within rounding, and with float64."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: on_gpu)
    x, y, w, b, c = _leaves(shape=(6, 24), seed=4)
    y = Tensor(y.data.astype(HALF[dtype]), requires_grad=True)
    g = np.random.default_rng(6).standard_normal((6, 24)).astype(np.float32)
    with amp.autocast("bf16" if dtype == "bfloat16" else "fp16"):
        out = F.residual_dropout_layer_norm(x, y, w, b, 0.0, y_bias=c)
    assert out.grad_fn.inputs[4] is c and out.grad_fn.uses_kernel == on_gpu and out.dtype == np.float32
    out.backward(Tensor(g))
    assert c.grad.dtype == np.float32 and y.grad.dtype == y.dtype
    exact = [Tensor(t.data.astype(np.float64), requires_grad=True) for t in (x, y, w, b, c)]
    reference = F.layer_norm(exact[0] + exact[1] + exact[4], exact[2], exact[3])
    reference.backward(Tensor(g.astype(np.float64)))
    np.testing.assert_allclose(out.data, reference.data, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c.grad, exact[4].grad, rtol=1e-2, atol=2e-2)  # Σ of half dy


# ---------------------------------------------------------------------------- the model
class _Sublayer(LeavesOutputBias, tf.nn.Module):
    def __init__(self, leaves):
        super().__init__()
        self.linear, self.leaves = tf.nn.Linear(4, 4, generator=np.random.default_rng(0)), leaves

    def forward(self, x):
        return self.output(self.linear, x) if self.leaves else self.linear(x)


def test_the_bias_is_taken_only_where_the_module_says_it_left_it_out_and_nothing_outlives_the_call():
    x = Tensor(np.ones((2, 4), np.float32))
    leaving, complete = _Sublayer(True), _Sublayer(False)
    y, bias = call_leaving_output_bias(leaving, leaving, x)
    assert bias is leaving.linear.bias
    np.testing.assert_allclose(y.data + bias.data, leaving.linear(x).data, rtol=1e-6)
    assert "_output_bias_asked" not in vars(leaving) and "_output_bias_left_out" not in vars(leaving)
    assert len(leaving(x).data) == 2 and "_output_bias_left_out" not in vars(leaving)  # not asked: complete
    y, bias = call_leaving_output_bias(complete, complete, x)  # a forward that never calls output()
    assert bias is None and "_output_bias_asked" not in vars(complete)
    assert [name for name, _ in leaving.named_parameters()] == ["linear.weight", "linear.bias"]


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_transformer_gives_the_values_of_its_sublayers_adding_their_own_bias(norm_first, monkeypatch):
    """Post-LN: the sublayers' output biases go to the residual nodes (no bias add of their own), with
    the outputs bit for bit and the gradients within a sum's rounding of the unfolded model's; pre-LN
    never asks."""
    src, tgt = np.array([[4, 5, 6, 2], [7, 8, 2, 0]]), np.array([[1, 7, 8], [1, 9, 0]])

    def run(fold):
        model = tf.nn.Transformer(src_vocab_size=20, d_model=16, d_ff=32, heads=2, num_layers=2, dropout=0.1, seed=1,
                                  norm_first=norm_first)
        taken = []
        with monkeypatch.context() as patch:
            if not fold:
                patch.setattr(LeavesOutputBias, "output", lambda self, linear, x: linear(x))
            original = F.residual.ResidualDropoutLayerNorm.apply
            patch.setattr(F.residual.ResidualDropoutLayerNorm, "apply",
                          classmethod(lambda cls, *a, **k: taken.append(a[4] is not None) or original(*a, **k)))
            tf.manual_seed(3)
            logits = model(src, tgt)
            (logits * logits).sum().backward()
        return logits.data, [p.grad for p in model.parameters()], taken

    folded, unfolded = run(True), run(False)
    assert folded[2] == ([] if norm_first else [True] * 10) and unfolded[2] == ([] if norm_first else [False] * 10)
    np.testing.assert_array_equal(folded[0], unfolded[0])
    for got, want in zip(folded[1], unfolded[1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
