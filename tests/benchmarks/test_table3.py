"""benchmarks/table3.py's machinery (the variants, (B)'s restriction, the verdicts, the report) and
TrainConfig.model_overrides, which it trains the variants through — in seconds, on a tiny corpus."""

from pathlib import Path

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.translation import checkpoint
from tinyformer.model import nn, optim
from tinyformer.engine import functional as F
from tinyformer.translation import train as tf_train
from tinyformer.translation.train import TrainConfig, Trainer, load_model

from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def load_table3():
    return load_script("benchmarks/table3.py")


table3 = load_table3()
TINY = nn.PRESETS["tiny"].to_dict()
QUIET = dict(echo=lambda *a: None, progress=False)

WORDS = ["the", "a", "red", "big", "dog", "cat", "man", "runs", "sees", "house"]
GERMAN = ["der", "ein", "rote", "große", "Hund", "Katze", "Mann", "läuft", "sieht", "Haus"]


def tiny_corpus(config, split):
    """A few dozen word-for-word pairs in place of the 20,000 built-in ones (whose generation alone
    takes seconds)."""
    rng = np.random.default_rng({"train": 0, "val": 1, "test": 2}[split])
    pairs = [rng.integers(0, len(WORDS), rng.integers(2, 6)) for _ in range(60 if split == "train" else 8)]
    return [" ".join(WORDS[i] for i in p) for p in pairs], [" ".join(GERMAN[i] for i in p) for p in pairs]


@pytest.fixture
def small_corpus(monkeypatch):
    monkeypatch.setattr(tf_train.builders, "load_corpus", tiny_corpus)
    monkeypatch.setattr(table3, "load_corpus", tiny_corpus)


# ---------------------------------------------------------------------------- the variants
def test_the_variants_cover_table_3_rows_a_to_e():
    rows = table3.variants(TINY)
    ids = [r.id for r in rows]
    assert ids[0] == "base" and len(ids) == len(set(ids))
    by_row = {}
    for r in rows:
        by_row.setdefault(r.row, []).append(r)
    assert set(by_row) == {"base", "noise", "A", "B", "C", "D", "E"}
    assert sorted(r.model["heads"] for r in by_row["A"]) == [1, 8, 16]  # with the base's 4: 1, 4, 8, 16
    assert all(set(r.model) == {"heads"} and r.against == "best" for r in by_row["A"])
    assert sorted(r.d_k for r in by_row["B"]) == [4, 8] and all(not r.model for r in by_row["B"])
    changed = {(key, value) for r in by_row["C"] for key, value in r.model.items()}
    assert changed == {("num_layers", 1), ("num_layers", 4), ("d_model", 32), ("d_model", 128),
                       ("d_ff", 128), ("d_ff", 512)}
    assert [r.train for r in by_row["D"]] == [{"dropout": 0.0}, {"label_smoothing": 0.0}]
    assert [r.model for r in by_row["E"]] == [{"positional": "learned"}]
    assert by_row["noise"][0].seed == 1 and all(r.seed == 0 for r in rows if r.row != "noise")
    for r in rows[2:]:
        assert r.expect and r.paper and set(r.expect) <= {"bleu", "ppl"}
    # every model variant builds
    for r in rows:
        nn.Transformer.from_preset("tiny", vocab_size=50, **r.model)


def test_select_keeps_the_base_and_names_unknown_variants():
    rows = table3.variants(TINY)
    assert [r.id for r in table3.select(rows, "E")] == ["base", "E-learned"]
    assert [r.id for r in table3.select(rows, "base,B-dk4,D")] == ["base", "B-dk4", "D-drop0", "D-ls0"]
    with pytest.raises(SystemExit, match="F-huge"):
        table3.select(rows, "A,F-huge")


# ---------------------------------------------------------------------------- (B)
def test_restricting_query_key_dims_keeps_them_zero_through_training():
    tf.manual_seed(0)
    model = nn.Transformer.from_preset("tiny", vocab_size=12, d_model=16, d_ff=32, heads=2, num_layers=1)
    before = model.decoder.layers[0].cross_attn.w_q.weight.data.copy()
    fixed = table3.restrict_query_key_dims(model, d_k=3)
    # 3 attention layers, W_Q and W_K each: (16 - 2·3) rows of 16 weights and a bias
    assert fixed == 3 * 2 * (16 - 6) * (16 + 1)
    attn = model.decoder.layers[0].cross_attn
    rows = attn.w_q.weight.data.reshape(2, 8, 16)
    assert not rows[:, 3:].any()
    np.testing.assert_allclose(rows[:, :3], before.reshape(2, 8, 16)[:, :3] * (8 / 3) ** 0.5, rtol=1e-6)
    adam = optim.Adam(model.parameters(), lr=1e-2)
    src, tgt = np.array([[3, 4, 5, 2]]), np.array([[1, 6, 7, 2]])
    for _ in range(3):
        adam.zero_grad()
        F.cross_entropy(model(src, tgt[:, :-1]), tgt[:, 1:]).backward()
        adam.step()
    for module in model.modules():
        if isinstance(module, nn.MultiHeadAttention):
            for linear in (module.w_q, module.w_k):
                assert not linear.weight.data.reshape(2, 8, 16)[:, 3:].any()
                assert not linear.bias.data.reshape(2, 8)[:, 3:].any()
                assert linear.weight.data.reshape(2, 8, 16)[:, :3].all()
            assert module.w_v.weight.data.all()  # values keep d_v = d_model / h
    with pytest.raises(ValueError, match="d_k"):
        table3.restrict_query_key_dims(model, d_k=9)


