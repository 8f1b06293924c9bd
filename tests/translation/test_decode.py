"""Greedy and beam search, the length penalty, and translate(): equivalences, limits, a trained copy
model, and the built-in task's `tiny` trained until it translates (conftest's ``trained_synthetic``)."""

import math

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.translation import decode, prediction
from tinyformer.model import nn
from tinyformer.translation.data.special import BOS_ID, EOS_ID, PAD_ID
from tinyformer.translation.decode import Hypothesis, beam_search, greedy_decode, length_penalty, translate
from tinyformer.common.filecache import cached_product

from copy_task import FIRST_WORD, VOCAB, copy_batch, train_copy_model
from trained_models import shared_directory

WORDS = "a b c d e f g h".split()

# Sources of different lengths, each ending in EOS, padded with PAD.
SRC = np.array([
    [5, 6, 7, 8, 9, 10, EOS_ID],
    [11, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
    [4, 4, 9, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
    [EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
    [6, 5, 11, 10, 7, EOS_ID, PAD_ID],
])


def random_model(seed=0, **overrides):
    """An untrained float64 model: near-uniform outputs, EOS at varied steps."""
    config = dict(vocab_size=VOCAB, d_model=16, d_ff=32, heads=2, num_layers=2, dropout=0.0, seed=seed,
                  max_len=64)
    config.update(overrides)
    return nn.Transformer.from_preset("tiny", **config).double()


COPY_MODEL_SIZES = dict(d_model=32, d_ff=64, heads=4, num_layers=1, max_len=32)
# With the rate falling to 0 over these steps, the model copies 40 of 40 test pairs (greedy and
# beam) from each of seeds 0-9; at a constant rate, 300 steps copied 29-40 of 40 over those seeds
# and 600 steps 31-40 (seed 0: 40 at 300 steps, 26 at 100).
COPY_MODEL_STEPS = 400


@pytest.fixture(scope="session")
def copy_model_weights(tmp_path_factory):
    """The copy model's weights (.npz), trained once per test run: the pytest-xdist workers share
    them (``trained_models``' directory and lock) instead of each training its own."""
    def make(partial):
        model = train_copy_model(COPY_MODEL_STEPS, decay=True, **COPY_MODEL_SIZES)
        with open(partial, "wb") as stream:
            np.savez(stream, **model.state_dict())

    return cached_product(shared_directory(tmp_path_factory), "copy-model.npz", make)


@pytest.fixture(scope="module")
def copy_model(copy_model_weights):
    """A 1-layer model trained to copy its source (float32, as trained)."""
    model = nn.Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, seed=0, **COPY_MODEL_SIZES)
    with np.load(copy_model_weights) as weights:
        model.load_state_dict(dict(weights))
    return model


@pytest.fixture(scope="module")
def copy_model64(copy_model):
    """The trained copy model in float64, for token-exact comparisons free of float32 near-ties."""
    model = nn.Transformer(copy_model.config)
    model.load_state_dict(copy_model.state_dict())
    return model.double()


@pytest.fixture(scope="module")
def translator(trained_synthetic):
    """(model, tokenizer, test sources, test references) of the built-in task's trained `tiny`."""
    model, tokenizer = trained_synthetic.load()
    sources, references = trained_synthetic.corpus("test")
    return model, tokenizer, sources, references


@pytest.fixture(scope="module")
def translator64(translator):
    """The trained translation model in float64, and a padded batch of test sources (EOS included)."""
    model, tokenizer, sources, _ = translator
    copy = nn.Transformer(model.config)
    copy.load_state_dict(model.state_dict())
    return copy.double().eval(), padded([tokenizer.encode(s) + [EOS_ID] for s in sources[:5]])


def padded(rows):
    batch = np.full((len(rows), max(map(len, rows))), PAD_ID)
    for i, row in enumerate(rows):
        batch[i, :len(row)] = row
    return batch


@pytest.fixture(params=["random", "trained", "translation"])
def model64(request):
    """(float64 model, sources): untrained, the trained copy model, the trained translation model."""
    if request.param == "translation":
        return request.getfixturevalue("translator64")
    return (random_model() if request.param == "random" else request.getfixturevalue("copy_model64")), SRC


def strip(row):
    return row[row != PAD_ID]


def teacher_forced_score(model, src_row, tokens):
    """Σ log p(y_t | y_<t, x) over tokens + EOS, from one full (uncached) forward pass."""
    tgt_in = np.array([[BOS_ID] + tokens])
    with tf.no_grad():
        logits = model.eval()(strip(src_row)[None], tgt_in).data[0].astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    return float(sum(log_probs[t, y] for t, y in enumerate(tokens + [EOS_ID])))


class WordTokenizer:
    """A word-level stand-in for the real tokenizer: ``encode`` gives ids without BOS/EOS."""

    def __init__(self, words=WORDS):
        self.ids = {w: FIRST_WORD + i for i, w in enumerate(words)}
        self.words = {i: w for w, i in self.ids.items()}
        self.encoded = []

    def encode(self, text):
        self.encoded.append(text)
        return [self.ids[w] for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids if i in self.words)


# ---------------------------------------------------------------------------- length penalty
def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2.0 ** 0.6)
    assert length_penalty(19, 1.0) == pytest.approx(4.0)
    assert length_penalty(30, 0.0) == 1.0


# ---------------------------------------------------------------------------- equivalences
def test_cached_greedy_equals_uncached(model64):
    model, src = model64
    cached = greedy_decode(model, src, max_len_b=8, return_scores=True)
    uncached = greedy_decode(model, src, max_len_b=8, use_cache=False, return_scores=True)
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]
    np.testing.assert_allclose([h.score for h in cached], [h.score for h in uncached], rtol=1e-9)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_cached_beam_equals_uncached(model64, beam_size):
    model, src = model64
    cached = beam_search(model, src, beam_size=beam_size, max_len_b=6, return_scores=True)
    uncached = beam_search(model, src, beam_size=beam_size, max_len_b=6, use_cache=False,
                           return_scores=True)
    assert [[h.tokens for h in hyps] for hyps in cached] == [[h.tokens for h in hyps] for hyps in uncached]
    np.testing.assert_allclose([h.score for hyps in cached for h in hyps],
                               [h.score for hyps in uncached for h in hyps], rtol=1e-9)


