"""Decoding, the public namespace: ``search`` (greedy and beam search over token ids, with the
decoder's cache), ``length_penalties`` (the length-normalisation conventions of beam search) and
``prediction`` (``translate``: text lines in, text lines out) in one module, as the manual and
``from tinyformer.translation import decode`` use them. The code lives in those three modules.
"""

from .length_penalties import (ALPHA_LIMIT, DEFAULT_ALPHA, GNMT, LENGTH_NORMALIZATIONS, LengthNormalization,
                               Transformers, hf_length_penalty, length_normalization, length_penalty)
from .prediction import (LONG_LINES, InputWarning, LongLineError, TranslateOptions, input_token_limit, line_list,
                         translate)
from .search import CANDIDATE_BUDGET, Hypothesis, SearchWarning, beam_search, greedy_decode, widest_beam

__all__ = ["Hypothesis", "InputWarning", "SearchWarning", "LongLineError", "LONG_LINES", "LENGTH_NORMALIZATIONS",
           "DEFAULT_ALPHA", "ALPHA_LIMIT", "CANDIDATE_BUDGET", "length_penalty", "hf_length_penalty",
           "LengthNormalization", "GNMT", "Transformers", "length_normalization", "widest_beam", "greedy_decode",
           "beam_search", "input_token_limit", "line_list", "translate", "TranslateOptions"]
