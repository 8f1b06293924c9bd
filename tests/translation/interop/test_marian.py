"""tinyformer import marian / export --format marian (translation/interop/, data/marian_tokenizer.py): a
Marian folder saved by transformers imports as the same model — same ids for the same text, logits to
float32 rounding, the same greedy translations token for token — and exports back to a folder that
transformers translates with identically; every bad input is one line and leaves nothing behind."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from marian_folders import SHAPES, corpus, hf_greedy, hf_model, marian_once  # noqa: E402

import tinyformer as tf  # noqa: E402
from tinyformer import cli  # noqa: E402
from tinyformer.translation import decode  # noqa: E402
from tinyformer.translation.data.batching import pad  # noqa: E402
from tinyformer.translation.interop.runs import export_marian, import_marian  # noqa: E402
from tinyformer.translation.train import load_model  # noqa: E402

# transformers' MarianTokenizer asks for sacremoses, which it does not use to tokenise (nor does tinyformer)
pytestmark = [pytest.mark.xdist_group("marian"),
              pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")]
SENTENCES = [source for source, _ in corpus(60, seed=11)]
MAX_NEW_TOKENS = 24
MIN_DISTINCT, EOS_SHARE = 50, 0.8  # of the 60 greedy outputs of every folder (measured: 59 or 60 distinct, 59 or 60 ended)


@pytest.fixture(scope="module", params=sorted(SHAPES))
def imported(request, tmp_path_factory):
    """(the Marian folder, the imported run's model and tokenizer, transformers' model and tokenizer)."""
    folder = marian_once(tmp_path_factory, request.param)
    run = tmp_path_factory.mktemp("runs") / request.param
    import_marian(folder, run)
    model, tokenizer, _ = load_model(run)
    return (folder, run, model, tokenizer, *hf_model(folder))


def test_the_tokenizer_gives_transformers_ids_and_text(imported):
    _, _, _, tokenizer, _, hf_tokenizer = imported
    texts = SENTENCES + [">>de<< the cat sits.", "an unknown wörd Ω", ""]
    assert [tokenizer.encode(t) + [tokenizer.eos_id] for t in texts] == hf_tokenizer(texts)["input_ids"]
    targets = [target for _, target in corpus(20, seed=3)]
    assert [tokenizer.encode_target(t) + [tokenizer.eos_id] for t in targets] == \
        hf_tokenizer(text_target=targets)["input_ids"]
    ids = [tokenizer.encode_target(t) for t in targets] + [[5, tokenizer.unk_id, 7, tokenizer.eos_id]]
    assert tokenizer.decode_batch(ids) == hf_tokenizer.batch_decode(ids, skip_special_tokens=True)


def test_encoder_decoder_and_logits_equal_transformers(imported):
    _, _, model, tokenizer, hf, hf_tokenizer = imported
    pairs = corpus(6, seed=5)
    batch = hf_tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], return_tensors="pt",
                         padding=True)
    decoder_input = hf.prepare_decoder_input_ids_from_labels(batch["labels"])
    with torch.no_grad():
        out = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 decoder_input_ids=decoder_input, output_hidden_states=True)
    src, tgt_in = batch["input_ids"].numpy(), decoder_input.numpy()
    with tf.no_grad():
        memory = model.encode(src).data
        logits = model.decode(tgt_in, model.encode(src), model.source_mask(src)).data
    real_source = batch["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(memory[real_source], out.encoder_last_hidden_state.numpy()[real_source],
                               rtol=1e-5, atol=1e-5)
    real_target = batch["labels"].numpy() != tokenizer.pad_id
    theirs = out.logits.numpy()
    scale = np.abs(theirs).max()
    assert np.abs(logits[real_target] - theirs[real_target]).max() <= 1e-6 * max(scale, 1) * 8


def test_greedy_translations_equal_transformers_token_for_token(imported):
    """All 60 equal, and 60 comparisons rather than one: the outputs differ from sentence to sentence
    (at least MIN_DISTINCT of them) and at least EOS_SHARE end with the model's own EOS, before the
    limit where transformers and tinyformer force it."""
    _, _, model, tokenizer, hf, hf_tokenizer = imported
    theirs = hf_greedy(hf, hf_tokenizer, SENTENCES, MAX_NEW_TOKENS)
    src = pad([tokenizer.encode(s) + [tokenizer.eos_id] for s in SENTENCES], tokenizer.pad_id)
    ours = decode.greedy_decode(model, src, max_len=MAX_NEW_TOKENS - 1, bos_id=tokenizer.bos_id,
                                eos_id=tokenizer.eos_id)
    assert len(SENTENCES) >= 50
    equal = sum(a == b for a, b in zip(ours, theirs))
    assert ours == theirs, f"{equal} of {len(SENTENCES)} sentences equal"
    distinct = len({tuple(tokens) for tokens in ours})
    ended = sum(len(tokens) < MAX_NEW_TOKENS - 1 for tokens in ours)
    print(f"{equal} of {len(SENTENCES)} equal; {distinct} distinct; {ended} ended before the limit")
    assert distinct >= MIN_DISTINCT, f"{distinct} distinct outputs of {len(SENTENCES)}: the input hardly matters"
    assert ended >= EOS_SHARE * len(SENTENCES), f"{ended} of {len(SENTENCES)} end with EOS before the limit"
    texts = decode.translate(model, tokenizer, SENTENCES[:8], beam_size=1, max_len_a=0, max_len_b=MAX_NEW_TOKENS - 1)
    assert texts == hf_tokenizer.batch_decode([[0] + ids for ids in theirs[:8]], skip_special_tokens=True)


def test_a_trained_model_translates_its_task(tmp_path_factory):
    """The trained folder is past its random state: it translates the made-up task."""
    folder = marian_once(tmp_path_factory, "trained-gelu")
    run = tmp_path_factory.mktemp("trained") / "run"
    import_marian(folder, run)
    model, tokenizer, _ = load_model(run)
    pairs = corpus(20, seed=21)
    outputs = decode.translate(model, tokenizer, [s for s, _ in pairs], beam_size=1)
    assert sum(o == t for o, (_, t) in zip(outputs, pairs)) >= 15


def test_export_round_trip_through_transformers(imported, tmp_path):
    folder, run, model, tokenizer, _, _ = imported
    exported = export_marian(run, tmp_path / "exported")
    hf, hf_tokenizer = hf_model(exported)
    src = pad([tokenizer.encode(s) + [tokenizer.eos_id] for s in SENTENCES], tokenizer.pad_id)
    ours = decode.greedy_decode(model, src, max_len=MAX_NEW_TOKENS - 1, bos_id=tokenizer.bos_id,
                                eos_id=tokenizer.eos_id)
    assert hf_greedy(hf, hf_tokenizer, SENTENCES, MAX_NEW_TOKENS) == ours
    again = tmp_path / "again"
    import_marian(exported, again)
    reimported, _, _ = load_model(again)
    for (name, p), (_, q) in zip(model.state_dict().items(), reimported.state_dict().items()):
        np.testing.assert_array_equal(p, q, err_msg=name)
    original = json.loads((folder / "config.json").read_text())
    written = json.loads((exported / "config.json").read_text())
    assert {k: written[k] for k in original if k != "transformers_version"} == \
        {k: v for k, v in original.items() if k != "transformers_version"}


def test_the_imported_run_exports_as_safetensors_and_translates_identically(imported, tmp_path):
    _, run, model, tokenizer, _, _ = imported
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    assert cli.main(["export", str(copy), "--output", str(copy / "model.safetensors")]) == 0
    reloaded, _, _ = load_model(copy / "model.safetensors")
    assert decode.translate(reloaded, tokenizer, SENTENCES[:10], beam_size=3) == \
        decode.translate(model, tokenizer, SENTENCES[:10], beam_size=3)


# ---------------------------------------------------------------------------------------- bad input
def _broken_copy(tmp_path_factory, tmp_path, change, name="brief-swish"):
    folder = tmp_path / "folder"
    shutil.copytree(marian_once(tmp_path_factory, name), folder)
    change(folder)
    return folder


def _edit_json(name, edit):
    def change(folder):
        values = json.loads((folder / name).read_text())
        edit(values)
        (folder / name).write_text(json.dumps(values))
    return change


def _edit_tensors(edit):
    def change(folder):
        from safetensors.numpy import load_file, save_file

        tensors = load_file(str(folder / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(folder / "model.safetensors"))
    return change


def _non_tensor_pickle(folder):
    (folder / "model.safetensors").unlink()
    torch.save({"model.shared.weight": torch.zeros(2, 2), "note": _Anything()}, str(folder / "pytorch_model.bin"))


class _Anything:
    pass


def _disagreeing_vocabulary(folder):
    vocab = json.loads((folder / "vocab.json").read_text())
    kept = {p: i for p, i in vocab.items() if p in ("</s>", "<unk>", "<pad>")}
    pieces = ["x%d" % i for i in range(len(vocab) - 3)]
    (folder / "vocab.json").write_text(json.dumps({"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)},
                                                   "<pad>": kept["<pad>"]}))


BAD_FOLDERS = {
    "a missing file": (lambda f: (f / "target.spm").unlink(), "lacks target.spm"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "holds no weights (model.safetensors or "
                                                                   "pytorch_model.bin)"),
    "another architecture": (_edit_json("config.json", lambda c: c.update(model_type="bart")),
                             "model_type is 'bart', not 'marian'"),
    "a pre-LN Marian": (_edit_json("config.json", lambda c: c.update(normalize_before=True)),
                        "normalize_before=True is a Marian variant"),
    "a missing field": (_edit_json("config.json", lambda c: c.pop("d_model")), "config.json lacks d_model"),
    "separate vocabularies": (_edit_json("config.json", lambda c: c.update(share_encoder_decoder_embeddings=False)),
                              "share_encoder_decoder_embeddings=False"),
    "a tensor of the wrong shape": (_edit_tensors(lambda t: t.update({"model.encoder.layers.0.fc1.weight":
                                                                      np.zeros((3, 32), np.float32)})),
                                    "tensor model.encoder.layers.0.fc1.weight has shape (3, 32), but config.json "
                                    "makes it (64, 32)"),
    "a tensor of another name": (_edit_tensors(lambda t: t.update({"model.encoder.layers.0.fc3.weight":
                                                                   t.pop("model.encoder.layers.0.fc1.weight")})),
                                 "tensor model.encoder.layers.0.fc1.weight is missing"),
    "an extra tensor": (_edit_tensors(lambda t: t.update({"model.encoder.layernorm_embedding.weight":
                                                          np.ones(32, np.float32)})),
                        "tensor model.encoder.layernorm_embedding.weight is not part of a MarianMTModel"),
    "a pickle that is not plain tensors": (_non_tensor_pickle, "is not plain tensors (read with weights_only=True"),
    "vocabulary and sentencepiece disagree": (_disagreeing_vocabulary, "vocab.json and source.spm disagree"),
    "a vocabulary of another size": (_edit_json("config.json", lambda c: c.update(vocab_size=c["vocab_size"] + 1,
                                                                          decoder_vocab_size=c["vocab_size"] + 1)),
                                     "config.json's vocab_size is"),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_a_bad_folder_is_one_line_and_writes_nothing(case, tmp_path_factory, tmp_path, capsys):
    change, message = BAD_FOLDERS[case]
    folder = _broken_copy(tmp_path_factory, tmp_path, change)
    output = tmp_path / "out" / "run"
    capsys.readouterr()
    assert cli.main(["import", "marian", str(folder), "--output", str(output)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tinyformer import: error: ") and message in err, err
    assert not output.exists()
    assert not output.parent.exists() or not list(output.parent.iterdir())


def test_an_existing_output_is_refused_and_kept(tmp_path_factory, tmp_path, capsys):
    output = tmp_path / "run"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    assert cli.main(["import", "marian", str(marian_once(tmp_path_factory, "brief-swish")), "--output",
                     str(output)]) == 1
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in output.iterdir()] == ["keep.txt"]


def test_a_joint_tokenizer_run_does_not_export_as_marian(tmp_path):
    from pathlib import Path

    legacy = Path(__file__).resolve().parents[2] / "data" / "legacy_run"
    with pytest.raises(ValueError, match="tokenizer is a joint sentencepiece model .* only Marian runs export"):
        export_marian(legacy, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_commands_take_an_imported_run(tmp_path_factory, tmp_path, capsys):
    """import, translate (a run directory), eval --sources/--references, average: as with any run."""
    run = tmp_path / "run"
    assert cli.main(["import", "marian", str(marian_once(tmp_path_factory, "trained-gelu")), "--output", str(run)]) == 0
    assert capsys.readouterr().out.startswith(f"imported {marian_once(tmp_path_factory, 'trained-gelu')} as ")
    pairs = corpus(12, seed=8)
    (tmp_path / "sources.txt").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "references.txt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    assert cli.main(["translate", "--checkpoint", str(run), "--beam", "1", "--input", str(tmp_path / "sources.txt"),
                     "--output", str(tmp_path / "out.txt")]) == 0
    model, tokenizer, _ = load_model(run)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == \
        decode.translate(model, tokenizer, [s for s, _ in pairs], beam_size=1)
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(run), "--sources", str(tmp_path / "sources.txt"), "--references",
                     str(tmp_path / "references.txt"), "--beam", "1"]) == 0
    assert "exact match" in capsys.readouterr().out
    assert cli.main(["eval", "--checkpoint", str(run)]) == 2
    assert "give --sources FILE --references FILE" in capsys.readouterr().err
    averaged = tmp_path / "averaged.npz"
    assert cli.main(["average", "--dir", str(run), "--output", str(averaged)]) == 0
    again, _, _ = load_model(averaged, tokenizer_path=run / "tokenizer")
    for (name, p), (_, q) in zip(model.state_dict().items(), again.state_dict().items()):
        np.testing.assert_array_equal(p, q, err_msg=name)


def test_eval_scores_with_transformers_beam_search(tmp_path_factory, tmp_path, capsys, monkeypatch):
    """tinyformer eval --length-normalization hf --alpha A: the translations are searched so (these models' beams
    agree either way, so the search's arguments are recorded too)."""
    from tinyformer.translation.train import evaluation

    run = tmp_path / "run"
    import_marian(marian_once(tmp_path_factory, "trained-gelu"), run)
    pairs = corpus(10, seed=31)
    (tmp_path / "s.txt").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "r.txt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    model, tokenizer, _ = load_model(run)
    expected = decode.translate(model, tokenizer, [s for s, _ in pairs], beam_size=4, length_normalization="hf",
                                alpha=-0.5)
    searches, translate = [], evaluation.prediction.translate

    def recorded(*args, **kwargs):
        searches.append({k: kwargs[k] for k in ("beam_size", "alpha", "length_normalization")})
        return translate(*args, **kwargs)

    monkeypatch.setattr(evaluation.prediction, "translate", recorded)
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(run), "--sources", str(tmp_path / "s.txt"), "--references",
                     str(tmp_path / "r.txt"), "--beam", "4", "--length-normalization", "hf", "--alpha", "-0.5"]) == 0
    assert searches == [{"beam_size": 4, "alpha": -0.5, "length_normalization": "hf"}]
    out = capsys.readouterr().out.splitlines()
    shown = [line.split("hypothesis: ", 1)[1] for line in out if "hypothesis: " in line]
    assert shown == expected[:len(shown)] and len(shown) == 3
    assert cli.main(["eval", "--checkpoint", str(run), "--sources", str(tmp_path / "s.txt"), "--references",
                     str(tmp_path / "r.txt"), "--alpha", "-0.5"]) == 2
    assert "GNMT's α must be a number in [0, 10]" in capsys.readouterr().err