def test_beam_size_one_equals_greedy(model64):
    model, src = model64
    greedy = greedy_decode(model, src, max_len_b=10, return_scores=True)
    beam = beam_search(model, src, beam_size=1, max_len_b=10, return_scores=True)
    assert all(len(hyps) == 1 for hyps in beam)
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam]
    np.testing.assert_allclose([h.score for h in greedy], [hyps[0].score for hyps in beam], rtol=1e-12)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batched_equals_one_at_a_time(search):
    model = random_model(seed=1)
    run = greedy_decode if search == "greedy" else beam_search
    batched = run(model, SRC[[0, 1, 2, 4]], max_len_b=6, return_scores=True)
    for row, result in zip(SRC[[0, 1, 2, 4]], batched):
        alone = run(model, strip(row)[None], max_len_b=6, return_scores=True)[0]
        if search == "greedy":
            assert alone.tokens == result.tokens
            assert alone.score == pytest.approx(result.score, rel=1e-9)
        else:
            assert [h.tokens for h in alone] == [h.tokens for h in result]
            np.testing.assert_allclose([h.score for h in alone], [h.score for h in result], rtol=1e-9)


# ---------------------------------------------------------------------------- scores and ranking
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_scores_and_ranking(alpha):
    model = random_model(seed=2)
    beam_size = 3
    ranked = beam_search(model, SRC, beam_size=beam_size, alpha=alpha, max_len_b=5, return_scores=True)
    best = beam_search(model, SRC, beam_size=beam_size, alpha=alpha, max_len_b=5)
    for row, hyps, top in zip(SRC, ranked, best):
        assert 1 <= len(hyps) <= beam_size
        assert top == hyps[0].tokens
        normalized = [h.normalized_score for h in hyps]
        assert normalized == sorted(normalized, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)  # no duplicates
        for h in hyps:
            assert isinstance(h, Hypothesis)
            # score: Σ log-probabilities of the tokens and EOS; normalized: score / lp(|Y|), |Y| = tokens + 1
            assert h.score == pytest.approx(teacher_forced_score(model, row, h.tokens), rel=1e-7)
            assert h.normalized_score == pytest.approx(h.score / length_penalty(len(h.tokens) + 1, alpha))
            assert PAD_ID not in h.tokens and BOS_ID not in h.tokens and EOS_ID not in h.tokens


