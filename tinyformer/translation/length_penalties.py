"""How beam search ranks finished outputs of different lengths: GNMT's length penalty (§6.1) and
transformers' ``length_penalty``, with the range of α in which their arithmetic holds.

Both divide a hypothesis' summed log-probability by a penalty lp(|Y|), |Y| being its tokens and
the final EOS. α is bounded: |α| ≤ ``ALPHA_LIMIT`` (10; GNMT takes [0, 10], transformers' any number
in [-10, 10]). Within it, for any length below 10⁹ tokens, lp lies in [10⁻⁹⁰, 10⁹⁰]: finite and not
zero, and a score (at most 10⁹ log-probabilities of float32 logits, each above −10³⁹ in size) divided by
it stays finite. A larger α would overflow or underflow the penalty (1e308 raised a Python OverflowError,
−1e308 a ZeroDivisionError); tuned values lie in [0, 1] for GNMT and [−2, 2] for transformers.
"""

from ..common.validation import check_real

__all__ = ["LENGTH_NORMALIZATIONS", "DEFAULT_ALPHA", "ALPHA_LIMIT", "alpha_range", "length_penalty",
           "hf_length_penalty", "check_length_normalization"]

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


def check_length_normalization(length_normalization, alpha):
    """(length_normalization, α): α defaults to DEFAULT_ALPHA and must lie in ``alpha_range`` (GNMT's
    in [0, 10], transformers' in [-10, 10]); a ValueError names what is wrong."""
    if length_normalization not in LENGTH_NORMALIZATIONS:
        raise ValueError(f"length_normalization must be one of {LENGTH_NORMALIZATIONS}, got {length_normalization!r}")
    if alpha is None:
        return length_normalization, DEFAULT_ALPHA[length_normalization]
    return length_normalization, check_real("alpha", alpha, *alpha_range(length_normalization))
