"""Token-count batching: budget kept, every pair once, seeded order, padding and masks."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinyformer.translation.data import BOS_ID, EOS_ID, PAD_ID
from tinyformer.translation.data.batching import ParallelData, ShapeBuckets, batch_indices, make_batch, pad

lengths = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=200)


@settings(max_examples=60, deadline=None)
@given(pairs=lengths, max_tokens=st.integers(1, 300), seed=st.integers(0, 5), epoch=st.integers(0, 3))
def test_budget_kept_and_every_pair_exactly_once(pairs, max_tokens, seed, epoch):
    src, tgt = np.array(pairs).T
    batches = batch_indices(src, tgt, max_tokens, seed=seed, epoch=epoch)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(pairs)))
    for b in batches:
        cost = len(b) * max(src[b].max(), tgt[b].max())
        assert cost <= max_tokens or len(b) == 1, (b, cost)


@settings(max_examples=30, deadline=None)
@given(pairs=lengths, max_tokens=st.integers(40, 300))
def test_batches_are_length_buckets(pairs, max_tokens):
    """Unshuffled batches come in length order: no batch's shortest is longer than the next's longest."""
    src, tgt = np.array(pairs).T
    longest = np.maximum(src, tgt)
    batches = batch_indices(src, tgt, max_tokens, shuffle=False)
    for a, b in zip(batches, batches[1:]):
        assert longest[a].max() <= longest[b].min()


def test_order_depends_on_seed_and_epoch_only():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 30, 500), rng.integers(1, 30, 500)
    a = batch_indices(src, tgt, 200, seed=1, epoch=2)
    b = batch_indices(src, tgt, 200, seed=1, epoch=2)
    c = batch_indices(src, tgt, 200, seed=1, epoch=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert [x.tolist() for x in a] != [x.tolist() for x in c]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_tokens"):
        batch_indices([1, 2], [1, 2], 0)
    with pytest.raises(ValueError, match="src_lengths"):
        batch_indices([1, 2], [1], 10)
    with pytest.raises(ValueError, match="2 source but 1 target"):
        ParallelData([[1], [2]], [[3]])


def test_make_batch_adds_bos_eos_pads_and_masks():
    batch = make_batch([[7, 8, 9], [5]], [[4, 4], [6, 6, 6]], indices=[10, 11])
    np.testing.assert_array_equal(batch.src, [[7, 8, 9, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]])
    np.testing.assert_array_equal(batch.tgt_in, [[BOS_ID, 4, 4, PAD_ID], [BOS_ID, 6, 6, 6]])
    np.testing.assert_array_equal(batch.tgt_out, [[4, 4, EOS_ID, PAD_ID], [6, 6, 6, EOS_ID]])
    np.testing.assert_array_equal(batch.src_mask[:, 0, 0], batch.src != PAD_ID)
    assert batch.src_mask.shape == (2, 1, 1, 4)
    assert batch.num_tokens == 7 and batch.num_src_tokens == 6 and len(batch) == 2
    assert batch.padded_tokens == 8
    assert batch.indices.tolist() == [10, 11]


def test_parallel_data_drops_overlong_pairs_and_counts_them():
    src = [[1] * 3, [1] * 10, [1] * 4, [1] * 2]
    tgt = [[1] * 3, [1] * 2, [1] * 9, [1] * 2]
    data = ParallelData(src, tgt, max_len=6)
    assert len(data) == 2 and data.num_dropped == 2
    assert data.original_index.tolist() == [0, 3]
    batches = data.batches(max_tokens=100, seed=0)
    assert sorted(np.concatenate([b.indices for b in batches]).tolist()) == [0, 1]
    assert data.num_target_tokens == 4 + 3


def test_pad_handles_empty_sequences():
    np.testing.assert_array_equal(pad([[], [1, 2]]), [[PAD_ID, PAD_ID], [1, 2]])
    assert pad([]).shape == (0, 0)


# ------------------------------------------------------------------ shape buckets (few shapes, one graph each)
@settings(max_examples=40, deadline=None)
@given(pairs=lengths, max_tokens=st.integers(40, 400), multiple=st.sampled_from([1, 4, 8]))
def test_shape_buckets_bound_the_shapes_and_keep_the_pairs(pairs, max_tokens, multiple):
    data = ParallelData([[5] * s for s, _ in pairs], [[6] * t for _, t in pairs])
    buckets = ShapeBuckets(max_tokens, multiple, max_len=44)
    padded = [buckets.pad(b) for b in data.batches(max_tokens, seed=1)]
    for batch in padded:
        rows, src_len, tgt_len = batch.shape
        assert (src_len % multiple == 0 or src_len == 44) and (tgt_len % multiple == 0 or tgt_len == 44)
        real_rows = int((batch.indices >= 0).sum())
        full, most, step = buckets.row_counts(src_len, tgt_len)
        assert rows == real_rows or (full <= rows <= most and ((rows - full) % step == 0 or rows == most))
    real = np.concatenate([b.indices[b.indices >= 0] for b in padded])
    assert sorted(real.tolist()) == list(range(len(pairs)))
    assert sum(b.num_tokens for b in padded) == data.num_target_tokens
    by_bucket = {}
    for shape in buckets.seen:
        by_bucket.setdefault(shape[1:], set()).add(shape[0])
    for (src_len, tgt_len), row_counts in by_bucket.items():
        full, most, step = buckets.row_counts(src_len, tgt_len)
        over_budget = {rows for rows in row_counts if rows > most}  # a single pair longer than the budget
        assert len(row_counts - over_budget) <= (most - full) // step + 2
    lengths_per_side = -(-44 // multiple)
    assert len(by_bucket) <= lengths_per_side ** 2
    assert len(buckets.seen) == len({b.shape for b in padded})


def test_shape_buckets_round_lengths_and_fill_rows_to_the_budget():
    buckets = ShapeBuckets(max_tokens=100, length_multiple=8, max_len=20)
    assert [buckets.length(n) for n in (1, 8, 9, 17, 20)] == [8, 8, 16, 20, 20]  # capped at the positions
    batch = make_batch([[4, 5, 6]], [[7, 8, 9, 10, 11, 12, 13, 14, 15]])  # src 4 tokens, tgt 10
    assert buckets.shape(batch) == (6, 8, 16)  # 100 // 16 rows
    full, most, step = buckets.row_counts(8, 16)
    assert (full, most, step) == (6, 11, 2)  # a bucket of 9..16 target tokens holds up to 100 // 9 rows
    assert buckets.shape(make_batch([[4]] * 7, [[5] * 9] * 7)) == (8, 8, 16)  # 6 + 1 step
    assert buckets.shape(make_batch([[4]] * 11, [[5] * 8] * 11)) == (11, 8, 16)  # 6 + 2 steps = 10 < its own 11
    padded = buckets.pad(batch)
    assert padded.shape == (6, 8, 16) and padded.indices.tolist() == [0, -1, -1, -1, -1, -1]
    assert not padded.src_mask[1:].any() and padded.num_tokens == batch.num_tokens
    np.testing.assert_array_equal(padded.tgt_out[0, :10], batch.tgt_out[0])
    with pytest.raises(ValueError, match=r"\(1, 8, 16\) is smaller than the batch's shape \(6, 8, 16\)"):
        padded.padded_to(1, 8, 16)
    with pytest.raises(ValueError, match="length_multiple"):
        ShapeBuckets(100, 0)


def test_a_padded_batch_has_the_unpadded_batchs_loss_and_gradients():
    """Padding rows and columns is masked everywhere: source keys, causal target positions and
    ignored loss targets (float64, dropout off: the same up to summation order)."""
    import tinyformer as tf
    from tinyformer.translation.train.evaluation import batch_loss

    model = tf.nn.Transformer(src_vocab_size=30,
                              d_model=16, d_ff=24, heads=2, num_layers=2, dropout=0.0, seed=4).to(dtype=np.float64)
    batch = make_batch([[4, 5, 6, 7], [8, 9], [10, 11, 12]], [[13, 14], [15, 16, 17, 18, 19], [20]])
    padded = ShapeBuckets(max_tokens=80, length_multiple=8).pad(batch)
    assert padded.shape == (10, 8, 8)  # 80 // 8 = 10 rows fill the budget
    results = []
    for b in (batch, padded):
        model.zero_grad()
        loss, nll = batch_loss(model, b, 0.1)
        (loss / b.num_tokens).backward()
        results.append((loss.item(), nll.item(), {n: p.grad.copy() for n, p in model.named_parameters()}))
    (loss, nll, grads), (loss_padded, nll_padded, grads_padded) = results
    assert loss_padded == pytest.approx(loss, rel=1e-12) and nll_padded == pytest.approx(nll, rel=1e-12)
    for name in grads:
        np.testing.assert_allclose(grads_padded[name], grads[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_the_loss_runs_on_packed_rows_and_equals_the_padded_loss(monkeypatch):
    """On the CPU batch_loss runs the model on packed rows (``packed=True``: no padding but in
    attention) and asks for the logits of the non-padding target positions only (``positions=``):
    the same loss, NLL and gradients as the padded model's (float64, dropout off, a random upstream
    gradient), with the vocabulary projection made for the counted rows."""
    import tinyformer as tf
    from tinyformer.translation.train.evaluation import batch_loss

    model = tf.nn.Transformer(src_vocab_size=30,
                              d_model=16, d_ff=24, heads=2, num_layers=2, dropout=0.0, seed=5).to(dtype=np.float64)
    batch = make_batch([[4, 5, 6, 7], [8, 9], [10, 11, 12]], [[13, 14], [15, 16, 17, 18, 19], [20]])
    calls = []
    forward = type(model).forward

    def spy(self, *args, positions=None, packed=False, **kwargs):
        calls.append((positions, packed))
        logits = forward(self, *args, positions=positions, packed=packed, **kwargs)
        calls.append(logits.shape)
        return logits

    monkeypatch.setattr(type(model), "forward", spy)
    upstream = np.random.default_rng(0).normal(size=2)
    results = []
    for padded_logits in (False, True):
        model.zero_grad()
        loss, nll = batch_loss(model, batch, 0.1, padded_logits=padded_logits)
        (loss * upstream[0] + nll * upstream[1]).backward()
        results.append((loss.item(), nll.item(), {n: p.grad.copy() for n, p in model.named_parameters()}))
    (counted, packed), counted_shape, (padded, padded_packed), padded_shape = calls
    np.testing.assert_array_equal(counted, batch.tgt_out != PAD_ID)
    assert packed and counted_shape == (batch.num_tokens, 30)
    assert padded is None and not padded_packed and padded_shape == (3, 6, 30)
    (loss, nll, grads), (loss_padded, nll_padded, grads_padded) = results
    assert loss == pytest.approx(loss_padded, rel=1e-12) and nll == pytest.approx(nll_padded, rel=1e-12)
    for name in grads:
        np.testing.assert_allclose(grads[name], grads_padded[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_a_batch_knows_its_source_lengths_and_makes_its_key_mask():
    batch = make_batch([[5, 6, 7], [8]], [[9], [10, 11]])
    np.testing.assert_array_equal(batch.src_lengths, [4, 2])  # with EOS
    mask = batch.src_key_mask()
    np.testing.assert_array_equal(mask.mask, batch.src_mask)
    padded = batch.padded_to(4, 8, 8)
    np.testing.assert_array_equal(padded.src_lengths, [4, 2, 0, 0])
    np.testing.assert_array_equal(padded.src_key_mask().mask, padded.src_mask)
    holes = make_batch([[5, PAD_ID, 7]], [[9]])  # padding inside a sentence: the boolean mask it is
    assert holes.src_lengths is None and holes.src_key_mask() is holes.src_mask


# ------------------------------------------------------------------ the compact layout equals the plain one
def _batch_indices_pair_by_pair(src_lengths, tgt_lengths, max_tokens, seed=0, epoch=0, shuffle=True):
    """The packing as first written, a Python step per pair: the reference of the per-batch one."""
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    rng = np.random.default_rng([seed, epoch])
    longest = np.maximum(src_lengths, tgt_lengths)
    tie_break = rng.permutation(len(longest))
    order = tie_break[np.lexsort((src_lengths[tie_break], longest[tie_break]))]
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
    return [b for b in batches]


@settings(max_examples=80, deadline=None)
@given(pairs=lengths, max_tokens=st.integers(1, 300), seed=st.integers(0, 5), shuffle=st.booleans())
@example(pairs=[(10, 3)] * 5 + [(4, 12)] * 3, max_tokens=24, seed=0, shuffle=False)  # batches that fit exactly
@example(pairs=[(50, 2), (3, 3), (60, 1)], max_tokens=40, seed=1, shuffle=True)  # pairs over the budget
def test_batches_are_those_of_the_pair_by_pair_packing(pairs, max_tokens, seed, shuffle):
    src, tgt = np.array(pairs).T
    got = batch_indices(src, tgt, max_tokens, seed=seed, epoch=1, shuffle=shuffle)
    assert [b.tolist() for b in got] == _batch_indices_pair_by_pair(src, tgt, max_tokens, seed, 1, shuffle)
    assert all(b.dtype == np.int64 for b in got)


@settings(max_examples=40, deadline=None)
@given(pairs=lengths, max_len=st.integers(1, 45), max_tokens=st.integers(20, 300))
def test_a_batch_of_the_flat_arrays_is_make_batch_of_the_lists(pairs, max_len, max_tokens):
    rng = np.random.default_rng(len(pairs))
    src = [rng.integers(4, 100, s).tolist() for s, _ in pairs]
    tgt = [rng.integers(4, 100, t).tolist() for _, t in pairs]
    data = ParallelData(src, tgt, max_len=max_len)
    kept = [i for i in range(len(src)) if len(src[i]) < max_len and len(tgt[i]) < max_len]
    assert data.original_index.tolist() == kept and data.num_dropped == len(src) - len(kept)
    batches = data.batches(max_tokens, seed=3)
    assert len(batches[:]) == len(batches)
    for batch in batches:
        expected = make_batch([src[kept[i]] for i in batch.indices], [tgt[kept[i]] for i in batch.indices],
                              batch.indices)
        for name in ("src", "tgt_in", "tgt_out", "src_mask", "indices"):
            np.testing.assert_array_equal(getattr(batch, name), getattr(expected, name))
            assert getattr(batch, name).dtype == getattr(expected, name).dtype
        assert batch.num_tokens == expected.num_tokens


def test_flat_sequences_refuse_offsets_that_do_not_cover_the_ids():
    from tinyformer.translation.data.batching import FlatSequences
    with pytest.raises(ValueError, match="offsets must run from 0 to len"):
        FlatSequences(np.arange(5, dtype=np.int32), [0, 2, 4])
    flat = FlatSequences.from_lists([[5, 6], [], [7]])
    assert flat.lengths.tolist() == [2, 0, 1] and flat[2].tolist() == [7] and len(flat) == 3
