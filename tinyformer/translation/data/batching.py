"""Batches by token count (§5.1): length-bucketed, shuffled by seed, padded once.

A batch's cost is its padded size, rows × the longest sentence in it (source or
target), as fairseq counts it; pairs are sorted by length so padding stays small,
cut into batches that keep the ``max_tokens`` budget, and the batch order is
shuffled with a generator seeded by (seed, epoch). Every kept pair appears in
exactly one batch per epoch; a single pair longer than the budget gets a batch of
its own; pairs longer than ``max_len`` are dropped and counted.

``ShapeBuckets`` bounds how many different batch shapes there are (one compiled or captured
step per shape, as a CUDA graph needs): lengths padded up to a multiple, rows up to a few counts
per length bucket. Padding is masked everywhere (source keys, causal target
positions, ignored loss targets), so a padded batch has the unpadded batch's loss and gradients.
"""

import collections.abc

import numpy

from ...engine import backend
from ...engine.functional.masks import KeyLengthMask
from ...common.validation import check_int
from .special import BOS_ID, EOS_ID, PAD_ID

__all__ = ["Batch", "Batches", "FlatSequences", "ParallelData", "ShapeBuckets", "batch_indices", "make_batch", "pad"]


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

    __slots__ = ("src", "tgt_in", "tgt_out", "src_mask", "src_lengths", "indices", "num_tokens", "num_src_tokens",
                 "pad_id")

    def __init__(self, src, tgt_in, tgt_out, indices, pad_id=PAD_ID):
        self.src, self.tgt_in, self.tgt_out, self.pad_id = src, tgt_in, tgt_out, pad_id
        self.src_mask = (src != pad_id)[:, None, None, :]
        lengths = self.src_mask[:, 0, 0, :].sum(axis=-1).astype(numpy.int32)
        trailing = (self.src_mask[:, 0, 0, :] == (numpy.arange(src.shape[1])[None, :] < lengths[:, None])).all()
        self.src_lengths = lengths if trailing else None  # None: padding inside a sentence (a hand-made batch)
        self.indices = indices
        self.num_tokens = int((tgt_out != pad_id).sum())
        self.num_src_tokens = int((src != pad_id).sum())

    def __len__(self):
        return len(self.src)

    def src_key_mask(self, like=None):
        """The source keep-mask for attention on ``like``'s device: a ``KeyLengthMask`` (the fused
        kernels take its lengths as they are) when the padding trails, else ``src_mask``."""
        if self.src_lengths is None:
            return backend.like(self.src_mask, like) if like is not None else self.src_mask
        lengths = self.src_lengths if like is None else backend.like(self.src_lengths, like)
        return KeyLengthMask(lengths, self.src.shape[1])

    @property
    def padded_tokens(self):
        """The budget this batch uses: rows × its longest sentence."""
        return len(self.src) * max(self.src.shape[1], self.tgt_in.shape[1])

    def __repr__(self):
        return (f"Batch({len(self)} pairs, src {self.src.shape}, tgt {self.tgt_in.shape}, "
                f"{self.num_tokens} target tokens)")

    @property
    def shape(self):
        """(rows, source length, target length)."""
        return (len(self.src), self.src.shape[1], self.tgt_in.shape[1])

    def padded_to(self, rows, src_len, tgt_len):
        """This batch with padding rows and columns up to (rows, src_len, tgt_len); the added rows
        index -1 (no pair). Its real tokens, and so its loss and gradients, are this batch's."""
        if rows < len(self) or src_len < self.src.shape[1] or tgt_len < self.tgt_in.shape[1]:
            raise ValueError(f"Batch.padded_to: {(rows, src_len, tgt_len)} is smaller than the batch's shape "
                             f"{self.shape}")

        def grown(ids, width):
            out = numpy.full((rows, width), self.pad_id, dtype=ids.dtype)
            out[: ids.shape[0], : ids.shape[1]] = ids
            return out

        indices = numpy.concatenate([self.indices, numpy.full(rows - len(self), -1, dtype=numpy.int64)])
        return Batch(grown(self.src, src_len), grown(self.tgt_in, tgt_len), grown(self.tgt_out, tgt_len), indices,
                     self.pad_id)


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
    batches = numpy.split(order, _batch_starts(longest[order], max_tokens)[1:]) if len(order) else []
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


