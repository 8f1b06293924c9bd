"""benchmarks/bench_decode.py on a tiny model and synthetic sentences (no Multi30k, no checkpoint, a few seconds)."""

import numpy as np
import pytest

from tinyformer.model import nn
from tinyformer.translation.data.special import BOS_ID, EOS_ID, PAD_ID

from copy_task import FIRST_WORD, VOCAB, train_copy_model
from scripts import load_script


MAX_LEN_B = 8  # short outputs keep the uncached and PyTorch searches fast


bench = load_script("benchmarks/bench_decode.py")


@pytest.fixture(scope="module")
def model():
    """A tiny float32 model (as a checkpoint is), randomly initialised, then 80 copy-task steps (~1 s).

    Untrained, such a model repeats one token up to the length limit, which would leave the search's
    EOS handling, stopping rule and length penalty unexercised; 80 steps make it stop at varied steps
    with beam search and greedy search disagreeing.
    """
    model = train_copy_model(80, d_model=16, d_ff=32, heads=2, num_layers=2, max_len=64)
    return model.eval()


@pytest.fixture(scope="module")
def sources():
    """40 synthetic sentences of 1-7 words + EOS, and one empty line (None, as encode_sources gives)."""
    rng = np.random.default_rng(1)
    lines = [rng.integers(FIRST_WORD, VOCAB, int(n)).tolist() + [EOS_ID] for n in rng.integers(1, 8, 40)]
    return lines[:4] + [None] + lines[4:]


def test_make_batches_sorts_by_length_pads_and_skips_empty_lines(sources):
    batches = bench.make_batches(sources, 4, PAD_ID)
    index = [i for idx, _ in batches for i in idx]
    assert sorted(index) == [i for i, s in enumerate(sources) if s is not None]
    lengths = [len(sources[i]) for i in index]
    assert lengths == sorted(lengths)
    for idx, src in batches:
        assert src.shape == (len(idx), max(len(sources[i]) for i in idx))
        for row, i in zip(src, idx):
            assert row[:len(sources[i])].tolist() == sources[i]
            assert (row[len(sources[i]):] == PAD_ID).all()


def test_encode_sources_appends_eos_and_marks_empty_lines():
    class Words:
        def encode(self, text):
            return [FIRST_WORD + len(w) for w in text.split()]

    assert bench.encode_sources(Words(), [" ab c ", "  ", "abc"], EOS_ID) == [
        [FIRST_WORD + 2, FIRST_WORD + 1, EOS_ID], None, [FIRST_WORD + 3, EOS_ID]]


def test_cached_and_uncached_outputs_are_identical(model, sources):
    run = bench.searchers(model, None, beam_size=4, alpha=0.6, max_len_a=1, max_len_b=MAX_LEN_B)
    assert set(run) == {"cached", "uncached"}
    batches = bench.make_batches(sources, 4, PAD_ID)
    seconds, outputs = bench.decode_all(run, batches, len(sources), warmup=False)
    assert set(seconds) == {"cached", "uncached"} and all(s > 0 for s in seconds.values())
    assert outputs["cached"] == outputs["uncached"]
    assert outputs["cached"][4] == []  # the empty line
    lengths = {len(ids) for i, ids in enumerate(outputs["cached"]) if i != 4}
    assert len(lengths) > 2  # the model stops at varied steps, so EOS handling is exercised


def test_the_model_exercises_the_search(model, sources):
    """Beam 4 and greedy search disagree, and α changes a result: the torch comparisons below test something."""
    from tinyformer.translation.decode import beam_search

    src = bench.make_batches(sources, 64, PAD_ID)[0][1]
    results = {(k, a): beam_search(model, src, beam_size=k, alpha=a, max_len_b=MAX_LEN_B)
               for k, a in [(1, 0.6), (4, 0.6), (4, 1.0)]}
    assert results[1, 0.6] != results[4, 0.6]
    assert results[4, 1.0] != results[4, 0.6]


def test_torch_search_returns_tinyformers_tokens_on_the_same_weights(model, sources):
    torch = pytest.importorskip("torch")
    assert bench.torch_supported(model) is None
    torch.set_num_threads(1)
    torch_model = bench.build_torch(model)
    run = bench.searchers(model, torch_model, beam_size=4, alpha=0.6, max_len_a=1, max_len_b=MAX_LEN_B)
    assert set(run) == {"cached", "uncached", "torch"}
    for order in ("interleaved", "blocks"):
        _, outputs = bench.decode_all(run, bench.make_batches(sources, 4, PAD_ID), len(sources), order)
        assert outputs["torch"] == outputs["cached"] == outputs["uncached"]


