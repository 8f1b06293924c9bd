"""Beam search with Hugging Face's length normalisation (``length_normalization="hf"``).

Against transformers itself: Marian models built by ``marian_folders`` (random and briefly trained,
of different depths and activations), imported as tinyformer runs, must give the tokens of
``generate(num_beams=4)`` on nearly every sentence. Without transformers: hand-built bigram models
whose searches are worked out by hand pin the rules — score / |Y|^α, the stop against the worst kept
hypothesis, the forced EOS that scores 0 — each where gnmt's rule gives another result.
"""

import math

import numpy as np
import pytest

from tinyformer.translation import decode
from tinyformer.translation.data.special import BOS_ID, EOS_ID
from tinyformer.translation.decode import Hypothesis, beam_search, hf_length_penalty, translate

from test_decode import SRC, BigramModel, WordTokenizer, random_model

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

    monkeypatch.setattr(decode, "beam_search", spy)
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
# (name, make_marian_folder arguments): random weights, and briefly trained ones of other depths.
MARIAN_MODELS = {
    "random-swish": dict(activation="swish", encoder_layers=2, decoder_layers=1, seed=7),
    "brief-gelu": dict(activation="gelu", encoder_layers=1, decoder_layers=2, seed=5, train_steps=60),
    "trained-swish": dict(activation="swish", encoder_layers=2, decoder_layers=2, seed=6, train_steps=150),
}


def redraw_weights(hf_model, eos_id, std=0.4, eos_bias=1.5, seed=1):
    """Random weights whose outputs depend on the input: every matrix but the positions' drawn from
    N(0, std²) (transformers' initial 0.02 gives every sentence the same output), EOS's logit raised
    by ``eos_bias``. Such a model seldom ends before the limit: its sentences test the forced EOS."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():
            if parameter.dim() == 2 and "embed_positions" not in name:
                parameter.normal_(0, std, generator=generator)
        hf_model.final_logits_bias[0, eos_id] += eos_bias


@pytest.fixture(scope="module")
def marian_runs(tmp_path_factory):
    """name -> (torch model, transformers' tokenizer, tinyformer model, tinyformer tokenizer, run directory).

    torch runs on one thread meanwhile: on a busy machine its threads make the training many times slower."""
    pytest.importorskip("transformers")
    import torch
    from marian_folders import make_marian_folder
    from tinyformer.translation.interop.runs import import_marian
    from tinyformer.translation.train.state import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hf-beam")
    runs = {}
    try:
        for name, shape in MARIAN_MODELS.items():
            folder, hf_model, hf_tokenizer = make_marian_folder(root / name, d_model=32, heads=4, ffn=64, **shape)
            if name.startswith("random"):
                redraw_weights(hf_model, hf_tokenizer.eos_token_id)
                hf_model.save_pretrained(str(folder))
            import_marian(folder, root / f"{name}-run")
            model, tokenizer, _ = load_model(root / f"{name}-run")
            runs[name] = (hf_model, hf_tokenizer, model, tokenizer, root / f"{name}-run")
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


# (model, length_penalty, max_new_tokens): short limits make many hypotheses end at the forced EOS.
CASES = [("random-swish", 1.0, 16), ("brief-gelu", 1.0, 16), ("brief-gelu", 1.0, 6),
         ("trained-swish", 1.0, 6), ("trained-swish", 2.0, 16), ("trained-swish", -0.5, 8)]


@pytest.mark.parametrize("name, length_penalty, max_new_tokens", CASES)
def test_hf_beam_4_equals_transformers_generate(marian_runs, name, length_penalty, max_new_tokens):
    from marian_folders import corpus

    hf_model, hf_tokenizer, model, tokenizer, _ = marian_runs[name]
    sources = [source for source, _ in corpus(SENTENCES, seed=99)]
    src, expected = hf_beam(hf_model, hf_tokenizer, sources, length_penalty, max_new_tokens)
    # transformers' max_new_tokens N with a forced EOS: at most N - 1 tokens before it
    found = beam_search(model, src, beam_size=4, alpha=length_penalty, max_len=max_new_tokens - 1,
                        bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
                        length_normalization="hf")
    equal = sum(a == b for a, b in zip(found, expected))
    assert equal >= 0.95 * SENTENCES, f"{name}: {equal} of {SENTENCES} sentences as transformers'"


def test_translate_cli_hf_equals_transformers_text(marian_runs, tmp_path):
    """``tinyformer translate --length-normalization hf`` on the imported run: transformers' decoded text
    (its limit, input length + 50 tokens, is not reached by this trained model)."""
    from marian_folders import corpus
    from tinyformer import cli

    hf_model, hf_tokenizer, _, _, run = marian_runs["trained-swish"]
    sources = [source for source, _ in corpus(20, seed=98)]
    _, expected = hf_beam(hf_model, hf_tokenizer, sources, 1.0, 64)
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    assert cli.main(["translate", "--checkpoint", str(run), "--input", str(tmp_path / "in.txt"),
                     "--output", str(tmp_path / "out.txt"), "--length-normalization", "hf"]) == 0
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert lines == hf_tokenizer.batch_decode(expected, skip_special_tokens=True)
