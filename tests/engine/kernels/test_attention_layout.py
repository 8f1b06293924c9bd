"""attention.cu reads the heads where the projections leave them and writes o and the gradients in
the projections' layout (``attention_heads_forward`` / ``_backward``), through the CPU emulation:
the same values as on contiguous (batch·heads, len, d) copies, and no copy launched on the way."""

import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import backend, functional as F, kernels
from tinyformer.engine.kernels import attention as attention_kernel
from tinyformer.testing.kernel_cases import rand

pytestmark = pytest.mark.usefixtures("cxx_compiler")  # skipped without g++ or clang++; failed in CI (compilers.py)

BATCH, HEADS, LEN_Q, LEN_K, DIM = 2, 3, 7, 5, 32


def projected(rng, length, parts=3):
    """``parts`` (batch, heads, len, d) views of one (batch, len, parts·heads·d) product, as
    ``F.linear_parts`` and the head split leave Q, K and V: strided, nothing contiguous."""
    joint = rand(rng, BATCH, length, parts * HEADS * DIM)
    return [joint[:, :, i * HEADS * DIM:(i + 1) * HEADS * DIM].reshape(BATCH, length, HEADS, DIM).transpose(0, 2, 1, 3)
            for i in range(parts)]


def flat(x):
    return np.ascontiguousarray(x).reshape(-1, *x.shape[2:])


@pytest.mark.parametrize("causal", [False, True])
def test_strided_heads_give_the_contiguous_kernels_values(causal):
    rng = np.random.default_rng(0)
    q, _, _ = projected(rng, LEN_Q)
    _, k, v = projected(rng, LEN_K)
    g = rand(rng, BATCH, HEADS, LEN_Q, DIM)
    lengths = np.array([LEN_K, 3], dtype=np.int32)
    args = dict(key_lengths=lengths, causal=causal, dropout_p=0.25, seed=11)
    o, lse = attention_kernel.attention_heads_forward(q, k, v, **args)
    assert o.transpose(0, 2, 1, 3).flags.c_contiguous  # the output projection's layout
    grads = attention_kernel.attention_heads_backward(q, k, v, o, lse, g, **args)
    o_flat, lse_flat = attention_kernel.attention_forward(flat(q), flat(k), flat(v), HEADS, **args)
    grads_flat = attention_kernel.attention_backward(flat(q), flat(k), flat(v), o_flat, lse_flat, flat(g), HEADS,
                                                     **args)
    np.testing.assert_array_equal(flat(o), o_flat)
    np.testing.assert_array_equal(lse, lse_flat)
    for grad, grad_flat in zip(grads, grads_flat):
        assert grad.transpose(0, 2, 1, 3).flags.c_contiguous
        np.testing.assert_array_equal(flat(grad), grad_flat)


def test_the_functional_op_launches_no_copy_on_the_cuda_core_path(monkeypatch):
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)
    rng = np.random.default_rng(1)
    q, k, v = (Tensor(a, requires_grad=True) for a in projected(rng, LEN_Q))
    with backend.counting_launches() as launches:
        out = F.scaled_dot_product_attention(q, k, v, causal=True)
        merged = out.transpose(0, 2, 1, 3).reshape(BATCH, LEN_Q, HEADS * DIM)  # the heads merged, as the model does
        merged.backward(Tensor(rand(rng, *merged.shape)))
    assert not [family for family in launches if "copy" in family], dict(launches)
    assert launches["attention_forward"] == launches["attention_backward_q"] == 1


@pytest.mark.parametrize("tensor_cores", [False, True], ids=["cuda cores", "tensor cores"])
def test_gradients_lie_side_by_side_where_q_k_and_v_did(tensor_cores):
    """Q, K, V from one product (column blocks of one buffer): dQ, dK, dV come back as the column
    blocks of one buffer too, which ``F.linear_parts`` reads as one matrix (no copy); the values are
    those of q, k, v each in its own memory. K and V alone (attention over a memory) likewise."""
    rng = np.random.default_rng(2)
    dtype = np.float16 if tensor_cores else np.float32
    forward, backward = ((attention_kernel.attention_mma_forward, attention_kernel.attention_mma_backward)
                         if tensor_cores else
                         (attention_kernel.attention_heads_forward, attention_kernel.attention_heads_backward))
    for parts in (3, 2):
        joint = rand(rng, BATCH, LEN_Q, parts * HEADS * DIM).astype(dtype)  # one product's output
        views = [joint[:, :, i * HEADS * DIM:(i + 1) * HEADS * DIM].reshape(BATCH, LEN_Q, HEADS, DIM)
                 .transpose(0, 2, 1, 3) for i in range(parts)]
        q = views[0] if parts == 3 else rand(rng, BATCH, HEADS, LEN_Q, DIM).astype(dtype)
        k, v = views[-2:]
        g = rand(rng, BATCH, LEN_Q, HEADS, DIM).astype(dtype).transpose(0, 2, 1, 3)
        o, lse = forward(q, k, v, causal=True)
        grads = backward(q, k, v, o, lse, g, causal=True)
        rows = [grad.transpose(0, 2, 1, 3).reshape(BATCH * LEN_Q, HEADS * DIM) for grad in grads[3 - parts:]]
        assert backend.side_by_side(rows) is not None
        apart = [np.ascontiguousarray(a.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for a in (q, k, v)]
        o_apart, lse_apart = forward(*apart, causal=True)
        for grad, grad_apart in zip(grads, backward(*apart, o_apart, lse_apart, g, causal=True)):
            np.testing.assert_array_equal(grad, grad_apart)
