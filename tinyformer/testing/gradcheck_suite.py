"""Every fused op and layer through the gradient checker, and every CUDA kernel against NumPy.

``tinyformer gradcheck`` runs this. A *case* builds, on random float64 inputs, a
callable and the tensors whose gradients are checked: ``build(mode, device) -> (fn,
inputs)``, registered under a name in ``CASES``. ``run`` hands each to
``tinyformer.engine.gradcheck.gradcheck`` (a random upstream gradient per output; ``full``
compares every element with central differences, ``fast`` one random direction per
input) and returns one ``Row`` per case; ``format_table`` prints them.

Parameters initialised to a constant (LayerNorm's gain 1 and bias 0, the Linear
biases 0) are moved off it first: with a gain of exactly 1 a backward that forgets
the gain would pass.

The ``kernel_*`` cases (``KERNEL_CASES``) run cases of the kernel harness,
``tinyformer.testing.kernel_cases``, in float32 (the tensor-core attention in bfloat16, the type it
exists for): a CUDA kernel through its launcher (``tinyformer.engine.kernels.softmax``, ...)
against the NumPy reference of ``functional`` (or ``optim.Adam``) in float64 on the
same values, outputs and gradients for a random upstream gradient. On "cuda" the
compiled kernel runs; on "cpu" its very source runs through the C++ emulation
(``tinyformer.testing.emulation``, needs g++).
"""

import math
import time
from typing import Callable, NamedTuple

import numpy

from ..engine import backend, functional as F
from ..model import nn
from ..engine.gradcheck import gradcheck
from . import kernel_cases
from ..engine.random import make_generator
from ..engine.tensor import Tensor

__all__ = ["Case", "Row", "CASES", "KERNEL_CASES", "TOLERANCES", "names", "run", "format_table"]

MODES = ("full", "fast")
TOLERANCES = {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3}
"""What every case is checked with (gradcheck's defaults, written out so the table's header can say them)."""
TOLERANCE_NOTE = (f"float64 inputs, random upstream gradients, eps={TOLERANCES['eps']:g}; pass when "
                  f"|analytic - numeric| <= {TOLERANCES['atol']:g} + {TOLERANCES['rtol']:g} * |numeric|")


class Case(NamedTuple):
    """A named check: ``build(mode, device)`` gives ``(fn, inputs)``; a kernel case's ``build(device)``
    gives a ``kernel_cases.KernelRun``."""

    name: str
    about: str
    build: Callable


class Row(NamedTuple):
    """One line of the table; ``detail`` holds gradcheck's report or the error when it failed."""

    name: str
    inputs: str
    max_abs_error: float
    max_rel_error: float
    seconds: float
    passed: bool
    detail: str = ""


CASES = {}
KERNEL_CASES = {}


def _register(registry, name, about):
    def register(build):
        registry[name] = Case(name, about, build)
        return build
    return register


def names(device="cpu"):
    """The cases ``all`` stands for: every gradcheck case, and on "cuda" every kernel case too."""
    return list(CASES) + (list(KERNEL_CASES) if device == "cuda" else [])


# ------------------------------------------------------------------ inputs
def _rng(seed):
    return numpy.random.default_rng(seed)


def _leaf(device, shape, seed, scale=1.0, shift=0.0):
    """A float64 Tensor of N(shift, scale²) values on ``device`` that requires grad."""
    values = _rng(seed).standard_normal(shape) * scale + shift
    return Tensor(backend.to_device(values, device), requires_grad=True)


def _key_mask(lengths, len_k):
    """Padding keep-mask (batch, 1, 1, len_k): sequence b has ``lengths[b]`` real keys."""
    return (numpy.arange(len_k)[None, :] < numpy.asarray(lengths)[:, None])[:, None, None, :]


def _prepare(module, device, seed):
    """``module`` in float64 on ``device``, eval mode, constant-initialised parameters made random."""
    module.to(device=device, dtype=numpy.float64).eval()
    rng = _rng(seed)
    for p in module.parameters():
        host = backend.to_numpy(p.data)
        if host.size > 1 and numpy.all(host == host.flat[0]):
            p.data = backend.to_device(host + 0.5 * rng.standard_normal(host.shape), device)
    return module


