"""``tinyformer study check`` of exercises 7 and 8: the reader's tiled forward (O, lse) or tiled
backward (dQ, dK, dV), case by case, then what right values cannot show.

1. Values: every case of ``flash_cases`` (padding, causal, a sequence with no key, scores of
   ~1,000, tile sizes that do not divide the length, ...) against the float64 answers, element by
   element (``diagnosis.wrong_elements``; equal infinities agree: lse = −∞ where a row sees no
   key). Wrong outputs are told as exercises 1–6 tell them — where, the largest error, and what
   it looks like (``flash_mistakes``: a sum not rescaled, the max not subtracted, hidden keys
   leaking, D = rowsum(dO), with the tile and row where it shows).
2. Once the values are right: the memory the reader's function takes at 3,072 tokens, its line
   named (``flash_probes.peak_memory``; an S or P whole fails); the score tiles computed wholly
   above the causal diagonal, counted (``flash_probes.score_tiles``; any fails); and for the
   backward, whether it reads O (else D came from Σ P ∘ dP: right, said) and lse (else the
   softmax's normaliser was recomputed: right, said).
"""

import dataclasses
from pathlib import Path

import numpy

from .reader_code import Unusable as _Unusable, first_line as _first_line, raised as _raised
from .diagnosis import wrong_elements
from .flash_cases import arguments, prepared_tiled
from .flash_mistakes import first_wrong_row, recognise_tiled
from .flash_probes import MEMORY_LENGTH, peak_memory, score_tiles, wasted
from .flash_reference import tiled_forward

__all__ = ["TiledReport", "check_tiled", "wrong"]

_MIB = 1 << 20


def wrong(got, right):
    """Elements of ``got`` that are not ``right``: ``diagnosis.wrong_elements`` on the finite
    answers, and any element where one is infinite and the other is not the same infinity."""
    finite = numpy.isfinite(right)
    bad = numpy.zeros(right.shape, dtype=bool)
    if finite.any():
        bad[finite] = wrong_elements(got[finite], right[finite])
    bad[~finite] = got[~finite] != right[~finite]
    return bad


@dataclasses.dataclass
class TiledReport:
    """What ``check_tiled`` found: ``problem`` one line when the reader's function could not be
    compared somewhere, ``wrong_lines`` the wrong outputs told, ``failures`` what right values hid
    (memory, tiles thrown away), ``notes`` what is right but said (D from P·dP)."""

    path: Path
    exercise: object
    cases: list
    module: object = None
    problem: str = None
    wrong_lines: list = dataclasses.field(default_factory=list)
    failures: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    not_written: bool = False
    differences: tuple = (0.0, 0.0)
    peak: tuple = None  # (bytes, line, source) at MEMORY_LENGTH tokens
    tiles: tuple = (0, 0)  # (score tiles computed in the causal cases, of them wholly above the diagonal)

    @property
    def passed(self):
        return self.problem is None and not self.wrong_lines and not self.failures and not self.not_written

    def lines(self):
        item = self.exercise
        head = f"{self.path}: exercise {item.number}, {item.title}"
        if self.not_written:
            return [f"{head}: {item.writes} is not written yet (it raises NotImplementedError): write it, then run "
                    f"`tinyformer study check {self.path}` again"]
        if self.passed:
            names = ", ".join(item.gradients)
            lines = [f"{head}: right.",
                     f"  {names} agree with {item.reference}, element by element in float64, in all "
                     f"{len(self.cases)} cases:", f"  {'; '.join(c.name for c in self.cases)}",
                     f"  (largest difference {self.differences[0]:.2g}, and {self.differences[1]:.2g} from "
                     f"{'the plain formula' if item.number == 7 else 'central differences of the plain forward'})"]
            size, line, _ = self.peak
            lines.append(f"  memory: {size / _MIB:.2f} MiB at most at once at {MEMORY_LENGTH:,} tokens (an S×S array "
                         f"would be {MEMORY_LENGTH ** 2 * 8 / _MIB:.0f} MiB){f', on line {line}' if line else ''}; "
                         f"{self.tiles[0]} score tiles in the causal cases, none wholly above the diagonal")
            return lines + [f"  note: {note}" for note in self.notes]
        lines = [f"{head}: not right yet."]
        if self.problem:
            lines.append(f"  {self.problem}")
        lines += self.wrong_lines + [f"  {failure}" for failure in self.failures]
        return lines + [f"  note: {note}" for note in self.notes]


