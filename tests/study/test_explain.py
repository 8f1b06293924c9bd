"""`tinyformer explain`: the data against the library's own backward pass, the gradient check
against a wrong backward, the command line's errors, and the page in a real browser (headless
Chromium: the DOM after its scripts ran, read with html.parser)."""

import decimal
import os
import json
import re
import shutil
import struct
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path

import children
import numpy as np
import pytest
from trained_models import SYNTHETIC, multi30k_or_skip

import tinyformer as tf
from tinyformer import cli
from tinyformer.translation import decode
from tinyformer.model import nn
from tinyformer.study import viz
from tinyformer.engine import functional as F
from tinyformer.translation.data.special import BOS_ID, EOS_ID
from tinyformer.translation.data.tokenizer import Tokenizer
from tinyformer.model.nn.layers import scale_embedding
from tinyformer.translation.train import load_model
from tinyformer.study.viz import explain_codec, explain_page, explanation
from tinyformer.study.viz.explain_page import render
from tinyformer.study.viz.explain_codec import (
    decode_array,
    encode_float16,
    recompute,
    softmax_backward,
    storage_error,
)

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium on the PATH (apt-get install chromium-headless-shell; .ci/run "
                             "installs it)")
KINDS = ("enc", "dec", "cross")
SOURCE, REFERENCE = "I see 3 red cats", "Ich sehe drei rote Katzen"


# ---------------------------------------------------------------- fixtures: a tiny run, its page
def save_untrained_run(directory, **options):
    """A checkpoint as `tinyformer train` with ``options`` builds it (the run's tokenizer and model,
    from its own builders), before any update: a page needs no trained model."""
    from tinyformer.translation import checkpoint
    from tinyformer.translation.train import TrainConfig
    from tinyformer.translation.train.builders import build_model, build_tokenizer, load_corpus
    from tinyformer.translation.train.state import Position, run_metadata

    config = TrainConfig(save_dir=str(directory), **options).resolved()
    tokenizer = build_tokenizer(config, load_corpus(config, "train"), echo=lambda message: None)
    model = build_model(config, tokenizer)
    path = directory / "checkpoint_0000000.npz"
    checkpoint.save_checkpoint(path, model.state_dict(), run_metadata(config, model, tokenizer, Position()))
    return path


def load_corpus_of(path, split):
    """(sources, targets) of a split of the data the run of checkpoint ``path`` was built on."""
    from tinyformer.translation import checkpoint
    from tinyformer.translation.train import TrainConfig
    from tinyformer.translation.train.builders import load_corpus

    return load_corpus(TrainConfig.from_dict(checkpoint.load_checkpoint(path)[1]["config"]), split)


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory):
    """The built-in task's `tiny` (a 120-piece BPE keeps its pages small), untrained."""
    return save_untrained_run(tmp_path_factory.mktemp("run"), vocab_size=120)


@pytest.fixture(scope="module", params=["untrained", "trained"])
def run(request, untrained_run):
    """The checkpoint of the built-in task's `tiny`: untrained, and trained until it translates
    (``trained_synthetic``: read-only; its softmaxes saturate, rows of P equal to one-hot in float64)."""
    return untrained_run if request.param == "untrained" else request.getfixturevalue("trained_synthetic").checkpoint