# ------------------------------------------------------------------ fused ops (functional/)
@_register(CASES, "softmax", "F.softmax over the last axis")
def _softmax(mode, device):
    return (lambda x: F.softmax(x, axis=-1)), [_leaf(device, (2, 3, 5), 1, scale=2.0)]


@_register(CASES, "log_softmax", "F.log_softmax over the last axis")
def _log_softmax(mode, device):
    return (lambda x: F.log_softmax(x, axis=-1)), [_leaf(device, (2, 3, 5), 2, scale=2.0)]


@_register(CASES, "layer_norm", "F.layer_norm: input, gain and bias")
def _layer_norm(mode, device):
    x = _leaf(device, (2, 3, 6), 3, scale=2.0, shift=1.0)
    return F.layer_norm, [x, _leaf(device, (6,), 4, shift=1.0), _leaf(device, (6,), 5)]


@_register(CASES, "residual_layer_norm", "F.residual_dropout_layer_norm: LayerNorm(x + dropout(y)), p 0.3")
def _residual_layer_norm(mode, device):
    x, y = _leaf(device, (2, 3, 6), 7, scale=2.0, shift=1.0), _leaf(device, (2, 3, 6), 8)
    # a generator of one seed per call: every evaluation drops the same elements
    return (lambda x, y, w, b: F.residual_dropout_layer_norm(x, y, w, b, 0.3, True, numpy.random.default_rng(3)),
            [x, y, _leaf(device, (6,), 9, shift=1.0), _leaf(device, (6,), 10)])


@_register(CASES, "embedding", "F.embedding with repeated ids (their gradients add up)")
def _embedding(mode, device):
    ids = numpy.array([[1, 3, 3], [0, 6, 1]])
    return (lambda w: F.embedding(ids, w)), [_leaf(device, (7, 4), 6)]


@_register(CASES, "cross_entropy", "F.cross_entropy, label smoothing 0.1, ignore_index 0; loss and NLL")
def _cross_entropy(mode, device):
    target = numpy.array([[2, 0, 6, 1], [0, 0, 3, 5]])
    return ((lambda z: F.cross_entropy(z, target, 0.1, ignore_index=0, return_nll=True)),
            [_leaf(device, (2, 4, 7), 7, scale=2.0)])


@_register(CASES, "attention_padding",
           "F.scaled_dot_product_attention, padding mask (key lengths 5, 2, 0); output and probabilities")
def _attention_padding(mode, device):
    mask = _key_mask([5, 2, 0], 5)
    q, k, v = (_leaf(device, (3, 2, n, 4), seed) for n, seed in ((3, 8), (5, 9), (5, 10)))
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, return_weights=True)), [q, k, v]


@_register(CASES, "attention_causal", "F.scaled_dot_product_attention, causal mask; output and probabilities")
def _attention_causal(mode, device):
    q, k, v = (_leaf(device, (2, 2, 4, 4), seed) for seed in (11, 12, 13))
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)), [q, k, v]


# ------------------------------------------------------------------ layers (nn/)
D_MODEL, HEADS, D_FF = 8, 2, 16


def _mha(device, seed):
    return _prepare(nn.MultiHeadAttention(D_MODEL, HEADS, generator=make_generator(seed)), device, seed)


@_register(CASES, "mha_self", "MultiHeadAttention, self-attention with a padding mask")
def _mha_self(mode, device):
    mha, mask = _mha(device, 20), _key_mask([3, 2], 3)
    return (lambda x, *params: mha(x, mask=mask)), [_leaf(device, (2, 3, D_MODEL), 21), *mha.parameters()]


@_register(CASES, "mha_cross", "MultiHeadAttention, queries attending to a padded memory (keys = values)")
def _mha_cross(mode, device):
    mha, mask = _mha(device, 22), _key_mask([4, 2], 4)
    query, memory = _leaf(device, (2, 3, D_MODEL), 23), _leaf(device, (2, 4, D_MODEL), 24)
    return (lambda q, m, *params: mha(q, m, m, mask=mask)), [query, memory, *mha.parameters()]