# ---------------------------------------------------------------------------- verdicts and report
def results_for(rows, **changes):
    results = {r.id: {"ppl": 20.0, "bleu": 10.0, "params": 1000, "seconds": 1.0, "sentences": 8} for r in rows}
    for key, (ppl, bleu) in changes.items():
        results[key.replace("_", "-")] = dict(results[key.replace("_", "-")], ppl=ppl, bleu=bleu)
    return results


def test_verdicts_follow_the_noise_band_and_the_papers_direction():
    rows = table3.variants(TINY)
    by_id = {r.id: r for r in rows}
    results = results_for(rows, base_seed1=(20.4, 10.5), B_dk8=(22.0, 9.0), B_dk4=(19.0, 11.0),
                          C_d128=(19.0, 10.2), D_ls0=(19.0, 11.0), E_learned=(20.1, 10.1), A_h1=(25.0, 8.0),
                          A_h8=(18.0, 12.0))
    bands = table3.noise_bands(results)
    assert bands[0] == pytest.approx(0.5) and bands[1] == pytest.approx(0.02)

    def answer(name):
        return table3.verdict(by_id[name], rows, results, bands)[0]

    assert answer("B-dk8") == "yes"  # both worse beyond the noise
    assert answer("B-dk4") == "no"  # both better
    assert answer("C-d128") == "yes"  # ppl better, BLEU within the noise
    assert answer("C-ff512") == "unclear"  # nothing moved
    assert answer("D-ls0") == "unclear"  # ppl better as in the paper, BLEU better too
    assert answer("E-learned") == "yes"  # the same within the noise, as in the paper
    assert answer("A-h1") == "yes"  # worse than the best of the others (A-h8)
    assert answer("A-h8") == "no"  # the paper's 2× heads ties the best; here it beats the others
    assert table3.verdict(by_id["base"], rows, results, bands)[0] == "—"
    del results["base-seed1"]
    assert table3.noise_bands(results) == (table3.BLEU_FLOOR, table3.PPL_FLOOR, None)


def test_markdown_table_has_the_expected_columns():
    rows = table3.variants(TINY)
    results = results_for(rows)
    table = table3.markdown_table(rows, results, table3.noise_bands(results)).splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[:7] == ["variant", "what changed", "params", "dev ppl", "dev BLEU",
                          "paper's direction (paper's dev numbers)", "agrees?"]
    assert len(table) == 2 + len(rows)
    assert all(line.count("|") == len(header) + 1 for line in table)
    assert "| E-learned | learned positional embeddings | 1,000 | 20.00 | 10.00 |" in table[-1]


# ---------------------------------------------------------------------------- a smoke run
def test_smoke_run_trains_two_steps_and_writes_the_report(small_corpus, tmp_path, capsys):
    output = tmp_path / "table3.md"
    workdir = tmp_path / "runs"
    assert table3.main(["--smoke", "--variants", "B-dk2,E", "--workdir", str(workdir),
                        "--output", str(output)]) == 0
    text = output.read_text(encoding="utf-8")
    assert capsys.readouterr().out == text + "\n"  # the same report on stdout
    assert "python benchmarks/table3.py --smoke --variants B-dk2,E" in text
    assert "**Hardware:**" in text and "**Date:**" in text
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in lines[1:]] == ["base", "B-dk2", "E-learned"]
    assert workdir.is_dir() and not any(workdir.iterdir())  # the runs were removed


def test_workdir_inside_the_repository_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="inside the repository"):
        table3.main(["--smoke", "--workdir", str(ROOT / "runs" / "table3-test")])
    assert not (ROOT / "runs" / "table3-test").exists()


