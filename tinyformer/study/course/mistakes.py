"""The typical mistakes of each exercise, and how to recognise them in a wrong gradient.

Two kinds of evidence, both read off the reader's numbers against the right ones:

* **error patterns** — what the difference between the reader's gradient and the right one looks
  like, whatever code produced it: for softmax, (got − right)/p constant along each row means the
  number subtracted from each row is wrong; for cross entropy, padding rows that are not zero,
  the same value in every column, are the smoothing mass ε/V given to padding. The generic
  patterns (a constant factor, a sign, a transpose, moved values, the parts of the input where
  the error lives) are in ``diagnosis``; the ``factors`` named here give a constant factor its
  meaning (√d_k in attention: the 1/√d_k forgotten);
* **suspects** — the gradient a typical mistake produces, computed from the case's inputs (a
  missing transpose, the mask applied to P instead of S, the wrong row sum, a path of a reused
  input not added): a reader's gradient that equals a suspect's in every case is named by it.

``recognise(number, gradient, findings)`` returns the first explanation that fits, or None.
"""

import math

import numpy

from .cases import agrees
from .exercises import template_module

__all__ = ["recognise", "FACTOR_MEANINGS"]


# ---------------------------------------------------------------------------- named constant factors
_SCALE_MEANING = {
    "√d_k": "√d_k times the right answer: forgetting the 1/√d_k — S = QKᵀ/√d_k, so the 1/√d_k multiplies "
            "dS on its way to dQ = dS·K/√d_k and dK = dSᵀ·Q/√d_k",
    "1/√d_k": "the right answer divided by √d_k: the 1/√d_k applied twice (or 1/d_k in its place)",
}
FACTOR_MEANINGS = {
    3: {"n": "n (the number of features) times the right answer: a sum where a mean belongs",
        "1/n": "the right answer divided by n (the number of features): a mean where a sum belongs"},
    4: _SCALE_MEANING,
    5: {"1/d_loss": "the right answer divided by d_loss: the upstream gradient d_loss is not multiplied in",
        "N": "N times the right answer: the 1/N of the mean over the N non-pad positions is missing",
        "N/(every position)": "divided by every position, padding included: the mean is over the N positions "
                              "whose target is not pad_id"},
    6: _SCALE_MEANING,
}


# ---------------------------------------------------------------------------- suspects
def _chain_rule_suspects(case):
    x, w, b = case.args
    h = numpy.tanh(x @ w + b)
    dy = numpy.broadcast_to(case.d_out[:, None], x.shape)
    dz = dy * x * (1 - h ** 2)
    wrong_tanh = dy * x * (1 - h)
    accumulate = ("x is used twice, in xW and in h ∘ x, and its gradient is the sum of what both paths send "
                  "back (dx = dz·Wᵀ + dy ∘ h)")
    return [
        (f"gradients not accumulated for x: dx is only the path through z = xW + b (dz·Wᵀ); {accumulate}",
         {"dx": dz @ w.T}),
        (f"gradients not accumulated for x: dx is only the path through y = h ∘ x (dy ∘ h); {accumulate}",
         {"dx": dy * h}),
        ("a missing transpose: dz·W where the path through z = xW sends dz·Wᵀ", {"dx": dz @ w + dy * h}),
        ("tanh's derivative taken as 1 − h; it is 1 − h²",
         {"dx": wrong_tanh @ w.T + dy * h, "dW": x.T @ wrong_tanh, "db": wrong_tanh.sum(axis=0)}),
    ]


_ROW_SUM = "softmax's backward is dx = p ∘ (dp − Σⱼ dpⱼ pⱼ), one sum per row, along the last axis"


def _softmax_suspects(case):
    (x,) = case.args
    dp = case.d_out
    p = template_module(2).forward(x)
    with numpy.errstate(invalid="ignore"):
        rowsum = (dp * p).sum(axis=-1)
        found = [(f"the wrong row sum in softmax's backward: Σ dp where it is Σ dp·p; {_ROW_SUM}",
                  {"dx": p * (dp - dp.sum(axis=-1, keepdims=True))})]
        for axis in range(x.ndim - 1):
            found.append((f"the wrong row sum in softmax's backward: summed over the wrong axis (across the rows) "
                          f"instead of along each row; {_ROW_SUM}",
                          {"dx": p * (dp - (dp * p).sum(axis=axis, keepdims=True))}))
        if x.ndim > 1 and x.shape[-1] == x.shape[-2]:
            found.append((f"the wrong row sum in softmax's backward: each row's sum lined up with the wrong axis "
                          f"(keepdims=True forgotten, so row i's sum lands in column i); {_ROW_SUM}",
                          {"dx": p * (dp - rowsum[..., None, :])}))
        found += [(f"no row sum subtracted: dx = p ∘ dp is only the diagonal of softmax's Jacobian; {_ROW_SUM}",
                   {"dx": p * dp}),
                  (f"the factor p in front is missing; {_ROW_SUM}", {"dx": dp - rowsum[..., None]})]
    return found


