"""Attention keep-masks (True = attend) and the sinusoidal positional table (§3.5)."""

import math

import numpy

from .. import backend
from ..tensor import Tensor
from ...common.validation import check_int


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


class KeyLengthMask:
    """A padding keep-mask given by its key lengths: ``mask`` (batch, 1, 1, len_k) keeps key j of
    sequence b iff j < ``lengths[b]`` (as ``padding_mask`` of a batch whose padding trails).

    Where attention knows a mask by this type, the fused kernels take ``lengths`` as they are:
    no per-call check of the mask's shape of holes, no read-back, no upload (a captured CUDA
    graph allows none). Everywhere else it is its boolean ``mask``: ``shape``, ``ndim``,
    ``dtype`` and indexing are the mask's. Both arrays live on the device of ``lengths``.
    """

    __slots__ = ("mask", "lengths")

    def __init__(self, lengths, len_k):
        xp = backend.get_array_module(lengths)
        if getattr(lengths, "ndim", None) != 1 or lengths.dtype.kind not in "iu":
            raise ValueError(f"KeyLengthMask: lengths must be a 1-D integer array, got "
                             f"{getattr(lengths, 'dtype', type(lengths).__name__)} of shape "
                             f"{tuple(getattr(lengths, 'shape', ()))}")
        len_k = check_int("KeyLengthMask: len_k", len_k, 0)
        self.lengths = lengths.astype(numpy.int32, copy=False)
        self.mask = (xp.arange(len_k, dtype=numpy.int32)[None, :] < self.lengths[:, None])[:, None, None, :]

    shape = property(lambda self: self.mask.shape)
    ndim = property(lambda self: self.mask.ndim)
    dtype = property(lambda self: self.mask.dtype)

    def __getitem__(self, index):
        return self.mask[index]

    def __repr__(self):
        return f"KeyLengthMask(shape={tuple(self.shape)})"


SINUSOID_LAYOUTS = ("interleaved", "split")


def sinusoid_table(max_len, d_model, dtype=numpy.float32, layout="interleaved"):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (§3.5); ``layout="split"``:
    the same sines in the first ⌈d_model/2⌉ columns and the cosines after them (Marian's layout)."""
    max_len = check_int("sinusoid_table: max_len", max_len, 1)
    d_model = check_int("sinusoid_table: d_model", d_model, 1)
    if layout not in SINUSOID_LAYOUTS:
        raise ValueError(f"sinusoid_table: layout must be one of {', '.join(map(repr, SINUSOID_LAYOUTS))}, "
                         f"got {layout!r}")
    position = numpy.arange(max_len, dtype=numpy.float64)[:, None]
    rate = numpy.exp(-math.log(10000.0) * numpy.arange(0, d_model, 2) / d_model)
    sines, cosines = numpy.sin(position * rate), numpy.cos(position * rate[: d_model // 2])
    if layout == "split":
        return numpy.concatenate([sines, cosines], axis=1).astype(dtype)
    table = numpy.zeros((max_len, d_model))
    table[:, 0::2], table[:, 1::2] = sines, cosines
    return table.astype(dtype)
