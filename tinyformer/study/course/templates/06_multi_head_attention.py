"""Exercise 6 of `tinyformer study`: multi-head attention with its projections (§3.2.2).

The forward pass is given below, parameterised as tinyformer's ``nn.MultiHeadAttention``; you
write ``backward``. With d_model = heads · d_k and every Linear y = x Wᵀ + b (W of shape
(out, in) = (d_model, d_model), as ``nn.Linear`` keeps it):

    Q = query W_Qᵀ + b_q,  K = key W_Kᵀ + b_k,  V = value W_Vᵀ + b_v     (batch, len, d_model)
    split each into heads:  (batch, len, d_model) → (batch, len, heads, d_k) → (batch, heads, len, d_k)
    Oₕ = attention(Qₕ, Kₕ, Vₕ) in every head h, with the masks   (exercise 4)
    merge the heads back:   (batch, heads, len_q, d_k) → (batch, len_q, d_model)
    out = merged W_Oᵀ + b_o

backward receives d_out = ∂L/∂out (random in the checker) and returns a dict of gradients: the
inputs' "query", "key" and "value", and one per parameter, under the parameter's own name
("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o"), each of its input's shape.

* A Linear y = x Wᵀ + b: dx, dW (shape (out, in), as W) and db (summed over every row of every
  batch entry); it appears four times here.
* Splitting and merging the heads only move numbers: their backward is the opposite move.
* Between them runs exercise 4 in every head at once; the mask broadcasts over the heads.
* In self-attention query, key and value are one array: its gradient is the sum of the three you
  return (the checker passes three separate arrays; tinyformer adds them up).
* One of the eight parameter gradients is exactly zero for any input: which, and why?

Shapes: query (batch, len_q, d_model), key and value (batch, len_k, d_model); params a dict of
the eight arrays; mask None or a boolean keep-mask (True = attend) that broadcasts to
(batch, heads, len_q, len_k), e.g. (batch, 1, 1, len_k) hiding padded keys; causal as in exercise 4.

Check your backward with ``tinyformer study check 06_multi_head_attention.py``.
"""

import math

import numpy

EXERCISE = 6  # which exercise this file holds; `tinyformer study check` reads it
PARAMETERS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")


def linear(x, w, b):
    """x Wᵀ + b, as nn.Linear (W of shape (out, in))."""
    return x @ w.T + b


def split_heads(x, heads):
    """(batch, len, d_model) → (batch, heads, len, d_k)."""
    batch, length, d_model = x.shape
    return x.reshape(batch, length, heads, d_model // heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(batch, heads, len, d_k) → (batch, len, heads · d_k)."""
    batch, heads, length, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, length, heads * d_k)


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


def forward(query, key, value, params, heads, mask=None, causal=False):
    """MultiHead(query, key, value) = Concat(head₁, …, headₕ) W_Oᵀ + b_o, (batch, len_q, d_model)."""
    q = split_heads(linear(query, params["w_q"], params["b_q"]), heads)
    k = split_heads(linear(key, params["w_k"], params["b_k"]), heads)
    v = split_heads(linear(value, params["w_v"], params["b_v"]), heads)
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    s = numpy.where(keep_mask(mask, causal, q.shape[-2], k.shape[-2]), s, -numpy.inf)
    return linear(merge_heads(softmax(s) @ v), params["w_o"], params["b_o"])


def backward(query, key, value, params, heads, mask, causal, d_out):
    """{"query": …, "key": …, "value": …, "w_q": …, …, "b_o": …}: ∂L/∂ each, given d_out = ∂L/∂out.

    Recompute what you need of the forward pass here (its helper functions are yours to call)."""
    raise NotImplementedError("write backward")