def _outputs(item, returned, case):
    names = item.gradients
    if not isinstance(returned, (tuple, list)) or len(returned) != len(names):
        got = type(returned).__name__ if not isinstance(returned, (tuple, list)) else f"{len(returned)} values"
        raise _Unusable(f"{item.writes} returned {got}; exercise {item.number} returns {len(names)}: "
                         f"({', '.join(names)})")
    outputs = {}
    for name, value in zip(names, returned):
        try:
            outputs[name] = numpy.asarray(value, dtype=numpy.float64)
        except (TypeError, ValueError):
            raise _Unusable(f"{name} is not an array of numbers in case \"{case.name}\"") from None
        if outputs[name].shape != case.expected[name].shape:
            raise _Unusable(f"{name} has shape {outputs[name].shape} in case \"{case.name}\"; it must be "
                             f"{case.expected[name].shape}")
    return outputs


def _told(item, findings):
    """The lines of the wrong outputs: which, where, the largest error, and what it looks like."""
    bad = {name: [(c, r, g) for c, r, g in rows if wrong(g, r).any()] for name, rows in findings.items()}
    names = [name for name in item.gradients if bad.get(name)]
    if not names:
        return []
    cases = list(dict.fromkeys(c.name for name in names for c, _, _ in bad[name]))
    total = len({c.name for rows in findings.values() for c, _, _ in rows})
    where = "in every case" if len(cases) == total else f"in {len(cases)} of {total} cases ({'; '.join(cases)})"
    lines = [f"  {', '.join(names)} {'is' if len(names) == 1 else 'are'} wrong {where}."]
    worst = (-1.0, None)
    for name in names:
        for case, right, got in bad[name]:
            with numpy.errstate(invalid="ignore"):
                error = numpy.where(wrong(got, right), numpy.abs(got - right), 0.0)
            error = numpy.where(numpy.isnan(error), numpy.inf, error)
            index = numpy.unravel_index(int(numpy.argmax(error)), error.shape)
            if error[index] > worst[0]:
                worst = (float(error[index]), (name, case, right, got, index))
    size, (name, case, right, got, index) = worst
    b, row = first_wrong_row(case, name, got, right)
    kind = "key" if name in ("dK", "dV") else "query"
    tile = row // case.factors["block"]
    lines.append(f"    largest error {size:.3g} in case \"{case.name}\" at {name}[{', '.join(map(str, index))}] "
                 f"(sequence {b}, {kind} row {row}, in {kind} tile {tile}): expected {right[index]:.6g}, "
                 f"got {got[index]:.6g}")
    looks_like = recognise_tiled(item.number, findings)
    if looks_like:
        lines.append(f"    what it looks like: {looks_like}")
    return lines


def _memory(module, item):
    """(bytes, line, source) of the reader's function at MEMORY_LENGTH tokens, one sequence."""
    rng = numpy.random.default_rng(7)
    q, k, v = (rng.normal(size=(1, MEMORY_LENGTH, 8)) for _ in range(3))
    if item.number == 7:
        return peak_memory(lambda: module.forward(q, k, v, None, False, 64), module.__file__)
    o, lse = tiled_forward(q, k, v, None, False, 512)
    d_out = rng.normal(size=o.shape)
    return peak_memory(lambda: module.backward(q, k, v, o, lse, d_out, None, False, 64), module.__file__)


def _tiles(module, item, cases):
    """(score tiles computed over the causal cases, those wholly above the diagonal, an example)."""
    total, thrown, example = 0, 0, None
    for case in (c for c in cases if "causal" in c.tags):
        args = arguments(item.number, case)
        function = module.forward if item.number == 7 else module.backward
        with numpy.errstate(all="ignore"):
            tiles = score_tiles(lambda q, k: function(q, k, *args[2:]), args[0], args[1])
        above = wasted(tiles, case.args[0].shape[1], case.args[1].shape[1])
        total, thrown = total + len(tiles), thrown + len(above)
        if above and example is None:
            (r0, r1), (k0, k1) = above[0]
            example = f"query rows {r0}–{r1 - 1} × keys {k0}–{k1 - 1} in case \"{case.name}\""
    return total, thrown, example


