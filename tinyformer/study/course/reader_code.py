"""Running the reader's code: what it raised, where, in one line (the checkers of every exercise)."""

import traceback

__all__ = ["Unusable", "line_in", "first_line", "raised"]


class Unusable(Exception):
    """What backward returned in one case cannot be compared: one line, and the gradient concerned."""

    def __init__(self, message, gradient=None):
        super().__init__(message)
        self.gradient = gradient


def line_in(path, error):
    """(line number, source line) of the innermost frame of ``error`` in the reader's file, or (None, None)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
    return (frames[-1].lineno, (frames[-1].line or "").strip()) if frames else (None, None)


def first_line(error):
    """The first line of the message of ``error`` (or "(no message)")."""
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def _hint(error):
    text = str(error)
    if "matmul" in text and "mismatch" in text:
        return " — shapes that do not fit a matrix product: a missing transpose?"
    if "could not be broadcast" in text:
        return " — shapes that do not broadcast: a sum without keepdims=True, or a missing transpose?"
    return ""


def raised(path, error, case):
    """One line: where in the reader's file ``error`` was raised in ``case``, what, and a hint."""
    line, source = line_in(path, error)
    where = f"line {line} (`{source}`)" if line else "backward"
    return (f"{where} raised {type(error).__name__} in case \"{case.name}\": {first_line(error)}{_hint(error)}")
