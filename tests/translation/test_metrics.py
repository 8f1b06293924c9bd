"""BLEU: sacreBLEU's corpus score (cased, 13a) and the lowercased tokenized score for Multi30k."""

import pytest
import sacrebleu

from tinyformer.translation.metrics import BleuScore, corpus_bleu, tokenized_bleu

REFS = ["The cat sat on the mat.", "A dog is running in the park!", "Two men are playing chess, quietly."]
HYPS = ["The cat sat on a mat.", "A dog runs in the park!", "Two men play chess quietly."]


@pytest.mark.parametrize("bleu", [corpus_bleu, tokenized_bleu])
def test_references_score_100_against_themselves(bleu):
    result = bleu(REFS, REFS)
    assert isinstance(result, BleuScore)
    assert result.score == pytest.approx(100.0)
    assert result.precisions == pytest.approx((100.0,) * 4) and result.brevity_penalty == 1.0


def test_corpus_bleu_matches_sacrebleu_and_its_signature():
    result = corpus_bleu(HYPS, REFS)
    expected = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert result.score == pytest.approx(expected.score, abs=1e-12)
    assert 0 < result.score < 100
    assert result.precisions == pytest.approx(tuple(expected.precisions))
    assert (result.hyp_len, result.ref_len) == (expected.sys_len, expected.ref_len)
    for part in ("nrefs:1", "case:mixed", "tok:13a", "smooth:exp", f"version:{sacrebleu.__version__}"):
        assert part in result.signature
    assert f"{result.score:.2f}" in str(result) and result.signature in str(result)


def test_hand_worked_scores():
    # No hypothesis word occurs in the reference: every n-gram precision is 0, so BLEU is 0.
    assert corpus_bleu(["xx yy zz ww"], ["the cat sat down"]).score == 0.0
    # Right words, half the length: precisions 100 %, BP = exp(1 − 8/4) = e^-1.
    result = corpus_bleu(["a b c d"], ["a b c d e f g h"])
    assert result.precisions == pytest.approx((100.0,) * 4)
    assert result.brevity_penalty == pytest.approx(0.36787944117, rel=1e-9)
    assert result.score == pytest.approx(100 * 0.36787944117, rel=1e-9)


def test_case_matters_for_corpus_bleu_but_not_for_tokenized_bleu():
    upper = [r.upper() for r in REFS]
    assert corpus_bleu(upper, REFS).score < 10
    lowered = tokenized_bleu(upper, REFS)
    assert lowered.score == pytest.approx(100.0)
    assert "case:lc" in lowered.signature and "tok:13a" in lowered.signature
    assert tokenized_bleu(HYPS, REFS).score == pytest.approx(
        sacrebleu.corpus_bleu(HYPS, [REFS], lowercase=True, tokenize="13a").score, abs=1e-12)


def test_13a_splits_punctuation():
    # "mat." against "mat ." is the same text once 13a has split the period off.
    assert corpus_bleu(["The cat sat on the mat ."], ["The cat sat on the mat."]).score == pytest.approx(100.0)


def test_several_references():
    second = ["A cat was sitting on a mat.", "A dog runs in the park!", "Two men play chess quietly."]
    result = corpus_bleu(HYPS, [REFS, second])
    assert result.score == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS, second]).score, abs=1e-12)
    assert result.score > corpus_bleu(HYPS, REFS).score
    assert "nrefs:2" in result.signature


@pytest.mark.parametrize("bleu", [corpus_bleu, tokenized_bleu])
def test_bad_inputs(bleu):
    with pytest.raises(ValueError, match="3 hypotheses but 2 references"):
        bleu(HYPS, REFS[:2])
    with pytest.raises(ValueError, match=r"3 hypotheses but 2 references\[1\]"):
        bleu(HYPS, [REFS, REFS[:2]])
    with pytest.raises(ValueError, match="hypotheses is empty"):
        bleu([], [])
    with pytest.raises(TypeError, match="hypotheses"):
        bleu("The cat sat on the mat.", REFS[:1])
    with pytest.raises(TypeError, match=r"hypotheses\[1\]"):
        bleu(["a", None, "c"], REFS)
