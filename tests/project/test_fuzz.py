"""Fuzzing with hypothesis: arbitrary Unicode through the tokenizer and ``translate``, arbitrary
bytes through ``tinyformer translate``, and the fused ops at extreme values against float64
references written here, independently of the library.

Example counts are kept moderate (the file runs in seconds); CI runs them derandomized, and the
thorough profile (``python benchmarks/fuzz_thorough.py``) ten times as many (tests/conftest.py).
"""

import io
import math
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinyformer as tf
from tinyformer import cli
from tinyformer.cli import text_io
from tinyformer.translation import decode
from tinyformer.model import nn
from tinyformer.engine import functional as F
from tinyformer.translation.data.special import UNK_ID
from tinyformer.translation.data.synthetic import synthetic_pairs

from trained_models import make_tiny_run

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- text
# Characters a random draw rarely hits: controls, line and paragraph separators, zero-width and
# bidirectional marks, combining marks, emoji with modifiers and joiners, RTL scripts, the
# sentencepiece space symbol, the highest code point, ...
AWKWARD = ["\x00", "\x01", "\x1b", "\x7f", "\t", "\r", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e",
           "\x85", "\u00a0", "\u2028", "\u2029", "\u200b", "\u200d", "\u200e", "\u200f", "\u202e", "\ufeff",
           "\ufffd", "\u0301", "\u0308\u0308\u0308", "\u20dd", "\U0001f600", "\U0001f44d\U0001f3fd",
           "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f1e9\U0001f1ea", "שלום", "مرحبا", "ß", "ẞ",
           "İ",
           "ﬁ", "\U0010ffff", "\U000e0001", "\u2581", "\u2581\u2581", " ", "   ", "I see 3 red cats", "Hund"]

unicode_text = st.lists(
    st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from(AWKWARD),
              st.text(st.characters(exclude_categories=("Cs",)), max_size=6)),
    max_size=30).map("".join)
long_words = st.builds(lambda piece, count: piece * count,
                       st.sampled_from(["a", "ü", "Haus", "\U0001f600", "e\u0301", "\u2581", "ab "]),
                       st.integers(300, 3000))
any_text = st.one_of(unicode_text, long_words)


@pytest.fixture(scope="module")
def corpus():
    english, german = synthetic_pairs("val")
    return english + german


@FUZZ
@given(text=any_text)
def test_tokenizer_encodes_and_decodes_any_unicode(tokenizer, text):
    ids = tokenizer.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size for i in ids)
    decoded = tokenizer.decode(ids)
    assert isinstance(decoded, str)
    # What comes back is made of the vocabulary's characters, spaces and " ⁇ " (sentencepiece's
    # surface for an unknown piece); NUL, controls and line breaks outside it never survive.
    pieces = "".join(tokenizer.id_to_piece(i) for i in range(4, tokenizer.vocab_size))
    assert set(decoded) <= set(pieces.replace("\u2581", " ")) | {" ", "\u2047"}
    assert tokenizer.encode_batch([text, decoded]) == [ids, tokenizer.encode(decoded)]


@FUZZ
@given(data=st.data())
def test_tokenizer_round_trips_text_over_its_training_alphabet(tokenizer, corpus, data):
    """What the tokenizer promises (tokenizer.py): decode(encode(s)) == s for characters seen in
    training, except that leading and trailing spaces are dropped and runs of spaces become one."""
    alphabet = sorted(set("".join(corpus)))
    text = data.draw(st.one_of(st.text(alphabet, max_size=80),
                               st.lists(st.sampled_from(corpus + [" ", "  "]), max_size=4).map(" ".join),
                               st.builds(lambda c, n: c * n, st.sampled_from(alphabet), st.integers(100, 2000))))
    assert tokenizer.decode(tokenizer.encode(text)) == " ".join(w for w in text.split(" ") if w)
    assert UNK_ID not in tokenizer.encode(text)


# --------------------------------------------------------------------------- translate
@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    """A random 1-layer model whose positional table holds 12 positions (so long lines get cut)."""
    return nn.Transformer(src_vocab_size=len(tokenizer),
                          d_model=16, d_ff=32, heads=2, num_layers=1, dropout=0.0, max_len=12,
                          seed=0)


