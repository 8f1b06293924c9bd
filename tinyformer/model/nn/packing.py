"""Packed rows: a batch's positions that carry tokens, without its padding.

Everything in the Transformer but attention works on each position alone (the projections, the
feed-forward network, dropout, the residual connections and layer norms), so it can run on the
positions that matter only, as rows (count, d_model), and skip the padding that a batch of
sentences of different lengths carries (about an eighth of a batch of 4,096 target tokens of
Multi30k). Attention puts the rows back into the padded (batch, len, d_model) layout for its
heads (``unpack``: zeros at the padding, which its mask hides) and takes them out again after
(``pack``). ``Transformer(..., packed=True)`` trains this way on the CPU; the padded layout stays
for decoding, for CUDA graphs (whose shapes must not depend on the batch) and for the GPU.
"""

import numpy

from ...engine.ops import pack_rows, unpack_rows

__all__ = ["PackedRows"]


class PackedRows:
    """The kept positions of a (batch, len) layout: ``mask`` (boolean, (batch, len)), ``index`` (their
    flat row numbers, in row-major order) and ``count``."""

    def __init__(self, mask):
        mask = numpy.asarray(mask, dtype=bool)
        if mask.ndim != 2:
            raise ValueError(f"PackedRows: mask must be (batch, len), got shape {mask.shape}")
        self.mask = mask
        self.shape = mask.shape
        self.index = numpy.flatnonzero(mask)
        self.count = self.index.size

    @classmethod
    def prefixes(cls, kept):
        """Each sentence's positions up to its last ``kept`` one (boolean (batch, len)): what causal
        attention needs of a row so that its kept positions see every position before them."""
        kept = numpy.asarray(kept, dtype=bool)
        length = kept.shape[1] - numpy.argmax(kept[:, ::-1], axis=1)
        length[~kept.any(axis=1)] = 0
        return cls(numpy.arange(kept.shape[1]) < length[:, None])

    def pack(self, x):
        """(batch, len, d) -> (count, d), the kept positions' rows."""
        if tuple(x.shape[:2]) != self.shape:
            raise ValueError(f"PackedRows.pack: x must be {self.shape + (x.shape[-1],)}, got {x.shape}")
        return pack_rows(x, self.index)

    def unpack(self, x):
        """(count, d) -> (batch, len, d), zeros at the positions not kept."""
        return unpack_rows(x, self.index, self.shape + (x.shape[-1],))

    def select(self, positions):
        """Where ``positions`` (boolean (batch, len), within the kept ones) fall among the packed rows:
        a boolean (count,) array, or None when they are all of them."""
        positions = numpy.asarray(positions, dtype=bool)
        if (positions & ~self.mask).any():
            raise ValueError("PackedRows.select: positions outside the packed rows")
        chosen = positions.reshape(-1)[self.index]
        return None if chosen.all() else chosen
