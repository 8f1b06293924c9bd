"""Bad input, swept: every case raises a clear error naming the argument and the offending
shape, value, key, file or line (the library), or exits with status 2 (misuse) or 1 (a failure
of the run) and one line on stderr, never a traceback (the command line).

Cases already covered elsewhere (tests/test_*.py: op shape mismatches, ids out of range in
``embedding``/``cross_entropy``, mask shapes in ``MultiHeadAttention``, ``max_len`` of the
positional table, unknown presets ...) are not repeated here. Each case is its own test id.
"""

import io
import math
import sys
import warnings

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.translation import checkpoint, decode, prediction, search
from tinyformer import cli
from tinyformer.model import nn
from tinyformer.engine import functional as F
from tinyformer.translation.data.batching import ParallelData, make_batch, pad
from tinyformer.translation.data.synthetic import number_to_german, synthetic_pairs
from tinyformer.translation.data.tokenizer import Tokenizer
from trained_models import make_tiny_run


def t(*shape, dtype=np.float64):
    """A tensor of ones (requires grad when floating)."""
    return tf.Tensor(np.ones(shape, dtype=dtype), requires_grad=np.dtype(dtype).kind == "f")


def f32(*shape):
    return tf.Tensor(np.ones(shape, dtype=np.float32))


def ids(*shape, value=1):
    return np.full(shape, value, dtype=np.int64)


def tiny_transformer(**overrides):
    config = dict(d_model=8, d_ff=16, heads=2, num_layers=1, dropout=0.0, max_len=16, seed=0)
    config.update(overrides)
    return nn.Transformer(src_vocab_size=11, **config)


MODEL = tiny_transformer()


def forward(*args, **kwargs):
    return lambda: MODEL(*args, **kwargs)


