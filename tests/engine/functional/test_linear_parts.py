"""Q, K and V as one product (``F.linear_parts``; ``nn.MultiHeadAttention`` packs its projections
back to back): the same values and gradients as one product per projection, checked by central
differences in float64, and one GEMM each way where there were three."""

import numpy as np
import pytest

import tinyformer as tf
from tinyformer import Tensor
from tinyformer.engine import amp, backend, functional as F, kernels
from tinyformer.model import nn, optim
from strategies import leaf

from emulated_capture import DeviceArray


def parts(rng, n=3, d_in=5, d_out=4, dtype=np.float64, packed=True):
    weights = [rng.uniform(-1, 1, (d_out, d_in)).astype(dtype) for _ in range(n)]
    biases = [rng.uniform(-1, 1, d_out).astype(dtype) for _ in range(n)]
    if packed:
        weights, biases = backend.pack_back_to_back(weights), backend.pack_back_to_back(biases)
    return [leaf(w) for w in weights], [leaf(b) for b in biases]


@pytest.fixture
def on_gpu(monkeypatch):
    """LinearParts as on a GPU: one product where the weights are packed (the arrays stay NumPy's)."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "apart"])
def test_the_parts_are_the_projections_and_gradcheck(packed, on_gpu):
    rng = np.random.default_rng(0)
    weights, biases = parts(rng, packed=packed)
    assert (backend.back_to_back([w.data for w in weights]) is not None) == packed
    x = leaf(rng.uniform(-1, 1, (2, 3, 5)))
    for y, w, b in zip(F.linear_parts(x, weights, biases), weights, biases):
        np.testing.assert_allclose(y.data, x.data @ w.data.T + b.data, rtol=1e-12)
    tf.gradcheck(lambda x, *p: F.linear_parts(x, p[:3], p[3:]), [x, *weights, *biases])
    tf.gradcheck(lambda x, *w: F.linear_parts(x, w), [x, *weights])


def test_bad_parts_are_named():
    rng = np.random.default_rng(1)
    weights, biases = parts(rng)
    x = leaf(rng.uniform(-1, 1, (2, 5)))
    with pytest.raises(ValueError, match="3 weights need 3 biases, got 2"):
        F.linear_parts(x, weights, biases[:2])
    with pytest.raises(ValueError, match="input has 4 features but weight expects 5"):
        F.linear_parts(leaf(rng.uniform(-1, 1, (2, 4))), weights, biases)


def test_attention_packs_its_projections_at_birth_after_loading_and_after_to():
    mha = nn.MultiHeadAttention(8, 2)

    def packed():
        return all(backend.back_to_back([getattr(l, name).data for l in (mha.w_q, mha.w_k, mha.w_v)]) is not None
                   for name in ("weight", "bias"))

    assert packed()
    state = {name: value + 1.0 for name, value in mha.state_dict().items()}
    mha.load_state_dict(state)
    assert packed() and np.array_equal(mha.w_k.weight.data, state["w_k.weight"])
    mha.double()
    assert packed() and mha.w_v.bias.dtype == np.float64


def attention_step(mha, x, memory, upstream):
    for p in mha.parameters():
        p.grad = None
    self_out = mha(x)
    cross_out = mha(x, memory)
    (self_out * Tensor(upstream) + cross_out * Tensor(upstream)).sum().backward()
    return self_out.data, cross_out.data, [p.grad.copy() for p in mha.parameters()]


def test_on_the_cpu_the_parts_are_products_of_their_own(monkeypatch):
    """NumPy arrays: one product per part even where the weights are packed (as fast, no copy)."""
    rng = np.random.default_rng(5)
    weights, biases = ([Tensor(a, requires_grad=True) for a in backend.pack_back_to_back(
        [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(3)])] for shape in ((4, 5), (4,)))
    x = Tensor(rng.uniform(-1, 1, (4, 5)).astype(np.float32))
    with backend.counting_launches() as launches:
        F.linear_parts(x, weights, biases)
    assert launches["cublas_gemm"] == 3
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)
    with backend.counting_launches() as launches:
        F.linear_parts(x, weights, biases)
    assert launches["cublas_gemm"] == 1


def test_packed_attention_equals_the_unpacked_one(on_gpu):
    rng = np.random.default_rng(2)
    mha = nn.MultiHeadAttention(8, 2).double()
    x, memory, upstream = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))
    packed = attention_step(mha, Tensor(x), Tensor(memory), upstream)
    for p in mha.parameters():
        p.data = p.data.copy()  # each its own memory: one product per projection
    assert backend.back_to_back([mha.w_q.weight.data, mha.w_k.weight.data]) is None
    apart = attention_step(mha, Tensor(x), Tensor(memory), upstream)
    for got, expected in zip([*packed[:2], *packed[2]], [*apart[:2], *apart[2]]):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_compute_copies_of_packed_parameters_are_packed_and_refreshed_by_adam():
    mha = nn.MultiHeadAttention(8, 2)
    weights = [mha.w_q.weight, mha.w_k.weight, mha.w_v.weight]
    copies = [amp.compute_copy(w, backend.bfloat16) for w in weights]
    assert backend.back_to_back(copies) is not None
    for w in weights:
        w.grad = np.ones(w.shape, np.float32)
    optim.Adam(weights, lr=0.1).step()
    for w, copy in zip(weights, copies):
        assert amp.compute_copy(w, backend.bfloat16) is copy
        np.testing.assert_array_equal(backend.cast(copy, np.float32),
                                      backend.cast(backend.cast(w.data, backend.bfloat16), np.float32))


def counted(mha, x, grads_back_to_back):
    """Launches of one self-attention projection's forward and backward on emulated device memory."""
    params = [p for linear in (mha.w_q, mha.w_k, mha.w_v) for p in (linear.weight, linear.bias)]
    for p in params:
        p.data = p.data.view(DeviceArray)
    order = [mha.w_q.weight, mha.w_k.weight, mha.w_v.weight, mha.w_q.bias, mha.w_k.bias, mha.w_v.bias]
    grads = backend.pack_back_to_back([np.zeros(p.shape, np.float32) for p in order])
    for p, grad in zip(order, grads if grads_back_to_back else [g.copy() for g in grads]):
        p.grad = grad.view(DeviceArray)
    with backend.capturing(), backend.counting_launches() as forward:
        q, k, v = F.linear_parts(x, order[:3], order[3:])
    loss = (q + k + v) * Tensor(np.ones(q.shape, np.float32).view(DeviceArray))
    with backend.capturing(), backend.counting_launches() as backward:
        loss.backward(np.ones(loss.shape, np.float32).view(DeviceArray))
    return forward, backward


