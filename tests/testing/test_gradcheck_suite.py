"""The catalogue behind `tinyformer gradcheck`: every case passes, and broken backwards or kernels fail."""


import numpy as np
import pytest

from tinyformer.engine import functional as F
from tinyformer.testing import gradcheck_suite as suite
from tinyformer.engine.kernels import softmax as softmax_kernel


@pytest.mark.parametrize("name", list(suite.CASES))
def test_every_case_passes_in_fast_mode(name):
    (row,) = suite.run([name], mode="fast")
    assert row.passed, row.detail
    assert row.name == name and row.inputs and row.detail == ""


@pytest.mark.parametrize("name", list(suite.CASES))
def test_full_mode_passes_and_reports_small_errors(name):
    """Every case, every element by central differences (what `tinyformer gradcheck --layer all`
    runs; cli/test_commands.py checks the command in fast mode)."""
    (row,) = suite.run([name], mode="full")
    assert row.passed, row.detail
    assert 0.0 <= row.max_abs_error < 1e-6 and row.seconds > 0


def test_the_catalogue_covers_every_fused_op_and_layer():
    assert {"softmax", "log_softmax", "layer_norm", "residual_layer_norm", "embedding", "cross_entropy",
            "attention_padding", "attention_causal", "mha_self", "mha_cross", "mha_causal", "feed_forward",
            "feed_forward_silu", "feed_forward_gelu", "layer_norm_module",
            "encoder_layer", "decoder_layer", "transformer"} == set(suite.CASES)
    assert suite.names("cpu") == list(suite.CASES)
    assert suite.names("cuda") == list(suite.CASES) + list(suite.KERNEL_CASES)


def test_transformer_case_checks_every_parameter_fast_and_the_embedding_full():
    fn, fast_inputs = suite.CASES["transformer"].build("fast", "cpu")
    assert len(fast_inputs) == 85 and all(p.dtype == np.float64 for p in fast_inputs)
    _, full_inputs = suite.CASES["transformer"].build("full", "cpu")
    assert [p.shape for p in full_inputs] == [(11, 64)]
    assert fn(*fast_inputs).shape == (2, 4, 11)


def test_a_layer_norm_that_forgets_its_gain_fails_even_in_the_module(monkeypatch):
    """The module's gain starts at exactly 1, where forgetting it changes nothing: the suite moves it off 1."""
    original = F.LayerNorm.backward

    def forgets_the_gain(self, g):
        self.weight = np.ones_like(self.weight)
        return original(self, g)

    monkeypatch.setattr(F.LayerNorm, "backward", forgets_the_gain)
    rows = suite.run(["layer_norm", "layer_norm_module", "softmax"], mode="full")
    assert [r.passed for r in rows] == [False, False, True]
    assert "gradcheck FAILED" in rows[1].detail and "FAIL" in rows[1].detail


def test_a_backward_that_raises_is_a_failed_row_and_the_run_goes_on(monkeypatch):
    def broken(self, g):
        raise RuntimeError("deliberately broken")

    monkeypatch.setattr(F.Softmax, "backward", broken)
    rows = suite.run(["softmax", "log_softmax"], mode="fast")
    assert not rows[0].passed and "RuntimeError: deliberately broken" in rows[0].detail
    assert np.isnan(rows[0].max_abs_error)
    assert rows[1].passed


def test_unknown_names_and_modes_are_refused():
    with pytest.raises(ValueError, match="unknown case 'softmaxx'; valid names: softmax, log_softmax"):
        suite.run(["softmaxx"])
    with pytest.raises(ValueError, match="mode must be one of"):
        suite.run(["softmax"], mode="quick")


def test_format_table_aligns_columns_and_appends_failure_details():
    rows = [suite.Row("softmax", "(2,3,5)", 1e-10, 2e-9, 0.01, True),
            suite.Row("broken_case", "(7,4)", 0.5, 0.25, 1.5, False, "the report")]
    lines = suite.format_table(rows).splitlines()
    assert lines[0].split() == ["case", "checked", "inputs", "max", "abs", "err", "max", "rel", "err", "time",
                                "result"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].endswith("PASS") and lines[3].endswith("FAIL")
    assert lines[2].index("PASS") == lines[3].index("FAIL")
    assert "5.00e-01" in lines[3] and "1.50 s" in lines[3]
    assert lines[-2:] == ["broken_case FAILED:", "the report"]


# ---------------------------------------------------------------- kernels against the NumPy reference
def _exact_softmax(x, log=False, dtype=None):
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return (log_p if log else np.exp(log_p)).astype(np.float32)


def test_a_wrong_kernel_gradient_is_flagged_with_the_place(monkeypatch):
    """Kernels replaced by Python stand-ins (no compiler needed): the forward exact, the backward 1% off."""
    monkeypatch.setattr(softmax_kernel, "softmax_forward", _exact_softmax)
    monkeypatch.setattr(softmax_kernel, "softmax_backward",
                        lambda y, g, log=False, dtype=None: (y * (g - (g * y).sum(-1, keepdims=True)) * 1.01))
    (row,) = suite.run(["kernel_softmax"], device="cpu")
    assert not row.passed
    assert "grad x:" in row.detail and "output" not in row.detail.split("\n", 1)[1]
    assert row.inputs == "x (6,37)"


def test_exact_stand_ins_pass_the_kernel_comparison(monkeypatch):
    monkeypatch.setattr(softmax_kernel, "softmax_forward", _exact_softmax)
    monkeypatch.setattr(softmax_kernel, "softmax_backward",
                        lambda y, g, log=False, dtype=None: y * (g - (g * y).sum(-1, keepdims=True)))
    (row,) = suite.run(["kernel_softmax"], device="cpu")
    assert row.passed, row.detail


@pytest.mark.usefixtures("cxx_compiler")
def test_every_kernel_matches_its_reference_through_the_cpu_emulation():
    rows = suite.run(list(suite.KERNEL_CASES), device="cpu")
    for row in rows:
        assert row.passed, row.detail
        # float32 kernels to float32 rounding; the bfloat16 tensor-core one to bfloat16's (2^-8 relative)
        assert row.max_abs_error < (5e-2 if row.name == "kernel_attention_tensor_cores" else 1e-4), row.name
