"""The reader's attention inside a model, through the model's own door: ``nn.probe.Attention``.

Each attention exercise is an ``Attention`` (``nn.probe``) that ``nn.probe.attention_swapped`` puts
into every ``MultiHeadAttention`` of a model; nothing of the module or of the engine's ops is
patched, and the contract it implements is the one the module calls (tests/study/test_course.py checks
the signatures against ``nn.probe.Attention``'s):

==============  =====================================================================================
2 softmax       ``heads``: one node, ``ReaderHeads``; forward tinyformer's attention (O and P), backward
                tinyformer's formulas (dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k) with dS
                from the reader's softmax backward, handed the masked scores S (rebuilt from Q, K and
                the mask) and dP. The model has no stand-alone softmax: attention's is the one that
                trains.
4 attention     ``heads``: forward tinyformer's, backward the reader's on (batch·heads, len, d_k)
                arrays and the mask broadcast to (batch·heads, len_q, len_k).
6 multi-head    ``module``: the whole module as one node, ``ReaderMultiHeadAttention`` (forward the
  attention     exercise's given forward, backward the reader's; its inputs the three input tensors
                and the eight parameters), on the padded layout the module hands it. Calls with
                attention dropout or without a graph run the module's own.
7, 8 the tiled  ``heads`` (``flash_swap``).
==============  =====================================================================================
"""

import math

import numpy

from ...engine import functional as F
from ...engine.functional import KeyLengthMask, causal_mask
from ...engine.ops._helpers import sum_to_shape
from ...engine.tensor import Function, Tensor, is_grad_enabled
from ...model.nn.probe import Attention

__all__ = ["ReaderAttention", "ReaderHeads", "ReaderSoftmax", "ReaderAttentionBackward", "ReaderMultiHead",
           "ReaderMultiHeadAttention", "own_attention", "plain_mask", "keep_mask"]


def own_attention(q, k, v, mask, causal, return_weights=False):
    """tinyformer's attention on arrays, nothing recorded: O, or (O, P)."""
    out = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), mask=mask, causal=causal,
                                         return_weights=return_weights)
    return (out[0].data, out[1].data) if return_weights else out.data


def plain_mask(mask):
    """The keep-mask of an attention call as a plain array (or None), whatever form it came in."""
    return mask.mask if isinstance(mask, KeyLengthMask) else (mask.data if isinstance(mask, Tensor) else mask)


def keep_mask(mask, causal, len_q, len_k):
    """The boolean keep-mask attention applied (None: every key), as its forward builds it."""
    mask = plain_mask(mask)
    if causal:
        future = causal_mask(len_q, len_k)
        mask = future if mask is None else mask & future
    return mask


class ReaderHeads(Function):
    """The heads' attention as one node: forward ``attention.forward(node, q, k, v)`` (O), backward
    ``attention.backward(node, dO)`` (dQ, dK, dV); ``node`` carries the call (``mask``, ``causal``,
    and ``problem``: what ``attention.takes`` found of it) and what the forward keeps for the backward. With ``return_weights`` P is a second output,
    through which no gradient may come."""

    def forward(self, q, k, v, attention, mask, causal, return_weights, problem):
        self.attention, self.mask, self.causal, self.problem = attention, mask, causal, problem
        self.q, self.k, self.v = q, k, v
        out = attention.forward(self, q, k, v)
        return (out, self.p) if return_weights else out

    def backward(self, g_out, g_weights=None):
        if g_weights is not None:
            raise RuntimeError(f"exercise {self.attention.swap.number}'s swap covers attention whose weights take "
                               "no gradient; this model sends one through them (keep_attention)")
        return tuple(sum_to_shape(numpy.asarray(d), a.shape).astype(g_out.dtype, copy=False)
                     for d, a in zip(self.attention.backward(self, g_out), (self.q, self.k, self.v)))


class ReaderAttention(Attention):
    """An exercise's attention over the heads: ``ReaderHeads`` on the calls ``takes`` accepts,
    tinyformer's own on the others (counted in ``swap.own``). ``module`` is the reader's file,
    ``swap`` the ``Swap`` that counts."""

    def __init__(self, module, swap):
        self.reader, self.swap = module, swap

    def heads(self, q, k, v, mask=None, causal=False, dropout_p=0.0, return_weights=False, generator=None):
        problem = self.takes(q, k, mask, causal, dropout_p, return_weights)
        if problem is None:
            self.swap.own += 1
            return super().heads(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p,
                                 return_weights=return_weights, generator=generator)
        return ReaderHeads.apply(q, k, v, attention=self, mask=mask, causal=bool(causal),
                                 return_weights=bool(return_weights), problem=problem)

    def takes(self, q, k, mask, causal, dropout_p, return_weights):
        """What the exercise takes of this call (kept on the node as ``problem``), or None to leave
        it to tinyformer's own. Exercises 2 and 4: every call but one with attention dropout, which
        they do not cover."""
        if dropout_p and is_grad_enabled():
            raise RuntimeError(f"exercise {self.swap.number}'s swap covers attention without dropout; this model "
                               "uses it (attention_dropout)")
        return None if dropout_p else True

    def forward(self, node, q, k, v):
        """tinyformer's O (P kept on the node)."""
        out, node.p = own_attention(q, k, v, node.mask, node.causal, return_weights=True)
        return out


