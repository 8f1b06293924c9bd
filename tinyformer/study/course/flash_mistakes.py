"""The typical mistakes of exercises 7 and 8, recognised in wrong answers and told with the tile
and row where they show.

A *suspect* is the answer a mistake gives (``flash_reference``'s recurrences with one switch
off): a running sum (or accumulator) not rescaled when the max changes; hidden keys let in (the
key length or the causal mask left out, a finite fill such as −1e9 or 0 in place of −∞, P not
masked in backward); D = rowsum(dO) in place of rowsum(dO ∘ O). A reader's answer equal to a
suspect's in every case (where the suspect differs from the right one) is named by it. Two
mistakes show only as numbers that are not finite, in the "large logits" case alone: the max not
subtracted (exp(s) of s ~ 1,000) and P taken as exp(S)·exp(−lse).

``recognise_tiled(number, findings)`` returns one sentence (or None) for the reader's outputs,
``findings`` being {output name: [(case, right, got)]}.
"""

import numpy

from .cases import agrees
from .flash_reference import keep, tiled_backward, tiled_forward

__all__ = ["recognise_tiled", "first_wrong_row", "OVERFLOW"]

OVERFLOW = float(numpy.log(numpy.finfo(numpy.float64).max))  # exp(s) is inf past this (709.78)


def first_wrong_row(case, name, got, right):
    """(b, row) of the worst wrong element of output ``name`` (a query row; a key row for dK, dV)."""
    with numpy.errstate(invalid="ignore"):
        error = numpy.where(numpy.isfinite(got) | ~numpy.isfinite(right), numpy.abs(got - right), numpy.inf)
    error = numpy.where(numpy.isnan(error), numpy.inf, error)
    index = numpy.unravel_index(int(numpy.argmax(error)), error.shape)
    return int(index[0]), int(index[1])


def _keys(case, tile):
    block = case.factors["block"]
    return f"key tile {tile} (keys {tile * block}–{min((tile + 1) * block, case.args[1].shape[1]) - 1})"


def _at(case, b, row):
    return f"in case \"{case.name}\", row {row} of sequence {b}"


def _length(case, b):
    lengths, len_k = case.args[3], case.args[1].shape[1]
    return len_k if lengths is None else max(0, min(int(lengths[b]), len_k))


# ---------------------------------------------------------------------------- where each mistake shows
def _max_rose(case, b, row):
    q, k, v, lengths, causal = case.args
    trace = []
    tiled_forward(q, k, v, lengths, causal, case.factors["block"], trace=trace)
    steps = sorted((t, m) for bb, r, t, m, _ in trace if bb == b and r == row)
    for (_, before), (tile, after) in zip(steps, steps[1:]):
        if numpy.isfinite(before) and after > before:
            return (f"the running sum not rescaled when the max changes: {_at(case, b, row)}, the max rose at "
                    f"{_keys(case, tile)} from {before:.4g} to {after:.4g}, so what was summed before it (at "
                    f"exp(s − {before:.4g})) must be multiplied by exp(m − m_new) = {numpy.exp(before - after):.3g}, "
                    "l and acc alike")
    return None


def _overflow(case, b, row, how):
    q, k = case.args[0], case.args[1]
    scores = q[b, row] @ k[b].T / numpy.sqrt(q.shape[-1])
    big = numpy.flatnonzero(scores > OVERFLOW)
    where = (f" — {_at(case, b, row)}, {_keys(case, int(big[0]) // case.factors['block'])} holds a score of "
             f"{scores[big[0]]:.4g}, whose exp is inf in float64") if big.size else f" ({_at(case, b, row)})"
    return how + where


def _hidden_tile(case, b, row, why, name="O"):
    """``why``, told at query ``row`` (the tile of its first hidden key) or, for dK and dV, at key
    ``row`` (the first query it is hidden from)."""
    q, k, v, lengths, causal = case.args
    len_q, len_k, block = q.shape[1], k.shape[1], case.factors["block"]
    seen = keep(len_q, len_k, _length(case, b), causal)
    if name in ("dK", "dV"):
        hidden = numpy.flatnonzero(~seen[:, row])
        where = (f"in case \"{case.name}\", key {row} of sequence {b} ({_keys(case, row // block)}) is hidden from "
                 f"query {hidden[0]} (query tile {hidden[0] // block}) and more, yet gets a gradient from them"
                 if hidden.size else _at(case, b, row))
        return f"{why}: {where}; a hidden key gets P = 0 exactly"
    hidden = numpy.flatnonzero(~seen[min(row, len_q - 1)])
    tile = f"{_keys(case, int(hidden[0]) // block)} holds keys it must not see" if hidden.size else "its tiles"
    return f"{why}: {_at(case, b, row)}, {tile}; a hidden key gets P = 0 exactly (its score is −∞)"


# ---------------------------------------------------------------------------- the suspects
def _leak(case, why):
    """A locator: ``why`` told at the tile of the first hidden key of the wrong row."""
    return lambda b, r, name: _hidden_tile(case, b, r, why, name)


