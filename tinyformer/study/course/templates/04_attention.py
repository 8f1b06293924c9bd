"""Exercise 4 of `tinyformer study`: scaled dot-product attention with padding and causal masks.

The forward pass is given below; you write ``backward``. For each batch entry (§3.2.1):

    S = Q Kᵀ / √d_k                  (len_q, len_k): one score per query and key
    S ← −∞ where the key is hidden   mask False (padding), or with causal a later key
    P = softmax(S) along the keys    a query that sees no key at all gets P = 0 (a zero output)
    O = P V                          (len_q, d_v)

backward receives dO = ∂L/∂O (random in the checker) and returns (dQ, dK, dV).

* dV and dP come from O = P V, the product rule for matrices: which index of P meets which of V?
  Check your transposes with len_q ≠ len_k, where a wrong one cannot fit.
* Derive dS from dP first: that is softmax's backward (exercise 2), row by row.
* Hidden entries: their S is the constant −∞, not a function of Q or K, and their P is 0. What
  does that give their dS? Apply the mask where the forward applies it: to S, before softmax
  (``keep_mask`` and ``softmax`` below are yours to call, to recompute P as the forward does).
* A query with every key hidden has P = 0 in its whole row: it must get no gradient, and must
  not turn into nan.
* dQ and dK from S = Q Kᵀ / √d_k: the 1/√d_k is part of S, so it is part of its derivative.

Shapes: q (batch, len_q, d_k), k (batch, len_k, d_k), v (batch, len_k, d_v); mask None or a
boolean keep-mask (True = attend) that broadcasts to (batch, len_q, len_k), e.g. (batch, 1, len_k)
hiding padded keys; causal=True also hides from query i the keys j > i + (len_k − len_q) (the
queries are aligned with the last keys, as tinyformer's causal_mask does).

Check your backward with ``tinyformer study check 04_attention.py``.
"""

import math

import numpy

EXERCISE = 4  # which exercise this file holds; `tinyformer study check` reads it


def keep_mask(mask, causal, len_q, len_k):
    """Which keys each query sees (True = attend): ``mask`` and, with ``causal``, no later key."""
    keep = numpy.ones((len_q, len_k), dtype=bool)
    if causal:
        keep = numpy.tril(keep, k=len_k - len_q)
    return keep if mask is None else keep & mask


def softmax(s):
    """Softmax along the last axis; a row that is −inf everywhere (no key seen) gives zeros."""
    top = s.max(axis=-1, keepdims=True)
    e = numpy.exp(s - numpy.where(numpy.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return e / numpy.where(total == 0, 1.0, total)


def forward(q, k, v, mask=None, causal=False):
    """O = softmax(QKᵀ/√d_k, hidden keys at −∞) V, (batch, len_q, d_v)."""
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    s = numpy.where(keep_mask(mask, causal, q.shape[-2], k.shape[-2]), s, -numpy.inf)
    return softmax(s) @ v


def backward(q, k, v, mask, causal, d_out):
    """(dQ, dK, dV) of the shapes of q, k and v, given d_out = ∂L/∂O (batch, len_q, d_v)."""
    raise NotImplementedError("write backward")