def test_greedy_scores_are_sequence_log_probabilities():
    model = random_model(seed=3)
    for row, h in zip(SRC, greedy_decode(model, SRC, max_len_b=6, return_scores=True)):
        assert h.score == pytest.approx(teacher_forced_score(model, row, h.tokens), rel=1e-7)
        assert h.normalized_score == h.score


def test_beam_finds_a_better_hypothesis_than_greedy_somewhere():
    """With α = 0 both rank by raw log-probability; on an untrained model (flat, ambiguous outputs)
    the beam's search finds more probable outputs than greedy's overall and for some sentence."""
    model = random_model(seed=4)
    greedy = greedy_decode(model, SRC, max_len_b=6, return_scores=True)
    beam = beam_search(model, SRC, beam_size=4, alpha=0.0, max_len_b=6, return_scores=True)
    gains = [hyps[0].score - g.score for g, hyps in zip(greedy, beam)]
    assert sum(gains) > 0 and max(gains) > 1e-3


class BigramModel:
    """A stand-in model whose next-token distribution depends only on the previous token.

    It has the interface the searches use (encode, decode with or without a state,
    init_state, modes), so search outcomes can be worked out by hand.
    """

    pad_id = PAD_ID

    def __init__(self, table):
        self.log_table = np.log(np.asarray(table, dtype=np.float64))
        self.tgt_vocab_size = self.log_table.shape[1]
        self.training = True

    def modules(self):
        return [self]

    def train(self, mode=True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def encode(self, src, src_mask=None):
        return tf.Tensor(np.zeros(src.shape + (1,)))

    def init_state(self):
        class State:
            def reorder(self, index):
                pass
        return State()

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None, state=None):
        return tf.Tensor(self.log_table[tgt])


def test_beam_keeps_searching_while_an_active_hypothesis_beats_the_finished_ones():
    """Ids: 4 = A, 5 = B, 6 = C. From BOS: A .5, EOS .2, B .15; after A: C .95; after B: EOS .9;
    after C: EOS .99. With beam 2 the hypotheses "" (EOS first) and "B" finish by step 2, ranked
    within the top two; stopping there (two finished) would return "" (log .2) although "A C"
    (log .5·.95·.99) is still active. The search must go on and return "A C"."""
    table = np.full((8, 8), 0.01)
    table[BOS_ID, [4, EOS_ID, 5]] = [0.5, 0.2, 0.15]
    table[4, 6] = table[5, EOS_ID] = table[6, EOS_ID] = 0.95
    table /= table.sum(1, keepdims=True)
    model = BigramModel(table)
    src = np.array([[4, EOS_ID]])
    hyps = beam_search(model, src, beam_size=2, alpha=0.0, return_scores=True)[0]
    assert [h.tokens for h in hyps] == [[4, 6], []]
    expected = np.log(table[BOS_ID, 4] * table[4, 6] * table[6, EOS_ID])
    assert hyps[0].score == pytest.approx(expected) and hyps[1].score == pytest.approx(np.log(table[BOS_ID, EOS_ID]))
    assert greedy_decode(model, src) == [[4, 6]]
    assert beam_search(model, src, beam_size=2, alpha=0.0, use_cache=False) == [[4, 6]]
    assert model.training