# --------------------------------------------------------------------------- the library
# (id, call, exception type, substrings the message must hold)
API_CASES = [
    # Tensor ops
    ("matmul-inner-dims", lambda: t(2, 3) @ t(4, 5), ValueError,
     ["MatMul", "inner dimensions differ", "(2, 3)", "(4, 5)"]),
    ("matmul-vector-matrix", lambda: t(3) @ t(4, 2), ValueError, ["inner dimensions differ", "(3,)", "(4, 2)"]),
    ("matmul-batch-axes", lambda: t(2, 3, 4) @ t(3, 4, 2), ValueError,
     ["MatMul", "batch axes (2,) and (3,)", "(2, 3, 4)", "(3, 4, 2)"]),
    ("reshape-float-size", lambda: t(2, 3).reshape(2.5, 2), TypeError, ["reshape", "(2.5, 2)", "(2, 3)"]),
    ("reshape-bool-size", lambda: t(2, 3).reshape(True, 6), TypeError, ["reshape", "(True, 6)"]),
    ("reshape-two-unknowns", lambda: t(2, 3).reshape(-1, -1), ValueError, ["Reshape", "unknown", "(2, 3)"]),
    ("broadcast-to-incompatible", lambda: t(2, 3).broadcast_to((4, 3)), ValueError,
     ["BroadcastTo", "(2, 3)", "(4, 3)"]),
    ("getitem-out-of-bounds", lambda: t(2, 3)[5], IndexError, ["(2, 3)", "index 5", "axis 0", "size 2"]),
    ("getitem-float-index", lambda: t(2, 3)[1.5], IndexError, ["(2, 3)", "1.5"]),
    ("getitem-too-many-indices", lambda: t(2, 3)[0, 0, 0], IndexError, ["(2, 3)", "(0, 0, 0)"]),
    ("getitem-int-array-out-of-bounds", lambda: t(2, 3)[np.array([0, 7])], IndexError,
     ["(2, 3)", "index 7", "shape (2,)"]),
    ("getitem-bool-mask-wrong-length", lambda: t(2, 3)[np.ones(3, dtype=bool)], IndexError,
     ["(2, 3)", "dtype bool", "size of axis is 2"]),
    ("tensor-complex-data", lambda: tf.Tensor(np.ones(2, dtype=complex)), TypeError, ["complex128"]),
    ("concat-nothing", lambda: tf.concat([]), ValueError, ["concat", "at least one"]),
    # softmax, log_softmax
    ("softmax-empty-axis", lambda: F.softmax(t(2, 0)), ValueError, ["Softmax", "axis 1 has length 0", "(2, 0)"]),
    ("log-softmax-empty-axis", lambda: F.log_softmax(t(0, 3), axis=0), ValueError,
     ["LogSoftmax", "axis 0 has length 0", "(0, 3)"]),
    # layer norm
    ("layer-norm-0d", lambda: F.layer_norm(t(), t(1), t(1)), ValueError, ["layer_norm", "0-d"]),
    ("layer-norm-eps-negative", lambda: F.layer_norm(t(2, 4), t(4), t(4), eps=-1e-5), ValueError,
     ["layer_norm: eps", "-1e-05"]),
    ("layer-norm-eps-string", lambda: F.layer_norm(t(2, 4), t(4), t(4), eps="1e-5"), ValueError,
     ["layer_norm: eps", "'1e-5'"]),
    ("layer-norm-eps-nan", lambda: F.layer_norm(t(2, 4), t(4), t(4), eps=math.nan), ValueError,
     ["layer_norm: eps", "nan"]),
    ("LayerNorm-wrong-features", lambda: nn.LayerNorm(4)(f32(2, 5)), ValueError,
     ["LayerNorm", "(2, 5)", "d_model=4"]),
    ("LayerNorm-0d-input", lambda: nn.LayerNorm(4)(f32()), ValueError, ["LayerNorm", "d_model=4"]),
    ("LayerNorm-eps-infinite", lambda: nn.LayerNorm(4, eps=math.inf), ValueError, ["LayerNorm: eps", "inf"]),
    # dropout
    ("dropout-p-string", lambda: F.dropout(t(3), "0.5"), ValueError, ["dropout: p", "'0.5'"]),
    ("dropout-p-bool", lambda: F.dropout(t(3), True), ValueError, ["dropout: p", "True"]),
    ("dropout-generator-int", lambda: F.dropout(t(3), 0.5, generator=42), TypeError,
     ["dropout: generator", "int"]),
    ("Dropout-module-p-nan", lambda: nn.Dropout(math.nan), ValueError, ["Dropout: p", "nan"]),
    # embedding
    ("embedding-ragged-ids", lambda: F.embedding([[1, 2], [3]], t(5, 2)), ValueError,
     ["embedding: ids", "ragged list"]),
    ("embedding-string-ids", lambda: F.embedding(["a"], t(5, 2)), TypeError, ["embedding: ids", "<U1"]),
    ("Embedding-zero-vocab", lambda: nn.Embedding(0, 4), ValueError, ["vocab_size", "0"]),
    ("Embedding-float-vocab", lambda: nn.Embedding(5.0, 4), ValueError, ["vocab_size", "5.0"]),
    # linear
    ("linear-weight-1d", lambda: F.linear(t(2, 3), t(3)), ValueError, ["Linear", "weight must be 2-D", "(3,)"]),
    ("linear-input-0d", lambda: F.linear(t(), t(4, 3)), ValueError, ["Linear", "0-d"]),
    ("linear-bias-shape", lambda: F.linear(t(2, 3), t(4, 3), t(5)), ValueError,
     ["Linear", "bias must have shape (4,)", "(5,)"]),
    ("Linear-module-0d-input", lambda: nn.Linear(3, 2)(f32()), ValueError, ["Linear", "0-d"]),
    # cross entropy
    ("cross-entropy-smoothing-string", lambda: F.cross_entropy(t(2, 4), ids(2), label_smoothing="0.1"),
     ValueError, ["label_smoothing", "'0.1'"]),
    ("cross-entropy-smoothing-nan", lambda: F.cross_entropy(t(2, 4), ids(2), label_smoothing=math.nan),
     ValueError, ["label_smoothing", "nan"]),
    ("cross-entropy-smoothing-negative", lambda: F.cross_entropy(t(2, 4), ids(2), label_smoothing=-0.1),
     ValueError, ["label_smoothing", "-0.1"]),
    ("cross-entropy-integer-logits", lambda: F.cross_entropy(tf.Tensor(np.ones((2, 4), dtype=np.int64)), ids(2)),
     TypeError, ["cross_entropy: logits", "int64"]),
    ("cross-entropy-no-classes", lambda: F.cross_entropy(t(2, 0), ids(2)), ValueError,
     ["cross_entropy", "(2, 0)", "no classes"]),
    ("cross-entropy-0d-logits", lambda: F.cross_entropy(t(), ids()), ValueError, ["cross_entropy", "class axis"]),
    ("cross-entropy-ragged-target", lambda: F.cross_entropy(t(2, 4), [[0], [1, 2]]), ValueError,
     ["cross_entropy: target", "ragged"]),
    ("nll-loss-negative-target", lambda: F.nll_loss(t(2, 4), np.array([0, -2])), IndexError,
     ["target ids", "-2"]),
    # attention
    ("attention-batch-axes", lambda: F.scaled_dot_product_attention(t(2, 3, 4), t(3, 5, 4), t(3, 5, 4)),
     ValueError, ["scaled_dot_product_attention", "batch axes", "(2, 3, 4)", "(3, 5, 4)"]),
    ("attention-ragged-mask", lambda: F.scaled_dot_product_attention(t(2, 2), t(2, 2), t(2, 2),
                                                                     mask=[[True], [True, False]]),
     ValueError, ["attention mask", "ragged"]),
    ("attention-dropout-generator", lambda: F.scaled_dot_product_attention(t(2, 2), t(2, 2), t(2, 2), dropout_p=0.5,
                                                                           generator="seed"),
     TypeError, ["generator", "str"]),
    ("padding-mask-3d-ids", lambda: F.padding_mask(ids(2, 3, 4), 0), ValueError, ["padding_mask", "(2, 3, 4)"]),
    ("sinusoid-table-negative-length", lambda: F.sinusoid_table(-1, 4), ValueError, ["max_len", "-1"]),
    ("sinusoid-table-zero-d-model", lambda: F.sinusoid_table(5, 0), ValueError, ["d_model", "0"]),
    ("sinusoid-table-float-length", lambda: F.sinusoid_table(5.5, 4), ValueError, ["max_len", "5.5"]),
    # positional encodings
    ("PositionalEncoding-1d-input", lambda: nn.PositionalEncoding(4, 8)(f32(4)), ValueError,
     ["PositionalEncoding", "(4,)"]),
    ("PositionalEncoding-negative-offset", lambda: nn.PositionalEncoding(4, 8)(f32(1, 3, 4), offset=-1), ValueError,
     ["PositionalEncoding", "offset", "-1"]),
    ("PositionalEncoding-float-offset", lambda: nn.PositionalEncoding(4, 8)(f32(1, 3, 4), offset=1.5), ValueError,
     ["offset", "1.5"]),
    ("LearnedPositionalEmbedding-negative-offset",
     lambda: nn.LearnedPositionalEmbedding(4, 8)(f32(1, 3, 4), offset=-2), ValueError,
     ["LearnedPositionalEmbedding", "offset", "-2"]),
    ("PositionalEncoding-zero-max-len", lambda: nn.PositionalEncoding(4, 0), ValueError, ["max_len", "0"]),
    # multi-head attention
    ("MultiHeadAttention-key-batch", lambda: nn.MultiHeadAttention(8, 2)(f32(2, 3, 8), f32(3, 4, 8)), ValueError,
     ["MultiHeadAttention", "key (3, 4, 8)", "(2, 3, 8)"]),
    ("MultiHeadAttention-key-value-lengths",
     lambda: nn.MultiHeadAttention(8, 2)(f32(2, 3, 8), f32(2, 4, 8), f32(2, 5, 8)),
     ValueError, ["MultiHeadAttention", "(2, 4, 8)", "(2, 5, 8)"]),
    ("MultiHeadAttention-zero-heads", lambda: nn.MultiHeadAttention(8, 0), ValueError, ["heads", "0"]),
    ("PositionwiseFeedForward-zero-d-ff", lambda: nn.PositionwiseFeedForward(8, 0), ValueError, ["d_ff", "0"]),
    # the Transformer
    ("Transformer-pad-id-beyond-vocab", lambda: tiny_transformer(pad_id=11), ValueError, ["pad_id", "11", "< 11"]),
    ("Transformer-pad-id-negative", lambda: tiny_transformer(pad_id=-1), ValueError, ["pad_id", "-1"]),
    ("Transformer-pad-id-beyond-target-vocab", lambda: nn.Transformer(src_vocab_size=11, tgt_vocab_size=5, d_model=8,
                                                                      d_ff=8, heads=2, num_layers=1, pad_id=7),
     ValueError, ["pad_id", "7", "< 5"]),
    ("Transformer-label-smoothing", lambda: tiny_transformer(label_smoothing=0.1), TypeError,
     ["label_smoothing", "the loss", "F.cross_entropy(..., label_smoothing=)", "TrainConfig.label_smoothing"]),
    ("Transformer-unknown-argument", lambda: tiny_transformer(d_modle=8), TypeError,
     ["unknown argument 'd_modle'", "d_model"]),
    ("Transformer-heads-not-dividing", lambda: tiny_transformer(heads=3), ValueError,
     ["d_model=8", "heads=3"]),
    ("Transformer-dropout", lambda: tiny_transformer(dropout=1.0), ValueError, ["Transformer: dropout", "1.0"]),
    ("Transformer-attention-dropout", lambda: tiny_transformer(attention_dropout=2), ValueError,
     ["Transformer: attention_dropout", "2"]),
    ("Transformer-activation-dropout", lambda: tiny_transformer(activation_dropout=-0.1), ValueError,
     ["Transformer: activation_dropout", "-0.1"]),
    ("Transformer-eps", lambda: tiny_transformer(eps=-1e-6), ValueError, ["eps", "-1e-06"]),
    ("Transformer-zero-layers", lambda: tiny_transformer(num_layers=0), ValueError, ["num_layers", "0"]),
    ("Transformer-src-as-list", forward([[3, 4]], ids(1, 2)), TypeError, ["src", "list"]),
    ("Transformer-tgt-as-list", forward(ids(1, 2), [[3, 4]]), TypeError, ["tgt_in", "list"]),
    ("Transformer-batch-mismatch", forward(ids(2, 3), ids(3, 3)), ValueError, ["src (2, 3)", "tgt_in (3, 3)"]),
    ("Transformer-src-mask-shape", forward(ids(2, 3), ids(2, 3), src_mask=np.ones((2, 1, 1, 4), dtype=bool)),
     ValueError, ["mask", "(2, 1, 1, 4)", "(2, 2, 3, 3)"]),
    ("Transformer-src-mask-dtype", forward(ids(2, 3), ids(2, 3), src_mask=np.ones((2, 1, 1, 3), dtype=np.int8)),
     TypeError, ["mask must be boolean", "int8"]),
    ("Transformer-tgt-mask-shape", forward(ids(2, 3), ids(2, 3), tgt_mask=np.ones((4, 4), dtype=bool)), ValueError,
     ["mask", "(4, 4)", "(2, 2, 3, 3)"]),
    ("Transformer-tgt-mask-dtype", forward(ids(2, 3), ids(2, 3), tgt_mask=np.tril(np.ones((3, 3)))), TypeError,
     ["mask must be boolean", "float64"]),
    ("Transformer-decode-memory-d-model", lambda: MODEL.decode(ids(2, 3), f32(2, 4, 7)), ValueError,
     ["memory", "(2, 4, 7)", "(2, len_src, 8)"]),
    ("Transformer-decode-memory-batch", lambda: MODEL.decode(ids(2, 3), f32(3, 4, 8)), ValueError,
     ["memory", "(3, 4, 8)", "(2, 3)"]),
    ("Transformer-to-unknown-device", lambda: tiny_transformer().to("tpu"), ValueError, ["device", "'tpu'"]),
    ("Tensor-to-device-zero", lambda: t(2).to(0), ValueError, ["device", "0"]),
    # decoding
    ("greedy-decode-src-id-out-of-range", lambda: decode.greedy_decode(MODEL, ids(1, 3, value=40)), IndexError,
     ["ids must lie in [0, 11)", "40"]),
    ("beam-search-3d-src", lambda: decode.beam_search(MODEL, ids(1, 2, 3)), ValueError, ["src", "(1, 2, 3)"]),
    ("beam-search-beam-size-float", lambda: decode.beam_search(MODEL, ids(1, 3), beam_size=2.0), ValueError,
     ["beam_size", "2.0"]),
    ("beam-search-bos-beyond-vocab", lambda: decode.beam_search(MODEL, ids(1, 3), bos_id=11), ValueError,
     ["bos_id=11", "11"]),
    ("beam-search-gnmt-alpha-huge", lambda: decode.beam_search(MODEL, ids(1, 3), alpha=1e308), ValueError,
     ["alpha", "[0, 10]", "1e+308"]),
    ("beam-search-hf-alpha-huge-negative",
     lambda: decode.beam_search(MODEL, ids(1, 3), alpha=-1e308, length_normalization="hf"), ValueError,
     ["alpha", "[-10, 10]", "-1e+308"]),
    ("translate-alpha-huge", lambda: decode.translate(MODEL, SplitTokenizer(), ["ab"], alpha=1e10), ValueError,
     ["alpha", "[0, 10]", "10000000000.0"]),
    # data
    ("make-batch-unequal-lengths", lambda: make_batch([[4]], [[5], [6]]), ValueError,
     ["make_batch", "1 source", "2 target"]),
    ("ParallelData-zero-max-len", lambda: ParallelData([[4]], [[5]], max_len=0), ValueError, ["max_len", "0"]),
    ("pad-none-row", lambda: pad([[1, 2], None]), TypeError, ["pad", "sequences[1]", "NoneType"]),
    ("pad-string-ids", lambda: pad([[1], [2, "x"]]), TypeError, ["pad", "sequences[1]", "'x'"]),
    ("number-to-german-float", lambda: number_to_german(3.5), ValueError, ["number_to_german", "3.5"]),
]


