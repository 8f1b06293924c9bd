"""``tinyformer study check FILE``: the reader's backward against tinyformer's, case by case.

``check(path)`` loads the reader's file by its path (a fresh module, never put in sys.modules),
runs its ``forward`` on every case of its exercise (it must still compute what the template's
does) and its ``backward`` with the case's random upstream gradient, in float64, and compares
each gradient with (a) tinyformer's own op's backward and (b) central differences of the given
forward (``cases.prepared``). It returns a ``Report``; ``Report.lines()`` says it as a teacher
would (``diagnosis``).

A file that cannot be checked at all — missing, unreadable, a syntax error, an exception while
importing it, no ``EXERCISE = N`` line or no ``backward``, a forward changed — raises
``ExerciseFileError`` (one line naming the file: the command line's exit status 2). A file whose
backward is not right yet — not written (NotImplementedError), raising, returning the wrong
number or shapes of arrays, or wrong numbers — gets a Report that did not pass (exit status 1).
Exercises 7 and 8 (the tiled forward and backward) are checked by ``flash_check``, which returns
a ``TiledReport`` read the same way.
"""

import ast
import dataclasses
import types
from pathlib import Path

import numpy

from .cases import copied, prepared
from .reader_code import Unusable as _Unusable, first_line as _first_line, line_in as _line_in, raised as _raised
from .diagnosis import Finding, diagnose
from .exercises import EXERCISES, exercise

__all__ = ["ExerciseFileError", "Report", "check", "load"]


class ExerciseFileError(Exception):
    """The file cannot be checked: the message is one line naming it and what is wrong."""


# ---------------------------------------------------------------------------- loading the reader's file
def _declared_exercise(tree):
    """The value of a top-level ``EXERCISE = <int>`` in the module's syntax tree, or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXERCISE" for t in node.targets):
            value = node.value
            return value.value if isinstance(value, ast.Constant) else value
    return None


def load(path):
    """(module, Exercise) of the reader's file at ``path``; ExerciseFileError if it cannot be checked."""
    path = Path(path)
    start = "`tinyformer study start N` writes exercise N (`tinyformer study` lists them)"
    if not path.exists():
        raise ExerciseFileError(f"{path}: no such file; {start}")
    if not path.is_file():
        raise ExerciseFileError(f"{path}: not a file; {start}")
    try:
        source = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as error:
        raise ExerciseFileError(f"{path}: cannot be read as UTF-8 text ({error})") from None
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as error:
        raise ExerciseFileError(f"{path}, line {error.lineno}: syntax error: {error.msg}") from None
    number = _declared_exercise(tree)
    if number is None:
        raise ExerciseFileError(f"{path}: not a tinyformer study exercise (it has no `EXERCISE = N` line); {start}")
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= len(EXERCISES):
        shown = ast.unparse(number) if isinstance(number, ast.AST) else repr(number)
        raise ExerciseFileError(f"{path}: not a tinyformer study exercise (EXERCISE must be a number from 1 to "
                                f"{len(EXERCISES)}, got {shown})")
    module = types.ModuleType(f"tinyformer_study_reader_{number:02d}")
    module.__file__ = str(path)
    try:
        exec(compile(tree, str(path), "exec"), module.__dict__)
    except Exception as error:  # the reader's code: anything may happen
        line, _ = _line_in(path, error)
        raise ExerciseFileError(f"{path}{f', line {line}' if line else ''}: importing it raised "
                                f"{type(error).__name__}: {_first_line(error)}") from None
    for name in ("forward", "backward") if item_writes_backward(number) else ("forward",):
        if not callable(getattr(module, name, None)):
            raise ExerciseFileError(f"{path}: exercise {number} needs a function `{name}`, and the file has none")
    return module, exercise(number)


def item_writes_backward(number):
    """Whether exercise ``number``'s reader writes ``backward`` (every one but 7, whose is ``forward``)."""
    return exercise(number).writes == "backward"


