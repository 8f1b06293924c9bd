"""What every kernel case shares: inputs rounded to the element type, float64 references, and
the comparisons with their tolerances.

A comparison passes when |kernel − reference| <= atol + rtol·|reference| everywhere, with
(rtol, atol) by element type (``TOLERANCE``), gradients (longer sums) looser by ``GRAD_FACTOR``:
    float32   rtol 1e-5, atol 2e-6
    float16   rtol 2e-3, atol 2e-3   (output rounding 2^-11, accumulation in float32)
    bfloat16  rtol 2e-2, atol 2e-2   (output rounding 2^-8)
A comparison may raise its atol floor for a cancellation it names (a half type's floor still
applies when larger); some compare at fixed tolerances, dropout's keep mask exactly.
"""

import math
from typing import NamedTuple

import numpy

from ...engine import backend
from ...engine.kernels.philox import philox_uniform
from ...engine.tensor import Tensor, grad

TOLERANCE = {"float32": (1e-5, 2e-6), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2)}
GRAD_FACTOR = {"float32": 10.0, "float16": 2.0, "bfloat16": 2.0}


class Comparison(NamedTuple):
    """A kernel result (host float64) against its reference, with the tolerance it must meet."""

    label: str
    actual: numpy.ndarray
    expected: numpy.ndarray
    rtol: float
    atol: float

    def failure(self):
        """None when within tolerance, else one line naming the worst element."""
        if self.actual.shape != self.expected.shape:
            return f"{self.label}: shape {self.actual.shape}, reference {self.expected.shape}"
        error = numpy.abs(self.actual - self.expected)
        bad = ~(error <= self.atol + self.rtol * numpy.abs(self.expected))  # NaN counts as off
        if not bad.any():
            return None
        worst = numpy.argmax(numpy.where(bad, numpy.nan_to_num(error, nan=numpy.inf), -1.0))
        at = tuple(int(i) for i in numpy.unravel_index(int(worst), error.shape))
        return (f"{self.label}: {int(bad.sum())} of {error.size} values off (tolerance {self.atol:g} + "
                f"{self.rtol:g}·|reference|), worst at {at}: kernel {self.actual[at]:.7g}, "
                f"reference {self.expected[at]:.7g}")

    def errors(self):
        """(max |kernel − reference|, max of that over |reference| + atol); NaN when a value is NaN."""
        if self.actual.shape != self.expected.shape or not self.actual.size:
            return (math.nan, math.nan) if self.actual.shape != self.expected.shape else (0.0, 0.0)
        error = numpy.abs(self.actual - self.expected)
        scale = numpy.abs(self.expected) + self.atol
        with numpy.errstate(divide="ignore", invalid="ignore"):
            relative = numpy.where(scale > 0, error / scale, numpy.where(error > 0, numpy.inf, 0.0))
        return _max_or_nan(error), _max_or_nan(relative)


def _max_or_nan(values):
    return math.nan if numpy.isnan(values).any() else float(values.max())


def compared(label, actual, expected, rtol, atol):
    """A Comparison of a kernel array (NumPy or CuPy) at a fixed tolerance; both are copied (the
    reference of a later step may update its arrays in place)."""
    actual = backend.to_numpy(actual).astype(numpy.float64)
    return Comparison(label, actual, numpy.array(expected, dtype=numpy.float64), rtol, atol)


class KernelRun(NamedTuple):
    """A case's outcome: what it ran on (for the table), its comparisons, and kernel results
    (host arrays) that a test may look at further."""

    inputs: str
    comparisons: list
    results: dict

    @property
    def failures(self):
        return [f for f in (c.failure() for c in self.comparisons) if f]

    @property
    def passed(self):
        return not self.failures

    def max_errors(self):
        """(worst absolute, worst relative) error over the comparisons, NaN first."""
        pairs = [c.errors() for c in self.comparisons] or [(0.0, 0.0)]
        return tuple(max((p[i] for p in pairs), key=lambda e: math.inf if math.isnan(e) else e) for i in (0, 1))

    def check(self):
        """Raise AssertionError listing every comparison off its tolerance; return ``results``."""
        failures = self.failures
        if failures:
            raise AssertionError(f"{self.inputs}:\n" + "\n".join(failures))
        return self.results


class Device:
    """Moves arrays to ``device`` in the element type ``dtype`` and back as float32, and makes
    the comparisons with that element type's tolerance."""

    def __init__(self, device, dtype="float32"):
        if dtype not in TOLERANCE:
            raise ValueError(f"dtype must be one of {', '.join(TOLERANCE)}, got {dtype!r}")
        self.device, self.dtype = device, dtype

    def round(self, x):
        """x as the element type would hold it, in float32 (the reference's input)."""
        if self.dtype == "bfloat16":
            return backend.from_bfloat16(backend.to_bfloat16(x))
        return x.astype(self.dtype).astype(numpy.float32)

    def put(self, x):
        x = backend.to_device(numpy.ascontiguousarray(x, dtype=numpy.float32), self.device)
        return backend.to_bfloat16(x) if self.dtype == "bfloat16" else x.astype(self.dtype)

    def get(self, x):
        """An array of the element type as host float32."""
        x = backend.from_bfloat16(x) if self.dtype == "bfloat16" else x
        return backend.to_numpy(x).astype(numpy.float32)

    def output(self, label, actual, expected, atol=None, gradient=False):
        """A Comparison of an element-type kernel result; ``atol`` names a case's own floor
        (cancellation in float32 sums), the element type's floor applies when larger."""
        rtol, floor = TOLERANCE[self.dtype]
        factor = GRAD_FACTOR[self.dtype] if gradient else 1.0
        atol = floor if atol is None else max(atol, floor)
        return compared(label, self.get(actual), expected, rtol * factor, atol * factor)

    def gradient(self, label, actual, expected, atol=None):
        return self.output(label, actual, expected, atol, gradient=True)


def rand(rng, *shape, scale=1.0):
    """float32 N(0, scale²) values."""
    return (rng.standard_normal(shape) * scale).astype(numpy.float32)


def reference(fn, inputs, upstream):
    """Outputs and input gradients of ``fn`` on float64 tensors of ``inputs`` for the upstream
    gradients ``upstream`` (one per output)."""
    tensors = [Tensor(numpy.asarray(x, dtype=numpy.float64), requires_grad=True) for x in inputs]
    outputs = fn(*tensors)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    grads = grad(outputs, tensors, [numpy.asarray(u, dtype=numpy.float64) for u in upstream])
    return [o.data for o in outputs], grads


def philox_keep(seed, offset, shape, p):
    """The kernels' dropout mask of an array of ``shape``: philox_uniform(seed, offset, e) >= p over
    its elements in C order (kernels/philox.cuh, kernels/philox.py)."""
    return (philox_uniform(seed, offset, numpy.arange(math.prod(shape))) >= numpy.float32(p)).reshape(shape)


def shape_label(array):
    """``array``'s shape without spaces, for a case's label."""
    return str(tuple(array.shape)).replace(" ", "")
