"""The gradient checker must pass right backwards and catch wrong ones."""

import numpy as np
import pytest

import tinyformer as tf
from tinyformer import Function, GradcheckError, Tensor


def leaf(*shape, seed=0, dtype=np.float64):
    data = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return Tensor(data, requires_grad=True)


class Sin(Function):
    """z = sin x;  dz/dx = cos x."""

    def forward(self, x):
        self.x = x
        return np.sin(x)

    def backward(self, g):
        return g * np.cos(self.x)


class SinWrong(Sin):
    """A sign error: dz/dx written as -cos x."""

    def backward(self, g):
        return -g * np.cos(self.x)


class MeanOfUpstream(Function):
    """z = x, with a backward that ignores where the gradient came from.

    It is right for an upstream gradient of all ones (as ``y.sum().backward()``
    gives) and wrong for any other: only a random upstream gradient catches it.
    """

    def forward(self, x):
        return x.copy()

    def backward(self, g):
        return np.full_like(g, g.mean())


class MatMulTransposeBug(Function):
    """Z = A @ B with dB = dZᵀ·A instead of Aᵀ·dZ: shapes agree for square inputs, values do not."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return a @ b

    def backward(self, g):
        return g @ self.b.T, g.T @ self.a


class NoisyBackward(Sin):
    def backward(self, g):
        return g * np.cos(self.x) + np.random.default_rng().normal(0, 1e-3, g.shape)


class ConstantLeak(Sin):
    def backward(self, g):
        return g * np.cos(self.x) + 1e-2


def test_right_backward_passes_in_both_modes():
    for mode in ("full", "fast"):
        report = tf.gradcheck(Sin.apply, [leaf(3, 4)], mode=mode)
        assert report.passed and bool(report)
        assert "passed" in str(report) and "max abs err" in str(report)


def test_wrong_backward_fails_with_a_report():
    with pytest.raises(GradcheckError) as info:
        tf.gradcheck(SinWrong.apply, [leaf(3, 4)])
    message = str(info.value)
    assert "FAILED" in message and "eps=1e-06" in message and "atol=1e-05" in message
    assert "rtol=0.001" in message
    assert not info.value.report.passed


def test_report_without_raising_names_the_worst_element():
    x = leaf(5, seed=1)
    report = tf.gradcheck(SinWrong.apply, [x], raise_on_failure=False)
    assert not report.passed
    row = report.inputs[0]
    assert isinstance(row.worst_index, tuple) and len(row.worst_index) == 1
    assert row.max_abs_error > 1e-3
    assert np.isclose(row.numeric, -row.analytic)


def test_random_upstream_catches_a_backward_that_is_right_only_for_ones():
    x = leaf(4, 3)
    MeanOfUpstream.apply(x).sum().backward()
    np.testing.assert_array_equal(x.grad, np.ones((4, 3)))  # looks right under .sum()
    with pytest.raises(GradcheckError):
        tf.gradcheck(MeanOfUpstream.apply, [leaf(4, 3)])


def test_transposed_gradient_is_caught_on_square_inputs():
    a, b = leaf(3, 3, seed=1), leaf(3, 3, seed=2)
    report = tf.gradcheck(MatMulTransposeBug.apply, [a, b], raise_on_failure=False)
    assert report.inputs[0].passed and not report.inputs[1].passed


def test_fast_mode_failure_reruns_full_mode_to_name_the_element():
    report = tf.gradcheck(SinWrong.apply, [leaf(2, 3)], mode="fast", raise_on_failure=False)
    assert not report.passed
    assert "full" in report.mode
    assert report.inputs[0].how == "elements" and report.inputs[0].worst_index is not None


def test_float32_is_refused_unless_allowed():
    with pytest.raises(TypeError, match="float64"):
        tf.gradcheck(Sin.apply, [leaf(3, dtype=np.float32)])
    report = tf.gradcheck(Sin.apply, [leaf(3, dtype=np.float32)], allow_float32=True)
    assert report.passed and report.float32 and "widened" in str(report)
    assert report.eps >= 1e-3


def test_only_inputs_requiring_grad_are_checked():
    w = Tensor(np.random.default_rng(0).standard_normal(3))
    report = tf.gradcheck(lambda x, c: x * c, [leaf(3), w])
    assert [r.position for r in report.inputs] == [0]
    with pytest.raises(ValueError, match="requires_grad"):
        tf.gradcheck(lambda c: c * 2, [w])


def test_nondeterministic_backward_is_reported():
    report = tf.gradcheck(NoisyBackward.apply, [leaf(4)], raise_on_failure=False, atol=1e-1)
    assert any("reentrant" in p for p in report.problems)
    assert tf.gradcheck(NoisyBackward.apply, [leaf(4)], nondet_tol=1.0, atol=1e-1).passed


def test_gradient_for_zero_upstream_must_be_zero():
    report = tf.gradcheck(ConstantLeak.apply, [leaf(4)], raise_on_failure=False, atol=1.0)
    assert any("zero upstream" in p for p in report.problems)


def test_several_outputs_and_inputs():
    def fn(a, b):
        return (a * b).tanh(), (a @ b.T).sum(axis=0), a.max(axis=1)

    report = tf.gradcheck(fn, [leaf(3, 4, seed=1), leaf(3, 4, seed=2)])
    assert len(report.inputs) == 2 and report.passed


def test_parameters_held_by_a_callable_are_checked_in_place_and_restored():
    class Affine:
        def __init__(self):
            self.weight = leaf(4, 2, seed=5)

        def __call__(self, x):
            return (x @ self.weight).tanh()

    model = Affine()
    x = Tensor(np.random.default_rng(1).standard_normal((3, 4)))
    before = model.weight.data.copy()
    report = tf.gradcheck(lambda w: model(x), [model.weight])
    assert report.passed
    np.testing.assert_array_equal(model.weight.data, before)


def test_fn_must_return_tensors():
    with pytest.raises(TypeError, match="Tensors"):
        tf.gradcheck(lambda x: x.data, [leaf(2)])


def test_nan_gradient_fails():
    class NanBackward(Sin):
        def backward(self, g):
            return g * np.nan

    with pytest.raises(GradcheckError, match="nan"):
        tf.gradcheck(NanBackward.apply, [leaf(2)])


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode"):
        tf.gradcheck(Sin.apply, [leaf(2)], mode="quick")


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_an_output_that_stays_minus_infinity_adds_nothing_to_the_difference(mode):
    """A masked score filled with −inf does not move when x does: its (−inf) − (−inf) counts as 0,
    not NaN (the study course's checker relies on it, with the same central differences)."""
    mask = np.array([[True, False, False], [False, True, True]])
    x = leaf(2, 3)
    report = tf.gradcheck(lambda x: tf.masked_fill(x * 2, mask, -np.inf), [x], mode=mode)
    assert report.passed


def test_central_differences_project_each_output_on_its_upstream_gradient():
    from tinyformer.engine.gradcheck import central_differences

    base = np.array([0.5, -1.0, 2.0])
    upstream = [np.array([1.0, 2.0, -1.0]), np.array([3.0])]
    numeric = central_differences(lambda x: [x ** 2, np.array([x.sum()])], base, upstream)
    np.testing.assert_allclose(numeric, 2 * base * upstream[0] + upstream[1], rtol=1e-7)


# ---------------------------------------------------------------------------- five_point_difference
def two_point_difference(value_at, step):
    """(f(x + h) − f(x − h)) / 2h: exact only up to quadratics, so the quartic check must reject it."""
    return (value_at(step) - value_at(-step)) / (2 * step)


def five_points_outer_sign_flipped(value_at, step):
    """The five-point weights with the outer pair added instead of subtracted."""
    return (8 * (value_at(step) - value_at(-step)) + (value_at(2 * step) - value_at(-2 * step))) / (12 * step)


# (coefficients of 1, x, x², x³, x⁴; the point x; the step h): h as large as 0.5, where a two-point
# difference is off by h²/6·f‴(x), tenths or more.
QUARTICS = [((1.0, -2.0, 0.5, 3.0, -1.5), 0.75, 0.5),
            ((0.0, 0.0, 0.0, 0.0, 1.0), -1.3, 0.25),
            ((2.0, 1.0, -4.0, 0.0, 0.2), 2.0, 0.125)]


def assert_exact_on_quartics(difference):
    """``difference`` gives p′(x) of every quartic p above to float64 rounding: |error| ≤ 64 ulp of the
    largest |p| it evaluates, divided by h (the rounding of p, amplified by the 1/h of the formula)."""
    for coefficients, x, step in QUARTICS:
        polynomial = np.polynomial.Polynomial(coefficients)
        seen = []

        def value_at(offset):
            seen.append(abs(float(polynomial(x + offset))))
            return float(polynomial(x + offset))

        numeric = difference(value_at, step)
        exact = float(polynomial.deriv()(x))
        bound = 64 * np.finfo(np.float64).eps * max(seen) / step
        assert abs(numeric - exact) <= bound, f"p = {coefficients}, x = {x}, h = {step}: {numeric} != {exact}"


def test_five_point_difference_is_exact_on_quartics():
    from tinyformer.engine.gradcheck import five_point_difference

    assert_exact_on_quartics(five_point_difference)


@pytest.mark.parametrize("wrong", [two_point_difference, five_points_outer_sign_flipped])
def test_the_quartic_check_rejects_a_wrong_difference(wrong):
    with pytest.raises(AssertionError, match="!="):
        assert_exact_on_quartics(wrong)


def test_five_point_difference_errs_by_h_to_the_fourth_on_a_quintic():
    """On x⁵ the error is exactly −h⁴/30·f⁽⁵⁾ = −4h⁴ wherever x is: halving h divides it by 16."""
    from tinyformer.engine.gradcheck import five_point_difference

    x = 0.7
    for step in (0.2, 0.1, 0.05):
        numeric = five_point_difference(lambda offset: (x + offset) ** 5, step)
        assert numeric - 5 * x ** 4 == pytest.approx(-4 * step ** 4, rel=1e-6)