line_text = st.one_of(unicode_text, long_words, st.sampled_from(["", " ", "\t \u3000", "\u2028", "I see"]))


@FEW
@given(lines=st.lists(line_text, max_size=6), beam=st.integers(1, 3), batch=st.integers(1, 4))
def test_translate_gives_one_clean_line_per_input_line(tokenizer, tiny_model, lines, beam, batch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", decode.InputWarning)
        out = decode.translate(tiny_model, tokenizer, lines, beam_size=beam, batch_size=batch, max_len_b=3)
    assert len(out) == len(lines)
    for line, translation in zip(lines, out):
        assert isinstance(translation, str) and len(translation.splitlines()) <= 1 and "\n" not in translation
        if not line.strip():
            assert translation == ""


def expected_line_count(data):
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


raw_bytes = st.one_of(
    st.binary(max_size=300),
    st.lists(st.one_of(st.binary(max_size=8), st.sampled_from([b"\n", b"\r\n", b"\r", b"\x00", b"\xff",
                                                               b"\xed\xa0\x80", b"\xc3", b"\xa4", b"I see ",
                                                               "\u2028".encode(), "\U0001f600".encode()])),
             max_size=40).map(b"".join),
    unicode_text.map(lambda s: s.encode("utf-8")),
)


@settings(max_examples=300, deadline=None)
@given(data=raw_bytes)
def test_cli_input_reading_keeps_the_lines_and_counts_replacements(data):
    lines, replaced, where = text_io.split_lines(data)
    assert len(lines) == expected_line_count(data)
    for line in lines:
        line.encode("utf-8")  # valid Unicode: no surrogates left
        assert "\n" not in line and "\x00" not in line
    assert where == sorted(set(where)) and (replaced == 0) == (not where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert replaced > 0
    else:
        assert replaced == text.count("\x00")
        if "\x00" not in text:
            pieces = text.split("\n")
            if pieces[-1] == "":
                pieces.pop()
            assert lines == [p[:-1] if p.endswith("\r") else p for p in pieces]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("run"), max_len=12)


@settings(max_examples=25, deadline=None)
@given(data=raw_bytes)
def test_cli_translate_writes_one_line_per_input_line(tiny_run, data):
    stdin, stdout, stderr = io.TextIOWrapper(io.BytesIO(data)), io.TextIOWrapper(io.BytesIO()), io.StringIO()
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    try:
        code = cli.main(["translate", "--checkpoint", str(tiny_run), "--beam", "1"])
        sys.stdout.flush()
    finally:
        sys.stdin, sys.stdout, sys.stderr = old
    assert code == 0, stderr.getvalue()
    out = stdout.buffer.getvalue().decode("utf-8")
    assert out.count("\n") == expected_line_count(data) and len(out.splitlines()) == expected_line_count(data)
    assert all(line.startswith("tinyformer translate: warning:") for line in stderr.getvalue().splitlines())


# --------------------------------------------------------------------------- fused ops at extreme values
def palette(dtype):
    """Zeros, ±1, ±1e4, ±1e30, subnormals of the dtype, and ordinary values."""
    tiny = np.finfo(dtype).smallest_subnormal
    specials = [float(dtype(v)) for v in (0.0, -0.0, 1.0, -1.0, 1e4, -1e4, 1e30, -1e30, tiny, -tiny, tiny * 3,
                                          np.finfo(dtype).tiny)]
    return st.one_of(st.sampled_from(specials), st.floats(-3, 3, width=np.dtype(dtype).itemsize * 8))


dtypes = st.sampled_from([np.float32, np.float64])


@st.composite
def extreme_arrays(draw, max_dims=3, min_side=1, max_side=5):
    dtype = draw(dtypes)
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=max_dims, min_side=min_side, max_side=max_side))
    return draw(hnp.arrays(dtype, shape, elements=palette(dtype)))


def eps_of(array):
    return float(np.finfo(array.dtype).eps)


# References run in extended precision (numpy.longdouble: 80-bit on x86, at least float64
# elsewhere) so that, for float64 inputs, their own rounding stays below the library's.
WIDE = np.longdouble


