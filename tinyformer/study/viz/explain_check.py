"""The explain page's gradient check: five-point differences of the sentence's loss, in float64,
along a sample of attention probabilities P, scores S, one head's gate and its W_Q, W_K, W_V
elements, against the gradients of the backward pass.

The loss depends on a head's P only through its output O = P·V (dropout is off), so moving
P_ij by h is moving row i of O by h·V_j, and moving S_ij by h is moving row i of O by
(softmax(S_i + h e_j) − P_i)·V; the probed copy adds such offsets to O (the attention probe's ``offset``).
A head's gate ξ scales its output (O → ξ·O): dL/dξ at ξ = 1 is Σ P∘dL/dP, the head's
sensitivity. Parameters are moved in place and put back. The pass rule and its relative
tolerance are ``tinyformer.engine.gradcheck``'s; the differences are its five-point ones, with a
step and an absolute tolerance of their own (``STEP``, ``check_atol``).
"""

import numpy

from ...engine.gradcheck import ATOL, RTOL, compare, five_point_difference
from .probe import attention_modules, sentence_loss

STEP = 1e-5
"""The five-point differences' step h: their error is O(h⁴), their rounding noise about
``NOISE``·|L|, and a step this small rarely crosses a ReLU's kink (at 1e-4 a trained
model's check did, and one of its rows was off by 4e-6)."""
NOISE = 1e-10
"""The rounding noise of the differences, relative to |L|: at most 2e-10·|L| over the rows of the
test models (untrained and trained), against 2e-9·|L| for gradcheck's two-point ones at ε = 1e-6."""
NOISE_MARGIN = 10

__all__ = ["check_gradients", "valid_entries"]


def valid_entries(kind, rows, cols):
    """A (rows, cols) boolean array: the entries of P that are not masked (causal for "dec")."""
    if kind == "dec":
        return numpy.tril(numpy.ones((rows, cols), dtype=bool))
    return numpy.ones((rows, cols), dtype=bool)


def _softmax(scores):
    e = numpy.exp(scores - scores.max())
    return e / e.sum()


def _derivative(copy, batch, move, step=STEP):
    """dL/dx of the sentence's loss by five-point differences, where ``move(offset)`` moves x by
    ``offset`` and returns what puts it back."""
    def loss_at(offset):
        undo = move(offset)
        try:
            return sentence_loss(copy, *batch)
        finally:
            undo()
    return five_point_difference(loss_at, step)


def _moving_output(module, offset_for):
    """A ``move`` that adds ``offset_for(step)`` to the module's heads' output O."""
    def move(step):
        module.probe.offset = offset_for(step)
        return lambda: setattr(module.probe, "offset", None)
    return move


def _moving_parameter(parameter, index):
    def move(step):
        original = parameter.data[index]
        parameter.data[index] = original + step
        return lambda: parameter.data.__setitem__(index, original)
    return move


def _row_offset(shape, head, row, vector):
    """An array of O's shape (1, heads, len_q, d_k), zero but for ``vector`` at (head, row)."""
    offset = numpy.zeros(shape)
    offset[0, head, row] = vector
    return offset


def _picks(magnitude, valid, rng):
    """The valid entry of largest |gradient| and a random other valid one (where there is one)."""
    flat = numpy.where(valid.ravel(), numpy.abs(magnitude).ravel(), -1.0)
    largest = int(numpy.argmax(flat))
    others = numpy.flatnonzero(valid.ravel())
    others = others[others != largest]
    picked = [largest] + ([int(rng.choice(others))] if others.size else [])
    return [tuple(int(i) for i in numpy.unravel_index(p, magnitude.shape)) for p in picked]


def check_atol(loss):
    """The check's absolute tolerance: ``NOISE_MARGIN`` times the rounding noise of the
    differences of L in float64 (``NOISE``·|L|, |L| taken as at least 1), at most gradcheck's ATOL.

    gradcheck's own 1e-5 hides a wrong backward wherever the gradients are small: a trained
    model's checked entries are often 1e-4 to 1e-7 (W_Q and W_K of a head whose softmax
    saturates), where dP·1.01 is off by 1e-6 to 1e-9 only.
    """
    return min(ATOL, NOISE_MARGIN * NOISE * max(1.0, abs(float(loss))))