@pytest.mark.parametrize("call, error, parts", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_api_bad_input_raises_a_clear_error(call, error, parts):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


# --------------------------------------------------------------------------- the tokenizer (conftest's)
TOKENIZER_CASES = [
    ("encode-lone-surrogate", lambda tok: tok.encode("I see \ud800 cats"), ValueError,
     ["Tokenizer.encode", "U+D800", "index 6"]),
    ("encode-batch-lone-surrogate", lambda tok: tok.encode_batch(["I see", "x\udfffy"]), ValueError,
     ["texts[1]", "U+DFFF", "index 1"]),
    ("encode-batch-one-string", lambda tok: tok.encode_batch("I see"), TypeError, ["encode_batch", "one string"]),
    ("decode-float-id", lambda tok: tok.decode([5, 5.5]), TypeError, ["Tokenizer.decode", "5.5"]),
    ("decode-float-array", lambda tok: tok.decode(np.array([5.0, 6.0])), TypeError, ["Tokenizer.decode", "5.0"]),
    ("decode-string-id", lambda tok: tok.decode(["5"]), TypeError, ["Tokenizer.decode", "'5'"]),
    ("decode-bool-id", lambda tok: tok.decode([True]), TypeError, ["Tokenizer.decode", "True"]),
    ("decode-none", lambda tok: tok.decode(None), TypeError, ["Tokenizer.decode", "NoneType"]),
    ("decode-int", lambda tok: tok.decode(5), TypeError, ["Tokenizer.decode", "int"]),
    ("decode-string", lambda tok: tok.decode("5 6"), TypeError, ["Tokenizer.decode", "str"]),
    ("decode-batch-id-beyond-vocab", lambda tok: tok.decode_batch([[5], [6, 10_000]]), IndexError,
     ["decode_batch", "id 10000", "outside the vocabulary"]),
    ("id-to-piece-negative", lambda tok: tok.id_to_piece(-1), IndexError, ["id_to_piece", "-1"]),
]


@pytest.mark.parametrize("call, error, parts", [c[1:] for c in TOKENIZER_CASES], ids=[c[0] for c in TOKENIZER_CASES])
def test_tokenizer_bad_input_raises_a_clear_error(tokenizer, call, error, parts):
    with pytest.raises(error) as info:
        call(tokenizer)
    message = str(info.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


def test_nul_and_control_characters_encode_as_unknown_without_crashing(tokenizer):
    ids_ = tokenizer.encode("I see\x00 3 \x1b[31mcats\x7f")
    assert all(0 <= i < tokenizer.vocab_size for i in ids_) and 1 in ids_  # UNK_ID
    assert isinstance(tokenizer.decode(ids_), str)


# --------------------------------------------------------------------------- translate(): long lines
class SplitTokenizer:
    """Characters as ids 4.. (mod the vocabulary); every output decodes to ``text``."""

    def __init__(self, vocab=11, text="x"):
        self.vocab, self.text = vocab, text

    def encode(self, line):
        return [4 + ord(c) % (self.vocab - 4) for c in line]

    def decode(self, ids_):
        return self.text


def test_translate_truncates_long_lines_to_the_positional_table_naming_them():
    model = tiny_transformer(max_len=6)  # 5 tokens and the EOS
    lines = ["abc", "abcdefgh", "", "abcdef", "abcde"]
    with pytest.warns(decode.InputWarning) as caught:
        out = decode.translate(model, SplitTokenizer(), lines, beam_size=1)
    assert len(out) == 5 and out[2] == ""
    message = str(caught[0].message)
    assert "truncated 2 lines longer than 5 tokens" in message and "lines 2, 4" in message


def test_translate_with_an_explicit_limit_truncates_more():
    with pytest.warns(decode.InputWarning, match=r"1 line longer than 2 tokens .* line 1$"):
        out = decode.translate(MODEL, SplitTokenizer(), ["abc", "ab", "  "], beam_size=1, max_input_tokens=2)
    assert len(out) == 3 and out[2] == ""


def test_translate_names_at_most_ten_truncated_lines():
    expected = r"truncated 12 lines .*lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 2 more"
    with pytest.warns(decode.InputWarning, match=expected):
        decode.translate(MODEL, SplitTokenizer(), ["abc"] * 12, beam_size=1, max_input_tokens=1, max_len_b=1)


@pytest.mark.parametrize("kwargs, error, parts", [
    (dict(long_lines="refuse", max_input_tokens=3), decode.LongLineError,
     ["line 3 has 5 tokens", "max_input_tokens=3"]),
    (dict(long_lines="cut"), ValueError, ["long_lines", "'cut'"]),
    (dict(max_input_tokens=0), ValueError, ["max_input_tokens", "0"]),
    (dict(max_input_tokens=16), ValueError, ["max_input_tokens=16", "15 tokens"]),
    (dict(max_input_tokens=2.5), ValueError, ["max_input_tokens", "2.5"]),
], ids=["refuse", "unknown-policy", "zero-limit", "limit-beyond-the-table", "float-limit"])
def test_translate_bad_limits_and_refused_lines_are_named(kwargs, error, parts):
    with pytest.raises(error) as info:
        decode.translate(MODEL, SplitTokenizer(), ["ab", "", "abcde"], beam_size=1, **kwargs)
    for part in parts:
        assert part in str(info.value)


def test_a_refused_line_is_reported_before_any_decoding(monkeypatch):
    monkeypatch.setattr(prediction, "greedy_decode", lambda *a, **k: pytest.fail("decoded before refusing"))
    with pytest.raises(decode.LongLineError) as info:
        decode.translate(MODEL, SplitTokenizer(), ["ab", "abcdefg", "abcdefgh"], beam_size=1, max_input_tokens=4,
                         long_lines="refuse")
    assert (info.value.line, info.value.tokens, info.value.limit) == (2, 7, 4)


# --------------------------------------------------------------------------- search at the edges of its numbers
EXTREME_FLOATS = [1e308, -1e308, 5e-324, -5e-324, -0.0, math.nan, math.inf, -math.inf]
SEARCH_FLOATS = {"gnmt-alpha": dict(length_normalization="gnmt"), "hf-alpha": dict(length_normalization="hf"),
                 "max_len_a": {}, "max_len_b": {}}


@pytest.mark.parametrize("value", EXTREME_FLOATS, ids=repr)
@pytest.mark.parametrize("argument", list(SEARCH_FLOATS))
def test_search_takes_any_float_without_a_traceback_or_a_numpy_warning(argument, value):
    """Either the search runs (a huge maximum length is the positional table's) or it refuses the number with
    one ValueError naming the argument: never an OverflowError, a ZeroDivisionError or a NumPy warning."""
    name = "alpha" if argument.endswith("alpha") else argument
    src = np.array([[4, 5, 6], [7, 8, 0]])
    kwargs = {name: value, **SEARCH_FLOATS[argument]}
    searches = [lambda: decode.beam_search(MODEL, src, beam_size=3, **kwargs),
                lambda: decode.translate(MODEL, SplitTokenizer(), ["ab", "cde"], beam_size=3, **kwargs)]
    if name != "alpha":
        kwargs.pop("length_normalization", None)
        searches.append(lambda: decode.greedy_decode(MODEL, src, **kwargs))
    for search in searches:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                result = search()
            except ValueError as error:
                assert str(error).startswith(f"{name} must be ") and "\n" not in str(error), error
                continue
        assert len(result) == 2
    if name != "alpha" and math.isfinite(value) and value > 1:  # as long as the positional table allows: 15 tokens
        assert decode.beam_search(MODEL, src, beam_size=3, **kwargs) == decode.beam_search(MODEL, src, beam_size=3,
                                                                                           max_len=15)


def test_a_maximum_length_beyond_any_integer_type_is_the_positional_tables():
    src = np.array([[4, 5, 6]])
    capped = decode.beam_search(MODEL, src, beam_size=2, max_len=15)
    assert decode.beam_search(MODEL, src, beam_size=2, max_len=10**30) == capped
    assert decode.greedy_decode(MODEL, src, max_len=10**30) == decode.greedy_decode(MODEL, src, max_len=15)


def test_a_beam_wider_than_the_model_can_emit_is_clipped_to_it_with_one_warning():
    assert decode.widest_beam(MODEL) == 9  # 11 ids less padding (0) and BOS (2): what fairseq clips to
    src = np.array([[4, 5, 6], [7, 8, 0]])
    for normalization in decode.LENGTH_NORMALIZATIONS:
        narrow = decode.beam_search(MODEL, src, beam_size=9, return_scores=True, length_normalization=normalization)
        with pytest.warns(decode.SearchWarning, match=r"^beam_size=1000000 is wider than the 9 tokens the model "
                                                      r"can emit .*: searching with beam_size=9"):
            wide = decode.beam_search(MODEL, src, beam_size=10**6, return_scores=True,
                                      length_normalization=normalization)
        assert wide == narrow
    with pytest.warns(decode.SearchWarning) as caught:
        decode.translate(MODEL, SplitTokenizer(), ["abc", "de"] * 40, beam_size=10**6, batch_size=8)
    assert len(caught) == 1  # once per call, not once per batch


def test_beam_search_keeps_its_candidate_scores_within_a_stated_budget(monkeypatch):
    src = pad([[4 + i % 7, 5 + i % 3, 6, 7][:2 + i % 3] for i in range(12)], 0)  # sentences of 2 to 4 tokens
    whole = decode.beam_search(MODEL, src, beam_size=9, return_scores=True)
    sizes, top_candidates = [], search._top_candidates
    monkeypatch.setattr(search, "CANDIDATE_BUDGET", 3 * 9 * 11)  # three sentences of beam 9 over 11 ids
    monkeypatch.setattr(search, "_top_candidates", lambda scores, count: sizes.append(scores.size) or
                        top_candidates(scores, count))
    parts = decode.beam_search(MODEL, src, beam_size=9, return_scores=True)
    assert sizes and max(sizes) <= 3 * 9 * 11
    for kept, split in zip(whole, parts):
        assert [h.tokens for h in kept] == [h.tokens for h in split]
        np.testing.assert_allclose([h.score for h in kept], [h.score for h in split], rtol=1e-6)  # float32 sums


def test_translate_outputs_never_hold_a_line_break():
    out = decode.translate(MODEL, SplitTokenizer(text="a\nb\u2028c\rd\x85"), ["abc", "", "de"], beam_size=1,
                           max_len_b=3)
    assert out == ["a b c d ", "", "a b c d "]


# --------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory):
    return Tokenizer.train(["Ein ganz anderer Text.", "Noch ein Satz."], tmp_path_factory.mktemp("other"),
                           vocab_size=40).path


def run_cli(argv, capsys):
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


USAGE_ERRORS = [
    ("top-unknown-option", ["--bogus"], "unrecognized arguments: --bogus"),
    ("info-extra-argument", ["info", "now"], "unrecognized arguments: now"),
    ("train-dropout-1.5", ["train", "--dropout", "1.5"], "--dropout: must be a probability in [0, 1), got '1.5'"),
    ("train-label-smoothing-2", ["train", "--label-smoothing", "2"], "--label-smoothing: must be a number in [0, 1]"),
    ("train-lr-factor-0", ["train", "--lr-factor", "0"], "--lr-factor: must be a positive number, got '0'"),
    ("train-lr-factor-nan", ["train", "--lr-factor", "nan"], "--lr-factor: must be a finite number, got 'nan'"),
    ("train-max-grad-norm-negative", ["train", "--max-grad-norm", "-1"], "--max-grad-norm: must be a positive number"),
    ("train-seed-negative", ["train", "--seed", "-1"], "--seed: must be an integer >= 0, got '-1'"),
    ("train-accum-0", ["train", "--accum", "0"], "--accum: must be a positive integer, got '0'"),
    ("train-keep-last-0", ["train", "--keep-last", "0"], "--keep-last: must be a positive integer"),
    ("train-vocab-size-negative", ["train", "--vocab-size", "-8000"], "--vocab-size: must be a positive integer"),
    ("train-alpha-negative", ["train", "--alpha", "-0.5"], "--alpha: must be a number in [0, 10], got '-0.5'"),
    ("train-beam-0", ["train", "--beam", "0"], "--beam: must be a positive integer, got '0'"),
    ("train-synthetic-src-fr", ["train", "--src", "fr", "--save-dir", "{tmp}"],
     "--src 'fr': the synthetic data has the languages en, de"),
    ("train-synthetic-tgt-xx", ["train", "--tgt", "xx", "--save-dir", "{tmp}"], "--tgt 'xx'"),
    ("train-multi30k-src-xx", ["train", "--data", "multi30k", "--src", "xx", "--save-dir", "{tmp}"],
     "--src 'xx': the multi30k data has the languages en, de, fr"),
    ("train-same-languages", ["train", "--src", "de", "--tgt", "de", "--save-dir", "{tmp}"],
     "source and target language are both 'de'"),
    ("train-unknown-device", ["train", "--device", "tpu", "--save-dir", "{tmp}"], "device must be one of"),
    ("translate-beam-0", ["translate", "--checkpoint", "x.npz", "--beam", "0"], "--beam: must be a positive integer"),
    ("translate-alpha-nan", ["translate", "--checkpoint", "x.npz", "--alpha", "nan"],
     "--alpha: must be a finite number"),
    ("translate-alpha-huge", ["translate", "--checkpoint", "x.npz", "--alpha", "1e308"],
     "--alpha 1e+308: GNMT's α must be a number in [0, 10]"),
    ("translate-hf-alpha-huge-negative", ["translate", "--checkpoint", "x.npz", "--length-normalization", "hf",
                                          "--alpha", "-1e308"],
     "--alpha -1e+308: transformers' length_penalty must be a number in [-10, 10]"),
    ("translate-hf-alpha-negative-infinity", ["translate", "--checkpoint", "x.npz", "--length-normalization", "hf",
                                              "--alpha", "-inf"], "--alpha: must be a finite number, got '-inf'"),
    ("eval-alpha-huge", ["eval", "--checkpoint", "x.npz", "--alpha", "1e10"],
     "--alpha 1e+10: GNMT's α must be a number in [0, 10]"),
    ("train-alpha-huge", ["train", "--alpha", "1e308"], "--alpha: must be a number in [0, 10], got '1e308'"),
    ("explain-alpha-huge", ["explain", "--checkpoint", "x.npz", "--source", "a", "--output", "p.html",
                            "--alpha", "1e308"], "--alpha: must be a number in [0, 10], got '1e308'"),
    ("translate-batch-size-0", ["translate", "--checkpoint", "x.npz", "--batch-size", "0"], "--batch-size: must be"),
    ("translate-unknown-device", ["translate", "--checkpoint", "x.npz", "--device", "tpu"],
     "--device: invalid choice: 'tpu'"),
    ("translate-max-input-tokens-0", ["translate", "--checkpoint", "x.npz", "--max-input-tokens", "0"],
     "--max-input-tokens: must be a positive integer, got '0'"),
    ("translate-long-lines-unknown", ["translate", "--checkpoint", "x.npz", "--long-lines", "cut"],
     "--long-lines: invalid choice: 'cut'"),
    ("translate-plot-limit-0", ["translate", "--checkpoint", "x.npz", "--plot-limit", "0"], "--plot-limit: must be"),
    ("eval-unknown-split", ["eval", "--split", "dev"], "--split: invalid choice: 'dev'"),
    ("eval-limit-0", ["eval", "--checkpoint", "x.npz", "--limit", "0"], "--limit: must be a positive integer, got '0'"),
    ("eval-limit-negative", ["eval", "--checkpoint", "x.npz", "--limit", "-1"], "--limit: must be a positive integer"),
    ("eval-hypotheses-alone", ["eval", "--hypotheses", "h.txt"], "--hypotheses needs --references"),
    ("eval-hypotheses-and-checkpoint",
     ["eval", "--hypotheses", "h.txt", "--references", "r.txt", "--checkpoint", "x.npz"],
     "--hypotheses needs --references (and no --checkpoint)"),
    ("eval-beam-0", ["eval", "--checkpoint", "x.npz", "--beam", "0"], "--beam: must be a positive integer"),
    ("average-last-0", ["average", "--dir", ".", "--last", "0", "--output", "o.npz"], "--last: must be a positive"),
    ("average-files-and-dir", ["average", "a.npz", "--dir", ".", "--output", "o.npz"],
     "give either checkpoint files or --dir, not both"),
    ("average-no-output", ["average", "a.npz"], "the following arguments are required: --output"),
    ("gradcheck-unknown-mode", ["gradcheck", "--mode", "slow"], "--mode: invalid choice: 'slow'"),
    ("gradcheck-unknown-device", ["gradcheck", "--device", "tpu"], "--device: invalid choice: 'tpu'"),
    ("gradcheck-empty-layer", ["gradcheck", "--layer", ""], "unknown --layer ''"),
    ("plot-steps-0", ["plot", "schedule", "--steps", "0"], "--steps: must be a positive integer, got '0'"),
    ("plot-d-model-negative", ["plot", "schedule", "--d-model", "-4"], "--d-model: must be a positive integer"),
    ("plot-nothing", ["plot"], "the following arguments are required: schedule|LOG"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in USAGE_ERRORS], ids=[c[0] for c in USAGE_ERRORS])
def test_misuse_exits_2_with_one_line(argv, message, tmp_path, capsys):
    code, _, err = run_cli([a.format(tmp=tmp_path / "unused") for a in argv], capsys)
    assert code == 2 and message in one_line(err), err
    assert not (tmp_path / "unused").exists()  # refused before anything was written


def test_an_unexpected_exception_is_still_one_line_with_its_type(monkeypatch, capsys):
    monkeypatch.setattr(cli.info, "run", lambda args: 1 / 0)
    code, _, err = run_cli(["info"], capsys)
    assert code == 1 and "ZeroDivisionError: division by zero" in one_line(err) and "TINYFORMER_DEBUG" in err


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("TINYFORMER_DEBUG", "1")
    monkeypatch.setattr(cli.info, "run", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["info"])


def translate_cli(run, capsys, *options, data=None, monkeypatch=None, tmp_path=None):
    argv = ["translate", "--checkpoint", run, "--beam", "1", *options]
    if data is not None:
        source = tmp_path / "input.txt"
        source.write_bytes(data)
        argv += ["--input", source]
    return run_cli(argv, capsys)


def test_translate_replaces_undecodable_bytes_and_nul_keeping_one_line_per_line(run, tmp_path, capsys):
    data = b"I see 3 red cats\n\xff\xfeWe buy 2 old cars\nA\x00B\x00\n\n   \t\nToday we see 1 new car"
    code, out, err = translate_cli(run, capsys, data=data, tmp_path=tmp_path)
    assert code == 0
    lines = out.split("\n")
    assert len(lines) == 7 and lines[-1] == "" and lines[3] == lines[4] == ""  # 6 lines, each ended
    assert "replaced 4 undecodable bytes / NUL characters by U+FFFD on 2 lines (2, 3)" in one_line(err)


def test_translate_reads_bytes_from_stdin_too(run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"I see \xe4 cats\r\n\r\nWe buy\x00\r\n")))
    code, out, err = run_cli(["translate", "--checkpoint", run, "--beam", "2"], capsys)
    assert code == 0 and out.count("\n") == 3 and out.split("\n")[1] == ""
    assert "input <stdin>: replaced 2 undecodable bytes / NUL characters by U+FFFD on 2 lines (1, 3)" in one_line(err)


