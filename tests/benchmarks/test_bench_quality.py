"""benchmarks/bench_quality.py (issue 28) on the synthetic task, in seconds: the batch list both engines
are given (identical, deterministic, the Trainer's order), the extras' switches, the report; where
PyTorch is installed, the weight round trip tinyformer -> PyTorch -> tinyformer and a few steps of
engine equality."""

import argparse
import dataclasses
import json
import math
import re
import warnings

import numpy as np
import pytest

import children
from scripts import ROOT, load_script
from tests.translation.train.test_trainer import cached_corpus  # noqa: F401 (an autouse fixture: each synthetic split generated once)
from tinyformer.model import nn
from tinyformer.translation.train import Trainer, build_parts
from tinyformer.translation.train.step_result import StepResult

bench = load_script("benchmarks/bench_quality.py")
QUIET = dict(echo=lambda *a, **k: None)
def bench_args(work, *extra):
    return bench.parse_args(["--data", "synthetic", "--preset", "tiny", "--vocab-size", "120", "--max-tokens", "1024",
                             "--steps", "4", "--work", str(work), *extra])


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-quality")


@pytest.fixture
def prepared(work):
    args = bench_args(work)
    bench.prepare_tokenizer(args)
    return args


# ---------------------------------------------------------------------------- the switches
def test_extras_are_parsed_and_become_model_overrides():
    assert bench.parse_extras("none") == () and bench.parse_extras("all") == bench.EXTRAS
    assert bench.parse_extras("torch-init, final-norm") == ("final-norm", "torch-init")  # in EXTRAS' order
    with pytest.raises(ValueError, match="unknown extra.*pre-ln"):
        bench.parse_extras("final-norm,pre-ln")
    assert bench.model_overrides((), 0.1) == {"attention_dropout": 0.0, "activation_dropout": 0.0,
                                              "final_norm": None, "init": "xavier"}
    assert bench.model_overrides(bench.EXTRAS, 0.3) == {"attention_dropout": 0.3, "activation_dropout": 0.3,
                                                        "final_norm": True, "init": "torch"}
    import torch_transformer  # on the path: bench_quality put benchmarks/ there

    assert bench.model_overrides(bench.EXTRAS, 0.1) == torch_transformer.stock_extras(0.1)


def test_tinyformer_defaults_to_the_presets_own_model_and_none_is_the_papers(work, monkeypatch):
    small = bench.parse_args(["--preset", "small", "--work", str(work)])
    assert small.tf_extras == bench.EXTRAS == bench.preset_extras("small")  # tinyformer train's small
    assert bench.run_config(small, "tinyformer").model_overrides == bench.model_overrides(bench.EXTRAS, 0.1)
    assert bench.parse_args(["--preset", "small", "--tf-extras", "none", "--work", str(work)]).tf_extras == ()
    assert bench.preset_extras("tiny") == bench.preset_extras("base") == ()
    from tinyformer.model.nn import presets

    monkeypatch.setattr(presets, "PRESETS", {**presets.PRESETS, "tiny": presets.PRESETS["tiny"].replace(
        attention_dropout=0.1, final_norm=True)})
    assert bench_args(work).tf_extras == ("attention-dropout", "final-norm")
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "huge", "--work", str(work)])


def test_defaults_compare_the_paper_with_stock_pytorch_and_equal_init_drops_all_dropout(work):
    args = bench_args(work)  # tiny is the paper's model
    assert (args.tf_extras, args.torch_extras, args.steps, args.warmup_steps) == ((), bench.EXTRAS, 4, 200)
    tf_config, torch_config = bench.run_config(args, "tinyformer"), bench.run_config(args, "torch")
    assert tf_config.dropout == torch_config.dropout == 0.1 and tf_config.label_smoothing == 0.1
    assert torch_config.model_overrides["final_norm"] is True and tf_config.model_overrides["init"] == "xavier"
    equal = bench_args(work, "--equal-init", "--tf-extras", "final-norm,attention-dropout")
    assert equal.torch_extras == equal.tf_extras == ("attention-dropout", "final-norm")
    config = bench.run_config(equal, "torch")
    assert config.dropout == 0.0 and config.model_overrides["attention_dropout"] == 0.0
    with pytest.raises(SystemExit):
        bench_args(work, "--equal-init", "--torch-extras", "all")


def test_the_report_shows_no_folder_of_this_machine():
    shown = bench.shown_command(["--work", "/somewhere/w", "--data-dir=/data", "--report", "/abs/q.md", "--steps", "9"])
    assert "/somewhere" not in shown and "/data" not in shown and "/abs" not in shown
    assert shown.endswith("--work WORK --data-dir DATA --report REPORT --steps 9")
    assert bench.shown_command(["--report", "benchmarks/results/quality.md"]).endswith("benchmarks/results/quality.md")


def test_the_report_names_the_commit_the_engines_read_not_one_that_landed_while_they_ran(monkeypatch):
    monkeypatch.setattr(bench.provenance, "git_commit", lambda: "bbbbbbb")
    both = {"tinyformer": {"commit": "aaaaaaa"}, "torch": {"commit": "aaaaaaa"}}
    assert bench.run_commit(both, list(both)) == "aaaaaaa at the start (HEAD bbbbbbb at the report)"
    assert bench.run_commit({"torch": {"commit": "bbbbbbb"}}, ["torch"]) == "bbbbbbb"
    assert bench.run_commit({"torch": {}}, ["torch"]) is None  # a result from before engines recorded it