def check_gradients(copy, batch, total, sensitivity, check_head, parameter_grads, seed=0):
    """The rows of the gradient-check panel and the verdict, as a JSON-ready dict.

    ``batch`` is (src, tgt_in, tgt_out) of one pair; ``total`` the probe's pass over it (whose
    gradients are the analytic side), with ``dS`` added per kind; ``sensitivity`` {kind: (layers,
    heads)}; ``check_head`` (kind, layer, head) counted from 0, whose gate and W_Q, W_K, W_V rows
    are checked; ``parameter_grads`` {"W_Q" | "W_K" | "W_V": that layer's weight gradient}.
    For each kind, the head of largest |sensitivity| gives two P and two S entries: the
    largest |gradient| and a random valid one.
    """
    rng = numpy.random.default_rng(seed)
    modules = attention_modules(copy)
    rows = []

    def add(what, kind, layer, head, index, analytic, move):
        rows.append({"what": what, "kind": kind, "layer": int(layer) + 1, "head": int(head) + 1,
                     "index": [int(i) + 1 for i in index], "analytic": float(analytic),
                     "numeric": float(_derivative(copy, batch, move))})

    for kind, module_list in modules.items():
        layer, head = numpy.unravel_index(int(numpy.argmax(numpy.abs(sensitivity[kind]))), sensitivity[kind].shape)
        module, found = module_list[layer], total[kind]
        shape = (1,) + found["O"].shape[2:]
        probs, values = found["P"][layer, 0, head], found["V"][layer, 0, head]
        queries, keys = found["Q"][layer, 0, head], found["K"][layer, 0, head]
        valid = valid_entries(kind, *probs.shape)
        for i, j in _picks(found["dP"][layer, 0, head], valid, rng):
            add("P", kind, layer, head, (i, j), found["dP"][layer, 0, head, i, j],
                _moving_output(module, lambda step, i=i, j=j: _row_offset(shape, head, i, step * values[j])))
        for i, j in _picks(found["dS"][layer, 0, head], valid, rng):
            scores = queries[i] @ keys.T / numpy.sqrt(queries.shape[-1])

            def moved_row(step, i=i, j=j, scores=scores):
                moved = scores.copy()
                moved[j] += step
                row_probs = numpy.zeros_like(moved)
                row_probs[valid[i]] = _softmax(moved[valid[i]])
                return _row_offset(shape, head, i, (row_probs - probs[i]) @ values)

            add("S", kind, layer, head, (i, j), found["dS"][layer, 0, head, i, j], _moving_output(module, moved_row))
    kind, layer, head = check_head
    module, found = modules[kind][layer], total[kind]
    gate = numpy.zeros((1,) + found["O"].shape[2:])
    gate[0, head] = found["O"][layer, 0, head]
    add("gate", kind, layer, head, (), sensitivity[kind][layer, head], _moving_output(module, lambda step: step * gate))
    d_k = module.d_k
    for name, linear in (("W_Q", module.w_q), ("W_K", module.w_k), ("W_V", module.w_v)):
        block = parameter_grads[name][head * d_k:(head + 1) * d_k]
        for r, c in _picks(block, numpy.ones(block.shape, dtype=bool), rng):
            index = (head * d_k + r, c)
            add(name, kind, layer, head, index, parameter_grads[name][index], _moving_parameter(linear.weight, index))
    atol = check_atol(total["loss"])
    absolute, relative, passed = compare([r["analytic"] for r in rows], [r["numeric"] for r in rows], atol=atol)
    for row, a, e, ok in zip(rows, absolute, relative, passed):
        row.update(abs_error=float(a), rel_error=float(e), passed=bool(ok))
    return {"eps": STEP, "atol": atol, "rtol": RTOL,
            "head": {"kind": kind, "layer": int(layer) + 1, "head": int(head) + 1},
            "rows": rows, "passed": bool(numpy.all(passed))}