@pytest.mark.parametrize("data, count", [
    (b"", 0), (b"\n", 1), (b"\n\n\n", 3), (b"a", 1), (b"a\rb\n", 1), (b"a\r\n", 1),
    ("a\u2028b\x0bc\x1cd\x85e\n".encode("utf-8"), 1), (b"\xed\xa0\x80 surrogate\n", 1), (b"\xc3\n\xa4\n", 2),
], ids=["empty", "one-empty-line", "three-empty-lines", "no-final-newline", "lone-cr", "crlf",
        "unicode-line-separators", "encoded-surrogate", "split-utf8-sequence"])
def test_translate_writes_exactly_one_line_per_input_line(run, tmp_path, capsys, data, count):
    out_file = tmp_path / "out.txt"
    code, _, _ = translate_cli(run, capsys, "--output", out_file, data=data, tmp_path=tmp_path)
    assert code == 0
    text = out_file.read_bytes().decode("utf-8")
    assert text.count("\n") == count and (not text or text.endswith("\n"))
    assert len(text.splitlines()) == count  # no other line break (U+2028 ...) in the translations


def test_translate_truncates_long_lines_by_default_with_a_warning_naming_them(run, tmp_path, capsys):
    long_line = " ".join(["I see 3 red cats"] * 20).encode()
    data = b"I see\n" + long_line + b"\n\n" + long_line + b"\n"
    code, out, err = translate_cli(run, capsys, data=data, tmp_path=tmp_path)
    assert code == 0 and out.count("\n") == 4 and out.split("\n")[2] == ""
    assert "truncated 2 lines longer than 23 tokens to their first 23: lines 2, 4" in one_line(err)