def _forward_suspects(case):
    q, k, v, lengths, causal = case.args
    block = case.factors["block"]

    def run(**switch):
        return dict(zip(("O", "lse"), tiled_forward(q, k, v, lengths, causal, block, **switch)))

    def rose(b, r, name):
        return _max_rose(case, b, r)

    found = {"sum": (rose, run(rescale_sum=False)), "acc": (rose, run(rescale_acc=False)),
             "both": (rose, run(rescale_sum=False, rescale_acc=False))}
    if lengths is not None:
        found["lengths"] = (_leak(case, "padded keys leak into the sum: the key length is left out"),
                            run(lengths_used=False))
    if causal:
        found["causal"] = (_leak(case, "keys the causal mask hides leak into the sum: the causal mask is left out"),
                           run(causal_used=False))
    for fill in (-1e9, 0.0):
        for stop in (True, False):
            found[fill, stop] = (_leak(case, f"masked keys leak into the sum: a hidden key's score is set to {fill:g} "
                                             "instead of −∞, so it gets exp(score − m) of the weight (a row that sees "
                                             "no key at all gets the mean of V, not 0)"),
                                 run(fill=fill, stop_early=stop))
    return found


def _backward_suspects(case):
    q, k, v, lengths, causal = case.args
    block = case.factors["block"]
    o, lse = case.output

    def run(**switch):
        return dict(zip(("dQ", "dK", "dV"), tiled_backward(q, k, v, o, lse, case.d_out, lengths, causal, block,
                                                           **switch)))

    def delta(b, r, name):
        return f"D = rowsum(dO) where it is rowsum(dO ∘ O) = Σⱼ Pᵢⱼ dPᵢⱼ ({_at(case, b, r)})"

    found = {"p": (_leak(case, "masked keys leak into the backward: P = exp(S − lse) is not masked"),
                   run(p_masked=False)),
             "delta": (delta, run(delta_from="d_out"))}
    if lengths is not None:
        found["lengths"] = (_leak(case, "padded keys leak into the backward: the key length is left out"),
                            run(lengths_used=False))
    if causal:
        found["causal"] = (_leak(case, "keys the causal mask hides leak into the backward: the causal mask is left "
                                       "out"), run(causal_used=False))
    return found


def _matches(got, suspect):
    finite = numpy.isfinite(suspect)
    return (got.shape == suspect.shape and numpy.array_equal(numpy.isfinite(got), finite)
            and bool(agrees(got[finite], suspect[finite]).all()))


def _suspected(number, findings):
    """The first suspect every output of the reader's equals in every case, and where it shows."""
    by_case = {}
    for name, rows in findings.items():
        for case, right, got in rows:
            by_case.setdefault(id(case), (case, {}))[1][name] = (right, got)
    per_case = [(case, outputs, (_forward_suspects if number == 7 else _backward_suspects)(case))
                for case, outputs in by_case.values()]
    order = list(dict.fromkeys(key for _, _, suspects in per_case for key in suspects))
    for key in order:
        shows, fits = None, True
        for case, outputs, suspects in per_case:
            if key not in suspects:  # the mistake makes no difference here: the reader must be right
                fits = all(_matches(got, right) for right, got in outputs.values())
            else:
                locate, suspect = suspects[key]
                for name, (right, got) in outputs.items():
                    fits = fits and _matches(got, suspect[name])
                    if fits and shows is None and not _matches(got, right):
                        shows = locate(*first_wrong_row(case, name, got, right), name)
            if not fits:
                break
        if fits and shows:
            return shows
    return None


def _overflowed(number, findings):
    """Not finite in the large-logits case, and only there: the max not subtracted."""
    wrong = [(name, case, right, got) for name, rows in findings.items() for case, right, got in rows
             if not _matches(got, right)]
    if not wrong or not all("large logits" in case.tags for _, case, _, _ in wrong):
        return None
    name, case, right, got = next(((n, c, r, g) for n, c, r, g in wrong if not numpy.isfinite(g).all()),
                                  (None, None, None, None))
    if name is None:
        return None
    index = numpy.argwhere(~numpy.isfinite(got))[0]
    b, row = int(index[0]), int(index[1])
    if number == 7:
        return _overflow(case, b, row, "the max not subtracted: P = exp(S) overflows at large scores; it must be "
                                       "P_t = exp(S_t − m_new), which never exceeds 1")
    if name == "dQ":
        return _overflow(case, b, row, "P taken as exp(S)·exp(−lse): exp(S) overflows at large scores where "
                                       "exp(S − lse) ≤ 1 does not")
    return (f"P taken as exp(S)·exp(−lse): exp(S) overflows at large scores where exp(S − lse) ≤ 1 does not "
            f"({name}[{b}, {row}] in case \"{case.name}\" is {got[b, row][~numpy.isfinite(got[b, row])][0]})")


def recognise_tiled(number, findings):
    """One sentence naming the mistake behind the reader's wrong outputs, with where it shows; or None."""
    return _suspected(number, findings) or _overflowed(number, findings)