def _batch_starts(widths, max_tokens):
    """Where each batch starts in ``widths`` (the pairs' padded lengths, in length order) when they
    are packed greedily: a pair joins the batch unless the batch, with it, would cost more than
    ``max_tokens`` (rows × its width, the widest so far); a pair alone always makes a batch. As the
    widths never fall, pair j joins a batch that starts at s when (j − s + 1) · widths[j] ≤
    max_tokens, and only the next max_tokens // widths[s] pairs can: one NumPy comparison per batch
    instead of a Python step per pair."""
    starts, start, count = [], 0, len(widths)
    while start < count:
        starts.append(start)
        candidates = widths[start + 1:start + max(max_tokens // int(widths[start]), 1)]
        over = numpy.arange(2, len(candidates) + 2) * candidates > max_tokens
        start += 1 + (int(over.argmax()) if over.any() else len(candidates))
    return starts


class ShapeBuckets:
    """Few batch shapes for a token budget: each length is padded up to a multiple of
    ``length_multiple`` (at most ``max_len``, the positions the model has), and the rows up to a
    few counts per length bucket (``row_counts``; at least the batch's own rows). The number of
    shapes is then bounded by the (source, target) length buckets times a few row counts each."""

    def __init__(self, max_tokens, length_multiple=8, max_len=None):
        self.max_tokens = check_int("ShapeBuckets: max_tokens", max_tokens, 1)
        self.length_multiple = check_int("ShapeBuckets: length_multiple", length_multiple, 1)
        self.max_len = None if max_len is None else check_int("ShapeBuckets: max_len", max_len, 1)
        self.seen = set()

    def length(self, n):
        """``n`` rounded up to the multiple, but not past max_len (nor below n)."""
        padded = -(-n // self.length_multiple) * self.length_multiple
        return max(n, padded if self.max_len is None else min(padded, self.max_len))

    def shortest(self, padded):
        """The shortest length that pads up to ``padded``."""
        return (padded - 1) // self.length_multiple * self.length_multiple + 1

    def row_counts(self, src_len, tgt_len):
        """(full, most, step) of a length bucket: ``full`` rows fill the budget at its padded
        lengths, a batch of its shortest sentences may hold up to ``most``; row counts are
        rounded up to ``full`` plus a multiple of ``step`` (a quarter of ``full``), so a bucket has at most
        (most − full) / step + 2 row counts and a padded batch at most a quarter more rows than
        its budget needs."""
        full = max(1, self.max_tokens // max(src_len, tgt_len))
        most = max(full, self.max_tokens // max(self.shortest(src_len), self.shortest(tgt_len)))
        return full, most, -(-full // 4)

    def shape(self, batch):
        """The bucket's (rows, source length, target length) for ``batch``: lengths rounded up to
        the bucket, rows up to ``full`` plus a multiple of the bucket's step (``row_counts``; a batch
        that fills the budget keeps its shape), never fewer than the batch's own."""
        rows, src_len, tgt_len = batch.shape
        src_len, tgt_len = self.length(src_len), self.length(tgt_len)
        full, most, step = self.row_counts(src_len, tgt_len)
        return (max(rows, min(most, full + -(-max(rows - full, 0) // step) * step)), src_len, tgt_len)

    def pad(self, batch):
        """``batch`` padded to its bucket's shape (recorded in ``seen``)."""
        shape = self.shape(batch)
        self.seen.add(shape)
        return batch if shape == batch.shape else batch.padded_to(*shape)


class FlatSequences:
    """Sequences of token ids as one flat array and the offsets where each starts (the last offset
    is the end): a corpus of millions of sentences in a few arrays, sliced without Python lists."""

    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, numpy.asarray(offsets, dtype=numpy.int64)
        if self.offsets.ndim != 1 or not len(self.offsets) or self.offsets[0] != 0 or self.offsets[-1] != len(ids):
            raise ValueError(f"FlatSequences: offsets must run from 0 to len(ids) = {len(ids)}")

    @classmethod
    def from_lists(cls, sequences, dtype=numpy.int32):
        lengths = numpy.fromiter((len(s) for s in sequences), dtype=numpy.int64, count=len(sequences))
        offsets = numpy.concatenate([[0], numpy.cumsum(lengths)]).astype(numpy.int64)
        ids = numpy.fromiter((i for s in sequences for i in s), dtype=dtype, count=int(offsets[-1]))
        return cls(ids, offsets)

    def __len__(self):
        return len(self.offsets) - 1

    @property
    def lengths(self):
        return numpy.diff(self.offsets)

    def __getitem__(self, row):
        return self.ids[self.offsets[row]:self.offsets[row + 1]]

    def padded(self, rows, before=None, after=None, pad_id=PAD_ID):
        """The sequences ``rows`` as one (len(rows), longest + extras) int64 array padded with
        ``pad_id``, with ``before`` put in front of each and ``after`` behind it (BOS, EOS)."""
        rows = numpy.asarray(rows, dtype=numpy.int64)
        starts, lengths = self.offsets[rows], self.offsets[rows + 1] - self.offsets[rows]
        shift = 0 if before is None else 1
        width = int(lengths.max(initial=0)) + shift + (0 if after is None else 1)
        out = numpy.full((len(rows), width), pad_id, dtype=numpy.int64)
        total = int(lengths.sum())
        row_of = numpy.repeat(numpy.arange(len(rows)), lengths)
        column = numpy.arange(total) - numpy.repeat(numpy.cumsum(lengths) - lengths, lengths)
        out[row_of, column + shift] = self.ids[numpy.repeat(starts, lengths) + column]
        if before is not None:
            out[:, 0] = before
        if after is not None:
            out[numpy.arange(len(rows)), lengths + shift] = after
        return out


class ParallelData:
    """Tokenised sentence pairs, with overlong ones dropped (and counted), ready to batch.

    The pairs live in two ``FlatSequences`` (from lists of id sequences, or ``from_flat`` for a
    corpus encoded into arrays); an epoch's batches are built as training visits them. A pair is
    dropped when a side with its EOS or BOS is longer than ``max_len`` tokens ("too long"), or,
    with ``max_ratio``, when its longer side has more than ``max_ratio`` times the tokens of its
    shorter one ("length ratio", Moses' clean-corpus rule counted in subwords); ``dropped`` counts
    each reason, ``num_dropped`` all."""

    def __init__(self, src_ids, tgt_ids, max_len=None, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, max_ratio=None):
        self._keep(FlatSequences.from_lists(src_ids), FlatSequences.from_lists(tgt_ids), max_len, max_ratio, None,
                   pad_id, bos_id, eos_id)

    @classmethod
    def from_flat(cls, src, tgt, max_len=None, max_ratio=None, rows=None, pad_id=PAD_ID, bos_id=BOS_ID,
                  eos_id=EOS_ID):
        """From two FlatSequences of as many sentences (memory-mapped arrays stay so); ``rows``: the
        sentences to take (all by default), e.g. all but those held out for validation."""
        data = cls.__new__(cls)
        data._keep(src, tgt, max_len, max_ratio, rows, pad_id, bos_id, eos_id)
        return data

    def _keep(self, src, tgt, max_len, max_ratio, rows, pad_id, bos_id, eos_id):
        if len(src) != len(tgt):
            raise ValueError(f"ParallelData: {len(src)} source but {len(tgt)} target sentences")
        if max_len is not None:
            max_len = check_int("ParallelData: max_len", max_len, 1)
        if max_ratio is not None and not max_ratio >= 1:
            raise ValueError(f"ParallelData: max_ratio must be at least 1, got {max_ratio!r}")
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self._src, self._tgt = src, tgt
        rows = numpy.arange(len(src), dtype=numpy.int64) if rows is None else numpy.asarray(rows, dtype=numpy.int64)
        src_tokens, tgt_tokens = src.lengths[rows], tgt.lengths[rows]
        too_long = numpy.zeros(len(rows), dtype=bool) if max_len is None else \
            (src_tokens + 1 > max_len) | (tgt_tokens + 1 > max_len)  # with EOS, with BOS
        off_ratio = numpy.zeros(len(rows), dtype=bool) if max_ratio is None else \
            ~too_long & (numpy.maximum(src_tokens, tgt_tokens) > max_ratio * numpy.maximum(
                numpy.minimum(src_tokens, tgt_tokens), 1))
        keep = ~(too_long | off_ratio)
        self.dropped = {"too long": int(too_long.sum()), "length ratio": int(off_ratio.sum())}
        self.num_dropped = len(rows) - int(keep.sum())
        self.original_index = rows[keep]
        self.src_lengths, self.tgt_lengths = src_tokens[keep] + 1, tgt_tokens[keep] + 1

    def __len__(self):
        return len(self.original_index)

    @property
    def num_target_tokens(self):
        return int(self.tgt_lengths.sum())

    def batches(self, max_tokens, seed=0, epoch=0, shuffle=True):
        """The epoch's batches in the order training should visit them: a sequence of Batch, each
        made when it is asked for (an epoch of a large corpus is never padded all at once)."""
        return Batches(self, batch_indices(self.src_lengths, self.tgt_lengths, max_tokens, seed, epoch, shuffle))

    def batch(self, indices):
        """The Batch of the pairs ``indices`` (positions among the kept pairs)."""
        indices = numpy.asarray(indices, dtype=numpy.int64)
        rows = self.original_index[indices]
        src = self._src.padded(rows, after=self.eos_id, pad_id=self.pad_id)
        tgt_in = self._tgt.padded(rows, before=self.bos_id, pad_id=self.pad_id)
        tgt_out = self._tgt.padded(rows, after=self.eos_id, pad_id=self.pad_id)
        return Batch(src, tgt_in, tgt_out, indices, self.pad_id)


class Batches(collections.abc.Sequence):
    """An epoch's batches: ``len``, indexing and slices (lists) of Batch, each built when asked for."""

    def __init__(self, data, groups):
        self.data, self.groups = data, groups

    def __len__(self):
        return len(self.groups)

    def __getitem__(self, which):
        if isinstance(which, slice):
            return [self.data.batch(g) for g in self.groups[which]]
        return self.data.batch(self.groups[which])
