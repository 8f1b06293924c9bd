"""Plots (Agg, to files), the metrics log reader, and the computation graph as DOT."""

import json
import re
import shutil
import struct
import sys
from pathlib import Path
from typing import NamedTuple

import children
import numpy as np
import pytest

import tinyformer as tf
from tinyformer.translation import decode
from tinyformer.engine import functional as F
from tinyformer.model import nn
from tinyformer.study import viz

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is part of the test extra")


def png_size(path):
    """(width, height) from a PNG's IHDR chunk."""
    data = Path(path).read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def pixels(inches):
    return tuple(round(i * viz.DPI) for i in inches)


class CharTokenizer:
    """A stand-in for the sentencepiece Tokenizer: one id per letter after the four special ids."""

    pieces = ["<pad>", "<unk>", "<s>", "</s>"] + list("abcdefghij")

    def encode(self, text):
        return [self.pieces.index(c) for c in text if c in self.pieces[4:]]

    def decode(self, ids):
        out = []
        for i in ids:
            if i == 3:
                break
            if i > 3:
                out.append(self.pieces[i])
        return "".join(out)

    def id_to_piece(self, i):
        return self.pieces[i]

    def piece_to_id(self, piece):
        return self.pieces.index(piece)


class Translator(NamedTuple):
    model: object
    tokenizer: object
    sentence: str


@pytest.fixture(scope="module", params=["untrained", "trained"])
def translator(request):
    """An untrained `tiny` over letters (max_len 12 keeps its translations, at most 11 tokens, and so its
    figures small), and the built-in task's `tiny` trained until it translates (its own copy)."""
    if request.param == "untrained":
        model = nn.Transformer.from_preset("tiny", vocab_size=len(CharTokenizer.pieces), seed=0, max_len=12)
        return Translator(model, CharTokenizer(), "abcde")
    model, tokenizer = request.getfixturevalue("trained_synthetic").load()
    return Translator(model, tokenizer, "Tomorrow I see 347 small cats")


# ---------------------------------------------------------------- attention heatmaps
def test_attention_maps_are_the_probabilities_of_every_layer_and_head(translator):
    model, tokenizer, sentence = translator
    found = viz.attention_maps(model, tokenizer, sentence, beam_size=1)
    assert found["source"] == [tokenizer.id_to_piece(i) for i in tokenizer.encode(sentence)] + ["</s>"]
    assert found["target"][0] == "<s>"
    assert found["translation"] == decode.translate(model, tokenizer, [sentence], beam_size=1)[0]
    assert sorted(found["maps"]) == sorted((kind, layer) for kind in viz.ATTENTION_KINDS for layer in (1, 2))
    src_len, tgt_len = len(found["source"]), len(found["target"])
    shapes = {"encoder_self": (4, src_len, src_len), "decoder_self": (4, tgt_len, tgt_len),
              "decoder_cross": (4, tgt_len, src_len)}
    for (kind, _), weights in found["maps"].items():
        assert weights.shape == shapes[kind]
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)
        if kind == "decoder_self":  # causal: nothing above the diagonal
            assert np.all(np.triu(weights, k=1) == 0)


def test_attention_maps_leave_the_model_as_they_found_it(translator):
    model, tokenizer, sentence = translator
    model.train()
    attentions = [m for m in model.modules() if isinstance(m, nn.MultiHeadAttention)]
    attentions[0].keep_attention = True  # a student's own switch stays as it was
    viz.attention_maps(model, tokenizer, sentence)
    for module in model.modules():
        assert module.training
        assert "forward" not in vars(module)  # the switch is an attribute, forward is never shadowed
    assert [m.keep_attention for m in attentions] == [True] + [False] * (len(attentions) - 1)
    assert all(m.attention_probs is None for m in attentions[1:])  # what the translation's last step left
    attentions[0].keep_attention = False
    model.eval()


def first_layer_probabilities(attention, x, causal):
    """softmax(QKᵀ/√d_k) per head, in float64, of ``attention`` over the embedded tokens ``x`` (len, d_model)."""
    def heads(linear):
        y = x @ linear.weight.data.T.astype(np.float64) + linear.bias.data
        return y.reshape(len(x), attention.heads, attention.d_k).swapaxes(0, 1)

    scores = heads(attention.w_q) @ heads(attention.w_k).swapaxes(-1, -2) / np.sqrt(attention.d_k)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], dtype=bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_attention_maps_are_the_probabilities_the_reference_computes(translator):
    model, tokenizer, sentence = translator
    found = viz.attention_maps(model, tokenizer, sentence)
    for kind, tokens, embed, stack in (("encoder_self", found["source"], model.src_embed, model.encoder),
                                       ("decoder_self", found["target"], model.tgt_embed, model.decoder)):
        ids = np.array([[tokenizer.piece_to_id(p) for p in tokens]])
        with tf.no_grad():  # post-LN: the first layer attends over the embedded tokens themselves
            x = model.positional(embed(ids) * np.sqrt(model.d_model)).data[0].astype(np.float64)
        expected = first_layer_probabilities(stack.layers[0].self_attn, x, causal=kind == "decoder_self")
        np.testing.assert_allclose(found["maps"][kind, 1], expected, rtol=1e-4, atol=1e-6)