def _reads(module, case, outputs, index):
    """Whether the backward's answer in ``case`` changes when argument ``index`` (3: o, 4: lse) moves."""
    args = list(arguments(8, case))
    args[index] = args[index] + 0.5
    with numpy.errstate(all="ignore"):
        moved = module.backward(*args)
    return any(wrong(numpy.asarray(m, dtype=numpy.float64), outputs[n]).any()
               for n, m in zip(("dQ", "dK", "dV"), moved))


def _probe(report, module, item):
    """Memory, tiles thrown away, and what the backward reads, once the values are right."""
    try:
        report.peak = _memory(module, item)
        total, thrown, example = _tiles(module, item, report.cases)
        report.tiles = (total, thrown)
    except Exception as error:  # the reader's code: anything may happen
        report.problem = (f"at {MEMORY_LENGTH:,} tokens (one sequence, d = 8, tiles of 64) your {item.writes} raised "
                          f"{type(error).__name__}: {_first_line(error)}")
        return
    size, line, source = report.peak
    whole = MEMORY_LENGTH ** 2 * 8
    if size >= whole // 4:
        where = f"line {line} (`{source}`)" if line else "your code"
        report.failures.append(
            f"S or P materialised whole: at {MEMORY_LENGTH:,} tokens {where} took {size / _MIB:.0f} MiB at once, "
            f"where an S×S array is {whole / _MIB:.0f} MiB ({MEMORY_LENGTH:,} × {MEMORY_LENGTH:,} float64) and a "
            "64 × 64 tile 32 KiB; keep one tile of S and P at a time")
    if report.tiles[1]:
        loop = ("stop the key loop at the last key the block sees, min(length, i1 + len_k − len_q), as the kernel's "
                "key_end does" if item.number == 7 else
                "start the query loop at the first query that sees key j0, max(0, j0 − (len_k − len_q)), rounded down "
                "to a tile")
        report.failures.append(
            f"causal tiles computed and thrown away: {report.tiles[1]} of the {report.tiles[0]} score tiles your "
            f"{item.writes} computed in the causal cases lie wholly above the diagonal (e.g. {example}): every key "
            f"there is hidden from every query of the tile; {loop}")
    if item.number == 8:
        case = next(c for c in report.cases if not c.tags)
        if not _reads(module, case, case.expected, 3):
            report.notes.append("D computed from P·dP (Σⱼ Pᵢⱼ dPᵢⱼ; your backward never reads O): right, but it needs "
                                "every tile of a row before any dS, a second pass over the keys; D = rowsum(dO ∘ O) is "
                                "one pass over O, before the tiles (the kernel's attention_backward_delta)")
        if not _reads(module, case, case.expected, 4):
            report.notes.append("your backward never reads lse: it recomputes softmax's max and sum, where "
                                "P = exp(S − lse) needs neither")


def check_tiled(path, module, item):
    """The ``TiledReport`` of the reader's exercise 7 or 8 (ExerciseFileError if it cannot be checked)."""
    cases = prepared_tiled(item.number)
    report = TiledReport(Path(path), item, cases, module)
    function = getattr(module, item.writes)
    findings, unwritten = {name: [] for name in item.gradients}, 0
    for case in cases:
        try:
            with numpy.errstate(all="ignore"):
                outputs = _outputs(item, function(*arguments(item.number, case)), case)
        except NotImplementedError as error:
            unwritten += 1
            report.problem = report.problem or _raised(path, error, case)
            continue
        except _Unusable as error:
            report.problem = report.problem or str(error)
            continue
        except Exception as error:  # the reader's code: anything may happen
            report.problem = report.problem or _raised(path, error, case)
            continue
        for name in item.gradients:
            findings[name].append((case, case.expected[name], outputs[name]))
    if unwritten == len(cases):
        report.not_written = True
        return report
    report.wrong_lines = _told(item, findings)
    report.differences = tuple(_largest_difference(findings, kind) for kind in ("expected", "numeric"))
    if report.problem is None and not report.wrong_lines:
        _probe(report, module, item)
    return report



def _largest_difference(findings, kind):
    """The largest |got − answer| over the elements where both are finite (``kind``: "expected" or
    "numeric", the case's answer it is taken from)."""
    largest = 0.0
    for name, rows in findings.items():
        for case, _, got in rows:
            answer = getattr(case, kind)[name]
            both = numpy.isfinite(got) & numpy.isfinite(answer)
            largest = max(largest, float(numpy.abs(got[both] - answer[both]).max(initial=0.0)))
    return largest