def test_translate_max_input_tokens_truncates_to_the_given_length(run, tmp_path, capsys):
    code, out, err = translate_cli(run, capsys, "--max-input-tokens", "3", data=b"I see 3 red cats\nI\n",
                                   tmp_path=tmp_path)
    assert code == 0 and out.count("\n") == 2
    assert "truncated 1 line longer than 3 tokens to their first 3: line 1" in one_line(err)


def test_translate_refuses_a_long_line_naming_it_before_writing(run, tmp_path, capsys):
    out_file = tmp_path / "out.txt"
    code, out, err = translate_cli(run, capsys, "--max-input-tokens", "3", "--long-lines", "refuse",
                                   "--output", out_file, data=b"I\nI see\nI see 3 red cats\n", tmp_path=tmp_path)
    message = one_line(err)
    assert code == 1 and f"{tmp_path / 'input.txt'}, line 3: " in message
    assert "more than --max-input-tokens 3 (--long-lines refuse; nothing was translated)" in message
    assert not out_file.exists() and out == ""


def test_translate_max_input_tokens_beyond_the_model_is_misuse(run, tmp_path, capsys):
    code, _, err = translate_cli(run, capsys, "--max-input-tokens", "24", data=b"I\n", tmp_path=tmp_path)
    assert code == 2 and "--max-input-tokens 24 is more than this model can encode: 23 tokens" in one_line(err)