class ReaderSoftmax(ReaderAttention):
    """Exercise 2: attention's backward with dS from the reader's softmax backward."""

    def backward(self, node, g_out):
        q, k, v, p = node.q, node.k, node.v, node.p
        scale = 1.0 / math.sqrt(q.shape[-1])  # a Python float: the scores stay in q's dtype
        scores = q @ k.swapaxes(-1, -2) * scale
        keep = keep_mask(node.mask, node.causal, q.shape[-2], k.shape[-2])
        if keep is not None:
            scores = numpy.where(keep, scores, -numpy.inf)
        seen = numpy.isfinite(scores).any(axis=-1, keepdims=True)  # a row with no key has P = 0 and no gradient
        scores = numpy.where(seen, scores, 0.0)
        dp = g_out @ v.swapaxes(-1, -2)
        n = scores.shape[-1]
        ds = numpy.asarray(self.reader.backward(scores.reshape(-1, n), dp.reshape(-1, n))).reshape(dp.shape)
        self.swap.calls += 1
        ds = numpy.where(seen, ds, 0.0).astype(p.dtype, copy=False) * p.dtype.type(scale)
        return ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ g_out


class ReaderAttentionBackward(ReaderAttention):
    """Exercise 4: the reader's attention backward on the heads flattened into the batch axis."""

    def backward(self, node, g_out):
        q, k, v = node.q, node.k, node.v
        lead = numpy.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        len_q, len_k = q.shape[-2], k.shape[-2]

        def flat(a, rows, cols):
            return numpy.ascontiguousarray(numpy.broadcast_to(a, lead + (rows, cols))).reshape(-1, rows, cols)

        mask = plain_mask(node.mask)
        if mask is not None:
            mask = flat(mask, len_q, len_k)
        dq, dk, dv = self.reader.backward(flat(q, len_q, q.shape[-1]), flat(k, len_k, k.shape[-1]),
                                          flat(v, len_k, v.shape[-1]), mask, node.causal,
                                          flat(g_out, len_q, g_out.shape[-1]))
        self.swap.calls += 1
        return tuple(numpy.asarray(d).reshape(lead + a.shape[-2:]) for d, a in ((dq, q), (dk, k), (dv, v)))


# ---------------------------------------------------------------------------- 6: the whole module
_INPUTS = ("query", "key", "value")
_PARAMETERS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")


class ReaderMultiHeadAttention(Function):
    """nn.MultiHeadAttention as one node: forward is the exercise's forward (the reader's file,
    checked to compute tinyformer's), backward the reader's; inputs query, key, value and the
    eight parameters, in that order (self-attention passes one tensor three times, and the engine
    adds its three gradients)."""

    def forward(self, query, key, value, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, heads, mask, causal, module, swap):
        self.arrays = (query, key, value)
        self.params = dict(zip(_PARAMETERS, (w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o)))
        self.heads, self.mask, self.causal, self.module, self.swap = heads, mask, causal, module, swap
        return numpy.asarray(module.forward(query, key, value, self.params, heads, mask, causal)).astype(query.dtype,
                                                                                                         copy=False)

    def backward(self, g):
        grads = self.module.backward(*self.arrays, self.params, self.heads, self.mask, self.causal, g)
        self.swap.calls += 1
        return tuple(numpy.asarray(grads[name]) for name in _INPUTS + _PARAMETERS)


class ReaderMultiHead(Attention):
    """Exercise 6: ``module`` runs the whole MultiHeadAttention as ``ReaderMultiHeadAttention``."""

    def __init__(self, module, swap):
        self.reader, self.swap = module, swap

    def module(self, mha, call):
        if (mha.training and mha.dropout) or not is_grad_enabled():
            return None
        params = [p for layer in (mha.w_q, mha.w_k, mha.w_v, mha.w_o) for p in (layer.weight, layer.bias)]
        return ReaderMultiHeadAttention.apply(call.query, call.key, call.value, *params, heads=mha.heads,
                                              mask=plain_mask(call.mask),
                                              causal=call.causal, module=self.reader, swap=self.swap)
