"""Exercise 7 of `tinyformer study`: FlashAttention's forward — attention over tiles of keys.

Attention as exercise 4 computes it holds S = QKᵀ/√d and P = softmax(S) whole: len_q × len_k
numbers per head, which at 4,096 tokens is 128 MiB in float64 for one head of one sentence.
FlashAttention (Dao et al., 2022) never holds them: for a block of ``block`` queries it streams
the keys in tiles of ``block`` and keeps, per query row, three things:

    m    the running maximum of the row's scores so far           (starts at −∞)
    l    the running sum Σ exp(s − m) over the keys so far          (starts at 0)
    acc  the running Σ exp(s − m) · v, a row of d_v numbers        (starts at 0)

and after each tile S_t = Q_blk K_tᵀ/√d (hidden keys at −∞):

    m_new = max(m, max of S_t's row)
    P_t   = exp(S_t − m_new)
    l     = l · exp(m − m_new) + rowsum(P_t)
    acc   = acc · exp(m − m_new) + P_t V_t
    m     = m_new

and at the end O = acc / l and lse = m + log l, the row's log-sum-exp, which the backward
(exercise 8) uses to recompute P tile by tile. ``forward`` returns (O, lse).

* Why exp(m − m_new)? Everything summed so far was scaled by exp(−m); from now on it must be
  exp(−m_new). A sum that is not rescaled when the max changes is right only for rows whose max
  sits in their first tile.
* Why subtract the max at all? exp(800) is inf in float64: the checker tries scores of ~1,000.
* Hidden keys: past the sequence's key length (padding), and with ``causal`` the keys
  j > i + (len_k − len_q). They get exactly nothing, not exp(0 − m) and not exp(−1e9 − m) either:
  a query that sees no key at all gets O = 0 and lse = −∞, and no nan.
* A tile that every query of the block is hidden from (causal: above the diagonal; or past the
  key length) need not be computed at all: stop the key loop at the last key the block can see.
  The checker counts the tiles computed and thrown away.
* Keep one tile at a time: the checker runs your forward at 3,072 tokens and measures the memory
  it takes; an S or P of the whole row range (72 MiB there) is named with its line.

``record(b, i0, tile, m, l)`` after each tile is already in place: ``tinyformer study trace``
listens to it to print your running max and sum beside those of tinyformer's CUDA kernel.

Shapes: q (batch, len_q, d), k (batch, len_k, d), v (batch, len_k, d_v); key_lengths None or
(batch,) integers; returns O (batch, len_q, d_v) and lse (batch, len_q).

Check your forward with ``tinyformer study check 07_flash_forward.py``.
"""

import math

import numpy

EXERCISE = 7  # which exercise this file holds; `tinyformer study check` reads it
BLOCK = 4  # queries per block and keys per tile (the checker passes other sizes too)


def seen(len_q, len_k, length, causal, rows, keys):
    """Which of ``keys`` each query of ``rows`` sees (True = seen): a (len(rows), len(keys)) mask."""
    keep = numpy.broadcast_to(keys[None, :] < length, (len(rows), len(keys)))
    return keep & (keys[None, :] <= rows[:, None] + (len_k - len_q)) if causal else keep


def attention(q, k, v, key_lengths=None, causal=False):
    """(O, lse) the plain way, S and P whole: what ``forward`` must compute, tile by tile."""
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


def record(b, i0, tile, m, l):
    """Called after every key tile with the block's running max and sum; does nothing unless traced."""


def forward(q, k, v, key_lengths=None, causal=False, block=BLOCK):
    """(O, lse) of attention over key tiles of ``block`` keys, never S whole.

    The loop to fill in:

        scale = 1 / math.sqrt(q.shape[-1])
        batch, len_q, len_k = q.shape[0], q.shape[1], k.shape[1]
        o = numpy.zeros((batch, len_q, v.shape[-1]))
        lse = numpy.full((batch, len_q), -numpy.inf)
        for b in range(batch):
            length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)
            for i0 in range(0, len_q, block):
                i1 = min(i0 + block, len_q)
                m, l, acc = ..., ..., ...              # per row of the block
                end = ...                              # one past the last key a row of the block sees
                for j0 in range(0, end, block):
                    j1 = min(j0 + block, len_k)
                    ...                                # S_t, hidden keys, m_new, P_t, l, acc, m
                    record(b, i0, j0 // block, m, l)
                o[b, i0:i1], lse[b, i0:i1] = ..., ...  # a row that saw nothing: 0 and −inf
        return o, lse
    """
    raise NotImplementedError("write forward")
