"""`tinyformer explain` on an imported Marian model: the tokenizer's own special ids (the decoder starts
from the padding id, EOS is 0), the page's self-test in Chromium, and the page-size estimate at
opus-mt-en-de's vocabulary of 58,101 pieces (a unit test: no opus-sized page is built here)."""

import html
import re

import numpy as np
import pytest
from tests.study.test_explain import KINDS, PageDOM, assert_self_test_passed, browse, needs_browser, page_data

from tinyformer import cli
from tinyformer.study import viz
from tinyformer.study.viz import explanation, sentence
from tinyformer.study.viz.explain_codec import encode_log8
from tinyformer.translation import decode
from tinyformer.translation.interop.marian import marian_config
from tinyformer.translation.train import load_model

SOURCE, REFERENCE = "the small cat sees the red ball.", "die klein katze sieht die rot ball."
OPUS_MT_EN_DE = {  # the shape of Helsinki-NLP/opus-mt-en-de's config.json (benchmarks/bench_explain.py)
    "model_type": "marian", "vocab_size": 58101, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
    "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048,
    "activation_function": "swish", "max_position_embeddings": 512, "scale_embedding": True, "pad_token_id": 58100,
    "eos_token_id": 0, "decoder_start_token_id": 58100}


@pytest.fixture(scope="module")
def marian_run(tmp_path_factory):
    """(the imported run's checkpoint, transformers' model, transformers' tokenizer) of a small Marian
    folder made by transformers (tests/marian_folders.py) and imported by `import_marian`."""
    pytest.importorskip("transformers")
    from marian_folders import make_marian_folder

    from tinyformer.translation.interop.runs import import_marian

    root = tmp_path_factory.mktemp("marian")
    folder, model, tokenizer = make_marian_folder(root / "folder", d_model=16, encoder_layers=2, decoder_layers=1,
                                                  heads=2, ffn=32)
    path, _, _ = import_marian(folder, root / "run")
    return path, model, tokenizer


@pytest.fixture(scope="module")
def marian_page(marian_run, tmp_path_factory):
    """(path, data) of the page `tinyformer explain` writes for SOURCE taught REFERENCE."""
    path = tmp_path_factory.mktemp("page") / "marian.html"
    assert cli.main(["explain", "--checkpoint", str(marian_run[0].parent), "--source", SOURCE, "--reference",
                     REFERENCE, "--output", str(path)]) == 0
    return path, page_data(path.read_text(encoding="utf-8"))


def test_the_page_uses_the_marian_tokenizers_own_special_ids(marian_run, marian_page):
    """The ids transformers gives the pair (source + EOS, target split by target.spm + EOS), the decoder
    fed from the padding piece, and the loss transformers' own model computes (its decoder input is
    the labels shifted right behind decoder_start_token_id, the padding id)."""
    import torch

    _, data = marian_page
    _, model, tokenizer = marian_run
    encoded = tokenizer(SOURCE, text_target=REFERENCE, return_tensors="pt")
    assert data["source"]["ids"] == encoded["input_ids"][0].tolist()
    assert data["target"]["ids"] == encoded["labels"][0].tolist()
    assert data["target"]["ids"][-1] == tokenizer.eos_token_id == 0 and data["target"]["outputs"][-1] == "</s>"
    assert data["target"]["inputs"][0] == "<pad>" and data["target"]["inputs"][1:] == data["target"]["outputs"][:-1]
    with torch.no_grad():
        mean = float(model(**encoded).loss)
    assert data["loss"]["total"] == pytest.approx(mean * len(data["target"]["ids"]), rel=1e-5)
    assert data["check"]["passed"]