def test_plot_attention_writes_one_png_per_kind_and_layer_with_one_panel_per_head(translator, tmp_path):
    model, tokenizer, sentence = translator
    found = viz.attention_maps(model, tokenizer, sentence, beam_size=2)
    translation, paths = viz.plot_attention(model, tokenizer, sentence, tmp_path / "maps", beam_size=2)
    assert translation == found["translation"]
    assert sorted(p.name for p in paths) == sorted(f"{kind}_layer{n}.png" for kind in viz.ATTENTION_KINDS
                                                   for n in (1, 2))
    src_len, tgt_len = len(found["source"]), len(found["target"])
    lengths = {"encoder_self": (src_len, src_len), "decoder_self": (tgt_len, tgt_len),
               "decoder_cross": (tgt_len, src_len)}
    for path in paths:
        assert path.stat().st_size > 0
        kind = path.name.rsplit("_layer", 1)[0]
        assert png_size(path) == pixels(viz.attention_figure_size(4, *lengths[kind]))


def test_the_attention_figure_size_is_documented():
    # six tokens, four heads in a row: 4 × (3.5 + 0.8) by (3.5 + 0.8) + 0.6 inches
    assert pixels(viz.attention_figure_size(4, 6, 6)) == (1720, 490)


def test_an_empty_sentence_is_refused(translator):
    with pytest.raises(ValueError, match="empty"):
        viz.attention_maps(translator.model, translator.tokenizer, "   ")


# ---------------------------------------------------------------- schedule and curves
def test_schedule_plot_has_the_documented_size(tmp_path):
    path = viz.plot_schedule(tmp_path / "schedule.png", d_model=512, warmup_steps=4000, steps=20000)
    assert path.stat().st_size > 0
    assert png_size(path) == pixels(viz.SCHEDULE_INCHES) == (800, 500)