# ---------------------------------------------------------------------------- TrainConfig.model_overrides
def small_config(save_dir, **overrides):
    values = dict(data="synthetic", preset="tiny", vocab_size=40, max_tokens=128, max_steps=2, warmup_steps=2,
                  save_every=2, eval_every=2, log_every=1, bleu_samples=2, save_dir=str(save_dir), threads=1)
    values.update(overrides)
    return TrainConfig(**values)


def test_model_overrides_reach_the_model_and_round_trip_through_the_checkpoint(small_corpus, tmp_path):
    overrides = {"heads": 2, "num_layers": 1, "positional": "learned"}
    trainer = Trainer(small_config(tmp_path, model_overrides=overrides), **QUIET)
    trainer.run()
    assert trainer.model.config.heads == 2 and len(trainer.model.encoder.layers) == 1
    assert isinstance(trainer.model.positional, nn.LearnedPositionalEmbedding)
    path = checkpoint.checkpoint_path(tmp_path, 2)
    _, meta, _ = checkpoint.load_checkpoint(path)
    assert meta["config"]["model_overrides"] == overrides and meta["model_config"]["positional"] == "learned"
    model, _, _ = load_model(path)
    assert isinstance(model.positional, nn.LearnedPositionalEmbedding)
    np.testing.assert_array_equal(model.positional.weight.data, trainer.model.positional.weight.data)
    src, tgt = np.array([[5, 6, 7, 2]]), np.array([[1, 8, 9]])
    np.testing.assert_array_equal(model(src, tgt).data, trainer.model.eval()(src, tgt).data)
    # the resume path of the command line rebuilds the same config
    assert TrainConfig.from_dict(meta["config"]).model_overrides == overrides


def test_pytorchs_extras_reach_the_model_through_model_overrides_and_the_checkpoint(small_corpus, tmp_path):
    """nn.Transformer's extras (issue 28) as model_overrides; a checkpoint keeps them, and one written
    before final_norm and init existed resumes and loads as the model it holds."""
    overrides = {"attention_dropout": 0.1, "activation_dropout": 0.1, "final_norm": True, "init": "torch"}
    trainer = Trainer(small_config(tmp_path / "extras", model_overrides=overrides), **QUIET)
    trainer.run()
    assert trainer.model.encoder.final_norm is not None and trainer.model.decoder.final_norm is not None
    assert trainer.model.encoder.layers[0].self_attn.dropout == 0.1
    assert trainer.model.encoder.layers[0].feed_forward.dropout.p == 0.1
    model, _, meta = load_model(checkpoint.checkpoint_path(tmp_path / "extras", 2))
    assert {k: meta["model_config"][k] for k in overrides} == overrides
    assert model.config == trainer.model.config and model.decoder.final_norm is not None
    src, tgt = np.array([[5, 6, 7, 2]]), np.array([[1, 8, 9]])
    np.testing.assert_array_equal(model(src, tgt).data, trainer.model.eval()(src, tgt).data)

    older = tmp_path / "older"  # as written before the two fields existed
    Trainer(small_config(older), **QUIET).run()
    path = checkpoint.checkpoint_path(older, 2)
    state, meta, adam = checkpoint.load_checkpoint(path)
    meta = {k: v for k, v in meta.items() if k != "adam"}
    meta["model_config"] = {k: v for k, v in meta["model_config"].items() if k not in ("final_norm", "init")}
    checkpoint.save_checkpoint(path, state, meta, adam)
    model, _, _ = load_model(path)
    assert (model.config.final_norm, model.config.init, model.encoder.final_norm) == (None, "xavier", None)
    resumed = Trainer(small_config(older, max_steps=3), resume=True, **QUIET)
    resumed.run()  # not refused as another model
    assert resumed.step == 3


def test_configs_without_model_overrides_still_load():
    values = small_config("x").to_dict()
    del values["model_overrides"]  # a checkpoint written before the field existed
    config = TrainConfig.from_dict(values)
    assert config.model_overrides is None and config.resolved().model_overrides is None


def test_configs_written_before_paper_existed_build_the_papers_model():
    values = small_config("x").to_dict()
    assert TrainConfig.from_dict(values).paper is False
    del values["paper"]  # a checkpoint written when every preset was the paper's model
    assert TrainConfig.from_dict(values).paper is True


@pytest.mark.parametrize("overrides, message", [
    ({"d_modle": 32}, "unknown Transformer argument 'd_modle'"),
    ({"dropout": 0.0}, "TrainConfig.dropout"),
    ({"label_smoothing": 0.0}, "TrainConfig.label_smoothing"),
    ({"src_vocab_size": 9}, "TrainConfig.vocab_size"),
    ({"pad_id": 3}, "'pad_id' is set by the run"),
    ([("heads", 2)], "must be a dict"),
])
def test_bad_model_overrides_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        small_config("x", model_overrides=overrides).resolved()
