"""Search over token ids: greedy search and beam search (§6.1), batched, with the decoder's cache.

Both encode the source once and then run the decoder one token per step, reusing cached
self-attention keys/values and the once-projected cross-attention keys/values
(``model.init_state()``); ``use_cache=False`` recomputes the whole prefix every step instead,
which must give the same tokens (a test checks it). Text in, text out is ``prediction.translate``.

Conventions shared by every search here:

* A hypothesis is returned as its token ids without BOS and EOS.
* Its ``score`` is the sum of the log-probabilities (float64 log-softmax of the
  step's logits) of its tokens *and of the final EOS*. A hypothesis never exceeds
  its maximum length L: after L tokens the only allowed next token is EOS
  (forced, as in fairseq), so every finished hypothesis ends in a scored EOS and
  |Y| = len(tokens) + 1.
* L = floor(max_len_a · src_len + max_len_b), src_len being the number of
  non-padding source tokens of that sentence (§6.1: input length + 50), or
  ``max_len`` when given; it is capped so that positions stay below the model's
  positional-encoding ``max_len``.
* The padding id and BOS are never generated (their log-probability is set to
  −inf after the softmax, as fairseq does for padding).

Beam search ranks finished hypotheses by a length-normalised score, and stops, by the rules of one
convention, a ``length_penalties.LengthNormalization`` chosen by ``length_normalization``: "gnmt"
(default, ``GNMT``) divides by GNMT's ((5 + |Y|)/6)^α; "hf" (``Transformers``) reproduces Hugging
Face transformers' beam search (``generate(num_beams=k)`` with its defaults): score / |Y|^α, α
being transformers' ``length_penalty`` (default 1.0), its ``early_stopping=False`` stopping rule
and its forced EOS, which scores 0 (``length_penalties``: both, and the range of α in which their
arithmetic holds).

A beam is never wider than the number of tokens the model can emit, its target vocabulary less
padding and BOS (``widest_beam``; fairseq clips its beam the same way): a wider one is searched at
that width, with one ``SearchWarning``. Sentences are searched together as long as their candidate
scores (sentences × beam × vocabulary) stay within ``CANDIDATE_BUDGET``, so that a wide beam over a
large vocabulary is searched a few sentences at a time rather than exhausting the memory.
"""

import warnings
from typing import NamedTuple

import numpy as np

from ..engine import functional as F
from ..engine.backend import to_numpy
from .data.special import BOS_ID, EOS_ID
from ..model.nn import inference
from ..common.validation import check_int, check_real
from .length_penalties import length_normalization as normalization_of

__all__ = ["Hypothesis", "SearchWarning", "CANDIDATE_BUDGET", "widest_beam", "greedy_decode", "beam_search",
           "check_special", "fit_beam"]

# Candidate scores (float64) that one beam search step may hold: 2^24, 128 MiB. More sentences are
# searched a group at a time; one sentence alone may exceed it (beam × vocabulary).
CANDIDATE_BUDGET = 2 ** 24


class SearchWarning(UserWarning):
    """A search ran with other settings than asked: a beam wider than the tokens the model can emit."""


class Hypothesis(NamedTuple):
    """One finished output: ids (no BOS/EOS), summed log-probability (EOS included) and score / lp."""

    tokens: list
    score: float
    normalized_score: float


