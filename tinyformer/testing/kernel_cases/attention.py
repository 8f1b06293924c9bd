"""The cases of attention.cu (CUDA cores) and attention_mma.cu (tensor cores): their launchers
against ``F.scaled_dot_product_attention``."""

import numpy

from ...engine import backend, functional as F
from ...engine.kernels import attention as attention_kernel
from ...engine.tensor import Tensor
from .harness import KernelRun, philox_keep, rand, reference, shape_label


def _attention_reference(dev, batch, heads, len_q, len_k, dim, lengths, causal, dropout_p, seed, rng_seed):
    """Rounded (batch, heads, len, dim) q, k, v, an upstream gradient g, and F's float64 output and
    gradients with the padding mask of ``lengths`` and ``causal``. With dropout the reference is
    (P ∘ Z)·V, P the probabilities F returns, Z = keep/(1 − p) from the kernels' Philox stream:
    keep = philox_uniform(seed, 0, (bh·Lq + i)·Lk + j) >= p."""
    rng = numpy.random.default_rng(rng_seed)
    q, k, v = (dev.round(rand(rng, batch, heads, n, dim)) for n in (len_q, len_k, len_k))
    g = dev.round(rand(rng, batch, heads, len_q, dim))
    mask = None
    if lengths is not None:
        mask = (numpy.arange(len_k)[None, :] < numpy.asarray(lengths)[:, None])[:, None, None, :]
    if dropout_p:
        keep = philox_keep(seed, 0, (batch, heads, len_q, len_k), dropout_p)
        kept = Tensor(keep / (1.0 - dropout_p))

        def fn(q, k, v):
            _, probabilities = F.scaled_dot_product_attention(q, k, v, mask, causal, return_weights=True)
            return (probabilities * kept) @ v
    else:
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, mask, causal)
    (expected,), grads = reference(fn, [q, k, v], [g])
    return (q, k, v, g), expected, grads


def _key_lengths_on(dev, lengths):
    return None if lengths is None else backend.to_device(numpy.asarray(lengths, numpy.int32), dev.device)


def attention(dev, batch, heads, len_q, len_k, dim, lengths=None, causal=False, dropout_p=0.0, seed=0,
              rng_seed=0):
    """attention.cu on (batch·heads, len, dim) arrays against F.scaled_dot_product_attention
    (``_attention_reference``)."""
    (q, k, v, g), expected, grads = _attention_reference(dev, batch, heads, len_q, len_k, dim, lengths, causal,
                                                         dropout_p, seed, rng_seed)

    def flat(a):
        return dev.put(a.reshape(batch * heads, a.shape[2], dim))

    args = dict(key_lengths=_key_lengths_on(dev, lengths), causal=causal, dropout_p=dropout_p, seed=seed)
    o, lse = attention_kernel.attention_forward(flat(q), flat(k), flat(v), heads, **args)
    kq, kk, kv = attention_kernel.attention_backward(flat(q), flat(k), flat(v), o, lse, flat(g), heads, **args)
    comparisons = [dev.output("output", o, expected.reshape(o.shape))]
    for label, got, want in (("grad q", kq, grads[0]), ("grad k", kk, grads[1]), ("grad v", kv, grads[2])):
        comparisons.append(dev.gradient(label, got, want.reshape(got.shape), atol=1e-5))
    return KernelRun(f"q {shape_label(q)} k,v {shape_label(k)}", comparisons,
                     {"o": dev.get(o), "lse": backend.to_numpy(lse)})


#: How the tensor-core case lays out q, k, v (batch, heads, len, d) in memory: "heads" contiguous as
#: (batch, heads, len, d); "projection" as views of (batch, len, heads, d) arrays (a head split by
#: reshape and transpose); "fused" as views of one (batch, len, 3, heads, d) array (a fused QKV
#: projection: rows 3·heads·d apart) — the last two read in place. Only "fused" needs len_q == len_k.
MMA_LAYOUTS = ("heads", "projection", "fused")


def _in_layout(dev, arrays, layout):
    if layout == "heads":
        return [dev.put(a) for a in arrays]
    if layout == "projection":
        return [dev.put(a.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for a in arrays]
    fused = dev.put(numpy.stack([a.transpose(0, 2, 1, 3) for a in arrays], axis=2))
    return [fused[:, :, n].transpose(0, 2, 1, 3) for n in range(len(arrays))]


def attention_mma(dev, batch, heads, len_q, len_k, dim, lengths=None, causal=False, dropout_p=0.0, seed=0,
                  rng_seed=0, layout="projection"):
    """attention_mma.cu (tensor cores; float16 or bfloat16) on q, k, v laid out as ``layout``
    (``MMA_LAYOUTS``) against F.scaled_dot_product_attention (``_attention_reference``). The
    products take P and dS rounded to the element type (as FlashAttention-2 does), so outputs and
    gradients meet the element type's tolerance on their values, gradients by GRAD_FACTOR."""
    if layout not in MMA_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(MMA_LAYOUTS)}, got {layout!r}")
    (q, k, v, g), expected, grads = _attention_reference(dev, batch, heads, len_q, len_k, dim, lengths, causal,
                                                         dropout_p, seed, rng_seed)
    qd, kd, vd = _in_layout(dev, [q, k, v], layout) if layout != "fused" or len_q == len_k else (
        _in_layout(dev, [q], "projection") + _in_layout(dev, [k, v], "fused"))
    (gd,) = _in_layout(dev, [g], "projection")
    args = dict(key_lengths=_key_lengths_on(dev, lengths), causal=causal, dropout_p=dropout_p, seed=seed)
    o, lse = attention_kernel.attention_mma_forward(qd, kd, vd, **args)
    kq, kk, kv = attention_kernel.attention_mma_backward(qd, kd, vd, o, lse, gd, **args)
    comparisons = [dev.output("output", o, expected)]
    for label, got, want in (("grad q", kq, grads[0]), ("grad k", kk, grads[1]), ("grad v", kv, grads[2])):
        comparisons.append(dev.gradient(label, got, want))
    return KernelRun(f"q {shape_label(q)} k,v {shape_label(k)} {layout}", comparisons,
                     {"o": dev.get(o), "lse": backend.to_numpy(lse), "grads": [dev.get(a) for a in (kq, kk, kv)]})
