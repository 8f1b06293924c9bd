"""Batches by token count (§5.1): length-bucketed, shuffled by seed, padded once.

A batch's cost is its padded size, rows × the longest sentence in it (source or
target), as fairseq counts it; pairs are sorted by length so padding stays small,
cut into batches that keep the ``max_tokens`` budget, and the batch order is
shuffled with a generator seeded by (seed, epoch). Every kept pair appears in
exactly one batch per epoch; a single pair longer than the budget gets a batch of
its own; pairs longer than ``max_len`` are dropped and counted.
"""

import numpy

from .special import BOS_ID, EOS_ID, PAD_ID
from ..validation import check_int

__all__ = ["Batch", "ParallelData", "batch_indices", "make_batch", "pad"]


def pad(sequences, pad_id=PAD_ID, dtype=numpy.int64):
    """Sequences of ids as one (len(sequences), longest) array padded with ``pad_id``."""
    try:
        width = max((len(s) for s in sequences), default=0)
    except TypeError:
        bad = next(i for i, s in enumerate(sequences) if not hasattr(s, "__len__"))
        raise TypeError(f"pad: sequences[{bad}] must be a sequence of ids, "
                        f"got {type(sequences[bad]).__name__}") from None
    out = numpy.full((len(sequences), width), pad_id, dtype=dtype)
    for row, s in enumerate(sequences):
        try:
            out[row, : len(s)] = s
        except (TypeError, ValueError):
            raise TypeError(f"pad: sequences[{row}] must hold integer ids, got {list(s)[:8]!r}") from None
    return out


class Batch:
    """One padded batch: ``src`` (ids + EOS), ``tgt_in`` (BOS + ids), ``tgt_out`` (ids + EOS).

    ``src_mask`` is the (batch, 1, 1, len_src) keep-mask hiding source padding,
    built once here; ``num_tokens`` counts the real target tokens (the loss's
    denominator), ``indices`` the pairs' positions in the dataset.
    """

    __slots__ = ("src", "tgt_in", "tgt_out", "src_mask", "indices", "num_tokens", "num_src_tokens")

    def __init__(self, src, tgt_in, tgt_out, indices, pad_id=PAD_ID):
        self.src, self.tgt_in, self.tgt_out = src, tgt_in, tgt_out
        self.src_mask = (src != pad_id)[:, None, None, :]
        self.indices = indices
        self.num_tokens = int((tgt_out != pad_id).sum())
        self.num_src_tokens = int((src != pad_id).sum())

    def __len__(self):
        return len(self.src)

    @property
    def padded_tokens(self):
        """The budget this batch uses: rows × its longest sentence."""
        return len(self.src) * max(self.src.shape[1], self.tgt_in.shape[1])

    def __repr__(self):
        return (f"Batch({len(self)} pairs, src {self.src.shape}, tgt {self.tgt_in.shape}, "
                f"{self.num_tokens} target tokens)")


def make_batch(src_ids, tgt_ids, indices=None, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID):
    """A Batch from lists of source and target id sequences (no BOS/EOS in them yet)."""
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"make_batch: {len(src_ids)} source but {len(tgt_ids)} target sequences")
    src = pad([list(s) + [eos_id] for s in src_ids], pad_id)
    tgt_in = pad([[bos_id] + list(t) for t in tgt_ids], pad_id)
    tgt_out = pad([list(t) + [eos_id] for t in tgt_ids], pad_id)
    if indices is None:
        indices = numpy.arange(len(src_ids))
    return Batch(src, tgt_in, tgt_out, numpy.asarray(indices), pad_id)


def batch_indices(src_lengths, tgt_lengths, max_tokens, seed=0, epoch=0, shuffle=True):
    """Lists of pair indices whose padded size is at most ``max_tokens`` each.

    Lengths are those the model sees (ids + EOS, BOS + ids). Pairs are sorted by
    length with ties broken randomly (seeded), packed greedily, and the batches
    are shuffled by (seed, epoch); with ``shuffle=False`` they stay in length order.
    """
    src_lengths = numpy.asarray(src_lengths, dtype=numpy.int64)
    tgt_lengths = numpy.asarray(tgt_lengths, dtype=numpy.int64)
    if src_lengths.shape != tgt_lengths.shape or src_lengths.ndim != 1:
        raise ValueError(f"batch_indices: src_lengths {src_lengths.shape} and tgt_lengths "
                         f"{tgt_lengths.shape} must be 1-D and equally long")
    check_int("batch_indices: max_tokens", max_tokens, 1)
    rng = numpy.random.default_rng([seed, epoch])
    longest = numpy.maximum(src_lengths, tgt_lengths)
    tie_break = rng.permutation(len(longest))
    order = tie_break[numpy.lexsort((src_lengths[tie_break], longest[tie_break]))]
    batches, current, width = [], [], 0
    for i in order:
        new_width = max(width, int(longest[i]))
        if current and (len(current) + 1) * new_width > max_tokens:
            batches.append(current)
            current, new_width = [], int(longest[i])
        current.append(int(i))
        width = new_width
    if current:
        batches.append(current)
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return [numpy.asarray(b, dtype=numpy.int64) for b in batches]


class ParallelData:
    """Tokenised sentence pairs, with overlong ones dropped (and counted), ready to batch."""

    def __init__(self, src_ids, tgt_ids, max_len=None, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID):
        if len(src_ids) != len(tgt_ids):
            raise ValueError(f"ParallelData: {len(src_ids)} source but {len(tgt_ids)} target sentences")
        if max_len is not None:
            max_len = check_int("ParallelData: max_len", max_len, 1)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        keep = [
            i for i, (s, t) in enumerate(zip(src_ids, tgt_ids))
            if max_len is None or (len(s) + 1 <= max_len and len(t) + 1 <= max_len)
        ]
        self.num_dropped = len(src_ids) - len(keep)
        self.original_index = numpy.asarray(keep, dtype=numpy.int64)
        self.src = [list(src_ids[i]) for i in keep]
        self.tgt = [list(tgt_ids[i]) for i in keep]
        self.src_lengths = numpy.array([len(s) + 1 for s in self.src], dtype=numpy.int64)
        self.tgt_lengths = numpy.array([len(t) + 1 for t in self.tgt], dtype=numpy.int64)

    def __len__(self):
        return len(self.src)

    @property
    def num_target_tokens(self):
        return int(self.tgt_lengths.sum())

    def batches(self, max_tokens, seed=0, epoch=0, shuffle=True):
        """The epoch's batches (a list of Batch), in the order training should visit them."""
        groups = batch_indices(self.src_lengths, self.tgt_lengths, max_tokens, seed, epoch, shuffle)
        return [self.batch(g) for g in groups]

    def batch(self, indices):
        return make_batch([self.src[i] for i in indices], [self.tgt[i] for i in indices],
                          indices, self.pad_id, self.bos_id, self.eos_id)