def write_page(run, directory):
    """(path, data) of the page `tinyformer explain` writes for SOURCE taught REFERENCE."""
    path = directory / "page.html"
    assert cli.main(["explain", "--checkpoint", str(run), "--source", SOURCE, "--reference", REFERENCE,
                     "--output", str(path)]) == 0
    return path, page_data(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def page(request, run, untrained_run, tmp_path_factory):
    """The page of SOURCE taught REFERENCE, of the untrained and of the trained model."""
    if run == untrained_run:
        return request.getfixturevalue("untrained_page")
    return write_page(run, tmp_path_factory.mktemp("page"))


@pytest.fixture(scope="module")
def untrained_page(untrained_run, tmp_path_factory):
    """The page of the untrained model only: for what the page's shell does, whatever its numbers
    (its policy, its error reporting, a screenshot)."""
    return write_page(untrained_run, tmp_path_factory.mktemp("page"))


@pytest.fixture(scope="module")
def model_and_tokenizer(run):
    model, tokenizer, _ = load_model(run)
    return model, tokenizer


def page_data(text):
    """The JSON the page embeds."""
    found = re.search(r'<script type="application/json" id="explain-data">(.*?)</script>', text, re.S)
    return json.loads(found.group(1))


def positions_of(data):
    return [t - 1 for t in data["token_gradients"]["positions"]]


PAGE_COMPUTED = ("P", "dP", "dS", "dQ", "dK", "dV", "token.dP", "token.dS")


def array(data, name):
    """An array of the page as its script reads it: computed again from what is stored (P's rows
    normalised, the gradients: ``explain_codec.recompute``, the Python twin of the page's own
    computation), or stored (decoded)."""
    if name.rsplit(".", 1)[0] in PAGE_COMPUTED:
        return recompute(data)[name]
    return decode_array(data["arrays"][name])


def stored_within_bounds(data, name, exact):
    """The stored array ``name`` holds ``exact`` (float64) within its encoding's stated error."""
    entry = data["arrays"][name]
    stored = decode_array(entry, positions_of(data))
    bound = storage_error(entry, stored, positions_of(data))
    assert stored.shape == exact.shape, name
    worst = np.max(np.abs(stored - exact) / np.where(bound > 0, bound, np.inf), initial=0.0)
    assert np.all(np.abs(stored - exact) <= bound), f"{name}: {worst:.3g} of its bound"


def batch_of(data):
    return (np.array([data["source"]["ids"]]), np.array([[BOS_ID] + data["target"]["ids"][:-1]]),
            np.array([data["target"]["ids"]]))


# ------------------------------------------ a reference: the manual's way (docs/attention.md), no probes
def float64_copy(model):
    copy = nn.Transformer(model.config.replace(seed=0))
    copy.load_state_dict(model.state_dict())
    return copy.double().eval()


def reference_backward(model, batch, position=None):
    """P and dL/dP of every head through the documented hook point (keep_attention, retain_grad),
    and the gradients at the looked-up embedding rows, of the whole NLL or of one position's."""
    copy = float64_copy(model)
    src, tgt_in, tgt_out = batch
    modules = {"enc": [layer.self_attn for layer in copy.encoder.layers],
               "dec": [layer.self_attn for layer in copy.decoder.layers],
               "cross": [layer.cross_attn for layer in copy.decoder.layers]}
    for module_list in modules.values():
        for module in module_list:
            module.keep_attention = True
    source_rows = tf.Tensor(copy.src_embed.weight.data[src], requires_grad=True)
    target_rows = tf.Tensor(copy.tgt_embed.weight.data[tgt_in], requires_grad=True)
    mask = copy.source_mask(src)
    memory = copy.encoder(copy.positional(scale_embedding(source_rows, copy.d_model)), mask)
    hidden = copy.decoder(copy.positional(scale_embedding(target_rows, copy.d_model)), memory, mask)
    logits = F.linear(hidden, copy.tgt_embed.weight)
    probs = {kind: [m.attention_probs for m in module_list] for kind, module_list in modules.items()}
    with tf.no_grad():
        np.testing.assert_allclose(logits.data, copy(src, tgt_in).data, rtol=1e-12, atol=1e-12)  # the same model
    nll = F.cross_entropy(logits, tgt_out, reduction="none")
    loss = nll.sum() if position is None else nll[0, position]
    for tensors in probs.values():
        for p in tensors:
            p.retain_grad()
    loss.backward()
    found = {kind: {"P": np.stack([p.data[0] for p in tensors]), "dP": np.stack([p.grad[0] for p in tensors])}
             for kind, tensors in probs.items()}
    found["nll"] = nll.data[0]
    found["source"], found["d_source"] = source_rows.data[0], source_rows.grad[0]
    found["target"], found["d_target"] = target_rows.data[0], target_rows.grad[0]
    return found


def assert_float32_of(stored, expected, what):
    """``stored`` (float32 from the page) equals ``expected`` (float64) up to float32 rounding."""
    scale = np.max(np.abs(expected)) or 1.0
    np.testing.assert_allclose(stored, expected, rtol=2e-7, atol=2e-7 * scale, err_msg=what)


def assert_recomputed(found, expected, what):
    """The page's recomputation from float16 inputs against float64: within 2⁻⁷ of the largest
    value (a few float16 units of the inputs, summed over d_k products; the page's self-test holds
    each sampled entry to its own bound)."""
    scale = np.max(np.abs(expected)) or 1.0
    np.testing.assert_allclose(found, expected, rtol=0, atol=2.0 ** -7 * scale, err_msg=what)


# ---------------------------------------------------------------- the data
def test_the_data_has_a_schema_and_one_map_per_layer_and_head(page, model_and_tokenizer):
    _, data = page
    model, tokenizer = model_and_tokenizer
    assert (data["schema"], data["version"]) == ("tinyformer-explain", 2)
    assert data["source"]["ids"] == tokenizer.encode(SOURCE) + [EOS_ID]
    assert data["target"]["ids"] == tokenizer.encode(REFERENCE) + [EOS_ID] and data["target"]["given"] == "reference"
    assert data["target"]["inputs"][0] == "<s>" and data["target"]["outputs"][-1] == "</s>"
    src_len, tgt_len = len(data["source"]["ids"]), len(data["target"]["ids"])
    rows_cols = {"enc": (src_len, src_len), "dec": (tgt_len, tgt_len), "cross": (tgt_len, src_len)}
    for kind in KINDS:
        info = data["kinds"][kind]
        assert (info["layers"], info["heads"], info["rows"], info["cols"]) == (2, 4, *rows_cols[kind])
        assert data["arrays"][f"P.{kind}"]["shape"] == [2, 4, *rows_cols[kind]]
        for name in ("Q", "V", "dO"):  # only what the page cannot compute again is stored
            rows = rows_cols[kind][0] if name != "V" else rows_cols[kind][1]
            assert data["arrays"][f"{name}.{kind}"]["shape"] == [2, 4, rows, 16]
        assert not {f"dP.{kind}", f"dS.{kind}", f"dQ.{kind}", f"token.dS.{kind}"} & set(data["arrays"])
        assert data["arrays"][f"token.dP.{kind}"]["encoding"] == "log8"
        for name in ("dP", "dS"):
            assert array(data, f"{name}.{kind}").shape == (2, 4, *rows_cols[kind])
    assert data["token_gradients"]["complete"] and data["token_gradients"]["positions"] == list(range(1, tgt_len + 1))


def test_the_arrays_are_what_the_library_backward_pass_gives(page, model_and_tokenizer):
    _, data = page
    model, _ = model_and_tokenizer
    batch = batch_of(data)
    whole = reference_backward(model, batch)
    assert data["loss"]["total"] == pytest.approx(float(whole["nll"].sum()), rel=1e-12)
    np.testing.assert_allclose(data["loss"]["tokens"], whole["nll"], rtol=1e-12)
    for kind in KINDS:
        probs, grads = whole[kind]["P"], whole[kind]["dP"]
        stored_within_bounds(data, f"P.{kind}", probs)
        assert_recomputed(array(data, f"P.{kind}"), probs, f"P of {kind}")
        assert_recomputed(array(data, f"dP.{kind}"), grads, f"dL/dP of {kind}")
        scores = probs * (grads - (probs * grads).sum(axis=-1, keepdims=True))
        assert_recomputed(array(data, f"dS.{kind}"), scores, f"dL/dS of {kind}")
        assert_float32_of(array(data, f"sensitivity.{kind}"), (probs * grads).sum(axis=(-2, -1)), kind)
        for name, exact in (("dP", grads), ("dS", scores)):  # the float64 values the page checks itself against
            sample = data["samples"][f"{name}.{kind}"]
            assert len(sample["index"]) >= 16
            np.testing.assert_allclose(sample["value"], exact.ravel()[sample["index"]], rtol=1e-12, atol=1e-15)
    for side in ("source", "target"):
        g, e = whole["d_" + side], whole[side]
        assert_float32_of(array(data, f"saliency.{side}.norm"), np.linalg.norm(g, axis=-1), side)
        assert_float32_of(array(data, f"saliency.{side}.gxi"), (g * e).sum(axis=-1), side)
    position = 2  # y_3: one token's loss alone
    alone = reference_backward(model, batch, position)
    index = data["token_gradients"]["positions"].index(position + 1)
    for kind in KINDS:
        exact = np.zeros(array(data, f"token.dP.{kind}").shape)
        exact[index] = alone[kind]["dP"]
        others = [i for i in range(len(exact)) if i != index]
        if not others:
            continue
        mine = array(data, f"token.dP.{kind}")[index]
        relative = np.abs(mine - alone[kind]["dP"]) / np.maximum(np.abs(alone[kind]["dP"]), 1e-300)
        assert np.all((relative <= 2 ** (1 / 16) - 1 + 1e-12) | (mine == 0)), f"dl_3/dP of {kind}"
        if kind != "enc":  # the decoder after position 3 does not reach its loss
            assert not array(data, f"token.dP.{kind}")[index][:, :, position + 1:].any()
    saliency = array(data, "token.saliency.source.norm")[position]
    np.testing.assert_allclose(saliency, np.linalg.norm(alone["d_source"], axis=-1), rtol=2.0 ** -10)


def test_the_gradients_of_every_token_sum_to_the_whole_loss(page):
    _, data = page
    for kind in KINDS:  # within what one byte a value (4.4 % of each dℓₜ/dP) and float16 inputs allow
        probs, token_grads = array(data, f"P.{kind}"), np.abs(array(data, "token.dP." + kind))
        # |Δ dS_ij| ≤ P_ij·(|Δ dP_ij| + Σ_k P_ik·|Δ dP_ik|) for a change Δ of dP
        moved = {"dP": token_grads, "dS": probs * (token_grads + (probs * token_grads).sum(axis=-1, keepdims=True))}
        for name in ("dP", "dS"):
            whole, parts = array(data, f"{name}.{kind}"), array(data, f"token.{name}.{kind}")
            allowed = 0.045 * moved[name].sum(axis=0) + 2.0 ** -7 * np.abs(whole).max()
            assert np.all(np.abs(parts.sum(axis=0) - whole) <= allowed), (kind, name)
    for name, found in data["token_gradients"]["sum_check"].items():
        assert found["max_abs_difference"] <= 1e-10 * max(1.0, found["max_abs"]), name


def exact_softmax_backward(scores, grads):
    """dL/dS of P = softmax(S) for rows of float64 scores S (−inf: masked) and dL/dP, computed with
    60 significant digits (decimal) from S itself, then rounded to float64."""
    rows = []
    with decimal.localcontext() as context:
        context.prec = 60
        for score_row, grad_row in zip(scores, grads):
            top = max(score_row)
            e = [(decimal.Decimal(float(x)) - decimal.Decimal(float(top))).exp() for x in score_row]
            p = [x / sum(e) for x in e]
            r = sum(pi * decimal.Decimal(float(g)) for pi, g in zip(p, grad_row))
            rows.append([float(pi * (decimal.Decimal(float(g)) - r)) for pi, g in zip(p, grad_row)])
    return np.array(rows)


def test_softmax_backward_is_right_in_saturated_rows_and_exactly_zero_with_one_key():
    """A trained model's softmax saturates: the top P_im is 1 in float64 while the others are 1e-20
    and less, and dL/dS_ij ≈ P_ij·(dP_ij − dP_im) is as small. Each row must be right to float64
    relative to its own terms (not to dP's size) and sum to 0 at that scale; a row with one
    visible key is exactly 0."""
    inf = np.inf
    scores = np.array([[0.0, 45.0, -3.0, 38.5, 38.0],    # nearly saturated: P_ij = 1.5e-3, 9e-4, 1e-20, 2e-21
                       [0.0, 50.0, 10.0, -inf, -inf],      # one-hot in float64: P_im == 1.0, the rest 4e-18
                       [3.0, -inf, -inf, -inf, -inf],      # one visible key (a causal first row)
                       [1.0, 1.0 + 1e-13, -2.0, 0.5, 40.0],
                       [0.3, -1.2, 2.2, 0.0, -0.7]])        # an ordinary row
    grads = np.random.default_rng(0).standard_normal(scores.shape) * 1e-3
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    found, exact = softmax_backward(probs, grads), exact_softmax_backward(scores, grads)
    scale = np.abs(exact).sum(axis=-1, keepdims=True)
    assert np.all(np.abs(found - exact) <= 1e-12 * scale), np.abs(found - exact) / scale
    assert np.all(np.abs(found.sum(axis=-1)) <= 1e-14 * np.abs(found).sum(axis=-1))
    assert not found[2].any() and probs[1].max() == 1.0 and scale[1, 0] < 1e-19


def test_the_derivation_formulas_match_the_engine(page):
    _, data = page
    for kind in KINDS:
        gaps = array(data, f"derivation.{kind}")  # dV, dP, dQ, dK: formula against autograd
        assert gaps.shape == (4, 2, 4) and gaps.max() < 1e-6, kind
        d_k = data["model"]["d_k"]
        queries, keys, scores = array(data, f"Q.{kind}"), array(data, f"K.{kind}"), array(data, f"dS.{kind}")
        np.testing.assert_allclose(scores @ keys / np.sqrt(d_k), array(data, f"dQ.{kind}"), atol=1e-12)
        np.testing.assert_allclose(np.swapaxes(scores, -1, -2) @ queries / np.sqrt(d_k), array(data, f"dK.{kind}"),
                                   atol=1e-12)
        for name in ("dQ", "dK", "dV"):  # the page's, from float16 inputs, against the engine's float64
            sample = data["samples"][f"{name}.{kind}"]
            found = array(data, f"{name}.{kind}").ravel()[sample["index"]]
            scale = np.max(np.abs(sample["value"])) or 1.0
            np.testing.assert_allclose(found, sample["value"], rtol=0, atol=2.0 ** -7 * scale, err_msg=name)


def test_the_gradient_check_passes_on_the_true_backward(page):
    _, data = page
    check = data["check"]
    assert check["passed"] and all(row["passed"] for row in check["rows"])
    assert {row["what"] for row in check["rows"]} == {"P", "S", "gate", "W_Q", "W_K", "W_V"}
    assert {row["kind"] for row in check["rows"] if row["what"] == "P"} == set(KINDS)
    # Five-point differences of L in float64 (h = 1e-5) are noisy to at most about 2e-10·|L|: a trained
    # model's tiny gradients (a saturated S entry's, 1e-6 to 1e-18) pass by the absolute tolerance.
    noise = 1e-9 * max(1.0, data["loss"]["total"])
    assert all(row["abs_error"] < noise for row in check["rows"])
    assert all(row["rel_error"] < 1e-4 for row in check["rows"] if abs(row["numeric"]) > 1e-4)


@pytest.mark.parametrize("hook, failing, may_fail", [
    # 1 % too much everywhere: wrong P, S and the checked head's W_Q, W_K; W_V too when an attention
    # after the checked head passes its wrong gradient back to it.
    (lambda g: g * 1.01, {"P", "S", "gate", "W_Q", "W_K"}, {"W_V"}),
    # A constant added to each row of dP leaves softmax's backward, and so S and every parameter,
    # right: only dP itself and the gate (Σ P∘dP) are wrong, and the check says exactly that.
    (lambda g: g + 0.5, {"P", "gate"}, set()),
], ids=["scaled", "shifted-rows"])
def test_the_gradient_check_fails_on_a_wrong_backward(model_and_tokenizer, hook, failing, may_fail):
    model, tokenizer = model_and_tokenizer
    data = viz.explain_data(model, tokenizer, SOURCE, REFERENCE, probs_grad_hook=hook, tokens=[1])
    assert not data["check"]["passed"]
    assert failing <= {row["what"] for row in data["check"]["rows"] if not row["passed"]} <= failing | may_fail


def test_without_a_reference_the_target_is_the_translation(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    short = nn.Transformer(model.config.replace(max_len=12, seed=0))  # short translations, small pages
    short.load_state_dict(model.state_dict())
    short.eval()
    for beam in (1, 2):
        data = viz.explain_data(short, tokenizer, "I see", beam_size=beam, tokens=[1])
        assert data["target"]["given"] == "translation"
        assert data["target"]["text"] == decode.translate(short, tokenizer, ["I see"], beam_size=beam)[0]
        assert data["token_gradients"]["positions"] == [1]


def test_the_page_holds_the_first_tokens_that_fit(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    data = viz.explain_data(model, tokenizer, SOURCE, REFERENCE, token_values_limit=1)
    assert data["token_gradients"]["positions"] == [] and not data["token_gradients"]["complete"]
    assert data["arrays"]["token.dP.enc"]["shape"][0] == 0
    lengths = len(data["source"]["ids"]), len(data["target"]["ids"])
    three = sum(explanation.token_values(model.config, *lengths, t) for t in range(3))
    data = viz.explain_data(model, tokenizer, SOURCE, REFERENCE, token_values_limit=three)
    assert data["token_gradients"]["positions"] == [1, 2, 3] and data["token_gradients"]["values"] == three
    # the decoder's rows up to each token, one byte a value
    assert data["arrays"]["token.dP.dec"]["bytes"] == 2 * 4 * (1 + 2 + 3) * lengths[1]
    assert array(data, "token.saliency.target.norm").shape[0] == len(data["target"]["ids"])  # for every token


# ---------------------------------------------------------------- offline by construction
def test_the_page_is_offline_by_construction(page, model_and_tokenizer):
    path, _ = page
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"(?i)https?:", text) and "<link" not in text.lower()
    assert not re.search(r"(?i)\bsrc\s*=", text)
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', text).group(1)
    assert "default-src 'none'" in csp and "'unsafe-inline'" not in csp and "connect-src 'none'" in csp
    model, tokenizer = model_and_tokenizer  # an address in a sentence does not make one in the page
    other = viz.explain(model, tokenizer, "see https://example.com/x </script>", REFERENCE, tokens=[1])
    # </script> ends the guard, the data and each of the page's scripts: none more
    assert not re.search(r"(?i)https?:", other) and other.count("</script>") == 2 + len(explain_page.SCRIPTS)
    assert page_data(other)["source"]["text"] == "see https://example.com/x </script>"


def test_the_page_inlines_its_scripts_in_order_each_under_its_own_hash(untrained_page):
    path, _ = untrained_page
    text = path.read_text(encoding="utf-8")
    scripts = [explain_page._read(name) for name in ("explain_guard.js",) + explain_page.SCRIPTS]
    where = [text.index(f"<script>{script}</script>") for script in scripts]
    assert where == sorted(where) and where[1] > text.index('id="explain-data"')  # the data before them
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', text).group(1)
    listed = re.search(r"script-src ([^;]*);", csp).group(1).split()
    assert listed == [explain_page._sha256(script) for script in scripts]


def test_the_page_scripts_share_one_namespace_and_are_strict():
    """Each script is one strict function, called with the namespace (the first creates it): nothing
    of it outside, no other global assigned, and at most 500 lines."""
    for name in explain_page.SCRIPTS:
        lines = explain_page._read(name).splitlines()
        code = [line for line in lines if not line.startswith("//")]
        first = name == explain_page.SCRIPTS[0]
        assert code[:2] == ["(function () {" if first else "(function (page) {", '  "use strict";'], name
        assert code[-1] == ("})();" if first else "})(window.tinyformerExplain);"), name
        assert all(line == "" or line.startswith("  ") for line in code[2:-1]), name
        assigned = re.findall(r"\bwindow\.(\w+)\s*=(?!=)", "\n".join(code))
        assert assigned == (["tinyformerExplain"] if first else []), name
        assert len(lines) <= 500, name


@needs_browser
def test_the_page_scripts_add_no_global_but_their_namespace(untrained_page, tmp_path, monkeypatch):
    """The window's own properties after every script ran, against those before the first: only the
    guard's list of errors and the scripts' namespace are new."""
    _, data = untrained_page
    read = explain_page._read
    before = "document.documentElement.dataset.globals = JSON.stringify(Object.getOwnPropertyNames(window));\n"
    after = ("\n(function () { const before = JSON.parse(document.documentElement.dataset.globals); "
             "document.getElementById('self-test').dataset.globals = JSON.stringify("
             "Object.getOwnPropertyNames(window).filter(function (n) { return before.indexOf(n) < 0; })); })();\n")
    texts = {"explain_guard.js": before + read("explain_guard.js"),
             explain_page.SCRIPTS[-1]: read(explain_page.SCRIPTS[-1]) + after}
    monkeypatch.setattr(explain_page, "_read", lambda name: texts.get(name) or read(name))
    path = tmp_path / "globals.html"
    path.write_text(render(data), encoding="utf-8")
    dom = PageDOM(browse(path)[0], only_ids=["self-test"])
    assert_self_test_passed(dom)
    assert sorted(json.loads(dom.ids["self-test"]["data-globals"])) == ["explainErrors", "tinyformerExplain"]


def test_the_page_files_are_package_data():
    tomllib = pytest.importorskip("tomllib")
    from tinyformer.study.viz import explain_page as module

    with open(children.ROOT / "pyproject.toml", "rb") as stream:
        patterns = tomllib.load(stream)["tool"]["setuptools"]["package-data"]["tinyformer.study.viz"]
    for name in module.PAGE_FILES:
        assert any(name.endswith(p.lstrip("*")) for p in patterns), name


# ---------------------------------------------------------------- the command line
@pytest.fixture
def cli_run(untrained_run, capsys):
    def call(*argv):
        try:
            code = cli.main(["explain", "--checkpoint", str(untrained_run), *map(str, argv)])
        except SystemExit as exit_:
            code = exit_.code
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return code, err.strip().splitlines()
    return call


def test_the_command_takes_a_line_of_a_file(cli_run, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("I see\nWe buy 2 old cars\n", encoding="utf-8")
    code, err = cli_run("--input", source, "--line", 2, "--reference", "Wir kaufen zwei alte Autos",
                        "--output", tmp_path / "p.html", "--tokens", "1,3")
    assert code == 0 and "wrote" in err[-1]
    data = page_data((tmp_path / "p.html").read_text(encoding="utf-8"))
    assert data["source"]["text"] == "We buy 2 old cars" and data["token_gradients"]["positions"] == [1, 3]


@pytest.mark.parametrize("argv, code, message", [
    (["--source", "   "], 2, "--source is empty"),
    (["--source", "I", "--reference", ""], 2, "--reference is empty"),
    ([], 2, "give the sentence as --source TEXT or as --input FILE --line N"),
    (["--source", "I", "--input", "{tmp}/in.txt"], 2, "(one of them)"),
    (["--source", "I", "--line", "2"], 2, "--line goes with --input FILE"),
    (["--source", "I", "--tokens", "0"], 2, "--tokens: must be comma-separated positive integers, got '0'"),
    (["--source", "I", "--tokens", "1,x"], 2, "--tokens: must be comma-separated positive integers"),
    (["--source", "I " * 1100], 1, "--source is 1,100 tokens long"),
    (["--source", "I", "--reference", "Ich " * 1100], 1, "--reference is"),
    (["--source", "I", "--reference", "Ich", "--tokens", "9"], 1, "tokens [9]: not target positions"),
    (["--input", "{tmp}/missing.txt"], 1, "--input {tmp}/missing.txt: no such file"),
    (["--input", "{tmp}/in.txt", "--line", "5"], 1, "--input {tmp}/in.txt has 2 lines; there is no --line 5"),
    (["--input", "{tmp}/in.txt", "--line", "2"], 1, "--input {tmp}/in.txt, line 2, is empty"),
    (["--source", "I", "--output", "{tmp}/no/page.html"], 1, "--output {tmp}/no/page.html: the directory"),
], ids=["empty-source", "empty-reference", "no-source", "source-and-input", "line-without-input", "tokens-0",
        "tokens-not-numbers", "source-too-long", "reference-too-long", "token-beyond-target", "missing-input",
        "line-beyond-file", "empty-line", "output-directory-missing"])
def test_bad_input_is_one_line(cli_run, tmp_path, argv, code, message):
    (tmp_path / "in.txt").write_text("I see\n   \n", encoding="utf-8")
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--output" not in argv:
        argv += ["--output", str(tmp_path / "page.html")]
    got, err = cli_run(*argv)
    assert got == code and len(err) == 1 and message.format(tmp=tmp_path) in err[0], err
    assert not (tmp_path / "page.html").exists()


def test_the_command_has_help(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["explain", "--help"])
    assert info.value.code == 0 and "usage: tinyformer explain" in capsys.readouterr().out


def test_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    code = cli.main(["explain", "--checkpoint", str(tmp_path / "none.npz"), "--source", "I", "--output",
                     str(tmp_path / "p.html")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "none.npz" in err[0]


# ---------------------------------------------------------------- the page in a browser
def start_tags_with_ids(text, ids):
    """The start tags in ``text`` (a DOM as Chromium serializes it) of the elements with one of
    ``ids``: every attribute value is double-quoted there, with '"' escaped inside it."""
    attribute = r'\s+[^\s"=>/]+(?:="[^"]*")?'
    wanted = "|".join(map(re.escape, ids))
    return re.findall(rf'<[a-zA-Z][\w-]*(?:{attribute})*?\s+id="(?:{wanted})"(?:{attribute})*\s*/?>', text)


class PageDOM(HTMLParser):
    """What the tests read of a page's DOM: attributes by id, each <svg> with its heatmap cells,
    the canvases, the rows of the gradient-check table (verdict, class, the text of each cell).
    With ``only_ids``, the attributes of those elements alone: a page of thousands of heatmap cells
    takes seconds to parse whole."""

    def __init__(self, text, only_ids=None):
        super().__init__()
        self.ids, self.svgs, self.canvases, self._open = {}, [], [], []
        self.check_rows, self._in_check_row = [], False
        if only_ids is not None:
            self.feed("".join(start_tags_with_ids(text, only_ids)))
            assert set(self.ids) == set(only_ids), (sorted(self.ids), only_ids)
            return
        # The data is long and the tests read it from the page file: leave it out of the parse.
        self.feed(re.sub(r'(<script type="application/json" id="explain-data">).*?(</script>)', r"\1\2", text,
                         flags=re.S))

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if "id" in attributes:
            self.ids[attributes["id"]] = attributes
        if tag == "tr" and "data-passed" in attributes:  # a row of the gradient-check table
            self.check_rows.append({"passed": attributes["data-passed"] == "true",
                                    "class": attributes.get("class") or "", "cells": []})
        elif tag == "td" and self.check_rows and self._in_check_row:
            self.check_rows[-1]["cells"].append("")
        if tag == "tr":
            self._in_check_row = "data-passed" in attributes
        if tag == "svg":
            self.svgs.append({"attrs": attributes, "cells": []})
            self._open.append(self.svgs[-1])
        elif tag == "rect" and "cell" in attributes.get("class", "").split() and self._open:
            self._open[-1]["cells"].append(attributes)
        elif tag == "canvas":
            self.canvases.append(attributes)

    def handle_endtag(self, tag):
        if tag == "svg" and self._open:
            self._open.pop()
        elif tag == "tr":
            self._in_check_row = False

    def handle_data(self, data):
        if self._in_check_row and self.check_rows[-1]["cells"]:
            self.check_rows[-1]["cells"][-1] += data

    def thumbs(self, kind):
        return [s for s in self.svgs if "thumb" in s["attrs"].get("class", "").split() and
                s["attrs"].get("data-kind") == kind]

    def status(self):
        found = self.ids["self-test"]
        return found["data-status"], json.loads(found.get("data-checks", "[]")), json.loads(found.get("data-errors", "[]"))


def browse(path, fragment="", screenshot=None, budget_ms=30000):
    """(DOM after the scripts ran, seconds) of the page at ``path``#``fragment`` in headless Chromium."""
    url = path.resolve().as_uri() + ("#" + fragment if fragment else "")
    profile = path.parent / f"profile-{time.monotonic_ns()}"
    args = [CHROMIUM, "--no-sandbox", "--headless", "--disable-gpu", "--no-first-run", "--disable-extensions",
            f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}"]
    args += [f"--screenshot={screenshot}", "--window-size=1280,2000"] if screenshot else ["--dump-dom"]
    start = time.perf_counter()
    result = children.run(args + [url], timeout=180)
    seconds = time.perf_counter() - start
    shutil.rmtree(profile, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, seconds


def drawn_values(cells, info):
    """The (rows, cols) matrix of values that heatmap cells show (in their data-v)."""
    drawn = np.full((info["rows"], info["cols"]), np.nan)
    for cell in cells:
        drawn[int(cell["data-r"]), int(cell["data-c"])] = float(cell["data-v"])
    return drawn


def assert_self_test_passed(dom):
    status, checks, errors = dom.status()
    assert errors == [], errors
    assert status == "pass", [c for c in checks if not c["passed"]]
    return checks


@needs_browser
def test_in_the_browser_every_head_is_drawn_and_the_self_test_passes(page):
    path, data = page
    text = browse(path)[0]
    dom = PageDOM(text)
    checks = assert_self_test_passed(dom)
    quick = ["self-test", "gradcheck-badge"]  # the quick reading of the other tests finds the same
    assert PageDOM(text, only_ids=quick).ids == {name: dom.ids[name] for name in quick}
    assert {c["name"] for c in checks} >= {"P rows sum to 1", "dL/dS rows sum to 0", "every layer and head drawn",
                                           "Σ over tokens of the per-token dL/dP, dL/dS = the whole loss's",
                                           SAMPLES_CHECK, "SVG export of this view", "PNG export of this view"}
    sampled = next(c["detail"] for c in checks if c["name"] == SAMPLES_CHECK)
    assert int(sampled.split()[0]) == sum(len(v["index"]) for v in data["samples"].values())
    for kind in KINDS:
        info = data["kinds"][kind]
        thumbs = dom.thumbs(kind)
        assert len(thumbs) == info["layers"] * info["heads"]
        assert sum(len(t["cells"]) for t in thumbs) == info["layers"] * info["heads"] * info["rows"] * info["cols"]
        probs = array(data, f"P.{kind}")
        for thumb in thumbs:
            layer, head = int(thumb["attrs"]["data-layer"]) - 1, int(thumb["attrs"]["data-head"]) - 1
            drawn = drawn_values(thumb["cells"], info)
            np.testing.assert_array_equal(drawn, probs[layer, head])  # the page draws the embedded numbers
            if kind == "dec":
                assert not np.triu(drawn, k=1).any()  # causal: nothing above the diagonal
    digest = json.loads(dom.ids["self-test"]["data-digest"])  # the arrays as the page decoded and computed them
    for name in data["arrays"]:
        values = decode_array(data["arrays"][name], positions_of(data))
        assert digest[name] == pytest.approx([values.sum(), np.abs(values).sum()], rel=1e-12, abs=1e-300), name
    for name, values in recompute(data).items():
        total = np.abs(values).sum()
        assert digest["page:" + name] == pytest.approx([values.sum(), total], abs=1e-11 * max(total, 1e-300)), name
    assert dom.ids["gradcheck-badge"]["data-status"] == "pass"
    head = data["check"]["head"]  # the default view: the most sensitive head
    view = dom.ids["detail-view"]
    assert (view["data-kind"], int(view["data-layer"]), int(view["data-head"])) == (head["kind"], head["layer"],
                                                                                     head["head"])


@needs_browser
def test_the_page_inflates_every_kind_of_deflate_block(untrained_run, tmp_path, monkeypatch):
    """The page inflates its data itself: stored blocks, fixed and dynamic Huffman codes, whatever
    zlib chose, give the bytes Python deflated (the page's sums of every array equal Python's).
    The page's arrays are deflated in turn with each of zlib's ways of writing blocks."""
    original, ways = zlib.compressobj, []
    kinds = [(0, zlib.Z_DEFAULT_STRATEGY), (9, zlib.Z_FIXED), (9, zlib.Z_RLE), (1, zlib.Z_HUFFMAN_ONLY),
             (9, zlib.Z_DEFAULT_STRATEGY)]  # stored, fixed codes, run lengths, Huffman only, dynamic

    def compressobj(_level, method, wbits):
        level, strategy = kinds[len(ways) % len(kinds)]
        ways.append(strategy)
        return original(level, method, wbits, 9, strategy)

    monkeypatch.setattr(explain_codec.zlib, "compressobj", compressobj)
    model, tokenizer, _ = load_model(untrained_run)
    path = tmp_path / "page.html"
    path.write_text(viz.explain(model, tokenizer, SOURCE, REFERENCE, tokens=[1, 2]), encoding="utf-8")
    data = page_data(path.read_text(encoding="utf-8"))
    dom = PageDOM(browse(path)[0], only_ids=["self-test"])
    assert_self_test_passed(dom)
    digest = json.loads(dom.ids["self-test"]["data-digest"])
    for name in data["arrays"]:
        values = decode_array(data["arrays"][name], positions_of(data))
        assert digest[name] == pytest.approx([values.sum(), np.abs(values).sum()], rel=1e-12, abs=1e-300), name
    assert len(ways) == len(data["arrays"]) >= 2 * len(kinds)  # every way, on two arrays at least


@needs_browser
@pytest.mark.parametrize("fragment, kind, layer, head, grad, token", [
    ("kind=cross&layer=1&head=2", "cross", 1, 2, "dP", 0),
    ("kind=dec&layer=2&head=3&grad=dS&token=2&row=3", "dec", 2, 3, "dS", 2),
    ("kind=enc&layer=2&head=4&grad=dP&token=5", "enc", 2, 4, "dP", 5),
])
def test_the_url_hash_selects_the_view(page, fragment, kind, layer, head, grad, token):
    path, data = page
    dom = PageDOM(browse(path, fragment)[0])
    assert_self_test_passed(dom)
    view = dom.ids["detail-view"]
    assert (view["data-kind"], view["data-layer"], view["data-head"], view["data-grad"], view["data-token"]) == \
        (kind, str(layer), str(head), grad, str(token))
    detail = next(s for s in dom.svgs if s["attrs"].get("id") == "detail-view")
    info = data["kinds"][kind]
    if token:
        expected = array(data, f"token.{grad}.{kind}")[data["token_gradients"]["positions"].index(token)]
    else:
        expected = array(data, f"{grad}.{kind}")
    for quantity, values in (("P", array(data, f"P.{kind}")[layer - 1, head - 1]),
                             ("grad", expected[layer - 1, head - 1])):
        cells = [c for c in detail["cells"] if c["data-q"] == quantity]
        assert len(cells) == info["rows"] * info["cols"]
        np.testing.assert_allclose(drawn_values(cells, info), values, rtol=0, atol=1e-12 * np.abs(values).max())


@needs_browser
def test_a_wrong_backward_turns_the_badge_to_fail(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    path = tmp_path / "wrong.html"
    path.write_text(viz.explain(model, tokenizer, SOURCE, REFERENCE, probs_grad_hook=lambda g: g * 1.01),
                    encoding="utf-8")
    data = page_data(path.read_text(encoding="utf-8"))
    text, _ = browse(path)
    dom = PageDOM(text)
    assert_self_test_passed(dom)  # the page is consistent: it is the backward that is wrong
    assert dom.ids["gradcheck-badge"]["data-status"] == "fail"
    failed = [row["what"] for row in data["check"]["rows"] if not row["passed"]]
    badge = re.search(r'id="gradcheck-badge"[^>]*>([^<]*)<', text).group(1)
    assert badge == f"FAIL: {len(failed)} of {len(data['check']['rows'])}"
    # The table shows every row of the check with the Python side's verdict, the failing ones marked.
    assert [row["passed"] for row in dom.check_rows] == [row["passed"] for row in data["check"]["rows"]]
    assert [row["cells"][0] for row in dom.check_rows] == [row["what"] for row in data["check"]["rows"]]
    for row in dom.check_rows:
        assert row["cells"][-1] == ("pass" if row["passed"] else "FAIL")
        assert ("fail" in row["class"].split()) == (not row["passed"])
    assert {"P", "S", "gate", "W_Q", "W_K"} <= set(failed)


@needs_browser
@pytest.mark.parametrize("change, recorded", [
    # An inline script the policy does not list (by its hash): blocked, and the violation recorded.
    (lambda text: text.replace("</body>", "<script>document.title = 'ran'</script></body>"),
     "content security policy: script-src-elem blocked inline"),
    # An image, even a data: URL, is a request the policy forbids.
    (lambda text: text.replace("</footer>", '</footer><img alt="" src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">'),
     "content security policy: img-src blocked data"),
    # Data the script cannot draw: its error is recorded.
    (lambda text: text.replace('"P.enc":', '"X.enc":'), "error: "),
], ids=["inline-script", "image", "script-error"])
def test_the_self_test_records_errors_and_policy_violations(untrained_page, tmp_path, change, recorded):
    path, _ = untrained_page
    broken = tmp_path / "broken.html"
    broken.write_text(change(path.read_text(encoding="utf-8")), encoding="utf-8")
    status, _, errors = PageDOM(browse(broken)[0], only_ids=["self-test"]).status()
    assert status == "fail" and any(e.startswith(recorded) for e in errors), errors


SAMPLES_CHECK = "this page's dP, dS, dQ, dK, dV and per-token dS against Python's float64"


def forgotten_subtraction(script, data):
    """The page's dL/dS computed as P∘(dP − dP_im), the row's r_i = Σ_k P_ik·(dP_ik − dP_im) left out."""
    old = "dS[o + j] = P[o + j] * ((dP[o + j] - centre) - r);"
    assert script.count(old) == 1
    return script.replace(old, "dS[o + j] = P[o + j] * (dP[o + j] - centre);"), data


def one_sample_off(script, data):
    """Python's float64 value of the largest sampled decoder dL/dS moved by 2 % of itself."""
    sample = data["samples"]["dS.dec"]
    k = int(np.argmax(np.abs(sample["value"])))
    sample["value"][k] *= 1.02
    return script, data


def one_probability_off(script, data):
    """One stored P of the encoder moved by 0.01: its row sums to 1.01."""
    probs = decode_array(data["arrays"]["P.enc"])
    probs[0, 0, 0, 0] += 0.01
    data["arrays"]["P.enc"] = encode_float16(probs)
    return script, data


@needs_browser
@pytest.mark.parametrize("corrupt, failing, may_fail", [
    (forgotten_subtraction, {"dL/dS rows sum to 0", SAMPLES_CHECK}, set()),
    (one_sample_off, {SAMPLES_CHECK}, set()),
    (one_probability_off, {"P rows sum to 1"}, {SAMPLES_CHECK}),
], ids=["forgotten-subtraction", "one-sample-off", "one-probability-off"])
def test_the_self_test_fails_where_the_page_or_its_data_is_wrong(page, tmp_path, monkeypatch, corrupt, failing,
                                                                 may_fail):
    """The page computes attention's backward itself: its self-test fails when that computation is
    wrong (a script that forgets softmax's row term), when it does not match Python's float64 beyond
    what storage allows (one sample moved by 2 %), and when the stored P is not a softmax."""
    _, data = page
    script = explain_page._read("explain_arrays.js")
    script, data = corrupt(script, json.loads(json.dumps(data)))
    read = explain_page._read
    monkeypatch.setattr(explain_page, "_read", lambda name: script if name == "explain_arrays.js" else read(name))
    path = tmp_path / "corrupt.html"
    path.write_text(render(data), encoding="utf-8")
    status, checks, errors = PageDOM(browse(path)[0], only_ids=["self-test"]).status()
    assert status == "fail" and errors == []
    assert failing <= {c["name"] for c in checks if not c["passed"]} <= failing | may_fail, checks


@needs_browser
@pytest.mark.parametrize("source", ["Tomorrow you want 808 small birds", "Now I have 1 old house",
                                    "We buy 64 big flowers"])
def test_pages_of_a_trained_model_pass_their_self_test(trained_synthetic, tmp_path, source):
    """The model's own translation of sentences no other test uses, as `tinyformer explain` shows it:
    rows of P that are one-hot in float32, and a page that passes its self-test and gradient check."""
    path = tmp_path / "page.html"
    assert cli.main(["explain", "--checkpoint", str(trained_synthetic.checkpoint), "--source", source,
                     "--output", str(path)]) == 0
    data = page_data(path.read_text(encoding="utf-8"))
    assert data["target"]["given"] == "translation" and data["check"]["passed"]
    assert any((array(data, f"P.{kind}") == 1).any() for kind in KINDS)  # saturated softmaxes
    dom = PageDOM(browse(path)[0], only_ids=["self-test", "gradcheck-badge"])
    checks = assert_self_test_passed(dom)
    assert "2⁻⁵³" in next(c["detail"] for c in checks if c["name"] == "dL/dS rows sum to 0")
    assert dom.ids["gradcheck-badge"]["data-status"] == "pass"


def png_size(path):
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@needs_browser
def test_a_screenshot_of_one_view(untrained_page, tmp_path):
    path, _ = untrained_page
    shot = tmp_path / "view.png"
    browse(path, "kind=cross&layer=2&head=1&grad=dS", screenshot=shot)
    assert png_size(shot) == (1280, 2000) and shot.stat().st_size > 50_000  # drawn, not a blank page


class Letters:
    """One token per letter: sentences of an exact length."""

    pieces = ["<pad>", "<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]

    def encode(self, text):
        return [self.pieces.index(c) for c in text if c in self.pieces[4:]]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids if i > 3)

    def id_to_piece(self, i):
        return self.pieces[i]


@needs_browser
def test_a_128_token_sentence_is_drawn_on_canvas_within_the_time_budget(tmp_path, capsys):
    model = nn.Transformer.from_preset("tiny", vocab_size=len(Letters.pieces), seed=0, max_len=130)
    letters = "".join(Letters.pieces[4 + (7 * i) % 26] for i in range(128))
    path = tmp_path / "long.html"
    path.write_text(viz.explain(model, Letters(), letters, letters[::-1]), encoding="utf-8")
    text, seconds = browse(path, "kind=cross&layer=2&head=3", budget_ms=60000)
    dom = PageDOM(text)
    assert_self_test_passed(dom)
    for kind in KINDS:
        thumbs = [c for c in dom.canvases if c.get("data-kind") == kind and "thumb" in c.get("class", "")]
        assert len(thumbs) == 8 and all(c["data-rows"] == "129" and c["data-cols"] == "129" for c in thumbs)
        assert not dom.thumbs(kind)
    status = dom.ids["self-test"]
    with capsys.disabled():
        print(f"\n128 tokens: page {path.stat().st_size / 2 ** 20:.1f} MiB, browser {seconds:.1f} s, first paint "
              f"{status.get('data-first-paint-ms')} ms, panels drawn {status['data-drawn-ms']} ms, scripts with the "
              f"self-test {status['data-ms']} ms")
    # Every panel drawn (the self-test runs after the first paint) within 2 s on an idle machine
    # (benchmarks/results/explain.md); 6 s here, where other tests share the cores.
    assert int(status["data-drawn-ms"]) < 6000
    assert seconds < 60


@needs_browser
@pytest.mark.parametrize("which, d_model", [("untrained small", 256), ("trained tiny", 64)])
def test_a_multi30k_checkpoint_on_a_30_token_sentence(tmp_path, capsys, request, which, d_model):
    """`small` as `tinyformer train --data multi30k --preset small` builds it (its 8k BPE, untrained:
    the sizes and the plumbing are the point), and `tiny` trained a few dozen steps on Multi30k
    (``trained_multi30k``: past its untrained state, its loss well down), through the command line."""
    multi30k_or_skip()
    if which == "trained tiny":
        trained = request.getfixturevalue("trained_multi30k")
        # nats per token, from ln(2,000) = 7.6 untrained. Over seeds 0-11 of this run's options the fall
        # (from min(first 5 steps, 7.6) to the last 5 steps) was 0.83 to 1.07 (0.97 on seed 0): 0.5
        # is past its untrained state on every draw, where the 0.9 of before failed seed 4.
        losses = [r["nll"] for r in trained.metrics()]
        assert len(losses) == trained.config.max_steps and np.mean(losses[-5:]) < min(np.mean(losses[:5]), 7.6) - 0.5
        path = trained.checkpoint
    else:
        path = save_untrained_run(tmp_path / "run", data="multi30k", preset="small")
    tokenizer = Tokenizer.load(path.parent / "spm.model")
    test_en, test_de = load_corpus_of(path, "test")
    source, reference = next((e, d) for e, d in zip(test_en, test_de) if len(tokenizer.encode(e)) == 30)
    page_path = tmp_path / "small.html"
    start = time.perf_counter()
    assert cli.main(["explain", "--checkpoint", str(path), "--source", source, "--reference", reference,
                     "--output", str(page_path)]) == 0
    python_seconds = time.perf_counter() - start
    data = page_data(page_path.read_text(encoding="utf-8"))
    assert data["kinds"]["enc"]["rows"] == 31 and data["model"]["d_model"] == d_model and data["check"]["passed"]
    dom_text, seconds = browse(page_path)
    dom = PageDOM(dom_text, only_ids=["self-test"])
    assert_self_test_passed(dom)
    size = page_path.stat().st_size / 2 ** 20
    assert data["token_gradients"]["complete"]
    with capsys.disabled():
        print(f"\n{which}, 30 source tokens, {len(data['target']['ids'])} target tokens: page {size:.1f} MiB (token "
              f"gradients of {len(data['token_gradients']['positions'])}), command {python_seconds:.1f} s, browser "
              f"{seconds:.1f} s (scripts {dom.ids['self-test']['data-ms']} ms)")
    assert size <= 2  # MiB: the budget for `small` and a 30-token sentence, every token's gradients held


# ---------------------------------------------------------------- across training: one run's checkpoints
STEPS_SOURCE = "Today we see 5 red cars"
SAVED_STEPS = list(range(SYNTHETIC["save_every"], SYNTHETIC["max_steps"] + 1, SYNTHETIC["save_every"]))


@pytest.fixture(scope="module")
def steps_page(trained_synthetic, tmp_path_factory):
    """(path, data) of `tinyformer explain --checkpoints` over the trained run's four checkpoints
    (SAVED_STEPS), the target its last checkpoint's translation."""
    path = tmp_path_factory.mktemp("steps") / "steps.html"
    assert cli.main(["explain", "--checkpoints", str(trained_synthetic.directory), "--every", str(SAVED_STEPS[0]),
                     "--source", STEPS_SOURCE, "--output", str(path)]) == 0
    return path, page_data(path.read_text(encoding="utf-8"))


def step_data(data, k):
    """Step k of a page across training as a page of one checkpoint (what the tests read of one)."""
    return {**{key: value for key, value in data.items() if key != "steps"}, **data["steps"][k]}


def test_a_run_across_checkpoints_holds_each_step_and_shares_the_rest(steps_page, trained_synthetic):
    path, data = steps_page
    steps = data["steps"]
    assert [s["step"] for s in steps] == SAVED_STEPS
    assert [s["checkpoint"] for s in steps] == [f"checkpoint_{n:07d}.npz" for n in SAVED_STEPS]
    assert not {"arrays", "samples", "check", "loss", "token_gradients"} & set(data)  # held once per step
    model, tokenizer, _ = load_model(trained_synthetic.checkpoint)
    translation = decode.translate(model, tokenizer, [STEPS_SOURCE])[0]
    assert data["target"]["text"] == translation and data["target"]["given"] == "translation"
    last_step = SAVED_STEPS[-1]
    assert data["target"]["decoding"].endswith(f"by step {last_step} (checkpoint_{last_step:07d}.npz)")
    assert len({tuple(s["token_gradients"]["positions"]) for s in steps}) == 1  # the same tokens at every step
    losses = [s["loss"]["total"] for s in steps]
    assert losses[-1] < losses[0] and len(set(losses)) == 4  # the last checkpoint's own translation, learnt
    last = step_data(data, 3)  # the last step is the page of the last checkpoint, target teacher-forced
    alone = viz.explain_data(model, tokenizer, STEPS_SOURCE, translation)
    assert last["loss"]["total"] == pytest.approx(alone["loss"]["total"], rel=1e-12)
    np.testing.assert_array_equal(array(last, "P.dec"), array(alone, "P.dec"))
    assert path.stat().st_size <= 2 ** 20 * 2 * len(steps) / 2  # 2 MiB a page, times half the steps at most


def test_models_of_another_architecture_are_not_one_run(trained_synthetic):
    model, tokenizer, _ = load_model(trained_synthetic.checkpoint)
    other = nn.Transformer(model.config.replace(d_ff=128, seed=0))
    with pytest.raises(ValueError, match=r"^explain: second has another model than first \(d_ff 128, not 256\)"):
        viz.explain_steps_data([(1, "first", model), (2, "second", other)], tokenizer, STEPS_SOURCE)


@pytest.mark.parametrize("argv, code, message", [
    (["--checkpoint", "{last}", "--every", "2"], 2, "--every and --steps go with --checkpoints RUN_DIR"),
    (["--checkpoints", "{run}", "--every", "2", "--steps", "250"], 2, "--every and --steps: give one of them"),
    (["--checkpoints", "{run}", "--steps", "250,260"], 1, "--steps 260: no checkpoint of step 260 in {run} (its "
                                                          "steps: " + ", ".join(map(str, SAVED_STEPS)) + ")"),
    (["--checkpoints", "{run}", "--every", "3000"], 1, "--every 3000: no checkpoint in {run} has a step that is a "
                                                       "multiple of 3000"),
    (["--checkpoints", "{last}"], 1, "--checkpoints {last}: not a directory"),
    (["--checkpoints", "{tmp}"], 1, "--checkpoints {tmp}: no checkpoint_*.npz in it"),
    (["--checkpoints", "{mixed}"], 1, "--checkpoints {mixed}: tokenizer {mixed}/spm.model"),
    (["--checkpoints", "{run}", "--steps", "x"], 2, "--steps: must be comma-separated steps"),
], ids=["every-without-checkpoints", "every-and-steps", "missing-step", "no-multiple", "not-a-directory",
        "no-checkpoints", "another-run", "steps-not-numbers"])
def test_bad_checkpoints_are_one_line(trained_synthetic, untrained_run, tmp_path, capsys, argv, code, message):
    mixed = tmp_path / "mixed"  # the trained run's last checkpoint beside one of another run (another tokenizer)
    mixed.mkdir()
    shutil.copy(trained_synthetic.checkpoint, mixed / "checkpoint_0001000.npz")
    shutil.copy(trained_synthetic.directory / "spm.model", mixed / "spm.model")
    shutil.copy(untrained_run, mixed / "checkpoint_0001100.npz")
    names = dict(run=trained_synthetic.directory, last=trained_synthetic.checkpoint, tmp=tmp_path / "empty",
                 mixed=mixed)
    (tmp_path / "empty").mkdir()
    argv = [a.format(**names) for a in argv] + ["--source", "I see", "--output", str(tmp_path / "page.html")]
    try:
        got = cli.main(["explain", *argv])
    except SystemExit as exit_:
        got = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert got == code and len(err) == 1 and message.format(**names) in err[0], err
    assert not (tmp_path / "page.html").exists()


def section_texts(dom_text):
    """The markup of each numbered section of a page's DOM (its drawings and tables), by id."""
    return dict(re.findall(r'<section id="([a-z-]+)-section"[^>]*>(.*?)</section>', dom_text, re.S))


@needs_browser
def test_the_slider_moves_every_panel_and_the_self_test_passes_at_every_step(steps_page, tmp_path):
    """The page across training in Chromium: its self-test runs every check at each of the four steps
    and moves the slider with the arrow keys (every panel changes) and back; the step of the URL hash
    is the step every panel shows; two screenshots at two steps differ; the page stays offline."""
    path, data = steps_page
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"(?i)https?:", text) and "default-src 'none'" in text
    sections = {}
    first, last = SAVED_STEPS[0], SAVED_STEPS[-1]
    for k, step in ((0, first), (3, last)):
        dom_text, _ = browse(path, f"kind=dec&layer=2&head=1&step={step}")
        dom = PageDOM(dom_text)
        checks = assert_self_test_passed(dom)
        slider = next(c for c in checks if c["name"] == "the step slider and ← → move every panel")
        assert "every panel changed" in slider["detail"] and "every panel as before" in slider["detail"]
        assert {c["name"] for c in checks} >= {"dL/dS rows sum to 0", SAMPLES_CHECK, "P rows sum to 1"}
        assert all(c["detail"].count("step ") >= 4 for c in checks if c["name"] in ("P rows sum to 1", SAMPLES_CHECK))
        assert re.search(r'<output id="step-label">([^<]*)</output>', dom_text).group(1) == f"step {step} ({k + 1} of 4)"
        detail = next(s for s in dom.svgs if s["attrs"].get("id") == "detail-view")
        cells = [c for c in detail["cells"] if c["data-q"] == "P"]
        expected = array(step_data(data, k), "P.dec")[1, 0]
        np.testing.assert_array_equal(drawn_values(cells, data["kinds"]["dec"]), expected)
        sections[step] = section_texts(dom_text)
    numbered = ["overview", "detail", "tokens", "saliency", "sensitivity", "check", "derivation", "steps"]
    assert [name for name in numbered if sections[first][name] == sections[last][name]] == []
    shots = []
    for step in (first, last):
        shot = tmp_path / f"step{step}.png"
        browse(path, f"kind=dec&layer=2&head=1&step={step}", screenshot=shot)
        assert png_size(shot) == (1280, 2000)
        shots.append(shot.read_bytes())
    assert shots[0] != shots[1]


def test_the_page_replaces_its_file_whole_and_never_a_device(cli_run, tmp_path, monkeypatch):
    """--output is written to a temporary file and renamed over the old page: a write that fails
    leaves the old page and no temporary; a path that is not a file (/dev/null) is written, not
    replaced."""
    from tinyformer.common import atomic

    page = tmp_path / "page.html"
    page.write_text("the old page", encoding="utf-8")

    def failing_rename(source, target):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(atomic.os, "replace", failing_rename)
        code, err = cli_run("--source", "I see", "--output", page, "--tokens", "1")
    assert code == 1 and len(err) == 1 and "No space left on device" in err[0]
    assert page.read_text(encoding="utf-8") == "the old page" and [p.name for p in tmp_path.iterdir()] == ["page.html"]
    code, _ = cli_run("--source", "I see", "--output", page, "--tokens", "1")
    assert code == 0 and page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # no temporary left
    if Path(os.devnull).exists() and not Path(os.devnull).is_file():
        device = Path(os.devnull).stat()
        assert cli_run("--source", "I see", "--output", os.devnull, "--tokens", "1")[0] == 0
        assert Path(os.devnull).stat().st_rdev == device.st_rdev and not Path(os.devnull).is_file()


@needs_browser
def test_a_model_with_marians_options_gets_a_page_that_passes_its_self_test(tmp_path):
    """Marian's shape options (issue 48): the SiLU feed-forward, an encoder deeper than the decoder,
    unscaled embeddings and a bias on the logits. Each kind has its own stack's layers, every head is
    drawn, and the page's self-test passes."""
    run = save_untrained_run(tmp_path / "run", vocab_size=120,
                             model_overrides={"activation": "silu", "encoder_layers": 3, "decoder_layers": 1,
                                              "scale_embedding": False, "logits_bias": True})
    path, data = write_page(run, tmp_path)
    assert {kind: data["kinds"][kind]["layers"] for kind in KINDS} == {"enc": 3, "dec": 1, "cross": 1}
    assert array(data, "P.enc").shape[0] == 3 and array(data, "P.cross").shape[0] == 1
    text = browse(path)[0]
    dom = PageDOM(text)
    assert_self_test_passed(dom)
    for kind in KINDS:
        assert len(dom.thumbs(kind)) == data["kinds"][kind]["layers"] * data["kinds"][kind]["heads"]
    assert "Model: 3 encoder and 1 decoder layers, d_model" in text
