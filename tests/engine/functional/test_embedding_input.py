"""F.embedding_input: the Transformer's input, dropout(W[ids] · scale + positions), as one node (one
kernel launch each way, kernels/embedding.cu through the CPU emulation here): the same values,
gradients and generator draws as the ops it replaces; W's gradient added into its .grad by the op."""

import math

import numpy as np
import pytest

import tinyformer as tf
from tinyformer import Tensor
from tinyformer.engine import autograd, kernels
from tinyformer.engine import functional as F
from tinyformer.model.nn import Transformer

SCALE = math.sqrt(16)


def _inputs(seed=0, vocab=11, length=7, d=16, dtype=np.float32):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (3, length))
    weight = Tensor(rng.standard_normal((vocab, d)).astype(dtype), requires_grad=True)
    table = F.sinusoid_table(length, d).astype(dtype)
    upstream = rng.standard_normal((3, length, d)).astype(dtype)
    return ids, weight, table, upstream


def _run(fused, p, scale=SCALE, with_table=True, held=None, seed=0):
    """(output, W's gradient, the generator's next draw, whether a kernel ran) of the fused op or of
    the ops it replaces."""
    ids, weight, table, upstream = _inputs(seed)
    if held is not None:
        weight.grad = held.copy()
    generator = np.random.default_rng(5)
    table = table if with_table else None
    if fused:
        out = F.embedding_input(ids, weight, scale, table, p, True, generator)
    else:
        x = F.embedding(ids, weight)
        x = x * scale if scale != 1.0 else x
        x = x + Tensor(table) if table is not None else x
        out = F.dropout(x, p, True, generator)
    uses_kernel = getattr(out.grad_fn, "uses_kernel", None)  # before the backward releases the node
    out.backward(Tensor(upstream))
    return out, weight.grad, generator.random(), uses_kernel


@pytest.mark.parametrize("p,scale,with_table", [(0.0, SCALE, True), (0.3, SCALE, True), (0.3, 1.0, False)])
def test_the_reference_equals_the_unfused_ops_bit_for_bit(p, scale, with_table):
    fused, unfused = _run(True, p, scale, with_table), _run(False, p, scale, with_table)
    assert fused[3] is False
    for got, want in zip((fused[0].data,) + fused[1:3], (unfused[0].data,) + unfused[1:3]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.usefixtures("cxx_compiler")
@pytest.mark.parametrize("p,scale,with_table", [(0.0, SCALE, True), (0.3, SCALE, True), (0.3, 1.0, False)])
def test_the_kernel_equals_the_unfused_kernels(p, scale, with_table, monkeypatch):
    """The same output bits and Philox mask as dropout.cu after the gather, product and sum; W's
    gradient within a rounding (the kernel multiplies each term by the two scales at once)."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)
    fused, unfused = _run(True, p, scale, with_table), _run(False, p, scale, with_table)
    assert fused[3] is True
    np.testing.assert_array_equal(fused[0].data, unfused[0].data)
    assert fused[2] == unfused[2]  # one seed drawn from the generator by each
    np.testing.assert_allclose(fused[1], unfused[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("on_gpu", [False, True])
@pytest.mark.parametrize("fused", [True, False])
def test_ws_gradient_is_added_into_its_grad_by_the_op(fused, on_gpu, monkeypatch, request):
    """A held gradient gets this backward's dW added by the op (kernels/embedding.cu accumulating,
    or the reference's scatter add into it): the engine's store_grad never sees W."""
    if on_gpu:
        request.getfixturevalue("cxx_compiler")
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: on_gpu)
    stored = []
    original = autograd.store_grad
    monkeypatch.setattr(autograd, "store_grad", lambda tensor, grad: stored.append(tensor) or original(tensor, grad))
    _, fresh, _, _ = _run(fused, 0.3)
    held = np.random.default_rng(9).standard_normal(fresh.shape).astype(np.float32)
    _, added, _, _ = _run(fused, 0.3, held=held)
    assert stored == []
    np.testing.assert_allclose(added, held + fresh, rtol=1e-6, atol=1e-6)
    ids, _, table, upstream = _inputs()
    if not fused:  # W's gradient itself, from the formula: Σ over the positions of each id of dy ∘ keep · 1/(1−p) · s
        return
    fused_out = _run(True, 0.3)[0]
    keep = fused_out.data != 0
    expected = np.zeros(fresh.shape)
    np.add.at(expected, ids.reshape(-1), (upstream * keep / 0.7 * SCALE).reshape(-1, fresh.shape[1]))
    np.testing.assert_allclose(fresh, expected, rtol=1e-5, atol=1e-5)


def test_gradients_pass_central_differences():
    ids, _, table, _ = _inputs(length=4)
    weight = Tensor(np.random.default_rng(1).standard_normal((11, 16)), requires_grad=True)
    assert tf.gradcheck(lambda w: F.embedding_input(ids, w, SCALE, table.astype(np.float64), 0.4, True,
                                                    np.random.default_rng(2)), [weight])


def test_bad_input_is_named():
    ids, weight, table, _ = _inputs()
    with pytest.raises(ValueError, match=r"table must be \(length, d\) = \(7, 16\)"):
        F.embedding_input(ids, weight, 1.0, table[:6])
    with pytest.raises(IndexError, match=r"embedding_input: ids must lie in \[0, 11\)"):
        F.embedding_input(ids + 11, weight)
    with pytest.raises(ValueError, match="embedding_input: p"):
        F.embedding_input(ids, weight, p=1.5)
    with pytest.raises(ValueError, match="embedding_input: scale must be a finite number"):
        F.embedding_input(ids, weight, scale=float("nan"))


@pytest.mark.parametrize("positional,calls", [("sinusoid", 2), ("learned", 0)])
def test_the_transformer_embeds_its_inputs_with_it_where_the_positions_are_fixed(positional, calls, monkeypatch):
    seen = []
    original = F.EmbeddingInput.apply
    monkeypatch.setattr(F.EmbeddingInput, "apply", classmethod(lambda cls, *a, **k: seen.append(1) or original(*a, **k)))
    model = Transformer(src_vocab_size=20,
                        d_model=16, d_ff=32, heads=2, num_layers=1, dropout=0.1, seed=1, positional=positional)
    model(np.array([[4, 5, 6, 2]]), np.array([[1, 7, 8]]))
    assert len(seen) == calls
