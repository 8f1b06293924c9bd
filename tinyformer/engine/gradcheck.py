"""Numerical gradient checking: does backward agree with central differences?

For a callable ``fn`` of Tensors with outputs y₁..yₖ, gradcheck draws a random
(seeded) upstream gradient vᵢ for every output and looks at the scalar

    f(x) = Σᵢ ⟨vᵢ, yᵢ(x)⟩          (summed in float64)

whose gradient is exactly what backward computes from those vᵢ. A random v,
rather than the plain sum of the outputs, is what makes a wrong transpose or a
wrong axis visible. The numeric side is (f(x + εe) − f(x − εe)) / 2ε, with the outputs differenced
element by element before they are projected on v (``central_difference``; the study course's
checker uses the same, ``central_differences``):

* ``mode="full"``: e runs over every element of every checked input;
* ``mode="fast"``: e is a random unit direction u per input, comparing the
  directional derivative vᵀJu with ⟨grad, u⟩; on failure full mode is re-run to
  name the worst element.

An element passes when |analytic − numeric| ≤ atol + rtol·|numeric|.
Besides the values, gradcheck checks that every gradient has its input's shape
and dtype, that backward is reentrant (two runs agree within ``nondet_tol``) and
that a zero upstream gradient gives zero gradients.
"""

import numpy

from . import backend
from .tensor import Tensor, grad, no_grad

__all__ = ["gradcheck", "GradcheckError", "GradcheckReport", "InputResult", "compare", "central_difference",
           "central_differences", "five_point_difference", "EPS", "ATOL", "RTOL"]

EPS, ATOL, RTOL = 1e-6, 1e-5, 1e-3
"""The defaults: the central-difference step and the tolerances of the pass rule (``compare``)."""

FLOAT32_TOLERANCES = {"eps": 1e-3, "atol": 1e-2, "rtol": 1e-2}
"""Floors applied to eps/atol/rtol when ``allow_float32=True`` (float32 rounds at ~6e-8)."""


class GradcheckError(AssertionError):
    """Raised when analytic and numeric gradients disagree; the message holds the report."""

    def __init__(self, report):
        super().__init__(str(report))
        self.report = report


class InputResult:
    """The comparison for one checked input."""

    def __init__(self, position, shape, dtype):
        self.position, self.shape, self.dtype = position, shape, dtype
        self.max_abs_error = 0.0
        self.max_rel_error = 0.0
        self.worst_index = None
        self.numeric = self.analytic = 0.0
        self.passed = True
        self.how = "elements"

    def row(self):
        index = "-" if self.worst_index is None else str(self.worst_index)
        return [
            str(self.position),
            str(self.shape),
            str(self.dtype),
            self.how,
            f"{self.max_abs_error:.3g}",
            f"{self.max_rel_error:.3g}",
            index,
            f"{self.numeric:.6g}",
            f"{self.analytic:.6g}",
            "ok" if self.passed else "FAIL",
        ]


class GradcheckReport:
    """What gradcheck found: one ``InputResult`` per checked input, plus other problems."""

    HEADER = ["input", "shape", "dtype", "compared", "max abs err", "max rel err",
              "worst index", "numeric", "analytic", "result"]

    def __init__(self, mode, eps, atol, rtol, float32):
        self.mode, self.eps, self.atol, self.rtol, self.float32 = mode, eps, atol, rtol, float32
        self.inputs = []
        self.problems = []

    @property
    def passed(self):
        return not self.problems and all(r.passed for r in self.inputs)

    def __bool__(self):
        return self.passed

    def __str__(self):
        verdict = "passed" if self.passed else "FAILED"
        lines = [f"gradcheck {verdict} (mode={self.mode}, eps={self.eps:g}, atol={self.atol:g}, "
                 f"rtol={self.rtol:g})"]
        if self.float32:
            lines.append("float32 inputs allowed: eps and tolerances were widened to "
                         f"at least eps={FLOAT32_TOLERANCES['eps']:g}, "
                         f"atol={FLOAT32_TOLERANCES['atol']:g}, rtol={FLOAT32_TOLERANCES['rtol']:g}")
        rows = [self.HEADER] + [r.row() for r in self.inputs]
        widths = [max(len(row[c]) for row in rows) for c in range(len(self.HEADER))]
        for row in rows:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        lines += [f"problem: {p}" for p in self.problems]
        lines.append("max rel err = |analytic - numeric| / (|numeric| + atol); "
                     "pass when |analytic - numeric| <= atol + rtol * |numeric|")
        return "\n".join(lines)

    __repr__ = __str__


def compare(analytic, numeric, atol=ATOL, rtol=RTOL):
    """gradcheck's verdict element by element: (absolute errors, relative errors, passed), arrays.

    An element passes when |analytic − numeric| ≤ atol + rtol·|numeric| (NaN fails); its
    relative error is |analytic − numeric| / (|numeric| + atol).
    """
    analytic, numeric = numpy.asarray(analytic, numpy.float64), numpy.asarray(numeric, numpy.float64)
    error = numpy.abs(analytic - numeric)
    return error, error / (numpy.abs(numeric) + atol), error <= atol + rtol * numpy.abs(numeric)


