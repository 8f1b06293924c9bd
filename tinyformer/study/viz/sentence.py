"""One sentence pair to look at: the source as the model reads it, and the target it is taught
(a reference) or produces (its translation)."""

import numpy

from ...translation.data.special import BOS_ID, EOS_ID
from ...translation.prediction import input_token_limit
from ...translation.search import beam_search, greedy_decode

__all__ = ["sentence_pair", "special_ids"]


def special_ids(tokenizer):
    """(BOS, EOS) of ``tokenizer``: its own ``bos_id`` and ``eos_id`` (a Marian tokenizer's decoder
    starts from its padding id, and its EOS is usually 0), else tinyformer's fixed ids (a
    tokenizer-like object without them)."""
    return int(getattr(tokenizer, "bos_id", BOS_ID)), int(getattr(tokenizer, "eos_id", EOS_ID))


def sentence_pair(model, tokenizer, sentence, reference=None, beam_size=1, alpha=0.6,
                  names=("the sentence", "the reference")):
    """(source ids, target ids) of one sentence: ``tokenizer.encode(sentence) + [EOS]`` (as
    ``decode.translate`` feeds it), and the tokens of ``reference`` (split by the tokenizer's
    ``encode_target`` where it has one: a Marian tokenizer's target model) or, without one, the
    model's translation by ``greedy_decode`` (``beam_size=1``) or ``beam_search``, without BOS and
    EOS. BOS and EOS are the tokenizer's (``special_ids``).

    An empty sentence or reference, or one longer than the model's positional table, raises a
    ValueError naming it as ``names`` does (e.g. the command line's options) and saying by how much.
    """
    limit = input_token_limit(model)
    bos_id, eos_id = special_ids(tokenizer)

    def tokens_of(encode, text, name, room):
        ids = [int(i) for i in encode(text.strip())] if text.strip() else []
        if not ids:
            raise ValueError(f"{name} is empty" + ("" if not text.strip() else " once tokenized"))
        if limit is not None and len(ids) > limit:
            raise ValueError(f"{name} is {len(ids):,} tokens long, more than this model {room}: {limit} tokens "
                             f"(positional max_len {limit + 1})")
        return ids

    source = tokens_of(tokenizer.encode, sentence, names[0], "can encode with the EOS") + [eos_id]
    if reference is not None:
        encode_target = getattr(tokenizer, "encode_target", tokenizer.encode)
        return source, tokens_of(encode_target, reference, names[1], "decodes after the BOS")
    src = numpy.array([source], dtype=numpy.int64)
    if beam_size == 1:
        return source, [int(i) for i in greedy_decode(model, src, bos_id=bos_id, eos_id=eos_id)[0]]
    return source, [int(i) for i in beam_search(model, src, beam_size=beam_size, alpha=alpha, bos_id=bos_id,
                                                eos_id=eos_id)[0]]