def _layer_norm_suspects(case):
    x, gain, bias = case.args
    dy, eps = case.d_out, template_module(3).EPS
    rows = tuple(range(x.ndim - 1))
    centred = x - x.mean(axis=-1, keepdims=True)
    r = 1 / numpy.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = centred * r

    def dx(d, with_mean=True, with_var=True):
        return r * (d - (d.mean(axis=-1, keepdims=True) if with_mean else 0)
                    - (xhat * (d * xhat).mean(axis=-1, keepdims=True) if with_var else 0))

    return [
        ("the path through σ² is missing: dx lacks the − x̂ ∘ mean(dx̂ ∘ x̂) term",
         {"dx": dx(dy * gain, with_var=False)}),
        ("the path through μ is missing: dx lacks the − mean(dx̂) term", {"dx": dx(dy * gain, with_mean=False)}),
        ("the gain is left out of dx: x̂'s gradient is dx̂ = dy ∘ gain", {"dx": dx(dy)}),
        ("the factor r = 1/√(σ² + ε) is missing from dx", {"dx": dx(dy * gain) / r}),
        ("dgain uses x where x̂ belongs: y = x̂ ∘ gain + bias, so dgain = Σ dy ∘ x̂",
         {"dgain": (dy * x).sum(axis=rows)}),
    ]


def _attention_gradients(q, k, v, p, d_out, scale, rowsum=None):
    """(dQ, dK, dV, dS) of O = P V, S = QKᵀ·scale, from P (a wrong P gives a mistake's gradients)."""
    dp = d_out @ v.swapaxes(-1, -2)
    ds = p * (dp - ((dp * p).sum(axis=-1, keepdims=True) if rowsum is None else rowsum(dp, p)))
    return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, p.swapaxes(-1, -2) @ d_out, ds


def _attention_suspects(case):
    template = template_module(4)
    q, k, v, mask, causal = case.args
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    len_q, len_k = q.shape[-2], k.shape[-2]
    keep = template.keep_mask(mask, causal, len_q, len_k)
    p = template.softmax(numpy.where(keep, s, -numpy.inf))
    found = []

    def add(description, p_used=p, rowsum=None, only=("dQ", "dK", "dV")):
        with numpy.errstate(invalid="ignore", divide="ignore"):
            grads = dict(zip(("dQ", "dK", "dV"), _attention_gradients(q, k, v, p_used, case.d_out, scale, rowsum)))
        found.append((description, {name: grads[name] for name in only}))

    add("the mask applied to P instead of S: softmax over every key, then the hidden keys' P set to 0 (the rows "
        "no longer sum to 1); the forward hides them in S, at −∞, before softmax",
        p_used=template.softmax(s) * keep)
    add("hidden scores set to 0 instead of −∞: a hidden key still gets exp(0 − max) of the probability; the "
        "forward puts them at −∞", p_used=template.softmax(numpy.where(keep, s, 0.0)))
    if causal:
        add("the causal mask left out of backward: P recomputed with the padding mask only",
            p_used=template.softmax(numpy.where(template.keep_mask(mask, False, len_q, len_k), s, -numpy.inf)))
    if mask is not None:
        add("the padding mask left out of backward: P recomputed without it",
            p_used=template.softmax(numpy.where(template.keep_mask(None, causal, len_q, len_k), s, -numpy.inf)))
    add("the wrong row sum in softmax's backward: dS = P ∘ (dP − Σ dP), where it is Σ dP·P (one sum per row)",
        rowsum=lambda dp, p: dp.sum(axis=-1, keepdims=True), only=("dQ", "dK"))
    add("the wrong row sum in softmax's backward: summed over the queries (axis −2) instead of along each "
        "row; dS = P ∘ (dP − Σⱼ dPᵢⱼ Pᵢⱼ)", rowsum=lambda dp, p: (dp * p).sum(axis=-2, keepdims=True),
        only=("dQ", "dK"))
    dq, dk, dv, ds = _attention_gradients(q, k, v, p, case.d_out, scale)
    if len_q == len_k:
        found += [("a missing transpose: dV = P·dO, where it is Pᵀ·dO (V's rows are keys, P's columns are)",
                   {"dV": p @ case.d_out}),
                  ("a missing transpose: dK = dS·Q/√d_k, where it is dSᵀ·Q/√d_k (K's rows are keys, dS's "
                   "columns are)", {"dK": ds @ q * scale}),
                  ("an extra transpose: dQ = dSᵀ·K/√d_k, where it is dS·K/√d_k",
                   {"dQ": ds.swapaxes(-1, -2) @ k * scale})]
    return found