def test_one_product_each_way_where_there_were_three(on_gpu):
    """Forward: one GEMM and one bias add (three of each apart). Backward with the gradients back to
    back (the graph step's flat buffer): the outputs' gradients side by side (one copy), then one
    GEMM each for dx, dW and db (nine apart, and two adds of dx)."""
    mha = nn.MultiHeadAttention(8, 2)
    x = Tensor(np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32).view(DeviceArray),
               requires_grad=True)
    forward, backward = counted(mha, x, grads_back_to_back=True)
    assert forward["cublas_gemm"] == 1 and forward["array op: add"] == 1, dict(forward)
    assert backward["cublas_gemm"] == 3 and backward["array op: concatenate"] == 1, dict(backward)
    _, apart = counted(mha, x, grads_back_to_back=False)
    assert apart["cublas_gemm"] == 7, dict(apart)  # dx: one (side by side); dW and db: three each


def test_the_graph_steps_flat_gradients_lie_back_to_back_where_the_parameters_do():
    from emulated_capture import EmulatedCapture
    from tinyformer.model.nn import Transformer
    from tinyformer.translation.train.graphs import GraphedStep

    model = Transformer(src_vocab_size=40, d_model=36, heads=2, d_ff=48, num_layers=1, max_len=16, seed=0)
    step = GraphedStep(model, optim.Adam(model.parameters(), lr=1e-3), amp.get_precision("fp32"), 0.1, 64, 16,
                       EmulatedCapture())
    step._prepare()
    attentions = [m for m in model.modules() if isinstance(m, nn.MultiHeadAttention)]
    assert len(attentions) == 3
    for mha in attentions:
        for name in ("weight", "bias"):
            params = [getattr(linear, name) for linear in (mha.w_q, mha.w_k, mha.w_v)]
            assert backend.back_to_back([p.data for p in params]) is not None
            assert backend.back_to_back([p.grad for p in params]) is not None  # one product writes them
            assert all(backend.root_buffer(p.grad) is backend.root_buffer(step.flat_grad) for p in params)
    for p in model.parameters():  # every other gradient still starts 256-byte aligned
        offset = backend.address(p.grad) - backend.address(step.flat_grad)
        assert offset % step.PACKED_ALIGNMENT == 0
