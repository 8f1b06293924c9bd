"""The inputs exercises 7 and 8 (the tiled forward and backward) are checked on, and their answers.

A case (``cases.Case``) holds q, k, v, key_lengths and causal as ``args``, the tile size in
``factors["block"]`` and a random upstream gradient dO; ``prepared_tiled(number)`` fills in, once
per process:

* exercise 7: ``expected`` O from tinyformer's own op (F.scaled_dot_product_attention, its key
  lengths as a padding mask) and lse from the float64 formula (``flash_reference.attention``);
  ``numeric`` the template's plain ``attention`` (S and P whole) — the two must agree;
* exercise 8: ``expected`` dQ, dK, dV from the op's backward; ``numeric`` central differences
  of the template's plain forward (O, projected on dO); ``output`` the (O, lse) backward is given.

Scores of ~1,000 (the "large logits" case) overflow exp in float64 unless the max is subtracted.
"""

import functools
import math

import numpy

from ...engine import functional as F
from ...engine.tensor import Tensor
from .cases import Case, agrees, copied, numeric_gradients
from .exercises import template_module
from .flash_reference import attention

__all__ = ["prepared_tiled", "arguments"]


def _case(rng, name, batch, len_q, len_k, d, lengths=None, causal=False, block=4, spread=1.0, tags=()):
    q, k = spread * rng.normal(size=(batch, len_q, d)), spread * rng.normal(size=(batch, len_k, d))
    v = rng.normal(size=(batch, len_k, d))
    key_lengths = None if lengths is None else numpy.asarray(lengths, dtype=numpy.int64)
    tags = set(tags) | ({"causal"} if causal else set()) | ({"padding"} if lengths is not None else set())
    tags |= {"len_q ≠ len_k"} if len_q != len_k else set()
    _, lse = attention(q, k, v, key_lengths, causal)
    tags |= {"fully masked row"} if numpy.isneginf(lse).any() else set()
    return Case(name, (q, k, v, key_lengths, causal), rng.normal(size=(batch, len_q, d)), frozenset(tags),
                factors={"block": block, "√d": math.sqrt(d), "1/√d": 1 / math.sqrt(d)})


def _cases(rng):
    return [
        _case(rng, "9 queries over 9 keys, tiles of 4", 2, 9, 9, 4),
        _case(rng, "padding: key lengths 7 and 3, 6 queries over 10 keys", 2, 6, 10, 4, lengths=[7, 3]),
        _case(rng, "causal, 11 tokens", 2, 11, 11, 4, causal=True),
        _case(rng, "causal + padding: key lengths 10 and 6", 2, 10, 10, 4, lengths=[10, 6], causal=True),
        _case(rng, "causal, 5 queries over 13 keys (aligned with the last keys)", 1, 5, 13, 4, causal=True),
        _case(rng, "a sequence with no key (key length 0)", 2, 6, 6, 4, lengths=[0, 5]),
        _case(rng, "large logits (scores ~ ±1,000)", 2, 9, 9, 4, spread=30.0, tags=["large logits"]),
        _case(rng, "length 1", 2, 1, 1, 4, tags=["length 1"]),
        _case(rng, "tiles of 3, causal, 8 tokens", 1, 8, 8, 4, causal=True, block=3),
        _case(rng, "tiles of 16, longer than the 5 tokens", 2, 5, 5, 4, block=16),
    ]


def arguments(number, case):
    """What the reader's function is called with in ``case`` (copies): forward (q, k, v,
    key_lengths, causal, block); backward (q, k, v, o, lse, d_out, key_lengths, causal, block)."""
    q, k, v, key_lengths, causal = copied(case.args)
    block = case.factors["block"]
    if number == 7:
        return q, k, v, key_lengths, causal, block
    o, lse = (a.copy() for a in case.output)
    return q, k, v, o, lse, case.d_out.copy(), key_lengths, causal, block


def _op(case, d_out=None):
    """O of tinyformer's own op on the case, and with ``d_out`` the gradients of q, k, v."""
    q, k, v, key_lengths, causal = case.args
    tensors = [Tensor(a[:, None], requires_grad=True) for a in (q, k, v)]
    mask = None
    if key_lengths is not None:
        mask = (numpy.arange(k.shape[1])[None, :] < key_lengths[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(*tensors, mask=mask, causal=causal)
    if d_out is None:
        return out.data[:, 0].copy()
    out.backward(d_out[:, None])
    return {name: t.grad[:, 0].copy() for name, t in zip(("dQ", "dK", "dV"), tensors)}


def _disagree(number, case, name):
    raise AssertionError(f"the study checker is wrong: for exercise {number}, case {case.name!r}, tinyformer's "
                         f"{name} and the template's plain formula disagree")


@functools.lru_cache(maxsize=None)
def prepared_tiled(number):
    """The cases of exercise ``number`` (7 or 8) with both answers filled in, once per process."""
    cases = _cases(numpy.random.default_rng(1000 + number))
    plain = template_module(number).attention if number == 7 else template_module(number).forward
    for case in cases:
        q, k, v, key_lengths, causal = case.args
        o, lse = attention(q, k, v, key_lengths, causal)
        case.output = (o, lse)
        if number == 7:
            case.expected = {"O": _op(case), "lse": lse}
            case.numeric = dict(zip(("O", "lse"), plain(*copied(case.args))))
        else:
            case.expected = _op(case, case.d_out)
            args = copied(case.args)
            wrt = dict(zip(("dQ", "dK", "dV"), args[:3]))
            case.numeric = numeric_gradients(lambda *a: plain(*a)[0], args, wrt, case.d_out)
        for name, expected in case.expected.items():
            finite = numpy.isfinite(expected)
            if not (numpy.array_equal(finite, numpy.isfinite(case.numeric[name]))
                    and agrees(case.numeric[name][finite], expected[finite]).all()):
                _disagree(number, case, name)
    return cases