def _cross_entropy_suspects(case):
    logits, target, smoothing, pad_id = case.args
    vocab = logits.shape[-1]
    template = template_module(5)
    p = numpy.exp(template.log_softmax(logits))
    kept = (target != pad_id)[..., None]
    count = max(int(kept.sum()), 1)
    onehot = numpy.zeros_like(p)
    numpy.put_along_axis(onehot, target[..., None], 1.0, axis=-1)
    found = []
    if vocab > 2 and smoothing:
        spread = numpy.full_like(p, smoothing / (vocab - 2))
        spread[..., pad_id] = 0
        q = numpy.where(onehot == 1, 1 - smoothing, spread)
        found.append(("ε spread the Annotated Transformer's way (ε/(V − 2) over the classes but the target and the "
                      "pad id); tinyformer's q = (1 − ε)·onehot + ε/V gives ε/V to every class, the target and "
                      "the pad id included, as PyTorch does", {"dlogits": case.d_out * kept * (p - q) / count}))
        q = (1 - smoothing) * onehot + (1 - onehot) * smoothing / (vocab - 1)
        found.append(("ε spread over the V − 1 other classes; tinyformer's q = (1 − ε)·onehot + ε/V gives ε/V "
                      "to every class, the target included", {"dlogits": case.d_out * kept * (p - q) / count}))
    return found


def _multi_head_gradients(case, unsplit_by_reshape=False, dx_by_transpose=False):
    """Exercise 6's gradients, right or with one of two mistakes: the heads' gradient split back
    by a reshape alone (no transpose), or a Linear's dx = dy·Wᵀ."""
    template = template_module(6)
    query, key, value, params, heads, mask, causal = case.args
    x = {"q": query, "k": key, "v": value}
    proj = {n: template.split_heads(template.linear(x[n], params["w_" + n], params["b_" + n]), heads) for n in "qkv"}
    scale = 1 / math.sqrt(proj["q"].shape[-1])
    s = proj["q"] @ proj["k"].swapaxes(-1, -2) * scale
    p = template.softmax(numpy.where(template.keep_mask(mask, causal, s.shape[-2], s.shape[-1]), s, -numpy.inf))
    merged = template.merge_heads(p @ proj["v"])
    grads = {}

    def linear_backward(inputs, name, dy):
        grads["w_" + name] = dy.reshape(-1, dy.shape[-1]).T @ inputs.reshape(-1, inputs.shape[-1])
        grads["b_" + name] = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
        return dy @ (params["w_" + name].T if dx_by_transpose else params["w_" + name])

    def unsplit(d):  # (batch, len, d_model) -> (batch, heads, len, d_k), the backward of merge_heads
        if unsplit_by_reshape:
            return d.reshape(d.shape[0], heads, d.shape[1], -1)
        return template.split_heads(d, heads)

    d_heads = unsplit(linear_backward(merged, "o", case.d_out))
    dq, dk, dv, _ = _attention_gradients(proj["q"], proj["k"], proj["v"], p, d_heads, scale)
    for name, d in zip("qkv", (dq, dk, dv)):
        grads[{"q": "query", "k": "key", "v": "value"}[name]] = linear_backward(x[name], name, template.merge_heads(d))
    names = dict(zip(("query", "key", "value", "w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o"),
                     ("dquery", "dkey", "dvalue", "dW_Q", "db_Q", "dW_K", "db_K", "dW_V", "db_V", "dW_O", "db_O")))
    return {names[k]: v for k, v in grads.items()}


def _multi_head_suspects(case):
    with numpy.errstate(invalid="ignore", divide="ignore"):
        return [("the heads' gradient split back by a reshape alone: merge_heads moved the heads axis before "
                 "reshaping, so its backward must reshape to (batch, len, heads, d_k) and then move the axis back",
                 _multi_head_gradients(case, unsplit_by_reshape=True)),
                ("a Linear's dx taken as dy·Wᵀ: y = x Wᵀ + b gives dx = dy·W (W is (out, in))",
                 _multi_head_gradients(case, dx_by_transpose=True))]


