"""Exercises 7 and 8 inside a real model: the reader's tiles as the model's attention over the heads
(``attention_swap.ReaderAttention``, an ``nn.probe.Attention``).

=====================  ================================================================================
7 the tiled forward    ``forward`` calls the reader's ``forward`` for O and lse (the heads flattened
                       into the batch axis, the key lengths repeated per head), and ``backward`` takes
                       attention's backward with P recomputed from the reader's lse, P = exp(S − lse):
                       the lse must be right for the model to learn.
8 the tiled backward   ``forward`` is tinyformer's own attention; ``backward`` calls the reader's
                       ``backward`` with its O and the lse of its scores.
=====================  ================================================================================

Calls the tiled exercises cannot take — a mask that is not trailing padding, attention dropout,
the weights asked for — run tinyformer's own forward and backward (``Swap.own`` counts them). The
tiles are ``BLOCK`` queries and keys: one tile per block of a sentence of the built-in task, so
that the reader's Python loops run over the batch and not over tiny tiles.
"""

import math

import numpy

from ...engine.functional.attention import _key_lengths_of_mask
from ...engine.tensor import Tensor
from .attention_swap import ReaderAttention, own_attention
from .flash_reference import keep

__all__ = ["BLOCK", "ReaderTiledForward", "ReaderTiledBackward"]

BLOCK = 64


def _flat(a):
    """(batch·heads, len, d) float64 of a (..., len, d) array."""
    return numpy.ascontiguousarray(a, dtype=numpy.float64).reshape(-1, *a.shape[-2:])


def _problem(q, k, mask, causal, dropout_p, return_weights):
    """What the tiled exercises take of this call: (key lengths per flattened sequence or None,
    causal); None when they cannot take it."""
    if dropout_p or return_weights or q.ndim != 4 or k.shape[:2] != q.shape[:2]:
        return None
    fits, lengths = _key_lengths_of_mask(mask.data if isinstance(mask, Tensor) else mask, q.shape[0], k.shape[2])
    if not fits:
        return None
    if lengths is not None:
        lengths = numpy.repeat(numpy.asarray(lengths, dtype=numpy.int64), q.shape[1])
    return lengths, bool(causal)


def _gradients_from_lse(q, k, v, lse, lengths, causal, g):
    """dQ, dK, dV of attention (flattened, float64) with P = exp(S − lse), hidden keys at 0."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    len_q, len_k = q.shape[1], k.shape[1]
    seen = numpy.stack([keep(len_q, len_k, len_k if lengths is None else lengths[b], causal)
                        for b in range(q.shape[0])])
    finite = numpy.isfinite(lse)[..., None]
    p = numpy.exp(numpy.where(seen & finite, s - numpy.where(finite, lse[..., None], 0.0), -numpy.inf))
    dp = g @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, p.swapaxes(-1, -2) @ g


class _Tiled(ReaderAttention):
    """The calls the tiles take: ``_problem``'s, (key lengths, causal) kept on the node."""

    def takes(self, q, k, mask, causal, dropout_p, return_weights):
        return _problem(q, k, mask, causal, dropout_p, return_weights)


class ReaderTiledForward(_Tiled):
    """Exercise 7's swap: the reader's tiled forward, and backward from the reader's lse."""

    def forward(self, node, q, k, v):
        node.flat = tuple(_flat(a) for a in (q, k, v))
        o, lse = self.reader.forward(*node.flat, *node.problem, BLOCK)
        self.swap.calls += 1
        node.lse = numpy.asarray(lse, dtype=numpy.float64)
        return numpy.asarray(o).reshape(q.shape[:-1] + v.shape[-1:]).astype(q.dtype, copy=False)

    def backward(self, node, g_out):
        grads = _gradients_from_lse(*node.flat, node.lse, *node.problem, _flat(g_out))
        return tuple(d.reshape(a.shape) for d, a in zip(grads, (node.q, node.k, node.v)))


class ReaderTiledBackward(_Tiled):
    """Exercise 8's swap: tinyformer's forward (its O, and the lse of its scores), the reader's backward."""

    def forward(self, node, q, k, v):
        out = own_attention(q, k, v, node.mask, node.causal)
        node.o = _flat(out)
        return out

    def backward(self, node, g_out):
        lengths, causal = node.problem
        q, k, v = (_flat(a) for a in (node.q, node.k, node.v))
        s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
        seen = numpy.stack([keep(q.shape[1], k.shape[1], k.shape[1] if lengths is None else lengths[b], causal)
                            for b in range(q.shape[0])])
        s = numpy.where(seen, s, -numpy.inf)
        top = s.max(axis=-1, keepdims=True)
        top = numpy.where(numpy.isfinite(top), top, 0.0)
        total = numpy.exp(s - top).sum(axis=-1)
        with numpy.errstate(divide="ignore"):
            lse = numpy.where(total > 0, top[..., 0] + numpy.log(numpy.where(total > 0, total, 1.0)), -numpy.inf)
        grads = self.reader.backward(q, k, v, node.o, lse, _flat(g_out), lengths, causal, BLOCK)
        self.swap.calls += 1
        return tuple(numpy.asarray(d).reshape(a.shape) for d, a in zip(grads, (node.q, node.k, node.v)))