# ---------------------------------------------------------------------------- lengths
def test_greedy_max_length_is_a_times_src_len_plus_b():
    model = random_model(seed=5)
    src_len = (SRC != PAD_ID).sum(1)
    full = greedy_decode(model, SRC, max_len=40)
    for a, b in [(0.5, 1), (1, 0), (0, 3)]:
        limits = np.floor(a * src_len + b).astype(int)
        out = greedy_decode(model, SRC, max_len_a=a, max_len_b=b)
        # Cutting at L and forcing EOS there leaves the first L tokens of the unlimited search.
        assert out == [f[:limit] for f, limit in zip(full, limits)]
    assert any(len(f) > limit for f, limit in zip(full, np.floor(0.5 * src_len + 1)))
    assert greedy_decode(model, SRC, max_len=2, max_len_b=30) == [f[:2] for f in full]
    assert greedy_decode(model, SRC, max_len=0) == [[]] * len(SRC)


def test_beam_max_length_respected():
    model = random_model(seed=5)
    src_len = (SRC != PAD_ID).sum(1)
    limits = np.floor(0.5 * src_len + 2).astype(int)
    hyps = beam_search(model, SRC, max_len_a=0.5, max_len_b=2, return_scores=True)
    assert all(len(h.tokens) <= limit for sentence, limit in zip(hyps, limits) for h in sentence)
    assert any(len(h.tokens) == limit for sentence, limit in zip(hyps, limits) for h in sentence)
    assert beam_search(model, SRC, max_len=0) == [[]] * len(SRC)


def test_limit_capped_by_positional_encoding():
    model = random_model(seed=6, max_len=8)  # positions 0..7: BOS + at most 7 tokens, no error
    for out in (greedy_decode(model, SRC, max_len_b=50), beam_search(model, SRC, max_len_b=50)):
        assert max(len(o) for o in out) <= 7


def test_all_padding_source_and_empty_batch():
    model = random_model()
    out = greedy_decode(model, np.full((2, 3), PAD_ID), max_len_b=4)
    assert len(out) == 2 and all(len(o) <= 4 for o in out)
    assert greedy_decode(model, np.zeros((0, 3), dtype=int)) == []
    assert beam_search(model, np.zeros((0, 3), dtype=int)) == []


# ---------------------------------------------------------------------------- a trained model
def test_trained_copy_model_copies(copy_model):
    src, _, tgt_out = copy_batch(np.random.default_rng(123), 40)
    reference = [[int(t) for t in row if t >= FIRST_WORD] for row in tgt_out]
    beam = beam_search(copy_model, src, beam_size=4)
    greedy = greedy_decode(copy_model, src)
    assert np.mean([h == r for h, r in zip(beam, reference)]) >= 0.9
    assert np.mean([h == r for h, r in zip(greedy, reference)]) >= 0.9


TRANSLATED = 64  # test sentences of the built-in task translated by the tests below
# The trained fixture (trained_models.SYNTHETIC) translated 96.9-100 % of them exactly, greedy and with
# beam 4 (α 0.6), over seeds 0-9 of its options; there, beam 4 (α 0) also found no hypothesis less
# probable than greedy's and no wrong translation where greedy's was right.
EXACT_MATCH = 0.9


def test_the_trained_translation_model_is_trained(trained_synthetic):
    """What the fixture's own validation measured at its last step: its loss far below the first
    steps', and greedy exact match on 100 validation sentences."""
    first, last = trained_synthetic.metrics()[0], trained_synthetic.metrics("val")[-1]
    assert last["step"] == trained_synthetic.config.max_steps and last["bleu_sentences"] == 100
    assert last["nll"] < 0.3 and first["nll"] > 4 and last["exact_match_greedy"] >= EXACT_MATCH


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_trained_translation_model_translates_the_built_in_task(translator, beam_size):
    """Greedy and beam search (α = 0.6) give the task's German, rules and numbers, for nearly every
    test sentence (the sentences the model was not trained on)."""
    model, tokenizer, sources, references = translator
    found = translate(model, tokenizer, sources[:TRANSLATED], beam_size=beam_size, alpha=0.6)
    right = [f == r for f, r in zip(found, references)]
    assert np.mean(right) >= EXACT_MATCH, [(f, r) for f, r, ok in zip(found, references, right) if not ok]