_SUSPECTS = {1: _chain_rule_suspects, 2: _softmax_suspects, 3: _layer_norm_suspects, 4: _attention_suspects,
             5: _cross_entropy_suspects, 6: _multi_head_suspects}


def _suspected(number, gradient, findings):
    """The first suspect whose gradient the reader's equals in every case where the suspect is
    defined, the reader's being right in the others (a suspect may have several variants per case,
    e.g. one per wrong axis, under one description)."""
    if number not in _SUSPECTS:
        return None
    per_case, order = [], {}
    for f in findings:
        variants = {}
        for description, grads in _SUSPECTS[number](f.case):
            variants.setdefault(description, []).append(grads)
            order.setdefault(description, None)
        per_case.append((f, variants))
    for description in order:
        fits, hit = True, False
        for f, variants in per_case:
            options = [grads[gradient] for grads in variants.get(description, []) if gradient in grads]
            if not options:
                fits = not f.bad.any()
            else:
                fits = any(o.shape == f.got.shape and bool(agrees(f.got, o).all()) for o in options)
                hit |= bool(f.bad.any())
            if not fits:
                break
        if fits and hit:
            return description
    return None


# ---------------------------------------------------------------------------- error patterns
def _softmax_row_pattern(number, gradient, findings):
    """Softmax: (got − right)/p the same along every row — the number subtracted per row is wrong."""
    if number != 2:
        return None
    for f in findings:
        if not f.bad.any():
            continue
        p = template_module(2).forward(f.case.args[0])
        seen = p > 1e-9
        if not numpy.isfinite(f.got).all() or not numpy.array_equal(f.bad & ~seen, numpy.zeros_like(f.bad)):
            return None
        per_row = numpy.where(seen, (f.got - f.expected) / numpy.where(seen, p, 1.0), numpy.nan)
        spread = numpy.nanmax(per_row, axis=-1) - numpy.nanmin(per_row, axis=-1)
        if not (spread <= 1e-6 * (1 + numpy.nanmax(numpy.abs(per_row), axis=-1))).all():
            return None
    return ("the wrong row sum in softmax's backward: your dx differs from the right one by p times one number "
            f"per row, so the number subtracted from each row of dp is wrong; {_ROW_SUM}")


def _padding_pattern(number, gradient, findings):
    """Cross entropy: gradient at padding positions, where it must be 0 — which kind of it."""
    if number != 5:
        return None
    uniform = full = True
    wrong = [f for f in findings if f.bad.any()]
    for f in wrong:
        logits, target, smoothing, pad_id = f.case.args
        padded = target == pad_id
        if f.bad[~padded].any() or not padded.any():
            return None
        rows = f.got[padded]
        uniform &= bool(smoothing) and bool((numpy.abs(rows - rows[:, :1]) <= 1e-9 * (1 + numpy.abs(rows))).all())
        full &= bool((numpy.abs(rows.sum(axis=-1)) <= 1e-9).all())
    if not wrong:
        return None
    if uniform:
        return ("smoothing mass given to padding: every padding position gets the same value in every column, the "
                "uniform ε/V part of q, where a position whose target is pad_id must get exactly 0")
    if full:
        return ("padding positions are not ignored: they get (p − q)-shaped gradients, where a position whose target "
                "is pad_id must get exactly 0 (and not count in N)")
    return "padding positions get a gradient: a position whose target is pad_id must get exactly 0"


def _masked_row_nan(number, gradient, findings):
    """Attention: nan only in cases with a query that sees no key."""
    if number not in (4, 6):
        return None
    wrong = [f for f in findings if f.bad.any()]
    if wrong and all("fully masked row" in f.case.tags and not numpy.isfinite(f.got).all() for f in wrong):
        return ("nan from a query that sees no key: its row of S is −∞ everywhere and softmax divides 0 by 0; "
                "tinyformer gives such a row P = 0, so it has no output and no gradient (the forward's softmax "
                "shows how)")
    return None


_PATTERNS = (_masked_row_nan, _padding_pattern, _softmax_row_pattern)


def recognise(number, gradient, findings):
    """An explanation of the reader's wrong ``gradient`` from the exercise's typical mistakes, or None:
    a suspect first (it names the mistake exactly), then the exercise's error patterns. ``findings``
    hold every case where the reader's gradient could be compared (``diagnosis.Finding``)."""
    found = _suspected(number, gradient, findings)
    for pattern in _PATTERNS:
        found = found or pattern(number, gradient, findings)
    return found