@_register(CASES, "mha_causal", "MultiHeadAttention, causal self-attention")
def _mha_causal(mode, device):
    mha = _mha(device, 25)
    return (lambda x, *params: mha(x, causal=True)), [_leaf(device, (2, 4, D_MODEL), 26), *mha.parameters()]


@_register(CASES, "feed_forward", "PositionwiseFeedForward: max(0, xW1 + b1)W2 + b2 (§3.3)")
def _feed_forward(mode, device):
    ffn = _prepare(nn.PositionwiseFeedForward(D_MODEL, D_FF, generator=make_generator(27)), device, 27)
    return (lambda x, *params: ffn(x)), [_leaf(device, (2, 3, D_MODEL), 28), *ffn.parameters()]


@_register(CASES, "feed_forward_silu", "PositionwiseFeedForward, activation silu: (h σ(h))W2 + b2, h = xW1 + b1")
def _feed_forward_silu(mode, device):
    ffn = _prepare(nn.PositionwiseFeedForward(D_MODEL, D_FF, generator=make_generator(27), activation="silu"),
                   device, 27)
    return (lambda x, *params: ffn(x)), [_leaf(device, (2, 3, D_MODEL), 28), *ffn.parameters()]


@_register(CASES, "feed_forward_gelu", "PositionwiseFeedForward, activation gelu: (h Φ(h))W2 + b2, exact erf")
def _feed_forward_gelu(mode, device):
    ffn = _prepare(nn.PositionwiseFeedForward(D_MODEL, D_FF, generator=make_generator(27), activation="gelu"),
                   device, 27)
    return (lambda x, *params: ffn(x)), [_leaf(device, (2, 3, D_MODEL), 28), *ffn.parameters()]


@_register(CASES, "layer_norm_module", "nn.LayerNorm (gain and bias moved off 1 and 0)")
def _layer_norm_module(mode, device):
    norm = _prepare(nn.LayerNorm(D_MODEL), device, 29)
    return (lambda x, *params: norm(x)), [_leaf(device, (2, 3, D_MODEL), 30, scale=2.0), *norm.parameters()]


@_register(CASES, "encoder_layer", "EncoderLayer: self-attention and feed-forward, residual + LayerNorm")
def _encoder_layer(mode, device):
    layer = _prepare(nn.EncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, generator=make_generator(31)), device, 31)
    mask = _key_mask([3, 2], 3)
    return (lambda x, *params: layer(x, mask)), [_leaf(device, (2, 3, D_MODEL), 32), *layer.parameters()]


@_register(CASES, "decoder_layer", "DecoderLayer: causal self-attention, cross-attention, feed-forward")
def _decoder_layer(mode, device):
    layer = _prepare(nn.DecoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, generator=make_generator(33)), device, 33)
    mask = _key_mask([4, 2], 4)
    x, memory = _leaf(device, (2, 3, D_MODEL), 34), _leaf(device, (2, 4, D_MODEL), 35)
    return (lambda x, m, *params: layer(x, m, memory_mask=mask)), [x, memory, *layer.parameters()]


@_register(CASES, "transformer",
           "the `tiny` Transformer, dropout 0, vocabulary 11; full mode: the shared embedding element by "
           "element (every layer and the tied output projection feed its gradient), fast mode: all parameters")
def _transformer(mode, device):
    model = _prepare(nn.Transformer.from_preset("tiny", vocab_size=11, dropout=0.0, seed=36), device, 36)
    src = numpy.array([[4, 7, 5, 9, 3], [6, 8, 3, 0, 0]])  # EOS = 3, padding = 0
    tgt_in = numpy.array([[2, 5, 10, 4], [2, 9, 6, 0]])  # BOS = 2
    params = model.parameters()
    checked = [model.src_embed.weight] if mode == "full" else params
    return (lambda *params: model(src, tgt_in)), checked


