"""Beam search with Hugging Face's length normalisation (``length_normalization="hf"``).

Against transformers itself: the Marian models of ``marian_folders`` (briefly and longer trained, of
different depths and activations), imported as tinyformer runs, must give the tokens of
``generate(num_beams=4)`` on every sentence, or a hypothesis that ties with transformers' to float32
rounding, over outputs that differ from sentence to sentence and end both before and at the limit. Without transformers: hand-built bigram models
whose searches are worked out by hand pin the rules — score / |Y|^α, the stop against the worst kept
hypothesis, the forced EOS that scores 0 — each where gnmt's rule gives another result.
"""

import math

import numpy as np
import pytest

from tinyformer.translation import decode, prediction
from tinyformer.translation.data.special import BOS_ID, EOS_ID
from tinyformer.translation.decode import Hypothesis, beam_search, hf_length_penalty, translate

from tests.translation.test_decode import SRC, BigramModel, WordTokenizer, random_model

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")  # transformers' tokenizer

A, B, C = 4, 5, 6  # the bigram models' words


# ---------------------------------------------------------------------------- the rules, by hand
def bigram_table():
    """From BOS: A .35, EOS .3, B .28; after A: C .7, EOS .2; after B: EOS .9; after C: EOS .99.

    Beam 2, α = 1. Step 1 finishes "" (log .3 / 1 = −1.204) and keeps A, B. Step 2 finishes "B"
    (log(.28·.9) / 2 = −0.689) and keeps "A C" (log(.35·.7) = −1.406). Now two are finished and the
    best active one, −1.406 / 2 = −0.703, is worse than the best finished (−0.689) but better than
    the worst (−1.204): gnmt's rule stops, transformers' goes on, and "A C" ends with
    log(.35·.7·.99) / 3 = −0.472, the best. (GNMT's penalty with α = 1 stops there too: −1.406 /
    (7/6) = −1.205 ≤ "B"'s −1.378 / (7/6) = −1.181.)
    """
    table = np.full((8, 8), 0.002)
    table[BOS_ID, [A, EOS_ID, B]] = [0.35, 0.3, 0.28]
    table[A, [C, EOS_ID]] = [0.7, 0.2]
    table[B, EOS_ID] = 0.9
    table[C, EOS_ID] = 0.99
    return table / table.sum(1, keepdims=True)


def path_log_prob(table, tokens, eos=True):
    """Σ log p along BOS, tokens (and EOS)."""
    path = [BOS_ID, *tokens] + ([EOS_ID] if eos else [])
    return float(sum(np.log(table[a, b]) for a, b in zip(path, path[1:])))


SOURCE = np.array([[A, EOS_ID]])


def test_hf_length_penalty_is_length_to_the_alpha():
    assert hf_length_penalty(3, 1.0) == 3.0
    assert hf_length_penalty(4, 0.5) == 2.0
    assert hf_length_penalty(4, -1.0) == 0.25
    assert hf_length_penalty(7, 0.0) == 1.0


def test_hf_ranks_by_score_over_length_and_stops_against_the_worst_kept():
    table = bigram_table()
    model = BigramModel(table)
    hf = beam_search(model, SOURCE, beam_size=2, alpha=1.0, length_normalization="hf", return_scores=True)[0]
    assert [h.tokens for h in hf] == [[A, C], [B]]
    for h in hf:
        assert isinstance(h, Hypothesis)
        assert h.score == pytest.approx(path_log_prob(table, h.tokens))
        assert h.normalized_score == pytest.approx(h.score / (len(h.tokens) + 1))  # |Y| counts the EOS
    assert hf[0].normalized_score == pytest.approx(path_log_prob(table, [A, C]) / 3)
    # gnmt, same α: stopped a step earlier, "A C" never finished
    gnmt = beam_search(model, SOURCE, beam_size=2, alpha=1.0, return_scores=True)[0]
    assert [h.tokens for h in gnmt] == [[B], []]
    assert beam_search(model, SOURCE, beam_size=2, alpha=1.0, length_normalization="hf", use_cache=False) == [[A, C]]
    assert model.training  # modes restored