def assert_same_hypotheses(theirs, ours):
    """torch_beam_search's (ids, score, normalized) lists equal beam_search's Hypothesis lists."""
    assert [[h[0] for h in hyps] for hyps in theirs] == [[h.tokens for h in hyps] for hyps in ours]
    for t_hyps, o_hyps in zip(theirs, ours):
        for t, o in zip(t_hyps, o_hyps):
            assert t[1:] == pytest.approx((o.score, o.normalized_score), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("beam_size, alpha", [(1, 0.6), (3, 0.0), (4, 0.6), (4, 2.0), (5, 0.6)])
def test_torch_search_keeps_the_same_finished_hypotheses(model, sources, beam_size, alpha):
    """All kept hypotheses, their order, scores and normalized scores: the whole search, not just the winner."""
    pytest.importorskip("torch")
    from tinyformer.translation.decode import beam_search

    torch_model = bench.build_torch(model)
    src = bench.make_batches(sources, 64, PAD_ID)[0][1]
    common = dict(beam_size=beam_size, alpha=alpha, max_len_b=MAX_LEN_B)
    ours = beam_search(model, src, return_scores=True, **common)
    theirs = bench.torch_beam_search(torch_model, src, pad_id=PAD_ID, max_positions=model.config.max_len,
                                     return_scores=True, **common)
    assert_same_hypotheses(theirs, ours)
    assert bench.torch_beam_search(torch_model, src, pad_id=PAD_ID, **common) == [h[0].tokens for h in ours]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_torch_search_stops_at_the_same_step(model, sources, monkeypatch, alpha):
    """Sentence by sentence, both searches run the decoder the same number of times (the stopping rule)."""
    pytest.importorskip("torch")
    from tinyformer.translation.decode import beam_search

    torch_model = bench.build_torch(model)
    calls = {"tinyformer": 0, "torch": 0}
    decode = model.decode

    def counted(*args, **kwargs):
        calls["tinyformer"] += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(model, "decode", counted)
    hook = torch_model.transformer.decoder.register_forward_pre_hook(
        lambda *_: calls.__setitem__("torch", calls["torch"] + 1))
    steps = []
    try:
        for ids in filter(None, sources):
            src = np.array([ids])
            for count in calls:
                calls[count] = 0
            ours = beam_search(model, src, alpha=alpha, max_len_b=MAX_LEN_B)
            theirs = bench.torch_beam_search(torch_model, src, alpha=alpha, max_len_b=MAX_LEN_B, pad_id=PAD_ID)
            assert theirs == ours
            assert calls["torch"] == calls["tinyformer"]
            steps.append((calls["tinyformer"], len(ids) + MAX_LEN_B + 1))
    finally:
        hook.remove()
    assert any(n < limit for n, limit in steps)  # some sentences stop before the length limit


@pytest.mark.parametrize("max_len_a, max_len_b", [(0, 0), (0, 1), (0, 2), (0.5, 0), (1, 0)])
def test_torch_search_forces_eos_at_the_same_length_limit(model, sources, max_len_a, max_len_b):
    pytest.importorskip("torch")
    from tinyformer.translation.decode import beam_search

    torch_model = bench.build_torch(model)
    src = bench.make_batches(sources, 64, PAD_ID)[0][1]
    common = dict(max_len_a=max_len_a, max_len_b=max_len_b)
    ours = beam_search(model, src, return_scores=True, **common)
    theirs = bench.torch_beam_search(torch_model, src, pad_id=PAD_ID, return_scores=True, **common)
    assert_same_hypotheses(theirs, ours)
    limits = np.floor(max_len_a * (src != PAD_ID).sum(1) + max_len_b)
    assert all(len(h[0]) <= limit for hyps, limit in zip(theirs, limits) for h in hyps)
    assert any(len(hyps[0][0]) == limit for hyps, limit in zip(theirs, limits))  # the limit is reached


def test_torch_search_bans_pad_and_bos_and_agrees_up_to_tied_words(model, sources):
    """A copy of the model whose BOS row is scaled up (BOS would win if allowed) and whose words 5 and 6 have
    one embedding row (their logits tie): no PAD or BOS, and the same hypotheses, scores and order once 6 is
    read as 5. Which of two tied words a hypothesis carries is rounding (float32 against float64 states,
    one beam row against another), so the words themselves are not compared."""
    pytest.importorskip("torch")
    from tinyformer.translation.decode import beam_search

    tweaked = nn.Transformer(model.config)
    tweaked.load_state_dict(model.state_dict())
    tweaked.eval()
    weight = tweaked.tgt_embed.weight.data
    weight[BOS_ID] *= 20
    weight[PAD_ID] = weight[BOS_ID]
    weight[6] = weight[5]
    torch_model = bench.build_torch(tweaked)
    src = bench.make_batches(sources, 64, PAD_ID)[0][1]
    ours = beam_search(tweaked, src, return_scores=True, max_len_b=MAX_LEN_B)
    theirs = bench.torch_beam_search(torch_model, src, pad_id=PAD_ID, return_scores=True, max_len_b=MAX_LEN_B)
    tokens = {t for hyps in theirs for h in hyps for t in h[0]} | {t for hyps in ours for h in hyps for t in h.tokens}
    assert not tokens & {PAD_ID, BOS_ID} and {5, 6} & tokens

    def as_five(ids):
        return [5 if t == 6 else t for t in ids]

    assert_same_hypotheses([[(as_five(h[0]),) + tuple(h[1:]) for h in hyps] for hyps in theirs],
                           [[h._replace(tokens=as_five(h.tokens)) for h in hyps] for hyps in ours])


def test_torch_search_caps_the_length_at_the_positional_table(model):
    pytest.importorskip("torch")

    torch_model = bench.build_torch(model)
    src = np.array([[5, 6, 7, 8, 9, EOS_ID]])
    capped = bench.torch_beam_search(torch_model, src, max_len_b=50, pad_id=PAD_ID, max_positions=3,
                                     return_scores=True)
    assert all(len(h[0]) <= 2 for h in capped[0]) and len(capped[0][0][0]) == 2


def test_torch_supported_names_what_build_torch_model_cannot_build():
    pre_ln = nn.Transformer.from_preset("tiny", vocab_size=VOCAB, d_model=16, d_ff=32, heads=2, num_layers=1,
                                        norm_first=True, seed=0)
    assert "pre-LN" in bench.torch_supported(pre_ln)
    two = nn.Transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB + 1, d_model=16, d_ff=32, heads=2, num_layers=1,
                         seed=0)
    assert "vocabularies" in bench.torch_supported(two)
