"""How beam search ranks finished outputs of different lengths: GNMT's length penalty (§6.1) and
transformers' ``length_penalty``, with the range of α in which their arithmetic holds; and each
convention whole as a small strategy object (``GNMT``, ``Transformers``, made by
``length_normalization``): its penalty, the score of the EOS forced at the maximum length and its
rule for when a sentence's search is over.

Both divide a hypothesis' summed log-probability by a penalty lp(|Y|), |Y| being its tokens and
the final EOS. α is bounded: |α| ≤ ``ALPHA_LIMIT`` (10; GNMT takes [0, 10], transformers' any number
in [-10, 10]). Within it, for any length below 10⁹ tokens, lp lies in [10⁻⁹⁰, 10⁹⁰]: finite and not
zero, and a score (at most 10⁹ log-probabilities of float32 logits, each above −10³⁹ in size) divided by
it stays finite. A larger α would overflow or underflow the penalty (1e308 raised a Python OverflowError,
−1e308 a ZeroDivisionError); tuned values lie in [0, 1] for GNMT and [−2, 2] for transformers.
"""

import numpy as np

from ..common.validation import check_real

__all__ = ["LENGTH_NORMALIZATIONS", "DEFAULT_ALPHA", "ALPHA_LIMIT", "alpha_range", "length_penalty",
           "hf_length_penalty", "LengthNormalization", "GNMT", "Transformers",
           "length_normalization"]

LENGTH_NORMALIZATIONS = ("gnmt", "hf")
# α when none is given: §6.1's 0.6 for GNMT's penalty, transformers' length_penalty default 1.0 for "hf".
DEFAULT_ALPHA = {"gnmt": 0.6, "hf": 1.0}
ALPHA_LIMIT = 10


def alpha_range(length_normalization):
    """(least, greatest) α of ``length_normalization``: [0, 10] for gnmt, [-10, 10] for hf."""
    return (0 if length_normalization == "gnmt" else -ALPHA_LIMIT), ALPHA_LIMIT


def length_penalty(length, alpha):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016, eq. 14); §6.1 uses α = 0.6.

    ``length`` is |Y|, the number of generated tokens including the final EOS.
    """
    return ((5.0 + length) / 6.0) ** alpha


def hf_length_penalty(length, alpha):
    """Hugging Face's divisor |Y|^α, α being transformers' ``length_penalty`` (default 1.0, the mean
    log-probability per token; α > 0 favours longer outputs, α < 0 shorter ones).

    ``length`` is |Y|, the number of generated tokens including the final EOS (transformers divides by
    ``cur_len + 1 - decoder_prompt_len`` when a hypothesis finishes).
    """
    return float(length) ** alpha


class LengthNormalization:
    """One convention of beam search for outputs of different lengths, with its ``alpha`` (checked;
    None: the convention's default). A finished hypothesis ranks by score / ``penalty(|Y|)``; the EOS
    forced at the maximum length scores ``forced_eos_log_prob`` (None: its own log-probability); a
    sentence's search is over once ``search_over`` says so."""

    name = None
    forced_eos_log_prob = None
    against_worst = False  # the stop compares with the worst kept finished hypothesis, not the best

    def __init__(self, alpha=None):
        self.alpha = DEFAULT_ALPHA[self.name] if alpha is None else check_real("alpha", alpha,
                                                                                 *alpha_range(self.name))

    def penalty(self, length):
        raise NotImplementedError

    def normalized(self, score, length):
        """``score`` (a number or an array) of a hypothesis of |Y| = ``length``, length-normalised."""
        return score / self.penalty(length)

    def search_over(self, best_active, finished, beam_size):
        """Per sentence: whether its search is over before the maximum length. ``best_active`` holds
        each sentence's best active score normalised at its current length, ``finished`` each one's
        finished hypotheses (``normalized_score``). Over once it has ``beam_size`` finished and
        best_active ≤ the best of their normalised scores (the worst, ``against_worst``)."""
        pick = min if self.against_worst else max
        enough = np.array([len(hyps) >= beam_size for hyps in finished])
        reference = np.array([pick((h.normalized_score for h in hyps), default=-np.inf) for hyps in finished])
        return enough & (best_active <= reference)

    def __repr__(self):
        return f"{type(self).__name__}(alpha={self.alpha!r})"


class GNMT(LengthNormalization):
    """GNMT's convention, tinyformer's default: ``length_penalty``; the forced EOS keeps its
    log-probability; a sentence stops once its best active hypothesis cannot beat the best finished
    one. (A fairseq-style stop at ``beam_size`` finished alone lets improbable early EOS hypotheses end
    the search while a far better one is still active.)"""

    name = "gnmt"

    def penalty(self, length):
        return length_penalty(length, self.alpha)


class Transformers(LengthNormalization):
    """Hugging Face transformers' beam search (``generate(num_beams=k)``, early_stopping=False):
    ``hf_length_penalty``; the forced EOS scores 0 (its ForcedEOSTokenLogitsProcessor acts after the
    log-softmax); a sentence stops once its best active hypothesis is no better than the *worst* kept
    finished one (``_check_early_stop_heuristic``)."""

    name = "hf"
    forced_eos_log_prob = 0.0
    against_worst = True

    def penalty(self, length):
        return hf_length_penalty(length, self.alpha)


_CONVENTIONS = {"gnmt": GNMT, "hf": Transformers}


def length_normalization(name, alpha=None):
    """The ``LengthNormalization`` called ``name`` ("gnmt" or "hf") with ``alpha`` (None: its default);
    a ValueError names a wrong name or an α outside ``alpha_range``. A ``LengthNormalization`` given as
    ``name`` is used as it is (with another ``alpha``: one of its kind with that α)."""
    if isinstance(name, LengthNormalization):  # a convention of one's own, or one made already
        return name if alpha is None else type(name)(alpha)
    if name not in LENGTH_NORMALIZATIONS:
        raise ValueError(f"length_normalization must be one of {LENGTH_NORMALIZATIONS}, got {name!r}")
    return _CONVENTIONS[name](alpha)
