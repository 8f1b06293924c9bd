"""The kernel harness itself (tinyformer/testing/kernel_cases/): a comparison fails where it should and
says where; no compiler needed (the cases run the kernels in engine/kernels/test_emulation.py)."""

import math

import numpy as np
import pytest

from tinyformer.testing import kernel_cases as cases


def test_a_comparison_within_tolerance_passes_and_reports_its_errors():
    c = cases.compared("output", np.array([1.0, 2.00001]), np.array([1.0, 2.0]), rtol=1e-5, atol=1e-6)
    assert c.failure() is None
    abs_err, rel_err = c.errors()
    assert abs_err == pytest.approx(1e-5) and rel_err == pytest.approx(1e-5 / (2 + 1e-6))


def test_a_comparison_off_tolerance_names_the_worst_element_and_the_tolerance():
    actual = np.array([[1.0, 2.0], [3.0, 4.1]], np.float32)
    c = cases.compared("grad x", actual, np.array([[1.0, 2.0], [3.01, 4.0]]), rtol=1e-3, atol=1e-6)
    message = c.failure()
    assert message.startswith("grad x: 2 of 4 values off (tolerance 1e-06 + 0.001·|reference|)")
    assert "worst at (1, 1): kernel 4.1" in message and "reference 4" in message


def test_nan_and_a_wrong_shape_fail():
    nan = cases.compared("y", np.array([1.0, np.nan]), np.array([1.0, 1.0]), 1e-5, 1e-6)
    assert "worst at (1,): kernel nan" in nan.failure()
    assert math.isnan(nan.errors()[0])
    wrong = cases.compared("y", np.zeros(3), np.zeros(4), 1e-5, 1e-6)
    assert wrong.failure() == "y: shape (3,), reference (4,)"


def test_an_exact_comparison_allows_no_difference():
    keep = np.array([True, False, True])
    assert cases.compared("keep", keep, keep, 0.0, 0.0).failure() is None
    assert cases.compared("keep", keep, ~keep, 0.0, 0.0).failure().startswith("keep: 3 of 3 values off")
    assert cases.compared("keep", keep, keep, 0.0, 0.0).errors() == (0.0, 0.0)


def test_a_run_raises_with_every_failure_and_returns_its_results_when_it_passes():
    good = cases.compared("a", np.ones(2), np.ones(2), 1e-5, 1e-6)
    bad = cases.compared("b", np.ones(2), np.zeros(2), 1e-5, 1e-6)
    assert cases.KernelRun("x (2,)", [good], {"y": 1}).check() == {"y": 1}
    run = cases.KernelRun("x (2,)", [good, bad, bad._replace(label="c")], {})
    assert not run.passed and run.max_errors() == (1.0, 1.0 / 1e-6)
    with pytest.raises(AssertionError, match=r"x \(2,\):\nb: 2 of 2 values off.*\nc: 2 of 2"):
        run.check()


def test_device_tolerances_follow_the_element_type():
    for dtype, (rtol, atol) in cases.TOLERANCE.items():
        device = cases.Device("cpu", dtype)
        x = device.put(np.array([1.0], np.float32))
        output = device.output("y", x, np.array([1.0]), atol=1e-5)
        gradient = device.gradient("g", x, np.array([1.0]))
        assert output.rtol == rtol and output.atol == max(1e-5, atol)
        assert gradient.rtol == rtol * cases.GRAD_FACTOR[dtype] and gradient.atol == atol * cases.GRAD_FACTOR[dtype]
    assert cases.Device("cpu", "bfloat16").round(np.array([1.0 + 2 ** -10], np.float32))[0] == 1.0
    with pytest.raises(ValueError, match="dtype must be one of float32, float16, bfloat16, got 'float64'"):
        cases.Device("cpu", "float64")