def test_beam_search_finds_at_least_greedy_score_on_the_trained_model(translator):
    """With α = 0 both rank by log-probability: on a trained model, whose next-token distributions are
    sharp, a beam of 4 finds hypotheses at least as probable as greedy's, and never a wrong
    translation where greedy's is right."""
    model, tokenizer, sources, references = translator
    src = padded([tokenizer.encode(s) + [EOS_ID] for s in sources[:TRANSLATED]])
    greedy = greedy_decode(model, src, return_scores=True)
    beam = beam_search(model, src, beam_size=4, alpha=0.0, return_scores=True)
    for g, hyps, reference in zip(greedy, beam, references):
        assert hyps[0].score >= g.score - 1e-5 * abs(g.score)
        if tokenizer.decode(g.tokens) == reference:
            assert tokenizer.decode(hyps[0].tokens) == reference


# ---------------------------------------------------------------------------- translate
@pytest.mark.parametrize("beam_size", [1, 4])
def test_translate_keeps_alignment_with_empty_lines(copy_model64, beam_size):
    """An empty line's translation is empty, the others' are each line's own, in order (held against
    each line translated alone, not against the copy the model has learned: how well it copies is
    the trained model's draw, not translate's alignment)."""
    lines = ["a b c", "", "h g", "   ", "d", "e f a b", "\n", "c c"]
    out = translate(copy_model64, WordTokenizer(), lines, beam_size=beam_size, batch_size=2)
    alone = [translate(copy_model64, WordTokenizer(), [line], beam_size=beam_size)[0] if line.strip() else ""
             for line in lines]
    assert out == alone and len(set(alone)) == 6  # five different translations and the empty one


def test_translate_skips_the_model_for_empty_lines():
    tokenizer = WordTokenizer()
    assert translate(None, tokenizer, ["", "  ", "\t\n"]) == ["", "", ""]
    assert translate(None, tokenizer, []) == []
    assert tokenizer.encoded == []


def test_translate_batches_sorted_sources_with_eos(monkeypatch, copy_model):
    seen = []

    def spy(model, src, **kwargs):
        seen.append((src.copy(), kwargs))
        return [[int(t) for t in strip(row) if t != EOS_ID] for row in src]  # echo the source words

    monkeypatch.setattr(prediction, "beam_search", spy)
    lines = ["a b c d", "e", "", "f g", "h a b"]
    out = translate(copy_model, WordTokenizer(), lines, batch_size=2, max_len_b=7, alpha=0.3)
    assert out == lines
    assert [s.shape for s, _ in seen] == [(2, 3), (2, 5)]  # lengths 2, 3 | 4, 5 (EOS included)
    np.testing.assert_array_equal(seen[0][0], [[8, EOS_ID, PAD_ID], [9, 10, EOS_ID]])
    assert seen[0][1]["beam_size"] == 4 and seen[0][1]["alpha"] == 0.3 and seen[0][1]["max_len_b"] == 7
    seen.clear()
    translate(copy_model, WordTokenizer(), lines[:1], append_eos=False)
    np.testing.assert_array_equal(seen[0][0], [[4, 5, 6, 7]])


