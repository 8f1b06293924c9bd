"""BLEU through sacreBLEU: the reproducible score, and the lowercased one Multi30k papers report.

The paper reports BLEU on WMT newstest2014 (§6.1, Table 2). Scores here come
from sacreBLEU (Post 2018), which tokenizes internally, so hypotheses and
references are given *detokenized* (plain text as a reader sees it), and every
score carries the signature that says how it was computed.
"""

from typing import NamedTuple

from sacrebleu.metrics import BLEU

__all__ = ["BleuScore", "corpus_bleu", "tokenized_bleu"]


class BleuScore(NamedTuple):
    """A corpus BLEU score (0–100) with its sacreBLEU signature and the parts it is made of."""

    score: float
    signature: str
    precisions: tuple  # modified 1- to 4-gram precisions, in percent
    brevity_penalty: float
    hyp_len: int
    ref_len: int

    def __str__(self):
        precisions = "/".join(f"{p:.1f}" for p in self.precisions)
        return (f"BLEU = {self.score:.2f} {precisions} (BP = {self.brevity_penalty:.3f} "
                f"hyp_len = {self.hyp_len} ref_len = {self.ref_len}) {self.signature}")


def _reference_streams(hypotheses, references):
    """Check the inputs; references as sacreBLEU wants them: a list of streams, one string per hypothesis."""
    if isinstance(hypotheses, str):
        raise TypeError("hypotheses must be a list of strings (one per segment), not a single string")
    if isinstance(references, str):
        raise TypeError("references must be a list of strings, or a list of such lists, not a single string")
    hypotheses, references = list(hypotheses), list(references)
    if not hypotheses:
        raise ValueError("hypotheses is empty: BLEU needs at least one segment")
    streams = references if references and not isinstance(references[0], str) else [references]
    streams = [list(stream) for stream in streams]
    for n, stream in enumerate(streams):
        if len(stream) != len(hypotheses):
            which = "references" if len(streams) == 1 else f"references[{n}]"
            raise ValueError(f"{len(hypotheses)} hypotheses but {len(stream)} {which}: "
                             "give one reference per hypothesis")
    for name, texts in [("hypotheses", hypotheses)] + [("references", s) for s in streams]:
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{name}[{i}] must be a str, got {type(text).__name__}")
    return hypotheses, streams


def _bleu(hypotheses, references, lowercase):
    hypotheses, streams = _reference_streams(hypotheses, references)
    metric = BLEU(tokenize="13a", lowercase=lowercase)
    result = metric.corpus_score(hypotheses, streams)
    return BleuScore(float(result.score), metric.get_signature().format(), tuple(result.precisions),
                     float(result.bp), int(result.sys_len), int(result.ref_len))


def corpus_bleu(hypotheses, references):
    """sacreBLEU corpus BLEU, cased, 13a tokenization (its defaults): the comparable, reproducible score.

    ``hypotheses``: one detokenized string per segment. ``references``: one list of
    strings aligned with them (a single reference), or a list of such lists
    (several references per segment, sacreBLEU's layout). The signature reads
    ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.x``.
    """
    return _bleu(hypotheses, references, lowercase=False)


def tokenized_bleu(hypotheses, references):
    """Lowercased BLEU on 13a-tokenized text, for comparison with published Multi30k numbers.

    Multi30k results are usually multi-bleu.perl on lowercased, Moses-tokenized
    text. This computes the close, reproducible equivalent: sacreBLEU on the same
    detokenized inputs as ``corpus_bleu``, lowercased, with its 13a (mteval-v13a)
    tokenizer splitting punctuation from words; signature
    ``nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.x``. Scores can differ
    slightly from multi-bleu.perl where the Moses and 13a tokenizers disagree.
    """
    return _bleu(hypotheses, references, lowercase=True)