# ---------------------------------------------------------------------------- the report
@dataclasses.dataclass
class Report:
    """What ``check`` found: ``problem`` is one line when backward could not be compared in some
    case (not written, raised, wrong count or shape), ``diagnoses`` one per gradient over the
    cases where it could."""

    path: Path
    exercise: object
    cases: list
    module: object = None  # the reader's file, loaded
    problem: str = None
    unusable: set = dataclasses.field(default_factory=set)  # gradients with a wrong shape (or no numbers) somewhere
    diagnoses: list = dataclasses.field(default_factory=list)
    not_written: bool = False
    differences: tuple = (0.0, 0.0)  # the largest |got − op| and |got − central differences|

    @property
    def passed(self):
        return self.problem is None and bool(self.diagnoses) and all(d.right for d in self.diagnoses)

    def lines(self):
        item = self.exercise
        head = f"{self.path}: exercise {item.number}, {item.title}"
        if self.not_written:
            return [f"{head}: backward is not written yet (it raises NotImplementedError): write it, then run "
                    f"`tinyformer study check {self.path}` again"]
        if self.passed:
            names = ", ".join(d.gradient for d in self.diagnoses)
            agree = "agrees" if len(self.diagnoses) == 1 else "agree"
            return [f"{head}: right.",
                    f"  {names} {agree} with the backward of {item.reference} and "
                    f"with central differences of the given forward, in float64 with random upstream gradients, "
                    f"in all {len(self.cases)} cases:",
                    f"  {'; '.join(c.name for c in self.cases)}",
                    f"  (largest difference {self.differences[0]:.2g} from {item.reference}, "
                    f"{self.differences[1]:.2g} from central differences)"]
        wrong = [d.gradient for d in self.diagnoses if not d.right]
        wrong += [g for g in item.gradients if g in self.unusable and g not in wrong]
        right = [d.gradient for d in self.diagnoses if d.right and d.gradient not in wrong]
        summary = []
        if wrong:
            summary.append(f"{_listed(wrong)} {'is' if len(wrong) == 1 else 'are'} wrong")
        if right:
            where = f" where {'it' if len(right) == 1 else 'they'} could be compared" if self.problem else ""
            summary.append(f"{_listed(right)} {'is' if len(right) == 1 else 'are'} right{where}")
        lines = [f"{head}: not right yet" + (f" — {'; '.join(summary)}." if summary else ".")]
        if self.problem:
            lines.append(f"  {self.problem}")
        groups = {}  # gradients wrong in the same places and the same way are told once
        for d in self.diagnoses:
            if not d.right:
                groups.setdefault((d.where, d.looks_like), []).append(d)
        for (where, looks_like), group in groups.items():
            names = [d.gradient for d in group]
            worst = max(group, key=lambda d: d.worst)
            lines.append(f"  {_listed(names)} {'is' if len(names) == 1 else 'are'} wrong {where}.")
            lines.append(f"    {worst.largest}")
            if looks_like:
                lines.append(f"    what it looks like: {looks_like}")
        return lines


def _listed(names):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# ---------------------------------------------------------------------------- running the reader's code
def _gradients(item, returned, case):
    """{gradient name: float64 array} of what backward returned; _Unusable if it cannot be compared."""
    names = item.gradients
    if item.keys is not None:
        if not isinstance(returned, dict):
            raise _Unusable(f"backward returned {type(returned).__name__}; exercise {item.number} returns a dict "
                            f"with the keys {', '.join(item.keys)}")
        missing = [k for k in item.keys if k not in returned]
        if missing:
            raise _Unusable(f"backward's dict has no {', '.join(repr(k) for k in missing)} (it needs "
                            f"{', '.join(item.keys)})")
        values = [returned[k] for k in item.keys]
    elif isinstance(returned, (tuple, list)):
        values = list(returned)
        if len(values) != len(names):
            raise _Unusable(f"backward returned {len(values)} value{'s' if len(values) != 1 else ''}; exercise "
                            f"{item.number} returns {len(names)}: ({', '.join(names)})")
    elif len(names) == 1:
        values = [returned]
    else:
        raise _Unusable(f"backward returned {type(returned).__name__}; exercise {item.number} returns a tuple of "
                        f"{len(names)}: ({', '.join(names)})")
    grads = {}
    for name, value in zip(names, values):
        try:
            grads[name] = numpy.asarray(value, dtype=numpy.float64)
        except (TypeError, ValueError):
            raise _Unusable(f"{name} is not an array of numbers (got {type(value).__name__}) in case \"{case.name}\"",
                            name) from None
        expected = case.expected[name].shape
        if grads[name].shape != expected:
            raise _Unusable(f"{name} has shape {grads[name].shape} in case \"{case.name}\"; it must be {expected}"
                            f"{_shape_hint(grads[name].shape, expected)}", name)
    return grads