def central_difference(plus, minus, upstream, eps=EPS):
    """(f(x + εe) − f(x − εe)) / 2ε of f = Σᵢ⟨vᵢ, yᵢ⟩, from the outputs yᵢ at x + εe (``plus``) and
    x − εe (``minus``), float64 arrays, and the upstream gradients vᵢ (``upstream``, flat float64).

    The outputs are differenced element by element before they are projected on v: an output
    that does not move (a -1e9 mask fill, a −inf one) then adds exactly 0, instead of swamping
    the difference in rounding error (or making it NaN).
    """
    total = 0.0
    for p, m, v in zip(plus, minus, upstream):
        with numpy.errstate(invalid="ignore"):  # −inf − (−inf) where an output stays masked
            change = numpy.where(p == m, 0.0, p - m)
        total += float(numpy.dot(change.ravel(), v))
    return total / (2 * eps)


def five_point_difference(value_at, step):
    """(8·(f(x + h) − f(x − h)) − (f(x + 2h) − f(x − 2h))) / 12h, with ``value_at(offset)`` = f(x +
    offset), a float: the derivative of a scalar f with an error of O(h⁴) instead of the two-point
    difference's O(h²), so that h can be ten times larger and the rounding noise of f, divided by
    h, ten times smaller (for a check that must resolve small gradients)."""
    plus, minus, plus2, minus2 = (value_at(offset) for offset in (step, -step, 2 * step, -2 * step))
    return (8 * (plus - minus) - (plus2 - minus2)) / (12 * step)


def central_differences(outputs_at, base, upstream, eps=EPS):
    """The numeric gradient of f = Σᵢ⟨vᵢ, yᵢ(x)⟩ at ``base`` (float64), element by element: a flat
    float64 array of ``base.size``. ``outputs_at(values)`` returns the outputs yᵢ (float64 arrays)
    with the input set to ``values`` (an array of ``base``'s shape); the caller puts the input back."""
    numeric = numpy.zeros(base.size)
    work = base.copy().reshape(-1)
    for j in range(base.size):
        work[j] = base.flat[j] + eps
        plus = outputs_at(work.reshape(base.shape))
        work[j] = base.flat[j] - eps
        minus = outputs_at(work.reshape(base.shape))
        work[j] = base.flat[j]
        numeric[j] = central_difference(plus, minus, upstream, eps)
    return numeric


def gradcheck(fn, inputs, *, eps=EPS, atol=ATOL, rtol=RTOL, mode="full", seed=0,
              nondet_tol=0.0, raise_on_failure=True, allow_float32=False):
    """Compare ``fn``'s backward with central differences; return a ``GradcheckReport``.

    ``inputs`` are passed to ``fn`` in order; those that are Tensors with
    ``requires_grad=True`` are checked (they are perturbed in place and restored,
    so a Module's parameters can be checked by passing them). Raises
    ``GradcheckError`` on failure unless ``raise_on_failure=False``.
    """
    if mode not in ("full", "fast"):
        raise ValueError(f"gradcheck: mode must be 'full' or 'fast', got {mode!r}")
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input is a Tensor with requires_grad=True")
    float32 = False
    for i in checked:
        dtype = inputs[i].dtype
        if dtype == numpy.float32 and allow_float32:
            float32 = True
        elif dtype != numpy.float64:
            raise TypeError(
                f"gradcheck: input {i} has dtype {dtype}; central differences need float64 "
                "(pass allow_float32=True to check float32 with widened tolerances)"
            )
    if float32:
        eps = max(eps, FLOAT32_TOLERANCES["eps"])
        atol = max(atol, FLOAT32_TOLERANCES["atol"])
        rtol = max(rtol, FLOAT32_TOLERANCES["rtol"])

    report = GradcheckReport(mode, eps, atol, rtol, float32)
    checker = _Checker(fn, inputs, checked, eps, atol, rtol, seed, report)
    analytic = checker.analytic(checker.upstream)
    checker.check_contract(analytic, nondet_tol)
    if mode == "full":
        checker.compare_elements(analytic)
    else:
        checker.compare_directions(analytic)
        if not all(r.passed for r in report.inputs):
            report.mode = "fast, failed, re-run as full"
            report.inputs = []
            checker.compare_elements(analytic)
    if raise_on_failure and not report.passed:
        raise GradcheckError(report)
    return report


