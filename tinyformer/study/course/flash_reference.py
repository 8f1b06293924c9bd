"""Exercises 7 and 8's answers, and the mistakes' answers: attention over tiles, in float64.

``attention`` is the plain formula (S and P whole): O and the row log-sum-exp. ``tiled_forward``
and ``tiled_backward`` are the tile recurrences of FlashAttention (Dao et al., 2022; Dao, 2023) as
kernels/attention.cu runs them, with switches that make one typical mistake each (a running sum
not rescaled, the max not subtracted, masked keys let in, ...): the checker compares a reader's
wrong answer with these to name the mistake. ``tiled_forward(..., trace=...)`` also gives the
running max and sum of every row after every key tile (``running_state``), what the kernel's
trace records.

Arrays: q (batch, len_q, d), k (batch, len_k, d), v (batch, len_k, d_v); key_lengths None or
(batch,) integers (key j of sequence b is seen iff j < key_lengths[b]); causal hides from query i
the keys j > i + (len_k − len_q), as the kernels do. A query that sees no key gets O = 0 and
lse = −∞ (and no gradient).
"""

import math

import numpy

__all__ = ["keep", "attention", "tiled_forward", "tiled_backward", "running_state", "key_end", "query_start"]


def keep(len_q, len_k, length, causal, rows=None, keys=None):
    """Which keys each query sees (True = seen), for the query ``rows`` and ``keys`` (default all)."""
    rows = numpy.arange(len_q) if rows is None else rows
    keys = numpy.arange(len_k) if keys is None else keys
    seen = numpy.broadcast_to(keys[None, :] < length, (len(rows), len(keys)))
    if causal:
        seen = seen & (keys[None, :] <= rows[:, None] + (len_k - len_q))
    return seen


def _length(key_lengths, b, len_k):
    return len_k if key_lengths is None else max(0, min(int(key_lengths[b]), len_k))


def attention(q, k, v, key_lengths=None, causal=False):
    """(O, lse) by the plain formula: S and P whole."""
    batch, len_q, len_k = q.shape[0], q.shape[1], k.shape[1]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    seen = numpy.stack([keep(len_q, len_k, _length(key_lengths, b, len_k), causal) for b in range(batch)])
    s = numpy.where(seen, s, -numpy.inf)
    top = s.max(axis=-1, keepdims=True)
    top = numpy.where(numpy.isfinite(top), top, 0.0)
    e = numpy.exp(s - top)
    total = e.sum(axis=-1, keepdims=True)
    with numpy.errstate(divide="ignore"):
        lse = numpy.where(total[..., 0] > 0, top[..., 0] + numpy.log(total[..., 0]), -numpy.inf)
    return e / numpy.where(total == 0, 1.0, total) @ v, lse


def key_end(i0, i1, length, causal, len_q, len_k):
    """One past the last key any of the queries [i0, i1) sees (the kernels' key_end)."""
    return min(length, i1 + (len_k - len_q)) if causal else length


def query_start(j0, causal, len_q, len_k):
    """The first query that may see key j0 (or a later one): the backward's first query tile."""
    return max(0, j0 - (len_k - len_q)) if causal else 0


