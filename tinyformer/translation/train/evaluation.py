"""Scoring a model: the loss of a batch (label-smoothed cross entropy, §5.4, as training and
validation compute it), the validation loss, and BLEU and exact match of its translations; a
run's validation (``validation_scores``: the loss and greedy BLEU of its validation split)."""

import dataclasses
import math

import numpy

from .. import metrics, prediction
from ...engine import backend
from ...engine import functional as F
from ...engine.tensor import no_grad

__all__ = ["batch_loss", "validation_loss", "perplexity", "translation_scores", "evaluate", "ValidationScores",
           "validation_scores"]


def batch_loss(model, batch, label_smoothing, padded_logits=False):
    """(label-smoothed loss, NLL) summed over the batch's target tokens, as Tensors; the padding is the
    model's ``pad_id`` (its tokenizer's, which the batches pad with).

    On the CPU the model runs on packed rows (``Transformer(..., packed=True)``): every layer but
    attention skips the padding, and the logits are those of the counted (non-padding) target
    positions only, so that the output projection and the vocabulary softmax skip it too. On a GPU,
    while a CUDA graph is captured, or with ``padded_logits``, the model keeps the padded layout (the
    padding then costs work instead of a selection whose size depends on the batch), its source mask
    made once for the batch on the model's device (``Batch.src_key_mask``), and the loss ignores the
    padding; the sums are the same either way, up to rounding (with dropout, the masks differ)."""
    like = next(iter(model.parameters())).data
    on_host = isinstance(like, numpy.ndarray) and isinstance(batch.tgt_out, numpy.ndarray)
    if on_host and not padded_logits and not backend.is_capturing():
        counted = batch.tgt_out != model.pad_id
        logits = model(batch.src, batch.tgt_in, positions=counted, packed=True)
        targets = batch.tgt_out[counted]
    else:
        logits, targets = model(batch.src, batch.tgt_in, src_mask=batch.src_key_mask(like)), batch.tgt_out
    return F.cross_entropy(logits, targets, label_smoothing, ignore_index=model.pad_id, reduction="sum",
                           return_nll=True)


@no_grad()
def validation_loss(model, data, max_tokens, label_smoothing):
    """(loss, NLL) per target token over ``data`` in batches of ``max_tokens``, without dropout."""
    model.eval()
    total_loss = total_nll = 0.0
    tokens = 0
    for batch in data.batches(max_tokens, shuffle=False):
        loss, nll = batch_loss(model, batch, label_smoothing)
        total_loss += loss.item()
        total_nll += nll.item()
        tokens += batch.num_tokens
    return total_loss / tokens, total_nll / tokens


def perplexity(nll):
    """exp(NLL per token), capped at exp(50) so that a diverged run still logs a number."""
    return math.exp(min(nll, 50))


def translation_scores(model, tokenizer, sources, references, beam_size=4, alpha=None, length_normalization="gnmt"):
    """(hypotheses, sacreBLEU result, exact-match rate) of the model's translations of ``sources``."""
    hypotheses = prediction.translate(model, tokenizer, sources, beam_size=beam_size, alpha=alpha,
                                      length_normalization=length_normalization)
    exact = sum(h == r for h, r in zip(hypotheses, references)) / max(len(references), 1)
    return hypotheses, metrics.corpus_bleu(hypotheses, references), exact


def evaluate(model, tokenizer, sources, references, beam_size=4, alpha=None, length_normalization="gnmt"):
    """BLEU (sacreBLEU, and tokenized lowercased) and exact match of the model's translations (beam search
    ranked by ``length_normalization``, "gnmt" or "hf", with its ``alpha``, None: its default; see
    ``search.beam_search``)."""
    hypotheses, bleu, exact = translation_scores(model, tokenizer, sources, references, beam_size, alpha,
                                                 length_normalization)
    tokenized = metrics.tokenized_bleu(hypotheses, references)
    return {"bleu": bleu.score, "signature": bleu.signature, "tokenized_bleu": tokenized.score,
            "tokenized_signature": tokenized.signature, "exact_match": exact,
            "sentences": len(references), "hypotheses": hypotheses}


@dataclasses.dataclass(frozen=True)
class ValidationScores:
    """A run's validation: loss and NLL per target token, greedy BLEU (sacreBLEU's result) and exact
    match of the first ``sentences`` validation sentences."""

    loss: float
    nll: float
    bleu: object
    exact: float
    sentences: int


def validation_scores(model, tokenizer, data, text, max_tokens, label_smoothing, bleu_samples):
    """The ``ValidationScores`` of ``model`` on a run's validation split: ``data`` (its batches) for the
    loss, the first ``bleu_samples`` sentences of ``text`` (sources, references) translated greedily."""
    loss, nll = validation_loss(model, data, max_tokens, label_smoothing)
    sources, references = (side[:bleu_samples] for side in text)
    _, bleu, exact = translation_scores(model, tokenizer, sources, references, beam_size=1)
    return ValidationScores(loss, nll, bleu, exact, len(references))