def test_translate_clips_a_beam_wider_than_the_model_can_emit_with_one_warning(run, tmp_path, capsys):
    data = b"I see 3 red cats\nWe buy 2 old cars\n"
    code, narrow, err = translate_cli(run, capsys, "--beam", "148", data=data, tmp_path=tmp_path)
    assert code == 0 and err == ""  # 150 pieces less padding and BOS
    code, wide, err = translate_cli(run, capsys, "--beam", "1000000", data=data, tmp_path=tmp_path)
    assert code == 0 and wide == narrow
    assert one_line(err) == ("tinyformer translate: warning: --beam 1,000,000 is wider than the 148 tokens this "
                             "model can emit (its target vocabulary less padding and BOS): searching with --beam 148")


@pytest.mark.parametrize("options", [["--alpha", "5e-324"], ["--alpha", "-0.0"], ["--alpha", "10"],
                                     ["--length-normalization", "hf", "--alpha", "-10"]], ids=" ".join)
def test_translate_takes_the_edges_of_alphas_range(run, tmp_path, capsys, options):
    code, out, err = translate_cli(run, capsys, "--beam", "3", *options, data=b"I see 3 red cats\n", tmp_path=tmp_path)
    assert code == 0 and out.count("\n") == 1 and err == ""


RUNTIME_ERRORS = [
    ("translate-missing-input", lambda d: ["translate", "--checkpoint", d["run"], "--input", d["tmp"] / "nope.txt"],
     "--input {tmp}/nope.txt: no such file"),
    ("translate-input-is-a-directory", lambda d: ["translate", "--checkpoint", d["run"], "--input", d["tmp"]],
     "--input {tmp}: not a file"),
    ("translate-output-directory-missing", lambda d: ["translate", "--checkpoint", d["run"], "--input", d["text"],
                                                      "--output", d["tmp"] / "no" / "out.txt"],
     "--output {tmp}/no/out.txt: the directory {tmp}/no does not exist"),
    ("translate-checkpoint-not-npz", lambda d: ["translate", "--checkpoint", d["text"], "--input", d["text"]],
     "{tmp}/in.txt"),
    ("translate-checkpoint-is-a-directory", lambda d: ["translate", "--checkpoint", d["tmp"], "--input", d["text"]],
     "{tmp}"),
    ("translate-other-tokenizer", lambda d: ["translate", "--checkpoint", d["run"], "--input", d["text"],
                                             "--tokenizer", d["other_tokenizer"]], "is not the one checkpoint"),
    ("translate-tokenizer-not-a-model", lambda d: ["translate", "--checkpoint", d["run"], "--input", d["text"],
                                                   "--tokenizer", d["text"]], "{tmp}/in.txt"),
    ("eval-missing-hypotheses", lambda d: ["eval", "--hypotheses", d["tmp"] / "h.txt", "--references", d["text"]],
     "{tmp}/h.txt"),
    ("eval-line-counts-differ", lambda d: ["eval", "--hypotheses", d["text"], "--references", d["two_lines"]],
     "1 hypotheses but 2 references"),
    ("eval-empty-hypotheses", lambda d: ["eval", "--hypotheses", d["empty"], "--references", d["empty"]],
     "hypotheses is empty"),
    ("average-empty-directory", lambda d: ["average", "--dir", d["tmp"], "--output", d["tmp"] / "o.npz"],
     "no checkpoint_*.npz in {tmp}"),
    ("train-resume-without-checkpoints", lambda d: ["train", "--resume", "--save-dir", d["tmp"]],
     "no checkpoint_*.npz in {tmp}"),
]