def test_hf_forced_eos_at_the_maximum_length_scores_zero():
    """max_len 1: step 2 may only end, and transformers scores that EOS 0, not log p(EOS): "A"
    (log .35 / 2) beats "B" (log .28 / 2) and "" (log .3 / 1). Were log p(EOS | A) = log .2 added,
    "B" (log(.28·.9) / 2) would win."""
    table = bigram_table()
    hyps = beam_search(BigramModel(table), SOURCE, beam_size=2, alpha=1.0, max_len=1, length_normalization="hf",
                       return_scores=True)[0]
    assert [h.tokens for h in hyps] == [[A], [B]]
    assert [h.score for h in hyps] == pytest.approx([math.log(table[BOS_ID, A]), math.log(table[BOS_ID, B])])
    assert [h.normalized_score for h in hyps] == pytest.approx([h.score / 2 for h in hyps])
    gnmt = beam_search(BigramModel(table), SOURCE, beam_size=2, alpha=1.0, max_len=1, return_scores=True)[0]
    assert gnmt[0].tokens == [B] and gnmt[0].score == pytest.approx(path_log_prob(table, [B]))


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.5, -0.5])
def test_hf_scores_rank_and_lengths_on_a_random_model(alpha):
    model = random_model(seed=2)
    ranked = beam_search(model, SRC, beam_size=3, alpha=alpha, max_len_b=5, length_normalization="hf",
                         return_scores=True)
    for hyps in ranked:
        assert 1 <= len(hyps) <= 3
        normalized = [h.normalized_score for h in hyps]
        assert normalized == sorted(normalized, reverse=True)
        for h in hyps:
            assert h.normalized_score == pytest.approx(h.score / (len(h.tokens) + 1) ** alpha)
    assert [hyps[0].tokens for hyps in ranked] == beam_search(model, SRC, beam_size=3, alpha=alpha, max_len_b=5,
                                                              length_normalization="hf")


def test_alpha_defaults_to_each_normalizations_own():
    model = BigramModel(bigram_table())
    assert beam_search(model, SOURCE, beam_size=2, length_normalization="hf") == [[A, C]]  # α = 1.0
    assert beam_search(model, SOURCE, beam_size=2) == beam_search(model, SOURCE, beam_size=2, alpha=0.6)
    assert decode.DEFAULT_ALPHA == {"gnmt": 0.6, "hf": 1.0}


def test_translate_passes_the_normalization_and_its_alpha(monkeypatch):
    seen = []

    def spy(model, src, **kwargs):
        seen.append(kwargs)
        return [[] for _ in src]

    monkeypatch.setattr(prediction, "beam_search", spy)
    model = random_model()
    translate(model, WordTokenizer(), ["a b"], length_normalization="hf")
    translate(model, WordTokenizer(), ["a b"], length_normalization="hf", alpha=-0.5)
    translate(model, WordTokenizer(), ["a b"])
    assert [(s["length_normalization"], s["alpha"]) for s in seen] == [("hf", 1.0), ("hf", -0.5), ("gnmt", 0.6)]