def tiled_forward(q, k, v, key_lengths=None, causal=False, block=4, *, rescale_sum=True, rescale_acc=True,
                  subtract_max=True, fill=-numpy.inf, lengths_used=True, causal_used=True, stop_early=True,
                  trace=None):
    """(O, lse) by the online softmax over key tiles of ``block`` keys, query blocks of ``block``
    rows; every switch off (or ``fill`` finite: the score a hidden key gets) makes one mistake;
    ``stop_early`` off runs every key tile (the kernels stop at the last key a block sees).
    ``trace``, a list, gets (b, row, tile, running max, running sum) after every tile."""
    batch, len_q, len_k = q.shape[0], q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    o = numpy.zeros((batch, len_q, v.shape[-1]))
    lse = numpy.full((batch, len_q), -numpy.inf)
    for b in range(batch):
        length = _length(key_lengths if lengths_used else None, b, len_k)
        mask_causal = causal and causal_used
        for i0 in range(0, len_q, block):
            i1 = min(i0 + block, len_q)
            m, l = numpy.full(i1 - i0, -numpy.inf), numpy.zeros(i1 - i0)
            acc = numpy.zeros((i1 - i0, v.shape[-1]))
            end = key_end(i0, i1, length, mask_causal, len_q, len_k) if stop_early else len_k
            for j0 in range(0, end, block):
                j1 = min(j0 + block, len_k)
                s = q[b, i0:i1] @ k[b, j0:j1].T * scale
                seen = keep(len_q, len_k, length, mask_causal, numpy.arange(i0, i1), numpy.arange(j0, j1))
                s = numpy.where(seen, s, fill)
                new = numpy.maximum(m, s.max(axis=1))
                base = numpy.where(numpy.isfinite(new), new, 0.0) if subtract_max else numpy.zeros_like(new)
                with numpy.errstate(over="ignore", invalid="ignore"):
                    p = numpy.exp(s - base[:, None])
                    correction = numpy.exp(numpy.where(numpy.isfinite(m), m, -numpy.inf) - base)
                    l = (l * correction if rescale_sum and subtract_max else l) + p.sum(axis=1)
                    acc = (acc * correction[:, None] if rescale_acc and subtract_max else acc) + p @ v[b, j0:j1]
                m = new
                if trace is not None:
                    for r in range(i1 - i0):
                        trace.append((b, i0 + r, j0 // block, float(m[r]), float(l[r])))
            with numpy.errstate(divide="ignore", invalid="ignore", over="ignore"):
                o[b, i0:i1] = numpy.where(l[:, None] > 0, acc / numpy.where(l > 0, l, 1.0)[:, None], 0.0)
                lse[b, i0:i1] = numpy.where(l > 0, (m if subtract_max else 0.0) + numpy.log(numpy.where(l > 0, l, 1.0)),
                                            -numpy.inf)
    return o, lse


def running_state(trace, batch, len_q, tiles):
    """(max, sum) arrays (batch, len_q, tiles) of a trace of (b, row, tile, m, l): the state after
    each tile, carried on through tiles a row skipped (−∞ and 0 before its first)."""
    m = numpy.full((batch, len_q, tiles), numpy.nan)
    l = numpy.full((batch, len_q, tiles), numpy.nan)
    for b, row, tile, row_max, row_sum in trace:
        if 0 <= b < batch and 0 <= row < len_q and 0 <= tile < tiles:
            m[b, row, tile], l[b, row, tile] = row_max, row_sum
    for t in range(tiles):
        previous_m = m[:, :, t - 1] if t else numpy.full((batch, len_q), -numpy.inf)
        previous_l = l[:, :, t - 1] if t else numpy.zeros((batch, len_q))
        missing = numpy.isnan(m[:, :, t])
        m[:, :, t] = numpy.where(missing, previous_m, m[:, :, t])
        l[:, :, t] = numpy.where(missing, previous_l, l[:, :, t])
    return m, l


def tiled_backward(q, k, v, o, lse, d_out, key_lengths=None, causal=False, block=4, *, delta_from="o",
                   p_masked=True, stable=True, lengths_used=True, causal_used=True, scaled=True):
    """(dQ, dK, dV) by FlashAttention's backward: for every key tile, the query tiles that see it,
    P = exp(S − lse) recomputed, dV += Pᵀ·dO, dP = dO·Vᵀ, dS = P ∘ (dP − D), dQ += dS·K·scale,
    dK += dSᵀ·Q·scale, with D = rowsum(dO ∘ O). Switches make the mistakes: ``delta_from`` "o"
    (right), "d_out" (D = rowsum(dO)); ``p_masked`` off: hidden keys get exp(S − lse) too;
    ``stable`` off: exp(S)·exp(−lse), which overflows at large scores; ``scaled`` off: no 1/√d."""
    batch, len_q, len_k = q.shape[0], q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq, dk, dv = numpy.zeros(q.shape), numpy.zeros(k.shape), numpy.zeros(v.shape)
    delta = (d_out * o).sum(axis=-1) if delta_from == "o" else d_out.sum(axis=-1)
    for b in range(batch):
        length = _length(key_lengths if lengths_used else None, b, len_k)
        mask_causal = causal and causal_used
        key_stop = length if p_masked else len_k
        for j0 in range(0, key_stop, block):
            j1 = min(j0 + block, len_k)
            first = query_start(j0, mask_causal, len_q, len_k) // block * block if p_masked else 0
            for i0 in range(first, len_q, block):
                i1 = min(i0 + block, len_q)
                s = q[b, i0:i1] @ k[b, j0:j1].T * scale
                seen = keep(len_q, len_k, length, mask_causal, numpy.arange(i0, i1), numpy.arange(j0, j1))
                row_lse = lse[b, i0:i1, None]
                with numpy.errstate(over="ignore", invalid="ignore"):
                    if stable:
                        p = numpy.exp(s - numpy.where(numpy.isfinite(row_lse), row_lse, numpy.inf))
                    else:
                        p = numpy.exp(s) * numpy.exp(-numpy.where(numpy.isfinite(row_lse), row_lse, numpy.inf))
                    p = numpy.where(seen, p, 0.0) if p_masked else numpy.where(numpy.isfinite(row_lse), p, 0.0)
                    dv[b, j0:j1] += p.T @ d_out[b, i0:i1]
                    dp = d_out[b, i0:i1] @ v[b, j0:j1].T
                    ds = p * (dp - delta[b, i0:i1, None])
                    factor = scale if scaled else 1.0
                    dq[b, i0:i1] += ds @ k[b, j0:j1] * factor
                    dk[b, j0:j1] += ds.T @ q[b, i0:i1] * factor
    return dq, dk, dv
