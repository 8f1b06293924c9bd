"""Attention keep-masks (True = attend) and the sinusoidal positional table (§3.5)."""

import math

import numpy

from ..tensor import Tensor
from ..validation import check_int


def causal_mask(len_q, len_k=None, xp=numpy):
    """Keep-mask (len_q, len_k): query i sees keys j <= i + (len_k − len_q).

    Queries are aligned with the *last* keys, so with a cache of earlier keys a
    new query sees everything before it and itself.
    """
    len_k = len_q if len_k is None else len_k
    return xp.tril(xp.ones((len_q, len_k), dtype=bool), k=len_k - len_q)


def padding_mask(ids, pad_id):
    """Keep-mask (batch, 1, 1, len) that hides the keys where ``ids == pad_id``."""
    ids = ids.data if isinstance(ids, Tensor) else ids
    if not hasattr(ids, "ndim"):
        ids = numpy.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"padding_mask: ids must be (batch, len), got shape {tuple(ids.shape)}")
    return (ids != pad_id)[:, None, None, :]


def sinusoid_table(max_len, d_model, dtype=numpy.float32):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (§3.5)."""
    max_len = check_int("sinusoid_table: max_len", max_len, 1)
    d_model = check_int("sinusoid_table: d_model", d_model, 1)
    position = numpy.arange(max_len, dtype=numpy.float64)[:, None]
    rate = numpy.exp(-math.log(10000.0) * numpy.arange(0, d_model, 2) / d_model)
    table = numpy.zeros((max_len, d_model))
    table[:, 0::2] = numpy.sin(position * rate)
    table[:, 1::2] = numpy.cos(position * rate[: d_model // 2])
    return table.astype(dtype)
