"""What is wrong with a gradient, said as a teacher would: where, how much, and what it looks like.

For one gradient of a reader's backward, over every case where it could be compared
(``Finding``: the case, the right answer, the central differences, the reader's answer and
which elements are wrong), ``diagnose`` finds:

* **where**: in which cases (``Case.tags``: "only with a causal mask", "only when a row is fully
  masked", "in every case") and, within them, in which part of the array (``Case.regions``:
  "only in rows the causal mask hides keys from", "only at padding positions"), taking the
  smallest named region that holds every wrong element;
* **the largest error**: the case, the index, the right value (and the central differences'),
  the reader's;
* **what it looks like**: the exercise's typical mistakes first (``mistakes.recognise``), then
  the generic patterns: not finite; zero; a constant factor c fitted per case as
  c = ⟨got, right⟩ / ⟨right, right⟩ when got − c·right vanishes (a named factor such as √d_k, or
  −1, a sign; or one c for every case); the right answer transposed; the right values at other
  positions (the sorted values agree).
"""

import dataclasses

import numpy

from .mistakes import FACTOR_MEANINGS, recognise

__all__ = ["Finding", "Diagnosis", "diagnose", "wrong_elements", "TAG_PHRASES"]

# What a case tag means, after "only".
TAG_PHRASES = {  # in the order of preference when several tags describe the same cases
    "causal": "with a causal mask",
    "fully masked row": "when a row is fully masked",
    "padding": "with padding",
    "every target padding": "when every target is padding",
    "an all-padding row": "with an all-padding row",
    "length 1": "for length 1",
    "one feature": "with one feature",
    "one head": "with one head",
    "masked entries": "with masked (−inf) entries",
    "len_q ≠ len_k": "when len_q ≠ len_k",
    "leading axes": "with more than one leading axis",
    "no smoothing": "without smoothing",
    "pad id ≠ 0": "when the pad id is not 0",
    "batch 1": "for batch 1",
}
_PRIORITY = {tag: i for i, tag in enumerate(TAG_PHRASES)}


def wrong_elements(got, expected):
    """Elements of ``got`` that are not ``expected``: |got − right| > 1e-7·max|right| (floor 1e-3)
    + 1e-6·|right|, or not finite. Any float64 way of computing the right answer is well within."""
    scale = max(float(numpy.abs(expected).max(initial=0.0)), 1e-3)
    with numpy.errstate(invalid="ignore"):
        return ~(numpy.abs(got - expected) <= 1e-7 * scale + 1e-6 * numpy.abs(expected))


@dataclasses.dataclass
class Finding:
    """One case's comparison of one gradient."""

    case: object
    expected: numpy.ndarray
    numeric: numpy.ndarray
    got: numpy.ndarray

    def __post_init__(self):
        self.bad = wrong_elements(self.got, self.expected)


@dataclasses.dataclass
class Diagnosis:
    gradient: str
    right: bool
    where: str = ""
    largest: str = ""
    worst: float = 0.0
    looks_like: str = None


def _index(index):
    return "[" + ", ".join(str(i) for i in index) + "]"


def _largest(gradient, findings):
    """The worst element over all cases, as a sentence."""
    worst, where = -1.0, None
    for f in findings:
        with numpy.errstate(invalid="ignore"):
            error = numpy.where(numpy.isfinite(f.got), numpy.abs(f.got - f.expected), numpy.inf)
        index = numpy.unravel_index(int(numpy.argmax(error)), error.shape) if error.size else ()
        if error.size and error[index] > worst:
            worst, where = float(error[index]), (f, index)
    f, index = where
    return worst, _describe(gradient, worst, f, index)


def _describe(gradient, worst, f, index):
    size = f"largest error {worst:.3g}" if numpy.isfinite(worst) else "largest error: not finite,"
    return (f"{size} in case \"{f.case.name}\" at {gradient}{_index(index)}: expected "
            f"{f.expected[index]:.6g} (central differences {f.numeric[index]:.6g}), got {f.got[index]:.6g}")