# ------------------------------------------------------------------------ helpers
def _check_src(src):
    """Source ids as a 2-D NumPy integer array (batch, len_src)."""
    array = to_numpy(src)
    if array.ndim != 2:
        raise ValueError(f"src must be token ids of shape (batch, len_src), got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise ValueError(f"src must hold integer token ids, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _max_lengths(model, src, pad_id, max_len, max_len_a, max_len_b):
    """The maximum number of tokens (EOS excluded) each sentence may get."""
    # BOS sits at position 0 and the L-th token at position L, which predicts EOS; without a positional
    # table, no more than an int64 holds. A larger maximum (1e308, 10**30) is that cap.
    positions = getattr(getattr(model, "positional", None), "max_len", None)
    cap = positions - 1 if positions is not None else 2 ** 62
    if max_len is not None:
        return np.full(len(src), min(check_int("max_len", max_len, 0), cap), dtype=np.int64)
    a = check_real("max_len_a", max_len_a, 0)
    b = check_real("max_len_b", max_len_b, 0)
    src_len = (src != pad_id).sum(axis=1)
    with np.errstate(over="ignore"):  # a · src_len beyond the float range is +inf, then the cap
        wanted = a * src_len.astype(np.float64) + b
    return np.floor(np.minimum(wanted, cap)).astype(np.int64)


def _banned_ids(model, bos_id, eos_id, vocab):
    banned = {int(model.pad_id), int(bos_id)} - {int(eos_id)}
    return np.array(sorted(i for i in banned if 0 <= i < vocab), dtype=np.int64)


def widest_beam(model, bos_id=BOS_ID, eos_id=EOS_ID):
    """The widest beam worth searching: the number of tokens the model can emit (its target vocabulary
    less padding and BOS, which are never generated), fairseq's bound."""
    vocab = model.tgt_vocab_size
    return max(1, vocab - len(_banned_ids(model, bos_id, eos_id, vocab)))


def fit_beam(model, beam_size, bos_id, eos_id, stacklevel):
    """``beam_size`` checked, and clipped to ``widest_beam`` with a SearchWarning."""
    beam_size = check_int("beam_size", beam_size, 1)
    widest = widest_beam(model, bos_id, eos_id)
    if beam_size > widest:
        warnings.warn(SearchWarning(f"beam_size={beam_size} is wider than the {widest} tokens the model can emit "
                                    f"(its target vocabulary less padding and BOS): searching with "
                                    f"beam_size={widest}"), stacklevel=stacklevel + 1)
        return widest
    return beam_size


def check_special(name, value, vocab):
    value = check_int(name, value, 0)
    if value >= vocab:
        raise ValueError(f"{name}={value} is outside the target vocabulary of size {vocab}")
    return value


def _log_probs(model, tokens, memory, src_mask, state, banned):
    """log p(next token | prefix) for every row (rows, vocab), float64, banned ids at −inf."""
    if state is not None:
        logits = model.decode(tokens[:, -1:], memory, src_mask, state=state)
    else:
        logits = model.decode(tokens, memory, src_mask)
    last = to_numpy(logits.data[:, -1]).astype(np.float64)
    if not np.isfinite(last).all():
        raise FloatingPointError("decoding: the model produced non-finite logits (NaN or inf)")
    shifted = last - last.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    log_probs[:, banned] = -np.inf
    return log_probs


def _force_eos(log_probs, rows, eos_id, eos_log_prob=None):
    """Rows ``rows`` (a boolean mask) may only produce EOS: every other log-probability becomes −inf.

    EOS keeps its own log-probability, or becomes ``eos_log_prob`` when given (transformers'
    ForcedEOSTokenLogitsProcessor, applied after the log-softmax, sets it to 0).
    """
    eos = log_probs[rows, eos_id] if eos_log_prob is None else eos_log_prob
    log_probs[rows] = -np.inf
    log_probs[rows, eos_id] = eos


def _top_candidates(scores, count):
    """Indices of the ``count`` best entries of each row, best first; ties go to the lower index."""
    count = min(count, scores.shape[1])
    part = np.argpartition(-scores, count - 1, axis=1)[:, :count]
    values = np.take_along_axis(scores, part, axis=1)
    order = np.lexsort((part, -values), axis=-1)
    return np.take_along_axis(part, order, axis=1)


def _start(model, src, pad_id, repeat, use_cache):
    """Encode once; memory and source mask repeated ``repeat`` times per sentence (beams)."""
    src_mask = F.padding_mask(src, pad_id)
    memory = model.encode(src, src_mask)
    if repeat > 1:
        expand = np.repeat(np.arange(len(src)), repeat)
        memory, src_mask = memory[expand], src_mask[expand]
    return memory, src_mask, (model.init_state() if use_cache else None)


def _setup(model, src, bos_id, eos_id, pad_id):
    src = _check_src(src)
    vocab = model.tgt_vocab_size
    bos_id = check_special("bos_id", bos_id, vocab)
    eos_id = check_special("eos_id", eos_id, vocab)
    pad_id = model.pad_id if pad_id is None else check_int("pad_id", pad_id, 0)
    return src, bos_id, eos_id, pad_id, _banned_ids(model, bos_id, eos_id, vocab)


# ------------------------------------------------------------------------ greedy
def greedy_decode(model, src, max_len=None, max_len_a=1, max_len_b=50, bos_id=BOS_ID, eos_id=EOS_ID,
                  pad_id=None, use_cache=True, return_scores=False):
    """Batched greedy search: feed back the most probable token until EOS or the maximum length.

    ``src`` (batch, len_src) holds source ids padded with ``pad_id`` (default
    ``model.pad_id``). Returns one list of ids (no BOS/EOS) per row, or with
    ``return_scores=True`` one ``Hypothesis`` per row (normalized_score = score:
    greedy search does not length-normalise). Finished rows leave the batch (their
    cache rows are dropped), and decoding stops once every row has emitted EOS.
    """
    src, bos_id, eos_id, pad_id, banned = _setup(model, src, bos_id, eos_id, pad_id)
    limits = _max_lengths(model, src, pad_id, max_len, max_len_a, max_len_b)
    results = [None] * len(src)
    if not len(src):
        return results
    with inference(model):
        memory, src_mask, state = _start(model, src, pad_id, 1, use_cache)
        alive = np.arange(len(src))  # the sentence each decoder row belongs to
        tokens = np.full((len(src), 1), bos_id, dtype=np.int64)
        scores = np.zeros(len(src))
        while alive.size:
            log_probs = _log_probs(model, tokens, memory, src_mask, state, banned)
            at_limit = limits[alive] <= tokens.shape[1] - 1
            _force_eos(log_probs, at_limit, eos_id)
            best = log_probs.argmax(axis=1)
            scores = scores + log_probs[np.arange(len(best)), best]
            done = best == eos_id
            for row in np.flatnonzero(done):
                score = float(scores[row])
                results[alive[row]] = Hypothesis(tokens[row, 1:].tolist(), score, score)
            keep = np.flatnonzero(~done)
            tokens = np.concatenate([tokens[keep], best[keep, None]], axis=1)
            scores, alive = scores[keep], alive[keep]
            if 0 < keep.size < done.size:
                memory, src_mask = memory[keep], src_mask[keep]
                if state is not None:
                    state.reorder(keep)
    return results if return_scores else [h.tokens for h in results]


# ------------------------------------------------------------------------ beam search
def beam_search(model, src, beam_size=4, alpha=None, max_len_a=1, max_len_b=50, max_len=None,
                bos_id=BOS_ID, eos_id=EOS_ID, pad_id=None, use_cache=True, return_scores=False,
                length_normalization="gnmt"):
    """Batched beam search with GNMT's length penalty (§6.1: beam 4, α = 0.6) or transformers' (``"hf"``).

    Each sentence keeps ``beam_size`` active hypotheses (batch × beam decoder rows,
    ``state.reorder`` following the survivors). Per step the 2×beam best
    extensions by summed log-probability are taken; those ending in EOS and ranked
    within the first ``beam_size`` are finished, the best ``beam_size`` others stay
    active (fairseq's scheme). Finished hypotheses are ranked by score / lp(|Y|),
    |Y| = tokens + EOS (see ``length_penalty``); the ``beam_size`` best are kept.

    A sentence stops at its maximum length (EOS forced), or once it has
    ``beam_size`` finished hypotheses and its best active one, scored as if it
    ended now (score / lp(its length)), does not beat the best finished one. (A
    fairseq-style stop at ``beam_size`` finished alone lets improbable early EOS
    hypotheses end the search while a far better one is still active.)

    Returns the best hypothesis (ids, no BOS/EOS) per sentence, or with
    ``return_scores=True`` the kept ``Hypothesis`` list per sentence, best first.
    With ``beam_size=1`` the result equals ``greedy_decode``'s: the one active
    hypothesis stops exactly when EOS is its most probable extension.

    ``length_normalization="hf"`` is transformers' beam search (``_beam_search`` with
    length_penalty=α, early_stopping=False, forced_eos_token_id set), step for step:

    * the same 2×beam candidates, finished (EOS within the first ``beam_size``) and
      active ones; the ``beam_size`` best finished are kept, ranked by
      score / |Y|^α (``hf_length_penalty``), and the best of them is returned;
    * a sentence stops once it has ``beam_size`` finished hypotheses and its best
      active one, score / (its current length)^α, is no better than the *worst*
      kept one (gnmt compares with the best);
    * at the maximum length the forced EOS adds 0 to the score, not its
      log-probability (transformers forces it after the log-softmax).

    ``length_normalization`` is "gnmt" (``length_penalties.GNMT``), "hf" (``Transformers``) or a
    ``LengthNormalization`` object. α defaults to ``DEFAULT_ALPHA[length_normalization]`` (0.6 for gnmt, transformers'
    1.0 for hf); gnmt takes α in [0, 10], hf in [-10, 10], negative ones favouring short
    outputs (``length_penalties``). With ``beam_size=1`` hf is not greedy search
    (transformers runs greedy search then). A ``beam_size`` above ``widest_beam(model)``
    is searched at that width (one ``SearchWarning``); sentences are searched in groups
    whose candidate scores fit ``CANDIDATE_BUDGET``.
    """
    src, bos_id, eos_id, pad_id, banned = _setup(model, src, bos_id, eos_id, pad_id)
    check_int("beam_size", beam_size, 1)
    rule = normalization_of(length_normalization, alpha)
    k = fit_beam(model, beam_size, bos_id, eos_id, stacklevel=2)
    limits = _max_lengths(model, src, pad_id, max_len, max_len_a, max_len_b)
    group = max(1, CANDIDATE_BUDGET // (k * model.tgt_vocab_size))  # sentences searched together
    ranked = []
    for start in range(0, len(src), group):
        ranked += _search_beams(model, src[start:start + group], limits[start:start + group], k, rule,
                                bos_id, eos_id, pad_id, banned, use_cache)
    return ranked if return_scores else [hyps[0].tokens for hyps in ranked]


def _search_beams(model, src, limits, k, rule, bos_id, eos_id, pad_id, banned, use_cache):
    """``beam_search`` of the sentences ``src`` (checked) under ``rule`` (a ``LengthNormalization``),
    their kept hypotheses best first."""
    finished = [[] for _ in range(len(src))]
    if not len(src):
        return []
    with inference(model):
        memory, src_mask, state = _start(model, src, pad_id, k, use_cache)
        alive = np.arange(len(src))
        tokens = np.full((len(src) * k, 1), bos_id, dtype=np.int64)
        cumulative = np.full((len(src), k), -np.inf)
        cumulative[:, 0] = 0.0  # the k beams start identical: extend only the first one at step 1
        while alive.size:
            n, step = alive.size, tokens.shape[1] - 1
            log_probs = _log_probs(model, tokens, memory, src_mask, state, banned)
            vocab = log_probs.shape[1]
            at_limit = limits[alive] <= step
            _force_eos(log_probs, np.repeat(at_limit, k), eos_id, rule.forced_eos_log_prob)
            candidates = (cumulative[:, :, None] + log_probs.reshape(n, k, vocab)).reshape(n, k * vocab)
            top = _top_candidates(candidates, 2 * k)
            top_scores = np.take_along_axis(candidates, top, axis=1)
            top_beam, top_token = top // vocab, top % vocab
            is_eos = top_token == eos_id
            finishing = is_eos[:, :k] & np.isfinite(top_scores[:, :k])
            for i, j in zip(*np.nonzero(finishing)):  # sentence by sentence, best rank first
                hyps = finished[alive[i]]
                ids = tokens[i * k + top_beam[i, j], 1:].tolist()
                score = float(top_scores[i, j])
                hyps.append(Hypothesis(ids, score, rule.normalized(score, len(ids) + 1)))
                if len(hyps) > k:  # keep the k best (stable: the earlier of equals stays)
                    hyps.sort(key=lambda h: -h.normalized_score)
                    hyps.pop()
            # Each beam row has one EOS entry, so at least k of the 2k candidates are not EOS.
            order = np.argsort(is_eos, axis=1, kind="stable")[:, :k]
            next_scores = np.take_along_axis(top_scores, order, axis=1)
            # Done: k finished and the best active one, were it to end now, would not win.
            best_active = rule.normalized(next_scores[:, 0], step + 1)
            done = at_limit | rule.search_over(best_active, [finished[s] for s in alive], k)
            keep = np.flatnonzero(~done)
            if not keep.size:
                break
            order = order[keep]
            new_beam = np.take_along_axis(top_beam[keep], order, axis=1)
            new_token = np.take_along_axis(top_token[keep], order, axis=1)
            cumulative = next_scores[keep]
            rows = (keep[:, None] * k + new_beam).reshape(-1)
            tokens = np.concatenate([tokens[rows], new_token.reshape(-1, 1)], axis=1)
            memory, src_mask, alive = memory[rows], src_mask[rows], alive[keep]
            if state is not None:
                state.reorder(rows)
    return [sorted(hyps, key=lambda h: -h.normalized_score) for hyps in finished]