# ------------------------------------------------------------------ running
def _describe(inputs):
    """'(2, 3, 8) (2, 4, 8) +16 params (288)': the checked inputs, parameters summed up."""
    params = [t for t in inputs if isinstance(t, nn.Parameter)]
    parts = [str(tuple(t.shape)).replace(" ", "") for t in inputs if not isinstance(t, nn.Parameter)]
    if params:
        count = sum(p.size for p in params)
        parts.append(f"+{len(params)} param{'s' if len(params) > 1 else ''} ({count})")
    return " ".join(parts)


def _check_case(case, mode, device):
    fn, inputs = case.build(mode, device)
    described = _describe(inputs)
    report = gradcheck(fn, inputs, mode=mode, raise_on_failure=False, **TOLERANCES)
    worst_abs = max((r.max_abs_error for r in report.inputs), default=0.0, key=_nan_last)
    worst_rel = max((r.max_rel_error for r in report.inputs), default=0.0, key=_nan_last)
    return described, worst_abs, worst_rel, report.passed, "" if report.passed else str(report)


def _nan_last(value):
    """Sort key that makes NaN the maximum (a NaN error must show in the table)."""
    return math.inf if math.isnan(value) else value


def run(selected=None, mode="full", device="cpu"):
    """Run the named cases (default: ``names(device)``) and return one ``Row`` each.

    An exception inside a case becomes a failed row whose ``detail`` names it.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    backend.check_device(device)
    selected = names(device) if selected is None else list(selected)
    unknown = [n for n in selected if n not in CASES and n not in KERNEL_CASES]
    if unknown:
        raise ValueError(f"unknown case {unknown[0]!r}; valid names: {', '.join(list(CASES) + list(KERNEL_CASES))}")
    rows = []
    for name in selected:
        start = time.perf_counter()
        try:
            if name in CASES:
                described, abs_err, rel_err, passed, detail = _check_case(CASES[name], mode, device)
            else:
                described, abs_err, rel_err, passed, detail = _compare_kernel(KERNEL_CASES[name], device)
        except Exception as error:  # a crash in backward is a failure to report, not to hide the rest
            described, abs_err, rel_err, passed = "-", math.nan, math.nan, False
            detail = f"{name}: {type(error).__name__}: {error}"
        rows.append(Row(name, described, abs_err, rel_err, time.perf_counter() - start, passed, detail))
    return rows


def format_table(rows):
    """The rows as an aligned text table (the details of failed rows follow it)."""
    header = ["case", "checked inputs", "max abs err", "max rel err", "time", "result"]
    lines = [header] + [
        [r.name, r.inputs, f"{r.max_abs_error:.2e}", f"{r.max_rel_error:.2e}", f"{r.seconds:.2f} s",
         "PASS" if r.passed else "FAIL"]
        for r in rows
    ]
    widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
    numeric = {2, 3, 4}
    text = ["  ".join(cell.rjust(w) if c in numeric else cell.ljust(w)
                      for c, (cell, w) in enumerate(zip(line, widths))).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        if r.detail:
            text += ["", f"{r.name} FAILED:", r.detail]
    return "\n".join(text)


# ------------------------------------------------------------------ CUDA kernels against NumPy
def _kernel_tolerance_note():
    rtol, atol = kernel_cases.TOLERANCE["float32"]
    rtol16, atol16 = kernel_cases.TOLERANCE["bfloat16"]
    return (f"kernel_* rows: the float32 kernel against the float64 NumPy reference on the same values "
            f"(kernel_cases), pass when |kernel - reference| <= atol + rtol * |reference|: outputs rtol {rtol:g}, "
            f"atol {atol:g}, gradients both x{kernel_cases.GRAD_FACTOR['float32']:g}; some comparisons have their own "
            f"(a failure names it); kernel_attention_tensor_cores in bfloat16: rtol {rtol16:g}, atol {atol16:g}, "
            f"gradients x{kernel_cases.GRAD_FACTOR['bfloat16']:g}")


KERNEL_TOLERANCE_NOTE = _kernel_tolerance_note()


def _compare_kernel(case, device):
    """Run a kernel case: (inputs, max abs err, max rel err, passed, detail)."""
    run = case.build(device)
    worst_abs, worst_rel = run.max_errors()
    failures = run.failures
    detail = "\n".join([f"{len(failures)} of {len(run.comparisons)} comparisons off:", *failures]) if failures else ""
    return run.inputs, worst_abs, worst_rel, not failures, detail


def _float32(device):
    return kernel_cases.Device(device, "float32")


@_register(KERNEL_CASES, "kernel_softmax", "softmax.cu forward and backward against F.softmax")
def _kernel_softmax(device):
    return kernel_cases.softmax(_float32(device), 6, 37, seed=40)


@_register(KERNEL_CASES, "kernel_log_softmax", "softmax.cu (log) forward and backward against F.log_softmax")
def _kernel_log_softmax(device):
    return kernel_cases.softmax(_float32(device), 6, 37, log=True, seed=41)


@_register(KERNEL_CASES, "kernel_layer_norm", "layer_norm.cu forward and the three backward kernels")
def _kernel_layer_norm(device):
    return kernel_cases.layer_norm(_float32(device), 10, 48, seed=42, rows_per_chunk=4)


@_register(KERNEL_CASES, "kernel_cross_entropy",
           "cross_entropy.cu, label smoothing 0.1, ignore_index 0: per-row loss, NLL, log-sum-exp, gradient")
def _kernel_cross_entropy(device):
    return kernel_cases.cross_entropy(_float32(device), 9, 50, 0.1, 0, seed=43)


@_register(KERNEL_CASES, "kernel_attention_padding", "attention.cu with key lengths 7 and 3, head size 32")
def _kernel_attention_padding(device):
    return kernel_cases.attention(_float32(device), 2, 2, 5, 7, 32, lengths=[7, 3], rng_seed=44)


@_register(KERNEL_CASES, "kernel_attention_causal", "attention.cu, causal, head size 64")
def _kernel_attention_causal(device):
    return kernel_cases.attention(_float32(device), 1, 2, 6, 6, 64, causal=True, rng_seed=45)


@_register(KERNEL_CASES, "kernel_attention_tensor_cores",
           "attention_mma.cu (mma.sync, bfloat16), causal, key lengths 40 and 9, q/k/v in the projections' layout")
def _kernel_attention_tensor_cores(device):
    return kernel_cases.attention_mma(kernel_cases.Device(device, "bfloat16"), 2, 2, 37, 40, 64, lengths=[40, 9],
                                      causal=True, rng_seed=48)


@_register(KERNEL_CASES, "kernel_bias_relu_dropout",
           "bias_relu_dropout.cu: dropout(max(0, y + b)) and its backward, p 0.3")
def _kernel_bias_relu_dropout(device):
    return kernel_cases.bias_relu_dropout(_float32(device), 9, 70, 0.3, seed=2 ** 33 + 50, rng_seed=50)


@_register(KERNEL_CASES, "kernel_residual_layer_norm",
           "residual_layer_norm.cu: LayerNorm(x + dropout(y)) forward and backward, p 0.3")
def _kernel_residual_layer_norm(device):
    return kernel_cases.residual_layer_norm(_float32(device), 7, 40, 0.3, seed=2 ** 40 + 49, rng_seed=49)


@_register(KERNEL_CASES, "kernel_dropout",
           "dropout.cu, p 0.3: the keep mask against philox.py, the output against x ∘ keep / (1 − p)")
def _kernel_dropout(device):
    return kernel_cases.dropout(_float32(device), (9, 130), 0.3, 2 ** 62 + 47, rng_seed=47)


@_register(KERNEL_CASES, "kernel_adam", "adam.cu: three steps on the device (the global norm, clipping to 2, the "
           "update) against optim.adam.fused_update and optim.Adam's NumPy loop")
def _kernel_adam(device):
    return kernel_cases.adam(_float32(device), [(3, 5), (7,), (300,)], 128, seed=46, max_grad_norm=2.0)
