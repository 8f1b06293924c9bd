"""Text in, text out: ``translate`` encodes text lines, searches (``search``: beam search, or greedy
search for a beam of 1) and decodes one output line per input line.

Its settings are grouped in ``TranslateOptions`` (how the lines are read, and how they are
searched): ``translate(model, tokenizer, lines, beam_size=1)`` sets them by keyword,
``translate(model, tokenizer, lines, options)`` hands them over whole.
"""

import dataclasses
import warnings

from .data.batching import pad
from .data.special import BOS_ID, EOS_ID
from ..common.validation import check_int
from .length_penalties import length_normalization as normalization_of
from .search import beam_search, check_special, fit_beam, greedy_decode

__all__ = ["TranslateOptions", "translate", "InputWarning", "LongLineError", "LONG_LINES", "input_token_limit",
           "line_list"]

LONG_LINES = ("truncate", "refuse")
# Characters that end a line for str.splitlines(): an output holding one would break line alignment.
_LINE_BREAKS = str.maketrans({c: " " for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


class InputWarning(UserWarning):
    """``translate`` changed its input to translate it: lines longer than the model allows were truncated."""


class LongLineError(ValueError):
    """``translate(long_lines="refuse")`` met a line of more than ``max_input_tokens`` tokens.

    ``line`` is its number counted from 1, ``tokens`` its length and ``limit`` the maximum.
    """

    def __init__(self, line, tokens, limit):
        super().__init__(f"translate: line {line} has {tokens:,} tokens, more than max_input_tokens={limit} "
                         "(long_lines='refuse')")
        self.line, self.tokens, self.limit = line, tokens, limit


@dataclasses.dataclass(frozen=True)
class TranslateOptions:
    """The settings of ``translate``: the search's, then the input's."""

    beam_size: int = 4                   # 1: greedy search
    alpha: float = None                  # the length normalisation's α (None: its default)
    length_normalization: str = "gnmt"   # or "hf" (transformers'), see search.beam_search
    max_len_a: float = 1                 # at most max_len_a · src_len + max_len_b tokens
    max_len_b: float = 50
    bos_id: int = None                   # None: the tokenizer's (else tinyformer's)
    eos_id: int = None
    batch_size: int = 64                 # lines searched together
    append_eos: bool = True              # the source is ids + [eos_id], as the trainer feeds it
    max_input_tokens: int = None         # None: what the positional table holds
    long_lines: str = "truncate"         # or "refuse" a line longer than max_input_tokens


_OPTION_NAMES = tuple(field.name for field in dataclasses.fields(TranslateOptions))


def input_token_limit(model, append_eos=True):
    """The most source tokens (EOS excluded) the model can encode: its positional ``max_len``, less
    one position for the EOS when ``append_eos``; None when the model has no such table."""
    positions = getattr(getattr(model, "positional", None), "max_len", None)
    if positions is None:
        return None
    return positions - 1 if append_eos else positions


def line_list(line_numbers, limit=10):
    """"3, 7, 12" — at most ``limit`` line numbers, then "and N more"."""
    shown = ", ".join(str(n) for n in line_numbers[:limit])
    return shown + (f" and {len(line_numbers) - limit} more" if len(line_numbers) > limit else "")


def translate(model, tokenizer, lines, options=None, **settings):
    """Translate text lines: one output string per input line, in the input order.

    ``options`` (a ``TranslateOptions``; None: the defaults) with ``settings`` (its fields by
    keyword) replacing some. Each line is stripped and encoded with ``tokenizer.encode(str) ->
    list[int]`` (ids without BOS/EOS); with ``append_eos`` the source fed to the encoder is
    ``ids + [eos_id]``, as the trainer feeds it (src_len for the maximum length counts that EOS).
    Lines are sorted by length into batches of ``batch_size``, decoded with ``beam_search`` (beam 4,
    α = 0.6 as §6.1; ``beam_size=1`` runs ``greedy_decode``) and ``tokenizer.decode(ids) -> str``.
    ``length_normalization`` and α are beam search's ("hf": transformers' score / |Y|^α, α default
    1.0). An empty or whitespace-only line gives an empty output without running the model.

    A line of more than ``max_input_tokens`` tokens (default and upper bound:
    ``input_token_limit(model)``, what the positional table holds) is cut to its first
    ``max_input_tokens`` tokens with an ``InputWarning`` naming the lines
    (``long_lines="truncate"``), or refused with a ValueError naming the first such line
    (``LongLineError``, a ValueError; ``long_lines="refuse"``), before anything is decoded. Line
    numbers in these messages count from 1, as in a file. Outputs never hold a line break (any is
    replaced by a space), so writing one output per line keeps the lines aligned.
    """
    o = _options(options, settings)
    lines = _checked_lines(lines)
    beam_size = check_int("beam_size", o.beam_size, 1)
    batch_size = check_int("batch_size", o.batch_size, 1)
    rule = normalization_of(o.length_normalization, o.alpha)
    if o.long_lines not in LONG_LINES:
        raise ValueError(f"translate: long_lines must be one of {LONG_LINES}, got {o.long_lines!r}")
    max_input_tokens = _max_input_tokens(model, o.max_input_tokens, o.append_eos)
    # The tokenizer's own ids (a Marian tokenizer's decoder starts from its padding id), else tinyformer's.
    bos_id = getattr(tokenizer, "bos_id", BOS_ID) if o.bos_id is None else o.bos_id
    eos_id = getattr(tokenizer, "eos_id", EOS_ID) if o.eos_id is None else o.eos_id
    sources = _sources(lines, tokenizer, max_input_tokens, o.long_lines, eos_id if o.append_eos else None)
    if sources and beam_size > 1:  # one warning for all batches
        vocab = model.tgt_vocab_size
        beam_size = fit_beam(model, beam_size, check_special("bos_id", bos_id, vocab),
                             check_special("eos_id", eos_id, vocab), stacklevel=2)
    outputs = [""] * len(lines)
    for start in range(0, len(sources), batch_size):
        batch = sources[start:start + batch_size]
        src = pad([ids or [model.pad_id] for _, ids in batch], model.pad_id)
        common = dict(max_len_a=o.max_len_a, max_len_b=o.max_len_b, bos_id=bos_id, eos_id=eos_id)
        if beam_size == 1:
            hypotheses = greedy_decode(model, src, **common)
        else:
            hypotheses = beam_search(model, src, beam_size=beam_size, alpha=rule.alpha,
                                     length_normalization=o.length_normalization, **common)
        for (i, _), ids in zip(batch, hypotheses):
            outputs[i] = tokenizer.decode(ids).translate(_LINE_BREAKS)
    return outputs


def _options(options, settings):
    """``options`` with ``settings`` replacing some of its fields; a TypeError names a wrong one."""
    if options is None:
        options = TranslateOptions()
    elif not isinstance(options, TranslateOptions):
        raise TypeError(f"translate: options must be a TranslateOptions, got {type(options).__name__} "
                        "(give the settings by keyword, e.g. beam_size=4)")
    unknown = [name for name in settings if name not in _OPTION_NAMES]
    if unknown:
        raise TypeError(f"translate: unknown setting {unknown[0]!r}; the settings are {', '.join(_OPTION_NAMES)}")
    return dataclasses.replace(options, **settings) if settings else options


def _checked_lines(lines):
    if isinstance(lines, (str, bytes)):
        raise TypeError("translate: lines must be a sequence of strings, not a single string")
    lines = list(lines)
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(f"translate: lines[{i}] must be a str, got {type(line).__name__}")
    return lines


def _max_input_tokens(model, max_input_tokens, append_eos):
    """``max_input_tokens`` checked against what the model can encode (None: that limit)."""
    limit = input_token_limit(model, append_eos)
    if max_input_tokens is None:
        return limit
    max_input_tokens = check_int("max_input_tokens", max_input_tokens, 1)
    if limit is not None and max_input_tokens > limit:
        eos = " and the EOS" if append_eos else ""
        raise ValueError(f"translate: max_input_tokens={max_input_tokens} is more than the model can "
                         f"encode: its positional table (max_len {model.positional.max_len}) holds "
                         f"{limit} tokens{eos}")
    return max_input_tokens


def _sources(lines, tokenizer, max_input_tokens, long_lines, eos_id):
    """(line index, source ids) of each non-empty line, shortest first (stable): encoded, cut to
    ``max_input_tokens`` (one InputWarning naming the lines) or refused (``LongLineError``), with
    ``eos_id`` appended unless it is None."""
    sources, truncated = [], []
    for i, line in enumerate(lines):
        text = line.strip()
        if text:
            ids = [int(t) for t in tokenizer.encode(text)]
            if max_input_tokens is not None and len(ids) > max_input_tokens:
                if long_lines == "refuse":
                    raise LongLineError(i + 1, len(ids), max_input_tokens)
                ids = ids[:max_input_tokens]
                truncated.append(i + 1)
            sources.append((i, ids if eos_id is None else ids + [eos_id]))
    if truncated:
        warnings.warn(InputWarning(
            f"truncated {len(truncated)} line{'s' if len(truncated) > 1 else ''} longer than "
            f"{max_input_tokens} tokens to their first {max_input_tokens}: line"
            f"{'s' if len(truncated) > 1 else ''} {line_list(truncated)}"), stacklevel=3)
    sources.sort(key=lambda item: len(item[1]))  # stable: equal lengths keep their order
    return sources