class _Checker:
    def __init__(self, fn, inputs, checked, eps, atol, rtol, seed, report):
        self.fn, self.inputs, self.checked = fn, inputs, checked
        self.eps, self.atol, self.rtol, self.report = eps, atol, rtol, report
        self.rng = numpy.random.default_rng(seed)
        with no_grad():
            outputs = self.outputs()
        if not outputs:
            raise ValueError("gradcheck: fn returned no floating-point Tensor")
        host = [self.rng.standard_normal(o.shape).astype(o.dtype) for o in outputs]
        self.upstream = [backend.to_device(v, o.device) for v, o in zip(host, outputs)]
        self.upstream_flat = [v.astype(numpy.float64).ravel() for v in host]  # for the numeric side

    def outputs(self):
        result = self.fn(*self.inputs)
        result = result if isinstance(result, (list, tuple)) else (result,)
        for r in result:
            if not isinstance(r, Tensor):
                raise TypeError(f"gradcheck: fn must return Tensors, got {type(r).__name__}")
        return [r for r in result if r.dtype.kind == "f"]

    def analytic(self, upstream):
        """Gradients of f = Σ⟨v, y⟩ for every checked input, from one forward and backward."""
        outputs = self.outputs()
        pairs = [(o, v) for o, v in zip(outputs, upstream) if o.requires_grad]
        tensors = [self.inputs[i] for i in self.checked]
        if not pairs:
            return [backend.get_array_module(t.data).zeros_like(t.data) for t in tensors]
        return grad([o for o, _ in pairs], tensors, [v for _, v in pairs])

    def evaluate(self):
        """The outputs y(x) as float64 NumPy arrays, recorded under no_grad."""
        with no_grad():
            return [backend.to_numpy(o.data).astype(numpy.float64) for o in self.outputs()]

    def check_contract(self, analytic, nondet_tol):
        for i, g in zip(self.checked, analytic):
            x = self.inputs[i]
            if g.shape != x.shape or g.dtype != x.dtype:
                self.report.problems.append(
                    f"input {i}: gradient has shape {g.shape} and dtype {g.dtype}, "
                    f"the input has {x.shape} and {x.dtype}"
                )
        again = self.analytic(self.upstream)
        for i, g1, g2 in zip(self.checked, analytic, again):
            diff = _max_abs(backend.to_numpy(g1).astype(numpy.float64) - backend.to_numpy(g2))
            if not diff <= nondet_tol:
                self.report.problems.append(
                    f"input {i}: backward is not reentrant: two runs differ by {diff:.3g} "
                    f"(nondet_tol={nondet_tol:g})"
                )
        zeros = [backend.get_array_module(v).zeros_like(v) for v in self.upstream]
        for i, g in zip(self.checked, self.analytic(zeros)):
            largest = _max_abs(backend.to_numpy(g))
            if not largest <= nondet_tol:
                self.report.problems.append(
                    f"input {i}: a zero upstream gradient gave a gradient as large as {largest:.3g}"
                )

    def _perturbed(self, x, values):
        """The outputs with ``x.data`` replaced by ``values`` (x's dtype, x's device)."""
        x.data = backend.to_device(values.astype(x.dtype), backend.device_of(x.data))
        return self.evaluate()

    def compare_elements(self, analytic):
        for i, g in zip(self.checked, analytic):
            x = self.inputs[i]
            original = x.data
            base = backend.to_numpy(original).astype(numpy.float64)
            try:
                numeric = central_differences(lambda values: self._perturbed(x, values), base,
                                              self.upstream_flat, self.eps)
            finally:
                x.data = original
            result = self._compare(i, x, numeric, backend.to_numpy(g).astype(numpy.float64).ravel())
            if result.worst_index is not None:
                result.worst_index = tuple(int(k) for k in numpy.unravel_index(result.worst_index, x.shape))
            self.report.inputs.append(result)

    def compare_directions(self, analytic):
        for i, g in zip(self.checked, analytic):
            x = self.inputs[i]
            original = x.data
            base = backend.to_numpy(original).astype(numpy.float64)
            direction = self.rng.standard_normal(base.shape)
            direction /= max(numpy.linalg.norm(direction), 1e-300)
            try:
                plus = self._perturbed(x, base + self.eps * direction)
                minus = self._perturbed(x, base - self.eps * direction)
            finally:
                x.data = original
            numeric = numpy.array([central_difference(plus, minus, self.upstream_flat, self.eps)])
            along = numpy.array([numpy.sum(backend.to_numpy(g).astype(numpy.float64) * direction)])
            result = self._compare(i, x, numeric, along)
            result.how = "direction"
            result.worst_index = None
            self.report.inputs.append(result)

    def _compare(self, position, x, numeric, analytic):
        result = InputResult(position, x.shape, x.dtype)
        if numeric.size == 0:
            return result
        error, relative, passed = compare(analytic, numeric, self.atol, self.rtol)
        bad = ~passed
        excess = numpy.where(numpy.isnan(error), numpy.inf, error - (self.atol + self.rtol * numpy.abs(numeric)))
        worst = int(numpy.argmax(excess))
        result.max_abs_error = float(numpy.max(error))  # NaN propagates into the report
        result.max_rel_error = float(numpy.max(relative))
        result.worst_index = worst
        result.numeric, result.analytic = float(numeric[worst]), float(analytic[worst])
        result.passed = not bad.any()
        return result


def _max_abs(array):
    return float(numpy.max(numpy.abs(array))) if array.size else 0.0