def _shape_hint(got, expected):
    if len(got) >= 2 and got[:-2] + got[-2:][::-1] == expected:
        return ", the shape of what it is the gradient of (transposed?)"
    if len(got) > len(expected) and got[len(got) - len(expected):] == expected:
        return ", the shape of what it is the gradient of: sum over the axes the forward broadcast it over"
    return ", the shape of what it is the gradient of"


def _check_forward(path, module, item, cases):
    """The reader's forward must still compute the exercise's (else the check means nothing)."""
    fresh = f"`tinyformer study start {item.number} DIR` writes a fresh copy"
    for case in cases:
        try:
            with numpy.errstate(all="ignore"):
                out = numpy.asarray(module.forward(*copied(case.args)), dtype=numpy.float64)
        except Exception as error:
            line, _ = _line_in(path, error)
            raise ExerciseFileError(f"{path}{f', line {line}' if line else ''}: its forward raised "
                                    f"{type(error).__name__} in case \"{case.name}\": {_first_line(error)} (the given "
                                    f"forward must stay as it was; {fresh})") from None
        scale = max(float(numpy.abs(case.output).max(initial=0.0)), 1.0)
        if out.shape != case.output.shape or not (numpy.abs(out - case.output) <= 1e-9 * scale).all():
            raise ExerciseFileError(f"{path}: its forward no longer computes exercise {item.number}'s (case "
                                    f"\"{case.name}\" differs from {item.reference}): restore the given forward; "
                                    f"{fresh}")


def check(path):
    """The ``Report`` of the reader's file at ``path`` (ExerciseFileError if it cannot be checked)."""
    path = Path(path)
    module, item = load(path)
    if item.number in (7, 8):  # the tiled exercises: their own cases, probes and report
        from .flash_check import check_tiled

        return check_tiled(path, module, item)
    cases = prepared(item.number)
    _check_forward(path, module, item, cases)
    report = Report(path, item, cases, module)
    answers = {}
    unwritten = 0
    for i, case in enumerate(cases):
        try:
            with numpy.errstate(all="ignore"):
                returned = module.backward(*copied(case.args), copied((case.d_out,))[0])
        except NotImplementedError as error:
            unwritten += 1
            report.problem = report.problem or _raised(path, error, case)
            continue
        except Exception as error:  # the reader's code: anything may happen
            report.problem = report.problem or _raised(path, error, case)
            continue
        try:
            answers[i] = _gradients(item, returned, case)
        except _Unusable as error:
            report.problem = report.problem or str(error)
            report.unusable.add(error.gradient)
    if unwritten == len(cases):
        report.not_written = True
        return report
    for name in item.gradients:
        findings = [Finding(cases[i], cases[i].expected[name], cases[i].numeric[name], grads[name])
                    for i, grads in answers.items()]
        if findings:
            report.diagnoses.append(diagnose(item.number, name, findings, cases))
    with numpy.errstate(invalid="ignore"):
        report.differences = tuple(
            max((float(numpy.abs(grads[n] - getattr(cases[i], kind)[n]).max(initial=0.0))
                 for i, grads in answers.items() for n in item.gradients), default=0.0)
            for kind in ("expected", "numeric"))
    return report
