"""The inputs every exercise is checked on, and the two answers a reader's backward must match.

A ``Case`` holds the forward's arguments (float64, drawn from a generator seeded per exercise)
and a random upstream gradient, plus what the diagnosis needs: ``tags`` (what kind of input it
is: "causal", "padding", "fully masked row", "length 1", ...), ``regions`` (named parts of each
gradient, e.g. the rows the causal mask hides keys from) and ``factors`` (named constant
factors, e.g. √d_k, that a typical mistake multiplies a gradient by).

``prepared(number)`` builds the cases once per process and fills in, for each:

* ``expected``: the gradients of tinyformer's own op (its autograd: Tensor.backward through
  F.softmax, F.layer_norm, F.scaled_dot_product_attention, F.cross_entropy,
  nn.MultiHeadAttention), and ``output``, the op's forward;
* ``numeric``: float64 central differences of the exercise's given forward,
  (f(x + εe) − f(x − εe)) / 2ε element by element, projected on the upstream gradient: the
  gradient checker's (``tinyformer.engine.gradcheck.central_differences``, its step ``EPS``).

The two must agree (else the checker itself is wrong, and says so).
"""

import dataclasses
import functools
import math

import numpy

from ...engine import functional as F
from ...model import nn
from ...engine.tensor import Tensor
from ...engine.gradcheck import central_differences, compare
from .exercises import exercise, template_module

__all__ = ["Case", "prepared", "differentiated", "numeric_gradients", "agrees", "TOLERANCE"]

TOLERANCE = (1e-5, 1e-4)  # (relative to the array's largest value, relative to the element) for numeric vs exact


@dataclasses.dataclass
class Case:
    name: str
    args: tuple
    d_out: object
    tags: frozenset = frozenset()
    regions: dict = dataclasses.field(default_factory=dict)  # {gradient: [(phrase, bool array of its shape)]}
    factors: dict = dataclasses.field(default_factory=dict)  # {name: value}
    output: object = None
    expected: dict = None
    numeric: dict = None


# ---------------------------------------------------------------------------- which arrays are differentiated
def differentiated(number, args):
    """{gradient name: the argument array it is the gradient of}, in backward's order (the arrays
    themselves, so that central differences can move their elements in place)."""
    names = exercise(number).gradients
    if number == 6:
        query, key, value, params = args[:4]
        return dict(zip(names, (query, key, value, *(params[k] for k in exercise(6).keys[3:]))))
    count = {1: 3, 2: 1, 3: 3, 4: 3, 5: 1}[number]
    return dict(zip(names, args[:count]))