# ---------------------------------------------------------------------------- the batch list
def test_both_engines_get_the_same_batches_in_the_trainers_order(prepared, monkeypatch):
    args = prepared
    tf_config, torch_config = bench.run_config(args, "tinyformer"), bench.run_config(args, "torch")
    parts = build_parts(tf_config, **QUIET)
    batches_per_epoch = len(parts.train_data.batches(tf_config.max_tokens, seed=tf_config.seed, epoch=0))
    steps = batches_per_epoch + 7  # into the second epoch
    plan = bench.batch_plan(parts.train_data, tf_config, steps)
    assert len(plan) == steps
    # deterministic, and the same for the other engine's config (its model overrides change no batch)
    torch_parts = build_parts(torch_config, **QUIET)
    assert torch_parts.model.config.final_norm is True
    again = bench.batch_plan(torch_parts.train_data, torch_config, steps)
    assert bench.plan_digest(again) == bench.plan_digest(plan)
    for a, b in zip(plan, again):
        for name in ("src", "tgt_in", "tgt_out"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert bench.plan_digest(plan[:-1]) != bench.plan_digest(plan)
    other_seed = bench.run_config(bench_args(args.work, "--seed", "1"), "tinyformer")
    assert bench.plan_digest(bench.batch_plan(parts.train_data, other_seed, steps)) != bench.plan_digest(plan)

    # what tinyformer train's loop takes, step by step, for the same config
    taken = []

    def record(self, batches):
        taken.extend(batches)
        self.position.advance(len(batches), sum(b.num_tokens for b in batches), applied=True)
        return StepResult(1.0, 1.0, sum(b.num_tokens for b in batches), 1.0, applied=True)

    monkeypatch.setattr(Trainer, "train_step", record)
    monkeypatch.setattr(Trainer, "_validate_now", lambda self: None)
    monkeypatch.setattr(Trainer, "save", lambda self: None)
    trainer = Trainer(dataclasses.replace(tf_config, max_steps=steps), parts=parts, progress=False, **QUIET)
    trainer.run()
    assert len(taken) == steps and trainer.epoch == 1
    assert bench.plan_digest(taken) == bench.plan_digest(plan)


def test_a_tinyformer_run_records_every_steps_loss_and_time(prepared):
    args = argparse.Namespace(**dict(vars(prepared), score=False))
    result = bench.run_engine(args, "tinyformer", log=lambda line: None)
    assert len(result["losses"]) == len(result["seconds"]) == 4 and all(map(math.isfinite, result["losses"]))
    assert result["model_config"]["final_norm"] is None and result["skipped_updates"] == 0
    assert result["plan_batches"] == 4 and len(result["plan_digest"]) == 64


def interrupted_then_resumed(args, engine, monkeypatch, target, method):
    """(uninterrupted result, result of a run stopped at step 3 and run again) of ``engine``,
    saving every 2 steps (6 steps: a state not restored shows in the losses after the stop); ``target`` and ``method`` are the training step that the stop hits."""
    fresh = argparse.Namespace(**dict(vars(args), score=False, save_every=0))
    whole = bench.run_engine(fresh, engine, log=lambda line: None)
    saving = argparse.Namespace(**dict(vars(args), score=False, save_every=2))
    original, calls = getattr(target, method), []

    def stopping(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(*a, **k)

    with monkeypatch.context() as patch:
        patch.setattr(target, method, stopping)
        with pytest.raises(KeyboardInterrupt):
            bench.run_engine(saving, engine, log=lambda line: None)
    lines = []
    resumed = bench.run_engine(saving, engine, log=lines.append)
    assert f"{engine}: resumed after step 2" in lines
    return whole, resumed


def test_an_interrupted_run_resumes_where_it_stopped_and_repeats_the_uninterrupted_one(work, monkeypatch):
    """--save-every: run again, an interrupted invocation continues from its last save, with the
    dropout generator and Adam's moments, and gives the uninterrupted run's losses exactly."""
    args = bench_args(work / "resume", "--dropout", "0.1", "--steps", "6")
    bench.prepare_tokenizer(args)
    whole, resumed = interrupted_then_resumed(args, "tinyformer", monkeypatch, Trainer, "train_step")
    assert resumed["losses"] == whole["losses"] and len(resumed["seconds"]) == 6
    assert len(set(whole["losses"])) == 6
    monkeypatch.setattr(bench, "plan_digest", lambda plan: "f" * 64)  # as if the batches had changed since
    with pytest.raises(SystemExit, match="was saved for another batch list"):
        bench.run_engine(argparse.Namespace(**dict(vars(args), score=False, save_every=2)), "tinyformer",
                         log=lambda line: None)


def test_the_control_engine_starts_one_ulp_away_and_is_compared_by_name(work):
    """--equal-init's control: "tinyformer-ulp" is tinyformer with its initial weights nudged one
    unit in the last place, so its first loss differs from tinyformer's by rounding only."""
    args = argparse.Namespace(**dict(vars(bench_args(work, "--equal-init", "--engines", "tinyformer,tinyformer-ulp",
                                                     "--steps", "2")), score=False))
    bench.prepare_tokenizer(args)
    assert args.engines == ("tinyformer", "tinyformer-ulp") and bench.run_config(args, "tinyformer-ulp").dropout == 0
    results = {e: bench.run_engine(args, e, log=lambda line: None) for e in args.engines}
    first = [results[e]["losses"][0] for e in args.engines]
    assert first[0] != first[1] and abs(first[0] - first[1]) < 1e-5 * first[0]
    text = bench.report(args, ["--equal-init"], results, 1.0)
    assert "| steps | tinyformer mean loss | tinyformer (init + 1 ulp) mean loss |" in text
    assert "Step time ratio tinyformer / tinyformer (init + 1 ulp)" in text


def test_the_script_end_to_end_with_one_engine(work):
    """The whole command (a child process per engine, the report) without PyTorch: tinyformer alone."""
    report = work / "report.md"
    result = children.run([children.PYTHON, str(ROOT / "benchmarks" / "bench_quality.py"), "--data", "synthetic",
                           "--preset", "tiny", "--vocab-size", "120", "--max-tokens", "512", "--steps", "3",
                           "--limit", "4", "--engines", "tinyformer", "--window", "2", "--work", str(work / "e2e"),
                           "--report", str(report)], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    text = report.read_text(encoding="utf-8")
    assert "## tinyformer alone, extras none: synthetic en-de, `tiny`, 3 steps, seed 0" in text
    assert "both training at the same time" not in text and "Side by side" not in text
    assert "--work WORK" in text and str(work) not in text and "commit " in text and "cores" in text
    assert "| tinyformer | none | " in text and "| 1-2 |" in text and "| 3-3 |" in text
    assert "| validation NLL | BLEU |" in text  # the held-out loss of the trained weights, beside BLEU
    result = json.loads(next((work / "e2e" / "results").glob("*-tinyformer.json")).read_text())
    assert 0 < result["valid_nll"] < 10 and 0 < result["valid_loss"] < 10
    assert "4 sentences" not in text  # one engine: no comparison lines
    assert (work / "e2e" / "results").is_dir()
    again = children.run([children.PYTHON, str(ROOT / "benchmarks" / "bench_quality.py"), "--data", "synthetic",
                          "--preset", "tiny", "--vocab-size", "120", "--max-tokens", "512", "--steps", "3",
                          "--limit", "4", "--engines", "tinyformer", "--window", "2", "--work", str(work / "e2e"),
                          "--report", str(report), "--skip-done"], timeout=300)
    assert again.returncode == 0 and "bench_quality: done already" in again.stdout, again.stdout + again.stderr
    assert report.read_text(encoding="utf-8") == text  # nothing trained, nothing appended
    summary = children.run([children.PYTHON, str(ROOT / "benchmarks" / "quality_summary.py"), str(work / "e2e"),
                            "--data", "synthetic", "--preset", "tiny", "--bootstrap"], timeout=120)
    assert summary.returncode == 0, summary.stdout + summary.stderr
    assert summary.stdout.splitlines()[2].startswith("| tinyformer | none | ")
    assert "(--bootstrap: no run has stock PyTorch's of its seed and steps beside it" in summary.stdout


def fake_result(folder, engine, extras, seed, bleu, steps=4, valid_nll=None, hypotheses=("ein Hund",) * 3):
    """A result file as bench_quality.py writes it; ``hypotheses=None`` leaves them out, as a kept record."""
    result = {"engine": engine, "extras": extras, "equal_init": False, "model_config": {"seed": seed},
              "losses": [5.0] * (steps - 1) + [float(seed + 1)], "seconds": [1.0 + seed] * steps, "bleu": bleu}
    if hypotheses is not None:
        result["hypotheses"] = list(hypotheses)
    if valid_nll is not None:
        result["valid_nll"] = valid_nll
    name = f"multi30k-small-s{seed}-n{steps}-{engine}-{'+'.join(extras) or 'none'}.json"
    (folder / name).write_text(json.dumps(result), encoding="utf-8")


STOCK = ["attention-dropout", "activation-dropout", "final-norm", "torch-init"]


def test_the_summary_compares_each_configuration_with_pytorch_on_the_same_seeds(tmp_path):
    summary = load_script("benchmarks/quality_summary.py")
    results = tmp_path / "results"
    results.mkdir()
    for seed, bleu in ((0, 30.0), (1, 32.0), (2, 40.0)):
        fake_result(results, "torch", STOCK, seed, bleu)
    for seed, bleu in ((0, 29.0), (1, 30.0)):
        fake_result(results, "tinyformer", [], seed, bleu, valid_nll=2.0 + seed)
    fake_result(results, "tinyformer", ["torch-init"], 1, 33.5, valid_nll=1.5)
    fake_result(results, "tinyformer", ["torch-init"], 2, 34.5)  # measured before the validation NLL
    fake_result(results, "tinyformer", ["torch-init"], 0, 99.0, steps=3)  # another step count: left out
    lines = summary.summary(summary.load_runs(tmp_path, steps=4)).splitlines()
    assert lines[0].startswith("| engine | extras | seed 0 | seed 1 | seed 2 | mean BLEU | vs PyTorch, same seeds | "
                               "validation NLL (mean) |")
    assert lines[2] == "| PyTorch | activation-dropout,attention-dropout,final-norm,torch-init | 30.00 | 32.00 | 40.00 | " \
                       "**34.00** |  |  | 4.2500 | 2.000 |"
    assert lines[3].startswith("| tinyformer | none | 29.00 | 30.00 |  | **29.50** | -1.50 (2 seeds) | 2.5000 | ")
    assert lines[4].startswith("| tinyformer | torch-init |  | 33.50 | 34.50 | **34.00** | -2.00 (2 seeds) | "
                               "1.5000 (1 of 2 seeds) | ")
    assert len(lines) == 5
    with pytest.raises(SystemExit):
        summary.main([str(tmp_path), "--steps", "7"])  # no run of 7 steps: refused, not an empty table


def test_the_summary_reads_several_folders_keeps_records_and_reads_them_back(tmp_path, capsys):
    """--keep writes each run without its hypotheses; a folder of kept records reads like a work
    folder; a run in a later folder replaces the same run of an earlier one; a record made from a
    report (no per-step values) gives its own last-100 loss and median step."""
    summary = load_script("benchmarks/quality_summary.py")
    first, second, kept = tmp_path / "a", tmp_path / "b", tmp_path / "kept"
    (first / "results").mkdir(parents=True)
    second.mkdir()
    fake_result(first / "results", "torch", STOCK, 0, 30.0)
    fake_result(first / "results", "tinyformer", [], 0, 28.0)
    fake_result(second, "tinyformer", [], 0, 28.5)  # the same run again: this one counts
    from_report = {"engine": "tinyformer", "extras": ["torch-init"], "equal_init": False, "model_config": {"seed": 0},
                   "steps": 4, "bleu": 31.0, "loss_last_100": 3.25, "median_step_s": 4.5,
                   "from_report": "results/quality.md, a section"}
    (second / "multi30k-small-s0-n4-report.json").write_text(json.dumps(from_report))
    assert summary.main([str(first), str(second), "--steps", "4", "--keep", str(kept)]) == 0
    table = capsys.readouterr().out
    assert "| tinyformer | none | 28.50 | **28.50** | -1.50 (1 seed) |" in table
    assert "| tinyformer | torch-init | 31.00 | **31.00** | +1.00 (1 seed) |  | 3.2500 | 4.500 |" in table
    records = sorted(kept.glob("*.json"))
    assert len(records) == 3 and all("hypotheses" not in r.read_text() for r in records)
    assert summary.summary(summary.load_runs(kept, steps=4)) == table
    with pytest.raises(SystemExit):
        summary.main([str(tmp_path / "missing")])  # a folder that is not there: one line, not a traceback


# ---------------------------------------------------------------------------- with PyTorch
CONFIGS = {"paper": {}, "stock": {"final_norm": True, "init": "torch", "attention_dropout": 0.1,
                                  "activation_dropout": 0.1}}


@pytest.mark.parametrize("extras", sorted(CONFIGS))
def test_weights_round_trip_tinyformer_torch_tinyformer_exactly(extras):
    torch = pytest.importorskip("torch")
    import torch_transformer

    tiny = nn.Transformer.from_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, num_layers=2, seed=4,
                                      **CONFIGS[extras])
    torch.manual_seed(0)
    model = torch_transformer.build_torch_model(tiny.config)
    assert sum(p.numel() for p in model.parameters()) == tiny.num_parameters()
    torch_transformer.copy_weights(tiny, model)
    other = nn.Transformer.from_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, num_layers=2, seed=5,
                                       **CONFIGS[extras])
    torch_transformer.copy_weights_back(model, other)
    for (name, p), (_, q) in zip(tiny.named_parameters(), other.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    # the same function: logits of both engines in eval mode
    src = np.array([[5, 6, 7, 2, 0], [8, 9, 2, 0, 0]])
    tgt = np.array([[1, 10, 11, 12], [1, 13, 0, 0]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the encoder's fast path: nested tensors are a prototype
        theirs = model.eval()(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    ours = tiny.eval()(src, tgt).data
    np.testing.assert_allclose(theirs[0], ours[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(theirs[1, :2], ours[1, :2], rtol=1e-4, atol=1e-5)  # the rows' real positions


def test_torch_side_initialisations():
    """PyTorch's stock init keeps its packed in_proj bound and nn.Linear biases; "xavier" redraws
    tinyformer's scheme with PyTorch's generator."""
    torch = pytest.importorskip("torch")
    import torch_transformer

    config = nn.PRESETS["tiny"].replace(src_vocab_size=50).to_dict()
    d = config["d_model"]
    torch.manual_seed(0)
    stock = torch_transformer.build_torch_model(dict(config, init="torch", final_norm=True))
    torch.manual_seed(0)
    paper = torch_transformer.build_torch_model(config)
    assert stock.transformer.encoder.norm is not None and paper.transformer.encoder.norm is None
    for model, bound in ((stock, math.sqrt(6 / (4 * d))), (paper, math.sqrt(6 / (2 * d)))):
        attention = model.transformer.encoder.layers[0].self_attn
        weight = attention.in_proj_weight.detach().numpy()
        for third in np.split(weight, 3):
            assert np.abs(third).max() <= bound and np.abs(third).max() > 0.95 * bound
        assert not attention.in_proj_bias.detach().numpy().any()
    assert stock.transformer.encoder.layers[0].linear1.bias.detach().abs().max() > 0  # nn.Linear's default
    assert not paper.transformer.encoder.layers[0].linear1.bias.detach().numpy().any()


def test_engine_equality_over_a_few_steps(prepared):
    """--equal-init: PyTorch from tinyformer's initial weights, no dropout, the same batches: the same
    loss at every step, to float32 rounding."""
    pytest.importorskip("torch")
    args = bench_args(prepared.work, "--equal-init", "--no-score", "--tf-extras", "final-norm,torch-init")
    results = {e: bench.run_engine(args, e, log=lambda line: None) for e in ("tinyformer", "torch")}
    tf, pt = results["tinyformer"], results["torch"]
    assert tf["plan_digest"] == pt["plan_digest"] and tf["params"] == pt["torch_params"]
    assert bench.relative_differences(tf["losses"], pt["losses"]).max() < 1e-5
    report = bench.report(args, ["--equal-init"], results, 1.0)
    assert "## Engine equality (--equal-init)" in report and "identical on both sides" in report
    assert "largest relative difference" in report


def test_an_interrupted_torch_run_resumes_where_it_stopped(work, monkeypatch):
    torch = pytest.importorskip("torch")
    args = bench_args(work / "resume-torch", "--dropout", "0.1", "--engines", "torch", "--steps", "6")
    bench.prepare_tokenizer(args)
    whole, resumed = interrupted_then_resumed(args, "torch", monkeypatch, torch.optim.Adam, "step")
    assert resumed["losses"] == whole["losses"] and len(set(whole["losses"])) == 6


def test_label_smoothing_spreads_over_the_whole_vocabulary_padding_included_as_pytorchs():
    """The issue names it as a difference; it is none: tinyformer's smoothed loss (ε/V on every class,
    the padding id's included, padded positions ignored) is F.cross_entropy's, value and gradient."""
    torch = pytest.importorskip("torch")
    import tinyformer as tf
    from tinyformer.engine import functional as F
    from tinyformer.translation.data import PAD_ID

    rng = np.random.default_rng(3)
    logits = rng.standard_normal((3, 5, 7))
    target = rng.integers(1, 7, size=(3, 5))
    target[0, 3:] = target[2, 1:] = PAD_ID
    ours = tf.Tensor(logits.copy(), requires_grad=True)
    loss = F.cross_entropy(ours, target, label_smoothing=0.1, ignore_index=PAD_ID, reduction="sum")
    upstream = rng.standard_normal()
    (loss * upstream).backward()
    theirs = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(theirs.reshape(-1, 7), torch.from_numpy(target).reshape(-1),
                                                 ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum")
    (expected * upstream).backward()
    np.testing.assert_allclose(float(loss.data), expected.item(), rtol=1e-12)
    np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert not ours.grad[target == PAD_ID].any() and ours.grad[target != PAD_ID].all()  # padded positions ignored


def _recording_dropout_masks(monkeypatch):
    """Every dropout mask tinyformer draws, as (p, boolean keep mask), in the order it draws them."""
    import importlib

    masks = []
    dropout_module = importlib.import_module("tinyformer.engine.functional.dropout")
    dropped, keep_mask = dropout_module._dropped, dropout_module._keep_mask_on_cpu

    def recorded_dropped(x, p, generator, **kwargs):
        y, keep = dropped(x, p, generator, **kwargs)
        masks.append((p, keep.copy()))
        return y, keep

    def recorded_keep_mask(shape, p, generator):
        keep = keep_mask(shape, p, generator)
        masks.append((p, keep.copy()))
        return keep

    for name in ("dropout", "attention", "residual", "linear", "embedding"):  # embedding: F.embedding_input's
        module = importlib.import_module(f"tinyformer.engine.functional.{name}")
        if hasattr(module, "_dropped"):
            monkeypatch.setattr(module, "_dropped", recorded_dropped)
        if hasattr(module, "_keep_mask_on_cpu"):
            monkeypatch.setattr(module, "_keep_mask_on_cpu", recorded_keep_mask)
    return masks


def _pytorch_dropping_these_masks(monkeypatch, torch, masks):
    """PyTorch's F.dropout and its attention's probability dropout made to drop ``masks`` in turn
    (each site checks that the mask has its shape and its p); returns the iterator, to check all were used."""
    functional = torch.nn.functional
    sdpa = functional.scaled_dot_product_attention
    remaining = iter(masks)

    def next_mask(p, shape):
        q, keep = next(remaining)
        assert (q, keep.shape) == (p, tuple(shape)), \
            f"PyTorch drops p {p} of {tuple(shape)}, tinyformer p {q} of {keep.shape}"
        return torch.from_numpy(keep)

    def dropout(x, p=0.5, training=True, inplace=False):
        return x * next_mask(p, x.shape) / (1 - p) if training and p else x

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **rest):
        if not dropout_p:
            return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **rest)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if is_causal:
            scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask
        probabilities = torch.softmax(scores, -1)
        return probabilities * next_mask(dropout_p, probabilities.shape) / (1 - dropout_p) @ v

    monkeypatch.setattr(functional, "dropout", dropout)
    monkeypatch.setattr(functional, "scaled_dot_product_attention", attention)
    return remaining


@pytest.mark.parametrize("final_norm", [True, False])
def test_with_the_same_dropout_masks_both_engines_give_the_same_loss_and_gradients(monkeypatch, final_norm):
    """Training mode with every dropout on (embedding sums, attention probabilities, feed-forward
    activations, sub-layer outputs; three different p): the masks tinyformer draws, given to PyTorch at
    the same sites, give the same loss and the same gradient of every parameter, in float64. Engine
    equality (dropout off) cannot see a dropout that is missing, misplaced or scaled wrongly; this can."""
    torch = pytest.importorskip("torch")
    import torch_transformer

    from tinyformer.engine import functional as F

    tiny = nn.Transformer.from_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, num_layers=2, seed=4,
                                      dropout=0.1, attention_dropout=0.2, activation_dropout=0.3,
                                      final_norm=final_norm, init="torch").double()
    model = torch_transformer.build_torch_model(tiny.config).double()
    torch_transformer.copy_weights(tiny, model)
    src = np.array([[5, 6, 7, 2, 0, 0], [8, 9, 2, 0, 0, 0], [3, 4, 5, 6, 7, 2]])
    tgt = np.array([[1, 10, 11, 12, 2, 0], [1, 13, 0, 0, 0, 0], [1, 14, 15, 16, 17, 2]])
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    upstream = np.random.default_rng(5).standard_normal()

    with monkeypatch.context() as patch:
        masks = _recording_dropout_masks(patch)
        ours = F.cross_entropy(tiny.train()(src, tgt_in), tgt_out, 0.1, ignore_index=0, reduction="sum")
        (ours * upstream).backward()
    assert len(masks) == 22  # 2 embeddings; per encoder layer 4, per decoder layer 6
    assert sorted({p for p, _ in masks}) == [0.1, 0.2, 0.3]
    # PyTorch embeds the target before it runs the encoder: tinyformer's mask after the encoder's is its 2nd
    target_embedding = 1 + 4 * tiny.config.num_layers
    in_pytorchs_order = [masks[0], masks[target_embedding], *masks[1:target_embedding], *masks[target_embedding + 1:]]
    with monkeypatch.context() as patch:
        remaining = _pytorch_dropping_these_masks(patch, torch, in_pytorchs_order)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            logits = model.train()(torch.from_numpy(src), torch.from_numpy(tgt_in))
        theirs = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), torch.from_numpy(tgt_out).reshape(-1),
                                                   ignore_index=0, label_smoothing=0.1, reduction="sum")
        (theirs * upstream).backward()
        assert next(remaining, None) is None, "PyTorch drew fewer masks than tinyformer"
    np.testing.assert_allclose(float(ours.data), theirs.item(), rtol=1e-12)
    for sources, target in torch_transformer.weight_pairs(tiny, model):
        np.testing.assert_allclose(np.concatenate([s.grad for s in sources]), target.grad.numpy(),
                                   rtol=1e-9, atol=1e-12)


def test_the_summary_bootstraps_each_run_against_pytorch_on_its_seed(tmp_path):
    """--bootstrap: sacreBLEU's paired bootstrap of each run against stock PyTorch's of the same seed and
    steps; a run that translates every sentence as PyTorch does differs by 0 and has no p, one that loses
    a quarter of them differs with a small p; a run without PyTorch's seed beside it, without
    hypotheses (a kept record) or with fewer than the references (--limit) has no row."""
    summary = load_script("benchmarks/quality_summary.py")
    references = summary.reference_lines("synthetic", "en", "de")
    assert len(references) >= 100
    results = tmp_path / "results"
    results.mkdir()

    def write(engine, extras, seed, hypotheses):
        fake_result(results, engine, extras, seed, 0.0, hypotheses=hypotheses)

    worse = [("" if i % 4 == 0 else line) for i, line in enumerate(references)]
    write("torch", STOCK, 0, list(references))
    write("tinyformer", ["torch-init"], 0, list(references))
    write("tinyformer", [], 0, worse)
    write("tinyformer", [], 1, worse)  # no PyTorch run of seed 1
    write("tinyformer", ["final-norm"], 0, worse[:10])  # not one hypothesis per reference (--limit)
    write("tinyformer", ["attention-dropout"], 0, None)  # a kept record
    table = summary.bootstrap(summary.load_runs(tmp_path, steps=4), references, samples=200).splitlines()
    assert table[0] == "| engine | extras | seed | steps | BLEU | stock PyTorch | difference | p (paired bootstrap) |"
    rows = {line.split(" | ")[1]: line.split(" | ") for line in table[2:]}
    assert sorted(rows) == ["none", "torch-init"]
    assert rows["torch-init"][4:8] == ["100.00", "100.00", "+0.00", "— |"]
    assert float(rows["none"][6]) < -10 and float(rows["none"][7][:-2]) < 0.01


# ---------------------------------------------------------------------------- the recipe comparison (issue 49)
def test_the_linear_schedule_is_the_time_budget_schedule_counted_in_steps(work):
    from tinyformer.model.optim import NoamSchedule, TimeBudgetSchedule

    peak = 2.0 * 64 ** -0.5 * 4 ** -0.5
    assert bench.linear_lr(4, 10, 64, 4, 2.0) == pytest.approx(peak * 0.6)  # top of the warm-up, decaying already
    assert bench.linear_lr(2, 10, 64, 4, 2.0) == pytest.approx(peak * 0.5 * 0.8)
    assert bench.linear_lr(10, 10, 64, 4, 2.0) == 0.0
    assert bench.linear_lr(4, 10, 64, 4, 2.0, decay_fraction=0.5) == pytest.approx(peak)  # the plateau
    assert bench.linear_lr(8, 10, 64, 4, 2.0, decay_fraction=0.5) == pytest.approx(peak * 0.4)
    twin = TimeBudgetSchedule(64, 4, 2.0, decay_fraction=0.3)
    for step in range(1, 11):
        twin.elapsed_fraction = step / 10
        assert bench.linear_lr(step, 10, 64, 4, 2.0, 0.3) == pytest.approx(twin(step), rel=1e-12)
    args = bench_args(work, "--schedule", "linear", "--warmup-steps", "3", "--lr-factor", "2",
                      "--decay-fraction", "0.5")
    schedule = bench.lr_schedule(args, 64)
    assert [schedule(s) for s in (1, 2, 3, 4)] == [bench.linear_lr(s, 4, 64, 3, 2.0, 0.5) for s in (1, 2, 3, 4)]
    noam = bench.lr_schedule(bench_args(work), 64)  # the default: today's Noam schedule
    assert [noam(s) for s in (1, 50, 400)] == [NoamSchedule(64, 200, 1.0)(s) for s in (1, 50, 400)]
    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit):
            bench_args(work, "--decay-fraction", bad)
    with pytest.raises(SystemExit):  # Noam's schedule has no linear decay to shape
        bench_args(work, "--decay-fraction", "0.5")
    assert bench.run_label(args) != bench.run_label(bench_args(work))  # results of the two recipes kept apart


def test_a_recipe_sweeps_points_are_kept_apart_and_the_defaults_keep_earlier_names(work):
    """recipe_sweep.sh varies the dropout and the batch size over one --work: each point its own
    result (--skip-done must not take one point's result for another's)."""
    plain = bench.run_label(bench.parse_args(["--data", "synthetic", "--steps", "4", "--work", str(work)]))
    assert not re.search(r"-drop[0-9]|-tok[0-9]|-noam_", plain)  # defaults: the names of runs made before the sweep
    labels = {bench.run_label(bench_args(work, *extra))
              for extra in ((), ("--dropout", "0.2"), ("--dropout", "0.3"), ("--max-tokens", "2048"),
                            ("--warmup-steps", "400"), ("--lr-factor", "2"))}
    assert len(labels) == 6


def test_the_time_to_a_validation_nll_is_interpolated_between_the_validations_around_the_crossing():
    curve = [(0, 0.0, 5.0), (10, 20.0, 4.0), (20, 40.0, 3.0), (30, 60.0, 2.5)]
    assert bench.time_to_nll(curve, 3.5) == pytest.approx((30.0, 15.0))  # halfway from 4.0 to 3.0
    assert bench.time_to_nll(curve, 3.0) == pytest.approx((40.0, 20.0))  # reached exactly at a validation
    assert bench.time_to_nll(curve, 2.6) == pytest.approx((56.0, 28.0))
    assert bench.time_to_nll(curve, 6.0) == (0.0, 0.0)  # there already at the first validation
    assert bench.time_to_nll(curve, 2.0) is None  # never reached
    assert bench.time_to_nll([(0, 0.0, 5.0), (10, 20.0, 5.0), (20, 30.0, 3.0)], 4.0) == pytest.approx((25.0, 15.0))
    results = {"tinyformer": {"validations": curve, "val_digest": "a" * 64, "val_tokens": 1000},
               "torch": {"validations": [(0, 0.0, 5.0), (10, 10.0, 3.0), (20, 20.0, 2.6)], "val_digest": "a" * 64,
                         "val_tokens": 1000}}
    text = "\n".join(bench.validation_section(results, ["tinyformer", "torch"]))
    assert "| 10 | 4.0000 | 20.00 | 3.0000 | 10.00 |" in text and "identical on both sides" in text
    assert "target 2.6000" in text  # the larger (worse) final NLL: PyTorch's
    assert "| tinyformer | 56.00 | 28.0 |" in text and "| PyTorch | 20.00 | 20.0 |" in text
    assert "tinyformer / PyTorch: **2.80x** (NOT ≤ 0.7" in text
    results["torch"]["validations"] = [(0, 0.0, 5.0), (10, 100.0, 3.0), (20, 200.0, 2.5)]
    text = "\n".join(bench.validation_section(results, ["tinyformer", "torch"]))
    assert "tinyformer / PyTorch: **0.30x** (≤ 0.7" in text
    results["tinyformer"]["validations"] = curve[:2] + [(20, 40.0, 1.0)]  # reaches the target between validations
    results["torch"]["validations"] = [(0, 0.0, 5.0), (10, 10.0, 3.0), (20, 20.0, 4.5)]  # worse at the end than ever
    text = "\n".join(bench.validation_section(results, ["tinyformer", "torch"]))
    assert "target 4.5000" in text and "| PyTorch | 2.50 | 2.5 |" in text and "| tinyformer | 10.00 | 5.0 |" in text
    # the target is one of the final NLLs, so both engines reach it in the section; one there before any
    # training (at 0 s) gives no ratio rather than a division by zero
    results["torch"]["validations"] = [(0, 0.0, 5.0)]
    results["tinyformer"]["validations"] = [(0, 0.0, 5.5), (10, 10.0, 5.2)]
    text = "\n".join(bench.validation_section(results, ["tinyformer", "torch"]))
    assert "| tinyformer | 10.00 | 10.0 |" in text and "| PyTorch | 0.00 | 0.0 |" in text
    assert "validation NLL 5.2000: no ratio (PyTorch was there before its first step)" in text


def test_both_engines_use_the_same_learning_rate_and_validate_on_the_same_batches(work):
    """--schedule linear --val-every: the children's lr at every step is ``linear_lr``'s, the same on
    both sides; each records (step, training seconds, NLL) before the first step, every N and at the last."""
    args = bench_args(work / "recipe", "--schedule", "linear", "--warmup-steps", "2", "--lr-factor", "2",
                      "--decay-fraction", "0.5", "--val-every", "2", "--steps", "5", "--no-score")
    bench.prepare_tokenizer(args)
    tf = bench.run_engine(args, "tinyformer", log=lambda line: None)
    d_model = tf["model_config"]["d_model"]
    expected = [bench.linear_lr(s, 5, d_model, 2, 2.0, 0.5) for s in range(1, 6)]
    assert tf["lrs"] == expected and tf["lrs"][-1] == 0.0 and tf["schedule"] == "linear"
    assert [v[0] for v in tf["validations"]] == [0, 2, 4, 5]
    assert [v[1] for v in tf["validations"]] == pytest.approx([0.0, *(sum(tf["seconds"][:n]) for n in (2, 4, 5))])
    assert all(0 < v[2] < 20 for v in tf["validations"])  # (lr this high over 5 steps: no claim it falls)
    config = bench.run_config(args, "tinyformer")
    parts = build_parts(config, **QUIET)  # the initial weights: the step-0 validation is validation_loss's NLL
    from tinyformer.translation.train.evaluation import validation_loss

    assert tf["validations"][0][2] == pytest.approx(validation_loss(parts.model, parts.val_data, config.max_tokens,
                                                                    0.0)[1], rel=1e-6)
    pytest.importorskip("torch")
    pt = bench.run_engine(args, "torch", log=lambda line: None)
    assert pt["lrs"] == tf["lrs"]
    assert pt["val_digest"] == tf["val_digest"] and pt["val_tokens"] == tf["val_tokens"] > 0
    assert [v[0] for v in pt["validations"]] == [0, 2, 4, 5] and all(0 < v[2] < 20 for v in pt["validations"])
    noam = bench_args(work / "recipe", "--no-score", "--steps", "3", "--warmup-steps", "2")
    from tinyformer.model.optim import NoamSchedule

    results = {e: bench.run_engine(noam, e, log=lambda line: None) for e in ("tinyformer", "torch")}
    assert results["tinyformer"]["lrs"] == results["torch"]["lrs"] == [NoamSchedule(d_model, 2)(s) for s in (1, 2, 3)]
    assert "validations" in results["torch"] and results["torch"]["validations"] == []  # --val-every 0: none


def test_a_smoke_run_of_the_recipe_comparison_writes_the_nll_table(work):
    pytest.importorskip("torch")
    report = work / "recipe.md"
    result = children.run([children.PYTHON, str(ROOT / "benchmarks" / "bench_quality.py"), "--data", "synthetic",
                           "--preset", "tiny", "--vocab-size", "120", "--max-tokens", "512", "--steps", "10",
                           "--schedule", "linear", "--warmup-steps", "3", "--lr-factor", "2", "--val-every", "5",
                           "--no-score", "--save-every", "0", "--work", str(work / "recipe-e2e"),
                           "--report", str(report)], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    text = report.read_text(encoding="utf-8")
    assert "Linear schedule (warm-up 3 steps to the Noam peak of factor 2, then linear decay to 0 at step 10" in text
    assert "Learning rate: the same at each of the 10 steps on both sides" in text
    assert "### Validation NLL by step" in text
    assert ("| step | tinyformer validation NLL | tinyformer training s | PyTorch validation NLL "
            "| PyTorch training s |") in text
    for step in (0, 5, 10):
        assert f"\n| {step} | " in text
    assert "the same tokenizer (batch list sha256 " in text and text.count("identical on both sides") == 2
    assert "Wall time to the same validation NLL: target " in text and "tinyformer / PyTorch: **" in text
    assert "validation excluded), one thread per engine, both training at the same time." in text