@pytest.mark.parametrize("make_argv, message", [c[1:] for c in RUNTIME_ERRORS], ids=[c[0] for c in RUNTIME_ERRORS])
def test_run_time_failures_exit_1_with_one_line_naming_the_file(run, other_tokenizer, tmp_path, capsys,
                                                                make_argv, message):
    text = tmp_path / "in.txt"
    text.write_text("I see\n", encoding="utf-8")
    (tmp_path / "two.txt").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_bytes(b"")
    names = dict(run=run, tmp=tmp_path, text=text, two_lines=tmp_path / "two.txt", empty=tmp_path / "empty.txt",
                 other_tokenizer=other_tokenizer)
    code, out, err = run_cli(make_argv(names), capsys)
    assert code == 1 and message.format(tmp=tmp_path) in one_line(err), err


def test_eval_replaces_undecodable_bytes_with_a_warning(tmp_path, capsys):
    hyps, refs = tmp_path / "h.txt", tmp_path / "r.txt"
    hyps.write_bytes(b"Ich sehe \xff Katzen\n")
    refs.write_bytes(b"Ich sehe drei Katzen\n")
    code, out, err = run_cli(["eval", "--hypotheses", hyps, "--references", refs], capsys)
    assert code == 0 and "BLEU" in out
    assert f"--hypotheses {hyps}: replaced 1 undecodable byte / NUL characters by U+FFFD on 1 line (1)" in one_line(err)


def test_translate_does_not_plot_a_line_longer_than_the_model_takes(run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    long_line = " ".join(["I see 3 red cats"] * 20).encode()
    maps = tmp_path / "maps"
    code, out, err = translate_cli(run, capsys, "--plot-attention", maps, data=long_line + b"\nI see\n",
                                   tmp_path=tmp_path)
    assert code == 0 and out.count("\n") == 2
    assert "tinyformer translate: warning: line 1 not plotted: longer than 23 tokens" in err
    assert not (maps / "line1").exists()