def ref_log_softmax(x, axis):
    """log pᵢ = (xᵢ − m) − log Σⱼ exp(xⱼ − m), m the maximum, in extended precision."""
    x = x.astype(WIDE)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def finite(*arrays):
    return all(np.all(np.isfinite(a)) for a in arrays)


@FUZZ
@given(x=extreme_arrays(), data=st.data())
def test_softmax_and_log_softmax_at_extreme_values(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    g = data.draw(hnp.arrays(x.dtype, x.shape, elements=st.floats(-2, 2, width=x.dtype.itemsize * 8)))
    eps, ref = eps_of(x), ref_log_softmax(x, axis)
    p_ref = np.exp(ref)
    for name, op in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
        leaf = tf.Tensor(x, requires_grad=True)
        out = op(leaf, axis=axis)
        out.backward(g)
        assert out.dtype == x.dtype and finite(out.data, leaf.grad), name
        g64 = g.astype(WIDE)
        if name == "softmax":
            np.testing.assert_allclose(out.data, p_ref, rtol=0, atol=8 * eps)
            grad_ref = p_ref * (g64 - (g64 * p_ref).sum(axis=axis, keepdims=True))
            atol = 16 * eps * (1 + np.abs(g64).sum(axis=axis, keepdims=True))
        else:
            np.testing.assert_allclose(out.data, ref, rtol=8 * eps, atol=8 * eps * math.log(x.shape[axis] + 1))
            grad_ref = g64 - p_ref * g64.sum(axis=axis, keepdims=True)
            atol = 16 * eps * (1 + np.abs(g64).sum(axis=axis, keepdims=True))
        assert np.all(np.abs(leaf.grad - grad_ref) <= atol), name


@FUZZ
@given(x=extreme_arrays(), data=st.data())
def test_layer_norm_at_extreme_values(x, data):
    n = x.shape[-1]
    w = data.draw(hnp.arrays(x.dtype, (n,), elements=st.floats(-2, 2, width=x.dtype.itemsize * 8)))
    b = data.draw(hnp.arrays(x.dtype, (n,), elements=st.floats(-2, 2, width=x.dtype.itemsize * 8)))
    layer_eps = data.draw(st.sampled_from([1e-5, 1e-12, 1.0]))
    leaf = tf.Tensor(x, requires_grad=True)
    y = F.layer_norm(leaf, tf.Tensor(w, requires_grad=True), tf.Tensor(b, requires_grad=True), layer_eps)
    y.backward(np.ones(x.shape, dtype=x.dtype))
    assert y.dtype == x.dtype and finite(y.data, leaf.grad)
    x64 = x.astype(WIDE)
    mu = x64.mean(axis=-1, keepdims=True)
    sigma = np.sqrt(((x64 - mu) ** 2).mean(axis=-1, keepdims=True) + layer_eps)
    expected = (x64 - mu) / sigma * w + b
    # Layer norm is ill-conditioned for rows whose spread is tiny next to their magnitude: an
    # input perturbation of eps·max|x| moves x̂ by eps·max|x|/σ. The tolerance is that bound.
    eps = eps_of(x)
    scale = np.abs(x64).max(axis=-1, keepdims=True)
    atol = 64 * eps * n * (1 + scale / sigma) * (1 + np.abs(w).max()) + 4 * eps * np.abs(b).max()
    assert np.all(np.abs(y.data - expected) <= atol)


@FUZZ
@given(logits=extreme_arrays(max_dims=3, min_side=1), data=st.data())
def test_cross_entropy_with_label_smoothing_at_extreme_values(logits, data):
    vocab = logits.shape[-1]
    target = data.draw(hnp.arrays(np.int64, logits.shape[:-1], elements=st.integers(0, vocab - 1)))
    smoothing = data.draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    reduction = data.draw(st.sampled_from(["none", "sum", "mean"]))
    leaf = tf.Tensor(logits, requires_grad=True)
    loss, nll = F.cross_entropy(leaf, target, label_smoothing=smoothing, reduction=reduction, return_nll=True)
    tf.backward([loss], [np.ones(loss.shape, dtype=logits.dtype)])
    assert finite(loss.data, nll.data, leaf.grad)
    log_p = ref_log_softmax(logits, -1)
    onehot = np.eye(vocab, dtype=WIDE)[target]
    q = (1 - smoothing) * onehot + smoothing / vocab
    loss_ref, nll_ref = -(q * log_p).sum(-1), -(onehot * log_p).sum(-1)
    count = max(target.size, 1)
    if reduction != "none":
        loss_ref, nll_ref = loss_ref.sum(), nll_ref.sum()
        if reduction == "mean":
            loss_ref, nll_ref = loss_ref / count, nll_ref / count
    eps = eps_of(logits)
    tol = dict(rtol=8 * vocab * eps, atol=8 * eps * (1 + math.log(vocab)))
    np.testing.assert_allclose(loss.data, loss_ref, **tol)
    np.testing.assert_allclose(nll.data, nll_ref, **tol)
    grad_ref = np.exp(log_p) - q
    if reduction == "mean":
        grad_ref = grad_ref / count
    np.testing.assert_allclose(leaf.grad, grad_ref, rtol=0, atol=16 * eps)


@st.composite
def attention_inputs(draw):
    dtype = draw(dtypes)
    batch, heads, len_q, len_k, d = (draw(st.integers(1, n)) for n in (2, 2, 4, 5, 4))
    small = st.one_of(st.sampled_from([0.0, -0.0, 1.0, -1.0, float(np.finfo(dtype).smallest_subnormal)]),
                      st.floats(-3, 3, width=np.dtype(dtype).itemsize * 8))
    big = 1e30 if dtype == np.float64 else 1e4  # scores q·k stay far from overflow (both exact in dtype)
    q = draw(hnp.arrays(dtype, (batch, heads, len_q, d), elements=st.one_of(small, st.sampled_from([big, -big]))))
    k = draw(hnp.arrays(dtype, (batch, heads, len_k, d), elements=small))
    v = draw(hnp.arrays(dtype, (batch, heads, len_k, d), elements=palette(dtype)))
    mask = draw(st.one_of(st.none(), hnp.arrays(bool, (batch, 1, len_q, len_k)),
                          hnp.arrays(bool, (batch, 1, 1, len_k))))
    return q, k, v, mask, draw(st.booleans())


@FUZZ
@given(inputs=attention_inputs())
def test_attention_at_extreme_values_and_fully_masked_rows(inputs):
    q, k, v, mask, causal = inputs
    leaves = [tf.Tensor(a, requires_grad=True) for a in (q, k, v)]
    out, weights = F.scaled_dot_product_attention(*leaves, mask=mask, causal=causal, return_weights=True)
    out.backward(np.ones(out.shape, dtype=q.dtype))
    assert finite(out.data, weights.data, *(t.grad for t in leaves))
    q64, k64, v64 = (a.astype(WIDE) for a in (q, k, v))
    d, len_q, len_k = q.shape[-1], q.shape[-2], k.shape[-2]
    scores = np.einsum("bhqd,bhkd->bhqk", q64, k64) / math.sqrt(d)
    keep = np.ones(scores.shape, dtype=bool)
    if mask is not None:
        keep &= mask
    if causal:
        keep &= np.tril(np.ones((len_q, len_k), dtype=bool), k=len_k - len_q)
    probs = np.zeros(scores.shape, dtype=WIDE)
    for index in np.ndindex(scores.shape[:-1]):
        row = scores[index][keep[index]]
        if row.size:  # a query with no key left attends to nothing: zeros
            probs[index][keep[index]] = np.exp(ref_log_softmax(row, -1))
    expected = probs @ v64
    # float32 scores carry an error of about d·eps·max|q|·max|k|; P moves by ~4× that (L1),
    # so O by that much times max|v| (the comparison is vacuous where that exceeds 2·max|v|).
    eps = eps_of(q)
    score_error = 2 * d * eps * np.abs(q64).max() * np.abs(k64).max() / math.sqrt(d)
    vmax = np.abs(v64).max()
    atol = vmax * (16 * eps * len_k + min(2.0, 8 * score_error)) + np.finfo(q.dtype).tiny
    assert np.all(np.abs(out.data - expected) <= atol)
    fully_masked = ~keep.any(axis=-1)
    assert np.all(out.data[fully_masked] == 0) and np.all(weights.data[fully_masked] == 0)
    assert np.all(leaves[0].grad[fully_masked] == 0)