def test_schedule_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        viz.plot_schedule(tmp_path / "s.png", steps=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        viz.plot_schedule(tmp_path / "s.png", warmup_steps=0)


def write_log(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def training_records():
    train = [{"step": s, "epoch": 1, "loss": 5.0 / s ** 0.3, "nll": 4.8 / s ** 0.3, "ppl": 2.0 + 100 / s,
              "lr": 1e-3 * min(s ** -0.5, s * 10 ** -1.5), "grad_norm": 1.5, "tokens_per_s": 2000.0}
             for s in range(1, 60, 5)]
    val = [{"step": s, "split": "val", "loss": 4.0 / s ** 0.2, "nll": 3.9 / s ** 0.2, "ppl": 3.0 + 50 / s,
            "bleu_greedy": 2.0 * s ** 0.5} for s in (20, 40, 56)]
    return train + val + [{"step": 56, "split": "test", "bleu": 14.5}]


def test_curves_from_a_training_log(tmp_path):
    log = write_log(tmp_path / "metrics.jsonl", training_records())
    path = viz.plot_curves(log, tmp_path / "curves.png")
    assert path.stat().st_size > 0 and png_size(path) == pixels(viz.CURVES_INCHES) == (1300, 700)


def test_curves_with_training_records_only(tmp_path):
    log = write_log(tmp_path / "metrics.jsonl", [r for r in training_records() if "split" not in r])
    assert png_size(viz.plot_curves(log, tmp_path / "c.png")) == (1300, 700)


@pytest.mark.parametrize("line, message", [
    ('{"step": 3, "loss": ', r"line 3: not JSON"),
    ("[1, 2]", r"line 3: expected a JSON object, got list"),
    ('{"loss": 2.0}', r"line 3: the record has no numeric \"step\""),
])
def test_a_bad_line_names_the_file_and_the_line(tmp_path, line, message):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"step": 1, "loss": 3.0}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(log)) + ", " + message):
        viz.plot_curves(log, tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()


def test_an_empty_log_is_an_error(tmp_path):
    log = tmp_path / "empty.jsonl"
    log.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no records"):
        viz.plot_curves(log, tmp_path / "c.png")


# ---------------------------------------------------------------- matplotlib: missing, and never a display
def test_missing_matplotlib_says_which_extra_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(viz.PlotExtraMissing, match=re.escape("install the 'plot' extra: pip install -e '.[plot]'")):
        viz.plot_schedule(tmp_path / "s.png")
    assert issubclass(viz.PlotExtraMissing, ImportError)


def test_plots_never_touch_pyplot_or_a_display(tmp_path):
    code = ("import sys; from tinyformer.study import viz; "
            f"viz.plot_schedule({str(tmp_path / 's.png')!r}, steps=100, warmup_steps=10); "
            "assert 'matplotlib.pyplot' not in sys.modules; import matplotlib; print(matplotlib.get_backend())")
    env = {"PATH": "", "MPLBACKEND": "", "DISPLAY": ""}
    result = children.run([children.PYTHON, "-c", code], env=env, inherit=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "s.png").stat().st_size > 0


# ---------------------------------------------------------------- the computation graph as DOT
NODE = re.compile(r'^\s*(\w+) \[label="((?:[^"\\]|\\.)*)"(?:, [^\]]*)?\];$')
EDGE = re.compile(r"^\s*(\w+) -> (\w+)(?: \[[^\]]*\])?;$")
SETTING = re.compile(r"^\s*(node|edge|graph) \[.*\];$")


def parse_dot(text):
    """A strict reading of what to_dot writes: braces balance, each line is a node, an edge or a
    default setting, and every edge joins two declared nodes. Returns ({id: label}, [(tail, head)])."""
    assert text.count("{") == text.count("}") == 1, "unbalanced braces"
    lines = text.strip().splitlines()
    assert re.match(r"^digraph \w+ \{$", lines[0]) and lines[-1] == "}"
    nodes, edges = {}, []
    for line in lines[1:-1]:
        if node := NODE.match(line):
            assert node.group(1) not in nodes, f"node declared twice: {line}"
            nodes[node.group(1)] = node.group(2)
        elif edge := EDGE.match(line):
            edges.append((edge.group(1), edge.group(2)))
        else:
            assert SETTING.match(line), f"not a node, an edge or a setting: {line!r}"
    for tail, head in edges:
        assert tail in nodes and head in nodes, f"edge {tail} -> {head} joins an undeclared node"
    return nodes, edges


def labelled(nodes, edges):
    return {(nodes[t].split("\\n")[0], nodes[h].split("\\n")[0]) for t, h in edges}


def test_dot_of_a_small_expression(tmp_path):
    x = tf.Tensor(np.ones((2, 3)), requires_grad=True)
    y = (x * 2.0).sum()
    text = viz.to_dot(y, tmp_path / "g.dot", names={"x": x})
    assert (tmp_path / "g.dot").read_text(encoding="utf-8") == text
    nodes, edges = parse_dot(text)
    assert sorted(nodes.values()) == sorted(["output\\n() float64", "Sum", "(2, 3) float64", "Mul",
                                             "x\\n(2, 3) float64"])
    assert labelled(nodes, edges) == {("x", "Mul"), ("Mul", "(2, 3) float64"), ("(2, 3) float64", "Sum"),
                                      ("Sum", "output")}


def test_dot_of_attention_shows_the_fused_node_its_mask_and_parameter_names():
    mha = nn.MultiHeadAttention(8, 2, generator=tf.random.make_generator(0))
    x = tf.Tensor(np.random.default_rng(0).standard_normal((2, 3, 8)), requires_grad=True)
    mask = F.padding_mask(np.array([[5, 6, 0], [5, 6, 7]]), 0)
    out = mha(x, mask=mask)
    nodes, edges = parse_dot(viz.to_dot(out, names=dict(mha.named_parameters())))
    labels = [label.split("\\n")[0] for label in nodes.values()]
    # Q, K and V in one node (F.linear_parts), the output projection another
    assert "ScaledDotProductAttention" in labels and labels.count("LinearParts") == labels.count("Linear") == 1
    assert "w_q.weight" in labels and "w_o.bias" in labels
    assert ("array", "ScaledDotProductAttention") in labelled(nodes, edges)  # the mask, dashed
    assert len(nodes) == len(set(nodes))


def test_dot_of_a_long_chain_needs_no_recursion():
    x = tf.Tensor(np.ones(3), requires_grad=True)
    y = x
    for _ in range(3000):
        y = y * 1.0
    nodes, edges = parse_dot(viz.to_dot(y))
    assert len(nodes) == 2 * 3000 + 1 and len(edges) == 2 * 3000


def test_dot_after_backward_says_the_graph_was_freed():
    x = tf.Tensor(np.ones(3), requires_grad=True)
    y = (x * 2.0).sum()
    y.backward()
    with pytest.raises(ValueError, match="freed by backward"):
        viz.to_dot(y)


def test_dot_parses_with_pydot_when_installed():
    pydot = pytest.importorskip("pydot")
    x = tf.Tensor(np.ones((2, 2)), requires_grad=True)
    (graph,) = pydot.graph_from_dot_data(viz.to_dot((x @ x).sum()))
    assert len(graph.get_edges()) == 4


def test_render_dot_without_graphviz_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(viz.GraphvizMissing, match="`dot` program is not installed"):
        viz.render_dot("digraph g { }", tmp_path / "g.svg")
    with pytest.raises(ValueError, match=r"g\.txt: the file name must end in one of \.svg, \.png, \.pdf"):
        viz.render_dot("digraph g { }", tmp_path / "g.txt")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_render_dot_writes_an_svg(tmp_path):
    x = tf.Tensor(np.ones(2), requires_grad=True)
    path = viz.render_dot(viz.to_dot((x * x).sum()), tmp_path / "graph.svg")
    assert "<svg" in path.read_text(encoding="utf-8")