def _copy(value):
    if isinstance(value, numpy.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def copied(args):
    """The arguments again, every array a copy: a reader's backward that writes into its inputs
    changes nothing the checker uses."""
    return tuple(_copy(a) for a in args)


# ---------------------------------------------------------------------------- the cases
def _chain_rule_cases(rng):
    def case(name, n, d, tags=()):
        x, w, b = rng.normal(size=(n, d)), rng.normal(0, 0.7, (d, d)), rng.normal(0, 0.5, d)
        return Case(name, (x, w, b), rng.normal(size=n), frozenset(tags))

    return [case("4 rows of 3", 4, 3), case("one row (batch 1)", 1, 3, ["batch 1"]),
            case("5 rows of 4", 5, 4), case("one feature", 3, 1, ["one feature"])]


def _softmax_cases(rng):
    def case(name, x, tags=()):
        masked = numpy.isneginf(x)
        return Case(name, (x,), rng.normal(size=x.shape), frozenset(tags),
                    regions={"dx": [("the masked (−inf) entries", masked)]} if masked.any() else {})

    masked = rng.normal(size=(3, 5))
    masked[0, [1, 3]] = masked[2, 4] = -numpy.inf
    return [case("3 rows of 5", rng.normal(size=(3, 5))),
            case("one row (batch 1)", rng.normal(size=(1, 6)), ["batch 1"]),
            case("4 rows of 4", rng.normal(size=(4, 4))),
            case("rows of length 1", rng.normal(size=(4, 1)), ["length 1"]),
            case("(2, 3, 4): leading axes", rng.normal(size=(2, 3, 4)), ["leading axes"]),
            case("masked entries (−inf)", masked, ["masked entries"]),
            case("large scores", 30 * rng.normal(size=(2, 5)))]


def _layer_norm_cases(rng):
    def case(name, shape, tags=(), scale=1.0, offset=0.0):
        n = shape[-1]
        x = offset + scale * rng.normal(size=shape)
        return Case(name, (x, 1 + 0.5 * rng.normal(size=n), 0.5 * rng.normal(size=n)), rng.normal(size=shape),
                    frozenset(tags), factors={"n": float(n), "1/n": 1.0 / n})

    return [case("3 rows of 5", (3, 5)), case("one row (batch 1)", (1, 6), ["batch 1"]),
            case("(2, 3, 4): leading axes", (2, 3, 4), ["leading axes"]),
            case("one feature", (4, 1), ["one feature"]),
            case("large offset and spread", (2, 5), scale=30.0, offset=100.0)]


def _causal_keep(len_q, len_k):
    return F.causal_mask(len_q, len_k)


def _lengths_mask(lengths, len_k):
    """(batch, 1, len_k) keep-mask hiding the keys past each length (trailing padding)."""
    return (numpy.arange(len_k)[None, :] < numpy.asarray(lengths)[:, None])[:, None, :]


def _attention_regions(keep, causal, padded_keys, grad_shapes):
    """Named regions of dQ (query rows) and of dK and dV (key rows), as bool arrays of their shapes.

    ``keep`` is the full keep-mask (batch, len_q, len_k); ``padded_keys`` (batch, len_k) the keys
    hidden from every query by padding, or None."""
    batch, len_q, len_k = keep.shape
    q_rows, k_rows = {}, {}
    if causal:
        hidden = ~_causal_keep(len_q, len_k)
        q_rows["the rows the causal mask hides keys from"] = numpy.broadcast_to(hidden.any(axis=1), (batch, len_q))
        k_rows["the rows the causal mask hides from some query"] = numpy.broadcast_to(hidden.any(axis=0),
                                                                                     (batch, len_k))
    if (~keep).any():
        q_rows["the rows with a hidden key"] = (~keep).any(axis=2)
        k_rows["the rows hidden from some query"] = (~keep).any(axis=1)
    if (~keep).all(axis=2).any():
        q_rows["the fully masked rows"] = (~keep).all(axis=2)
    if padded_keys is not None and padded_keys.any():
        k_rows["the padding positions"] = padded_keys
    regions = {}
    for name, shape, rows in zip(("dQ", "dK", "dV"), grad_shapes, (q_rows, k_rows, k_rows)):
        regions[name] = [(phrase, numpy.broadcast_to(mask[:, :, None], shape)) for phrase, mask in rows.items()]
    return regions


def _attention_cases(rng):
    def case(name, batch, len_q, len_k, d_k, d_v, mask=None, causal=False, tags=(), padded_keys=None):
        q, k = rng.normal(size=(batch, len_q, d_k)), rng.normal(size=(batch, len_k, d_k))
        v = rng.normal(size=(batch, len_k, d_v))
        keep = numpy.ones((batch, len_q, len_k), dtype=bool)
        if causal:
            keep &= _causal_keep(len_q, len_k)
        if mask is not None:
            keep &= mask
        tags = set(tags) | ({"causal"} if causal else set()) | ({"len_q ≠ len_k"} if len_q != len_k else set())
        tags |= {"batch 1"} if batch == 1 else set()
        tags |= {"fully masked row"} if (~keep).all(axis=2).any() else set()
        return Case(name, (q, k, v, mask, causal), rng.normal(size=(batch, len_q, d_v)), frozenset(tags),
                    regions=_attention_regions(keep, causal, padded_keys, (q.shape, k.shape, v.shape)),
                    factors={"√d_k": math.sqrt(d_k), "1/√d_k": 1 / math.sqrt(d_k)})

    padding = _lengths_mask([5, 3], 5)
    causal_padding = _lengths_mask([5, 2], 5)
    holes = rng.random((2, 3, 4)) < 0.7
    holes[:, :, 0] = True
    holes[1, 0, :] = False  # one query that sees no key
    return [
        case("no mask", 2, 3, 3, 4, 2),
        case("padding, len_q 3 ≠ len_k 5", 2, 3, 5, 3, 4, mask=padding, tags=["padding"], padded_keys=~padding[:, 0]),
        case("causal", 2, 4, 4, 2, 3, causal=True),
        case("causal + padding", 2, 5, 5, 3, 2, mask=causal_padding, causal=True, tags=["padding"],
             padded_keys=~causal_padding[:, 0]),
        case("a fully masked row", 2, 3, 4, 2, 2, mask=holes),
        case("length 1", 2, 1, 1, 3, 2, tags=["length 1"]),
        case("batch 1, causal, 2 queries over 5 keys", 1, 2, 5, 4, 3, causal=True),
    ]


def _cross_entropy_cases(rng):
    def case(name, lengths, length, vocab, smoothing, pad_id=0, tags=()):
        batch = len(lengths)
        logits = 2 * rng.normal(size=(batch, length, vocab))
        target = rng.integers(0, vocab - 1, size=(batch, length))
        target[target >= pad_id] += 1  # any class but pad_id
        padded = numpy.arange(length)[None, :] >= numpy.asarray(lengths)[:, None]
        target[padded] = pad_id
        total, kept = padded.size, int((~padded).sum())
        d_loss = float(rng.uniform(0.5, 1.5) * rng.choice([-1, 1]))
        factors = {"1/d_loss": 1 / d_loss, "N": float(max(kept, 1))}
        if kept and kept < total:
            factors["N/(every position)"] = kept / total
        tags = set(tags) | ({"padding"} if padded.any() else set()) | ({"no smoothing"} if not smoothing else set())
        tags |= {"batch 1"} if batch == 1 else set()
        tags |= {"length 1"} if length == 1 else set()
        tags |= {"an all-padding row"} if padded.all(axis=1).any() and not padded.all() else set()
        tags |= {"every target padding"} if padded.all() else set()
        columns = numpy.arange(vocab)
        regions = [("the padding positions", numpy.broadcast_to(padded[:, :, None], logits.shape)),
                   ("the pad id's column", numpy.broadcast_to(columns == pad_id, logits.shape)),
                   ("the target's column", columns == target[:, :, None])]
        return Case(name, (logits, target, smoothing, pad_id), d_loss, frozenset(tags),
                    regions={"dlogits": regions}, factors=factors)

    return [case("padding at the end", [4, 2, 3], 4, 7, 0.1),
            case("no smoothing", [3, 1], 3, 5, 0.0),
            case("an all-padding row", [3, 0, 2], 3, 6, 0.1),
            case("pad id 3", [2, 4], 4, 6, 0.2, pad_id=3, tags=["pad id ≠ 0"]),
            case("length 1, batch 1", [1], 1, 4, 0.1),
            case("every target padding", [0, 0], 2, 5, 0.1)]


def _multi_head_cases(rng):
    def case(name, batch, len_q, len_k, d_model, heads, mask=None, causal=False, tags=(), padded_keys=None):
        params = {}
        for key in exercise(6).keys[3:]:
            params[key] = rng.normal(0, 0.5, (d_model, d_model) if key[0] == "w" else d_model)
        query, key, value = (rng.normal(size=(batch, n, d_model)) for n in (len_q, len_k, len_k))
        keep = numpy.ones((batch, 1, len_q, len_k), dtype=bool)
        if causal:
            keep = keep & _causal_keep(len_q, len_k)
        if mask is not None:
            keep = keep & mask
        tags = set(tags) | ({"causal"} if causal else set()) | ({"len_q ≠ len_k"} if len_q != len_k else set())
        tags |= {"batch 1"} if batch == 1 else set()
        tags |= {"one head"} if heads == 1 else set()
        tags |= {"fully masked row"} if (~keep).all(axis=-1).any() else set()
        shapes = (query.shape, key.shape, value.shape)
        regions = _attention_regions(keep[:, 0], causal, padded_keys, shapes)
        regions = {new: regions[old] for old, new in zip(("dQ", "dK", "dV"), ("dquery", "dkey", "dvalue"))}
        d_k = d_model // heads
        return Case(name, (query, key, value, params, heads, mask, causal), rng.normal(size=(batch, len_q, d_model)),
                    frozenset(tags), regions=regions,
                    factors={"√d_k": math.sqrt(d_k), "1/√d_k": 1 / math.sqrt(d_k)})

    padding = _lengths_mask([4, 2], 4)[:, None]  # (batch, 1, 1, len_k)
    holes = numpy.ones((2, 1, 3, 3), dtype=bool)
    holes[0, 0, 1, :] = False
    holes[1, 0, :, 2] = False
    return [case("self-attention shapes, 2 heads", 2, 3, 3, 4, 2),
            case("padding, len_q 2 ≠ len_k 4, 3 heads", 2, 2, 4, 6, 3, mask=padding, tags=["padding"],
                 padded_keys=~padding[:, 0, 0]),
            case("causal, one head", 2, 3, 3, 4, 1, causal=True),
            case("a fully masked row", 2, 3, 3, 4, 2, mask=holes),
            case("length 1, batch 1", 1, 1, 1, 4, 2, tags=["length 1"])]


_CASES = {1: _chain_rule_cases, 2: _softmax_cases, 3: _layer_norm_cases, 4: _attention_cases,
          5: _cross_entropy_cases, 6: _multi_head_cases}


# ---------------------------------------------------------------------------- tinyformer's op
def _tensors(arrays):
    return [Tensor(a, requires_grad=True) for a in arrays]


def _op_chain_rule(case):
    x, w, b = _tensors(case.args)
    return ((x @ w + b).tanh() * x).sum(axis=1), (x, w, b)


def _op_softmax(case):
    (x,) = _tensors(case.args)
    return F.softmax(x, axis=-1), (x,)


def _op_layer_norm(case):
    x, gain, bias = _tensors(case.args)
    return F.layer_norm(x, gain, bias, eps=template_module(3).EPS), (x, gain, bias)


def _op_attention(case):
    q, k, v = _tensors(case.args[:3])
    mask, causal = case.args[3:]
    return F.scaled_dot_product_attention(q, k, v, mask=mask, causal=causal), (q, k, v)


def _op_cross_entropy(case):
    logits, target, smoothing, pad_id = case.args
    (logits,) = _tensors([logits])
    return F.cross_entropy(logits, target, label_smoothing=smoothing, ignore_index=pad_id), (logits,)


def _op_multi_head(case):
    query, key, value, params, heads, mask, causal = case.args
    # its own generator: the weights are replaced below, and the default one (dropout's) stays untouched
    mha = nn.MultiHeadAttention(query.shape[-1], heads, generator=numpy.random.default_rng(0))
    for name, layer in zip("qkvo", (mha.w_q, mha.w_k, mha.w_v, mha.w_o)):
        layer.weight.data, layer.bias.data = params["w_" + name].copy(), params["b_" + name].copy()
    inputs = _tensors((query, key, value))
    out = mha(*inputs, mask=mask, causal=causal)
    return out, (*inputs, *(p for layer in (mha.w_q, mha.w_k, mha.w_v, mha.w_o) for p in (layer.weight, layer.bias)))


_OPS = {1: _op_chain_rule, 2: _op_softmax, 3: _op_layer_norm, 4: _op_attention, 5: _op_cross_entropy,
        6: _op_multi_head}


def _op_answer(number, case):
    """(output, {gradient: array}) of tinyformer's op on the case, for its upstream gradient."""
    out, leaves = _OPS[number](case)
    output = out.data.copy()
    out.backward(numpy.asarray(case.d_out, dtype=numpy.float64))
    names = exercise(number).gradients
    return output, {name: leaf.grad for name, leaf in zip(names, leaves)}


# ---------------------------------------------------------------------------- central differences
def numeric_gradients(forward, args, wrt, d_out):
    """{gradient: the gradient checker's central differences (``gradcheck.central_differences``) of
    Σ d_out ∘ forward(*args)} for every array in ``wrt`` (arrays inside ``args``, moved in place
    and put back)."""
    upstream = [numpy.asarray(d_out, dtype=numpy.float64).ravel()]
    grads = {}
    for name, array in wrt.items():
        original = array.copy()

        def outputs_at(values, array=array):
            array[...] = values
            return [numpy.asarray(forward(*args), dtype=numpy.float64)]

        try:
            grads[name] = central_differences(outputs_at, original, upstream).reshape(array.shape)
        finally:
            array[...] = original
    return grads


def agrees(a, b, tolerance=TOLERANCE):
    """Element by element, whether a ≈ b: the gradient checker's pass rule (``gradcheck.compare``)
    with atol = t₀·max|b| (floor 1e-3) and rtol = t₁, i.e. |a − b| ≤ t₀·max|b| + t₁·|b|."""
    scale = max(float(numpy.abs(b).max(initial=0.0)), 1e-3)
    return compare(a, b, atol=tolerance[0] * scale, rtol=tolerance[1])[2]


@functools.lru_cache(maxsize=None)
def prepared(number):
    """The cases of exercise ``number`` with tinyformer's answer and the numeric one filled in
    (once per process: both are the same for every file checked)."""
    cases = _CASES[number](numpy.random.default_rng(1000 + number))
    forward = template_module(number).forward
    for case in cases:
        case.output, case.expected = _op_answer(number, case)
        args = copied(case.args)
        case.numeric = numeric_gradients(forward, args, differentiated(number, args), case.d_out)
        for name, expected in case.expected.items():
            if not agrees(case.numeric[name], expected).all():
                raise AssertionError(f"the study checker is wrong: for exercise {number}, case {case.name!r}, "
                                     f"tinyformer's {name} and central differences disagree")
    return cases
