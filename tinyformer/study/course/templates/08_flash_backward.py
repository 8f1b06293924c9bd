"""Exercise 8 of `tinyformer study`: FlashAttention's backward — dQ, dK, dV tile by tile.

Exercise 7's forward kept O and lse = log Σⱼ exp(sᵢⱼ) per query row, never P. The backward
recomputes P where it needs it, one tile at a time, from the saved lse:

    Pᵢⱼ = exp(sᵢⱼ − lseᵢ)                    exactly softmax's P: no max, no sum to redo

and takes softmax's backward (exercise 2) one tile at a time too. Softmax's backward needs one
number per row, Dᵢ = Σⱼ dPᵢⱼ Pᵢⱼ: a sum over every key, which a tile alone does not have. But

    Dᵢ = Σⱼ Pᵢⱼ dPᵢⱼ = Σⱼ Pᵢⱼ (dOᵢ · vⱼ) = dOᵢ · Σⱼ Pᵢⱼ vⱼ = dOᵢ · Oᵢ

so D = rowsum(dO ∘ O), from what the forward returned, before any tile. Then, for each key tile
(K_t, V_t) and each query tile (Q_b, dO_b, lse_b, D_b) that sees it:

    S = Q_b K_tᵀ/√d,   P = exp(S − lse_b)        hidden keys: P = 0
    dV_t += Pᵀ dO_b
    dP = dO_b V_tᵀ
    dS = P ∘ (dP − D_b)
    dQ_b += dS K_t /√d
    dK_t += dSᵀ Q_b /√d

* exp(S − lse), not exp(S)·exp(−lse): the checker tries scores of ~1,000, where exp(S) is inf.
* Hidden keys (padding, causal) and queries that see no key (lse = −∞): P = 0 there, no nan.
* D from Σ P ∘ dP is right too, but needs every tile of the row first (a second pass over the
  keys); the checker says so.
* With ``causal``, the query tiles wholly before a key tile see none of its keys: start the query
  loop at the first query that can see key j0 (the checker counts the tiles computed for nothing).
* One tile at a time: the checker measures the memory your backward takes at 3,072 tokens.

Shapes: q (batch, len_q, d), k (batch, len_k, d), v (batch, len_k, d_v); o and d_out (batch,
len_q, d_v); lse (batch, len_q); key_lengths None or (batch,) integers. Returns (dQ, dK, dV), of
the shapes of q, k, v.

Check your backward with ``tinyformer study check 08_flash_backward.py``.
"""

import math

import numpy

EXERCISE = 8  # which exercise this file holds; `tinyformer study check` reads it
BLOCK = 4  # queries per tile and keys per tile (the checker passes other sizes too)


def seen(len_q, len_k, length, causal, rows, keys):
    """Which of ``keys`` each query of ``rows`` sees (True = seen): a (len(rows), len(keys)) mask."""
    keep = numpy.broadcast_to(keys[None, :] < length, (len(rows), len(keys)))
    return keep & (keys[None, :] <= rows[:, None] + (len_k - len_q)) if causal else keep


def forward(q, k, v, key_lengths=None, causal=False):
    """(O, lse) the plain way, S and P whole: exercise 7's answer, which ``backward`` differentiates."""
    len_q, len_k = q.shape[1], k.shape[1]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    lengths = [len_k] * q.shape[0] if key_lengths is None else [int(n) for n in key_lengths]
    mask = numpy.stack([seen(len_q, len_k, n, causal, numpy.arange(len_q), numpy.arange(len_k)) for n in lengths])
    s = numpy.where(mask, s, -numpy.inf)
    top = s.max(axis=-1, keepdims=True)
    top = numpy.where(numpy.isfinite(top), top, 0.0)
    e = numpy.exp(s - top)
    total = e.sum(axis=-1, keepdims=True)
    with numpy.errstate(divide="ignore"):
        lse = numpy.where(total[..., 0] > 0, top[..., 0] + numpy.log(total[..., 0]), -numpy.inf)
    return e / numpy.where(total == 0, 1.0, total) @ v, lse


def backward(q, k, v, o, lse, d_out, key_lengths=None, causal=False, block=BLOCK):
    """(dQ, dK, dV) given d_out = ∂L/∂O, from the forward's o and lse, one tile at a time.

    The loop to fill in:

        scale = 1 / math.sqrt(q.shape[-1])
        batch, len_q, len_k = q.shape[0], q.shape[1], k.shape[1]
        dq, dk, dv = numpy.zeros(q.shape), numpy.zeros(k.shape), numpy.zeros(v.shape)
        delta = ...                                    # D, one number per query row
        for b in range(batch):
            length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)
            for j0 in range(0, length, block):
                j1 = min(j0 + block, len_k)
                first = ...                            # the first query tile that sees a key of this tile
                for i0 in range(first, len_q, block):
                    i1 = min(i0 + block, len_q)
                    ...                                # S, P from lse, dV, dP, dS, dQ, dK
        return dq, dk, dv
    """
    raise NotImplementedError("write backward")