def test_bad_length_normalization_and_alpha_are_named():
    model = random_model()
    cases = [
        (lambda: beam_search(model, SRC, length_normalization="fairseq"), "length_normalization"),
        (lambda: beam_search(model, SRC, length_normalization=None), "length_normalization"),
        (lambda: beam_search(model, SRC, alpha=-0.5), "alpha"),  # GNMT's α is ≥ 0
        (lambda: beam_search(model, SRC, alpha=math.inf, length_normalization="hf"), "alpha"),
        (lambda: translate(model, WordTokenizer(), [], length_normalization="HF"), "length_normalization"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name) as info:
            call()
        assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------- against transformers
SENTENCES = 60
TIE = 1e-5
"""Where the two searches return different tokens for a sentence, the difference is allowed only as a
tie: both hypotheses' scores / |Y|^α, computed by tinyformer's model, equal to this relative tolerance
(float32 logits of two implementations differ in their last bits)."""


@pytest.fixture(scope="module")
def marian_runs(tmp_path_factory):
    """name -> (torch model, transformers' tokenizer, tinyformer model, tinyformer tokenizer, run directory)
    for the shared Marian folders of marian_folders.SHAPES (built once per test run: brief and longer
    training, different depths and activations), each imported as a tinyformer run.

    torch runs on one thread meanwhile: beside the other test processes, more threads only wait."""
    pytest.importorskip("transformers")
    import torch
    from marian_folders import SHAPES, hf_model, marian_once
    from tinyformer.translation.interop.runs import import_marian
    from tinyformer.translation.train.state import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hf-beam")
    runs = {}
    try:
        for name in SHAPES:
            folder = marian_once(tmp_path_factory, name)
            import_marian(folder, root / name)
            model, tokenizer, _ = load_model(root / name)
            runs[name] = (*hf_model(folder), model, tokenizer, root / name)
        yield runs
    finally:
        torch.set_num_threads(threads)


def hf_beam(hf_model, hf_tokenizer, sources, length_penalty, max_new_tokens):
    """transformers' beam 4 on ``sources``: (source ids, one list of generated ids per sentence, without the
    decoder-start token, padding and final EOS)."""
    import torch

    inputs = hf_tokenizer(sources, return_tensors="pt", padding=True)
    pad = hf_tokenizer.pad_token_id
    with torch.no_grad():
        output = hf_model.generate(**inputs, num_beams=4, max_new_tokens=max_new_tokens, length_penalty=length_penalty,
                                   bad_words_ids=[[pad]])
    generated = []
    for row in output.tolist():
        row = row[1:]
        while row and row[-1] == pad:
            row.pop()
        generated.append(row[:-1] if row and row[-1] == hf_tokenizer.eos_token_id else row)
    return inputs["input_ids"].numpy(), generated


def hf_normalized_score(model, tokenizer, source, tokens, alpha, max_len):
    """What ``beam_search(length_normalization="hf")`` scores ``tokens`` as a finished hypothesis for the
    source ids ``source`` (padded), computed afresh by ``model`` on the whole sequence: Σ log p of the
    tokens and of the EOS after them (0 for the EOS forced at ``max_len`` tokens), / |Y|^α."""
    import tinyformer as tf

    src, target = np.asarray(source)[None], np.array([[tokenizer.bos_id, *tokens]])
    model.eval()
    with tf.no_grad():
        logits = model.decode(target, model.encode(src), model.source_mask(src)).data[0].astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    score = float(sum(log_probs[i, token] for i, token in enumerate(tokens)))
    if len(tokens) < max_len:
        score += float(log_probs[len(tokens), tokenizer.eos_id])
    return score / hf_length_penalty(len(tokens) + 1, alpha)


def differences_that_are_not_ties(ranked, expected, score_of):
    """The sentences where tinyformer's best hypothesis (``ranked[i][0]``, a Hypothesis) is not
    transformers' (``expected[i]``, ids) and ``score_of(i, ids)`` of transformers' differs from ours
    by more than TIE (relative): [(sentence, our tokens, our score, theirs, its score)]."""
    differences = []
    for i, (hyps, theirs) in enumerate(zip(ranked, expected)):
        ours = hyps[0]
        if ours.tokens != theirs:
            other = score_of(i, theirs)
            if abs(other - ours.normalized_score) > TIE * abs(ours.normalized_score):
                differences.append((i, ours.tokens, ours.normalized_score, theirs, other))
    return differences


# (model, length_penalty, max_new_tokens): a limit of 16 lets nearly every hypothesis end with its own
# EOS; one of 8 (7 tokens and the forced EOS) cuts about half of them, whose EOS then scores 0.
CASES = [("brief-swish", 1.0, 16), ("brief-swish", 2.0, 8), ("brief-swish", -0.5, 8), ("trained-gelu", 1.0, 8),
         ("brief-relu-bin", 2.0, 16), ("brief-relu-bin", -0.5, 8)]
# Of the 60 best hypotheses of each case: at least MIN_DISTINCT distinct, MIN_ENDED ended by their own
# EOS before the limit, and under a limit of 8, MIN_CUT ended by the forced one.
MIN_DISTINCT, MIN_ENDED, MIN_CUT = 50, 10, 10


@pytest.mark.parametrize("name, length_penalty, max_new_tokens", CASES)
def test_hf_beam_4_equals_transformers_generate(marian_runs, name, length_penalty, max_new_tokens):
    """Every sentence the same tokens as ``generate(num_beams=4)``, or a tie (TIE); over outputs that
    depend on the input, and of which some end before the limit (and so were not cut by it)."""
    from marian_folders import corpus

    hf_model, hf_tokenizer, model, tokenizer, _ = marian_runs[name]
    sources = [source for source, _ in corpus(SENTENCES, seed=99)]
    src, expected = hf_beam(hf_model, hf_tokenizer, sources, length_penalty, max_new_tokens)
    # transformers' max_new_tokens N with a forced EOS: at most N - 1 tokens before it
    max_len = max_new_tokens - 1
    ranked = beam_search(model, src, beam_size=4, alpha=length_penalty, max_len=max_len, bos_id=tokenizer.bos_id,
                         eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, length_normalization="hf",
                         return_scores=True)
    best = [hyps[0].tokens for hyps in ranked]
    equal = sum(tokens == theirs for tokens, theirs in zip(best, expected))
    distinct, ended = len({tuple(tokens) for tokens in best}), sum(len(tokens) < max_len for tokens in best)
    print(f"{name}, length_penalty {length_penalty}, max_new_tokens {max_new_tokens}: {equal} of {SENTENCES} "
          f"sentences equal to transformers'; {distinct} distinct, {ended} ended before the limit")
    untied = differences_that_are_not_ties(ranked, expected, lambda i, ids: hf_normalized_score(
        model, tokenizer, src[i], ids, length_penalty, max_len))
    assert not untied, f"{name}: {equal} of {SENTENCES} equal; not ties: {untied}"
    assert distinct >= MIN_DISTINCT, f"{name}: {distinct} distinct outputs of {SENTENCES}: the input hardly matters"
    assert ended >= MIN_ENDED, f"{name}: {ended} of {SENTENCES} end with EOS before the limit"
    assert max_new_tokens > 8 or SENTENCES - ended >= MIN_CUT, f"{name}: {SENTENCES - ended} cut by the limit"


def test_a_difference_passes_only_as_a_tie(marian_runs):
    """The rule above, on tinyformer's own ranked hypotheses: a runner-up that does not tie is a
    failure, the same tokens scored within TIE are not; and the rescoring gives the search's own scores."""
    from marian_folders import corpus

    hf_model, hf_tokenizer, model, tokenizer, _ = marian_runs["brief-swish"]
    src, _ = hf_beam(hf_model, hf_tokenizer, [s for s, _ in corpus(8, seed=99)], 1.0, 16)
    ranked = beam_search(model, src, beam_size=4, alpha=1.0, max_len=15, bos_id=tokenizer.bos_id,
                         eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, length_normalization="hf",
                         return_scores=True)

    def rescored(i, ids):
        return hf_normalized_score(model, tokenizer, src[i], ids, 1.0, 15)

    for i, hyps in enumerate(ranked):
        for h in hyps:
            assert rescored(i, h.tokens) == pytest.approx(h.normalized_score, rel=TIE)
    runners_up = [hyps[1].tokens for hyps in ranked]
    assert len(differences_that_are_not_ties(ranked, runners_up, rescored)) == len(ranked)
    tied = [[h._replace(tokens=h.tokens + [7])] for h in (hyps[0] for hyps in ranked)]  # other tokens, same score
    best = [hyps[0].tokens for hyps in ranked]
    assert differences_that_are_not_ties(tied, best, lambda i, ids: tied[i][0].normalized_score * (1 + TIE / 2)) == []
    assert len(differences_that_are_not_ties(tied, best, lambda i, ids: tied[i][0].normalized_score * (1 + 2 * TIE))) \
        == len(ranked)


def test_translate_cli_hf_equals_transformers_text(marian_runs, tmp_path):
    """``tinyformer translate --length-normalization hf`` on the imported run: transformers' decoded text
    (its limit, input length + 50 tokens, is not reached by this trained model)."""
    from marian_folders import corpus
    from tinyformer import cli

    hf_model, hf_tokenizer, _, _, run = marian_runs["trained-gelu"]
    sources = [source for source, _ in corpus(20, seed=98)]
    _, expected = hf_beam(hf_model, hf_tokenizer, sources, 1.0, 64)
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    assert cli.main(["translate", "--checkpoint", str(run), "--input", str(tmp_path / "in.txt"),
                     "--output", str(tmp_path / "out.txt"), "--length-normalization", "hf"]) == 0
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert lines == hf_tokenizer.batch_decode(expected, skip_special_tokens=True)