@pytest.mark.parametrize("beam", [1, 2])
def test_without_a_reference_the_translation_starts_from_the_padding_id(marian_run, monkeypatch, beam):
    """The model's own translation, decoded from the tokenizer's BOS (its padding id) to its EOS, as
    `translate` decodes it. (An untrained model's translation hardly depends on its start token: the
    ids the search is given are checked too.)"""
    model, tokenizer, _ = load_model(marian_run[0])
    given = []
    for name in ("greedy_decode", "beam_search"):
        search = getattr(sentence, name)
        monkeypatch.setattr(sentence, name, lambda *args, search=search, **options: given.append(options) or
                            search(*args, **options))
    data = viz.explain_data(model, tokenizer, SOURCE, beam_size=beam, tokens=[1])
    assert [(options["bos_id"], options["eos_id"]) for options in given] == [(tokenizer.pad_id, tokenizer.eos_id)]
    assert data["target"]["given"] == "translation" and data["target"]["inputs"][0] == "<pad>"
    assert data["target"]["text"] == decode.translate(model, tokenizer, [SOURCE], beam_size=beam)[0]
    assert data["target"]["ids"][-1] == tokenizer.eos_id


def test_attention_maps_feed_the_decoder_the_padding_piece(marian_run):
    model, tokenizer, _ = load_model(marian_run[0])
    found = viz.attention_maps(model, tokenizer, SOURCE)
    assert found["target"][0] == "<pad>" and found["source"][-1] == "</s>"


@needs_browser
def test_in_the_browser_the_self_test_passes_and_the_decoder_starts_from_the_padding_piece(marian_page):
    """The decoder's view: its query rows and key columns labelled with the decoder's inputs, the
    first of them the padding piece (a Marian decoder's start), drawn as a token like the others."""
    path, data = marian_page
    text = browse(path, "kind=dec&layer=1&head=1")[0]
    assert_self_test_passed(PageDOM(text))
    start = text.index('id="detail-view"')
    texts = _svg_texts(text[start:text.index("</svg>", start)])
    rows = [label for attributes, label in texts if 'text-anchor="end"' in attributes and "rotate(" not in attributes]
    columns = [label for attributes, label in texts if "rotate(" in attributes]
    count = data["kinds"]["dec"]["rows"]
    assert rows[:count] == columns[:count] == data["target"]["inputs"] and rows[0] == "<pad>"


def _svg_texts(svg):
    """(attributes, text) of each <text> element of an SVG as Chromium serialises it, the text unescaped."""
    return [(attributes, html.unescape(label)) for attributes, label in re.findall(r"<text([^>]*)>([^<]*)</text>", svg)]


def test_the_token_values_estimate_holds_for_an_opus_mt_sized_vocabulary():
    """At opus-mt-en-de's shape and a 30-token pair (31 with the EOS), ``token_values`` counts exactly
    the bytes ``encode_log8`` stores of the tokens that fit in ``TOKEN_VALUES_LIMIT`` (the page's
    largest part), and the vocabulary plays no part in it: a 58,101-piece vocabulary ships nothing of
    its size."""
    config = marian_config(OPUS_MT_EN_DE)
    small = marian_config({**OPUS_MT_EN_DE, "vocab_size": 120, "pad_token_id": 119,
                           "decoder_start_token_id": 119})
    length = 31
    costs = [explanation.token_values(config, length, length, t) for t in range(length)]
    assert costs == [explanation.token_values(small, length, length, t) for t in range(length)]
    limit = explanation.TOKEN_VALUES_LIMIT
    positions = explanation._embedded_positions(None, length, costs.__getitem__, limit)
    assert sum(costs[:len(positions)]) <= limit < sum(costs[:len(positions) + 1])
    layers, heads = 6, 8
    rng = np.random.default_rng(0)
    stored, encoded = 0, 0
    for kind in KINDS:
        values = rng.standard_normal((len(positions), layers, heads, length, length))
        if kind != "enc":  # the later rows of the decoder cannot reach a token's loss
            for token, position in enumerate(positions):
                values[token, :, :, position + 1:] = 0
        entry = encode_log8(values, positions if kind != "enc" else None)
        stored += entry["bytes"]
        encoded += len(entry["base64"])
    assert stored == sum(costs[t] for t in positions)
    assert encoded <= 4 / 3 * limit + 1024  # in the page: at most about 1.2 MiB of base64
