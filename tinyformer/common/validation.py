"""Argument checks with one behaviour everywhere in tinyformer.

Integers: Python ints and NumPy integers are accepted, bools are refused (``True`` is not a
size). Reals: ints, floats and their NumPy kinds, bools refused, never NaN or ±inf. A check
returns the value as a plain Python ``int`` or ``float`` and raises a one-line ``ValueError``
that names the argument and shows the value it got.
"""

import math
import numbers

import numpy

__all__ = ["is_integer", "is_real", "check_int", "check_real", "check_probability", "rectangular_array", "json_type"]


def is_integer(value):
    """True for Python and NumPy integers, False for bools (and everything else)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, numpy.bool_))


def is_real(value):
    """True for Python and NumPy ints and floats, False for bools (and everything else)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, numpy.bool_))


def _range_text(minimum, maximum, open_minimum=False, open_maximum=False):
    if minimum is not None and maximum is not None:
        return f"in {'(' if open_minimum else '['}{minimum}, {maximum}{')' if open_maximum else ']'}"
    if minimum is not None:
        return f"{'>' if open_minimum else '>='} {minimum}"
    if maximum is not None:
        return f"{'<' if open_maximum else '<='} {maximum}"
    return ""


def check_int(name, value, minimum=None, maximum=None):
    """``value`` as an int within [minimum, maximum] (either bound may be None)."""
    if not is_integer(value) or (minimum is not None and value < minimum) \
            or (maximum is not None and value > maximum):
        if minimum == 1 and maximum is None:
            wanted = "a positive integer"
        else:
            wanted = " ".join(filter(None, ["an integer", _range_text(minimum, maximum)]))
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return int(value)


def check_real(name, value, minimum=None, maximum=None, *, open_minimum=False, open_maximum=False):
    """``value`` as a finite float within the given bounds (open ones exclude the bound itself).

    A value that is no finite number is told so ("must be a finite number"); a finite one out of
    bounds is told the bounds ("must be a positive number", "must be a number in [0, 1]").
    """
    if not (is_real(value) and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    ok = minimum is None or (value > minimum if open_minimum else value >= minimum)
    if ok and maximum is not None:
        ok = value < maximum if open_maximum else value <= maximum
    if not ok:
        if minimum == 0 and open_minimum and maximum is None:
            wanted = "a positive number"
        else:
            wanted = f"a number {_range_text(minimum, maximum, open_minimum, open_maximum)}"
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return float(value)


def check_probability(name, value, *, allow_one=False):
    """A probability in [0, 1) — dropout's, where p = 1 would drop everything — or in [0, 1]."""
    if not is_real(value) or not (0.0 <= value <= 1.0 if allow_one else 0.0 <= value < 1.0):
        raise ValueError(f"{name} must be a probability in [0, 1{']' if allow_one else ')'}, got {value!r}")
    return float(value)


def rectangular_array(value, name):
    """A nested list as a NumPy array; a ragged one is a one-line error naming ``name``, not NumPy's."""
    try:
        return numpy.asarray(value)
    except ValueError:
        raise ValueError(f"{name} must be a rectangular array, got a ragged {type(value).__name__} "
                         f"(rows of different lengths)") from None


def json_type(value):
    """The JSON name of a parsed JSON value's type (object, array, string, number, true/false, null)."""
    return ("null" if value is None else "true/false" if isinstance(value, bool) else
            "string" if isinstance(value, str) else "array" if isinstance(value, list) else
            "object" if isinstance(value, dict) else "number" if isinstance(value, (int, float)) else
            type(value).__name__)