def _where(gradient, findings, cases):
    """In which cases, and where within them, the gradient is wrong."""
    failing = [f for f in findings if f.bad.any()]
    passing = [f for f in findings if not f.bad.any()]
    if len(failing) == len(cases):
        text = f"in every case ({len(cases)} of {len(cases)})"
    else:
        common = set.intersection(*(set(f.case.tags) for f in failing)) & set(TAG_PHRASES)
        exact = [t for t in common if not any(t in f.case.tags for f in passing)]
        names = "; ".join(f.case.name for f in failing)
        spared = [t for t in set.intersection(*(set(f.case.tags) for f in passing)) & set(TAG_PHRASES)
                  if not any(t in f.case.tags for f in failing)] if passing else []
        if exact:
            tag = min(exact, key=lambda t: (sum(t in c.tags for c in cases), _PRIORITY[t]))
            text = f"only {TAG_PHRASES[tag]} ({len(failing)} of {len(cases)} cases: {names})"
        elif spared and len(passing) + len(failing) == len(cases):
            tag = min(spared, key=_PRIORITY.get)
            text = f"in every case but those {TAG_PHRASES[tag]} ({len(failing)} of {len(cases)})"
        else:
            text = f"in {len(failing)} of {len(cases)} cases ({names})"
    regions = None
    for f in failing:
        inside = {phrase for phrase, mask in f.case.regions.get(gradient, ()) if not (f.bad & ~mask).any()}
        regions = inside if regions is None else regions & inside
    sizes = {}
    for phrase in regions:
        masks = [dict(f.case.regions[gradient])[phrase] for f in failing]
        if all(m.all() for m in masks):
            continue  # the region is the whole array: it says nothing
        sizes[phrase] = sum(int(m.sum()) for m in masks)
    if sizes:
        text += f", there only in {min(sizes, key=lambda p: (sizes[p], p))}"
    bad_expected = numpy.concatenate([f.expected[f.bad] for f in failing])
    if bad_expected.size and (numpy.abs(bad_expected) <= 1e-12).all():
        text += ", where the right answer is 0"
    return text


def _named_factor(number, gradient, failing):
    """A constant factor per failing case, and its meaning when it is one of the cases' named factors."""
    factors = []
    for f in failing:
        right, got = f.expected.ravel(), f.got.ravel()
        norm = float(right @ right)
        if norm == 0 or not numpy.isfinite(got).all():
            return None
        c = float(got @ right) / norm
        if numpy.linalg.norm(got - c * right) > 1e-6 * numpy.sqrt(norm):
            return None
        factors.append(c)
    meanings = FACTOR_MEANINGS.get(number, {})
    for name, meaning in meanings.items():
        values = [f.case.factors.get(name) for f in failing]
        if all(v is not None and abs(c - v) <= 1e-6 * abs(v) for c, v in zip(factors, values)):
            shown = sorted({round(c, 4) for c in factors})
            return meaning + f" (×{', ×'.join(f'{c:g}' for c in shown)})"
    if all(abs(c + 1) <= 1e-6 for c in factors):
        return "−1 times the right answer: the wrong sign (a sign lost along the way)"
    if all(abs(c - factors[0]) <= 1e-6 * abs(factors[0]) for c in factors):
        return (f"the right answer times a constant, ×{factors[0]:.6g} in every case where it is wrong: a missing "
                "or extra constant factor")
    listed = ", ".join(f"×{c:.4g} in \"{f.case.name}\"" for c, f in zip(factors, failing))
    return f"proportional to the right answer, by a factor that changes from case to case ({listed})"


def _generic(number, gradient, findings):
    failing = [f for f in findings if f.bad.any()]
    if any(not numpy.isfinite(f.got).all() for f in failing):
        f = next(f for f in failing if not numpy.isfinite(f.got).all())
        index = tuple(int(i) for i in numpy.argwhere(~numpy.isfinite(f.got))[0])
        return (f"not finite ({f.got[index]}) in case \"{f.case.name}\" at {gradient}{_index(index)}: look for 0/0, "
                "log 0 or −inf − (−inf)")
    if all((f.got == 0).all() for f in failing):
        return "zero where it should not be: not computed, or masked away"
    found = _named_factor(number, gradient, failing)
    if found:
        return found
    square = all(f.got.ndim >= 2 and f.got.shape[-1] == f.got.shape[-2] for f in failing)
    if square and all(not wrong_elements(f.got, f.expected.swapaxes(-1, -2)).any() for f in failing):
        return ("the right numbers transposed: a missing (or extra) transpose — a gradient has the layout of what it "
                "is the gradient of")
    if all(not wrong_elements(numpy.sort(f.got, axis=None), numpy.sort(f.expected, axis=None)).any() for f in failing):
        return ("the right numbers at the wrong positions: a reshape, transpose or index that moves them (splitting "
                "or merging axes in another order?)")
    return None


def diagnose(number, gradient, findings, cases):
    """The ``Diagnosis`` of one gradient from its ``findings`` (the cases where it could be compared)
    out of ``cases`` (all the exercise's cases)."""
    if not any(f.bad.any() for f in findings):
        return Diagnosis(gradient, True)
    worst, largest = _largest(gradient, findings)
    return Diagnosis(gradient, False, where=_where(gradient, findings, cases), largest=largest, worst=worst,
                     looks_like=recognise(number, gradient, findings) or _generic(number, gradient, findings))