def test_translate_takes_its_settings_by_keyword_or_as_one_options_object():
    """``TranslateOptions`` groups translate's settings: given whole, or field by field by keyword (the
    keywords replacing the object's), the output is the same; an unknown setting or a positional
    non-options argument is refused in one line naming it."""
    model, lines = random_model(), ["a b c", "", "d e", "a"]
    options = prediction.TranslateOptions(beam_size=3, max_len_b=5, batch_size=2)
    by_keyword = translate(model, WordTokenizer(), lines, beam_size=3, max_len_b=5, batch_size=2)
    assert translate(model, WordTokenizer(), lines, options) == by_keyword
    assert translate(model, WordTokenizer(), lines, prediction.TranslateOptions(beam_size=1), beam_size=3,
                     max_len_b=5) == by_keyword
    assert translate(model, WordTokenizer(), lines, options, beam_size=1) == \
        translate(model, WordTokenizer(), lines, beam_size=1, max_len_b=5)
    with pytest.raises(TypeError, match=r"^translate: unknown setting 'beam'; the settings are beam_size, "):
        translate(model, WordTokenizer(), lines, beam=3)
    with pytest.raises(TypeError, match=r"^translate: options must be a TranslateOptions, got int"):
        translate(model, WordTokenizer(), lines, 3)


def test_a_length_normalization_object_searches_as_its_name():
    """The conventions are strategy objects: ``GNMT(α)`` and ``Transformers(α)`` search as "gnmt" and
    "hf" with that α, and a convention of one's own (here no penalty at all) ranks by its penalty."""
    model = random_model()
    for name, convention in (("gnmt", decode.GNMT), ("hf", decode.Transformers)):
        by_name = beam_search(model, SRC, beam_size=3, alpha=0.5, length_normalization=name, return_scores=True)
        assert beam_search(model, SRC, beam_size=3, length_normalization=convention(0.5),
                           return_scores=True) == by_name
        assert beam_search(model, SRC, beam_size=3, alpha=0.5, length_normalization=convention(),
                           return_scores=True) == by_name

    class Unnormalized(decode.GNMT):
        def penalty(self, length):
            return 1.0

    for hyps in beam_search(model, SRC, beam_size=3, length_normalization=Unnormalized(), return_scores=True):
        assert [h.normalized_score for h in hyps] == [h.score for h in hyps]
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    with pytest.raises(ValueError, match=r"^length_normalization must be one of \('gnmt', 'hf'\), got 'HF'$"):
        decode.length_normalization("HF")
    with pytest.raises(ValueError, match="alpha"):
        decode.Transformers(11)


# ---------------------------------------------------------------------------- modes and errors
def test_decoding_runs_in_eval_mode_without_graph_and_restores_modes():
    model = random_model()
    model.train()
    model.decoder.layers[0].train(False)  # a mixed state, to be restored exactly
    before = [m.training for m in model.modules()]
    seen = []
    original = model.decode

    def watched(*args, **kwargs):
        seen.append((model.training, model.decoder.layers[1].training, tf.is_grad_enabled()))
        logits = original(*args, **kwargs)
        assert not logits.requires_grad
        return logits

    model.decode = watched
    greedy_decode(model, SRC[:2], max_len_b=2)
    beam_search(model, SRC[:2], max_len_b=2)
    assert seen and all(s == (False, False, False) for s in seen)
    assert [m.training for m in model.modules()] == before
    assert tf.is_grad_enabled()


def test_bad_arguments_are_named():
    model = random_model()
    cases = [
        (lambda: greedy_decode(model, SRC[0]), "src"),
        (lambda: greedy_decode(model, SRC.astype(float)), "src"),
        (lambda: beam_search(model, SRC, beam_size=0), "beam_size"),
        (lambda: beam_search(model, SRC, alpha=-1), "alpha"),
        (lambda: greedy_decode(model, SRC, max_len=-1), "max_len"),
        (lambda: greedy_decode(model, SRC, max_len_a="1"), "max_len_a"),
        (lambda: beam_search(model, SRC, max_len_b=math.nan), "max_len_b"),
        (lambda: greedy_decode(model, SRC, eos_id=VOCAB), "eos_id"),
        (lambda: translate(model, WordTokenizer(), ["a"], batch_size=0), "batch_size"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name):
            call()
    with pytest.raises(TypeError, match="lines"):
        translate(model, WordTokenizer(), "a b c")
    with pytest.raises(TypeError, match=r"lines\[1\]"):
        translate(model, WordTokenizer(), ["a", None])
