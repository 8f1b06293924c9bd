"""The command line and the runnable scripts: they must keep working, not just import."""

import struct
import sys
from pathlib import Path

import children
import pytest
import step_benchmark
from scripts import load_script

from tinyformer.engine import backend, functional as F
from tinyformer import cli
from tinyformer.testing import gradcheck_suite
from tinyformer.model import nn


def test_info_prints_versions_and_gpu_availability(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "tinyformer" in out and "GPU available" in out and "CUDA kernels: on" in out


def test_info_names_each_ops_path_on_a_t4_and_an_h100(capsys):
    assert cli.main(["info", "--capability", "sm_75"]) == 0
    out = capsys.readouterr().out
    assert "kernel paths on sm_75 (asked with --capability)" in out
    assert "attention fp16: CUDA cores (attention.cu): float16 on sm_75" in out
    assert "attention bf16: refused" in out and "bf16 refused: precision bf16 needs compute capability 8.0" in out
    assert "softmax: fp32 CUDA cores, fp16 CUDA cores, bf16 refused (softmax.cu)" in out
    assert cli.main(["info", "--capability", "9.0"]) == 0
    out = capsys.readouterr().out
    assert "attention bf16: tensor cores (attention_mma.cu)" in out and "refused" not in out
    assert cli.main(["info", "--capability", "turing"]) == 2
    assert capsys.readouterr().err.strip() == ("tinyformer info: error: --capability must look like sm_75 (or 7.5), "
                                               "got 'turing'")


def test_info_on_a_faked_gpu_names_it_its_capability_memory_and_versions(monkeypatch, capsys):
    facts = {"cupy": "13.6.0", "cuda_runtime": "12.8", "cuda_driver": "12.4", "name": "Tesla T4",
             "capability": "sm_75", "memory_total": 15 * 2 ** 30, "memory_free": 14.5 * 2 ** 30}
    monkeypatch.setattr(backend, "device_facts", lambda: facts)
    monkeypatch.setattr(backend, "compute_capability", lambda capped=True: "sm_75")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "CuPy 13.6.0, CUDA runtime 12.8, driver 12.4" in out
    assert "device: Tesla T4, compute capability 7.5 (sm_75), memory 15.0 GiB (14.5 GiB free)" in out
    assert "kernel paths on sm_75, per precision" in out and "attention fp16: CUDA cores" in out
    monkeypatch.setattr(backend, "compute_capability", lambda capped=True: "sm_70" if capped else "sm_75")
    assert cli.main(["info"]) == 0
    assert "(sm_75) (capped to sm_70 by $TINYFORMER_MAX_CAPABILITY)" in capsys.readouterr().out


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        cli.main(["fly"])
    assert info.value.code == 2


def run_script(*args):
    result = children.run([children.PYTHON, *args], timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_attention_example_gradchecks_and_learns():
    out = run_script("examples/attention_from_scratch.py", "--steps", "200")
    assert "gradcheck passed" in out
    final = [line for line in out.splitlines() if "step  200" in line][0]
    accuracy = int(final.rsplit(" ", 1)[1].rstrip("%"))
    assert accuracy >= 90, final


def test_engine_benchmark_runs():
    out = run_script("benchmarks/bench_engine.py", "--ops", "200", "--repeats", "1")
    assert "tinyformer: forward" in out and "us/op" in out


@pytest.fixture(scope="module")
def step_report(tmp_path_factory):
    """bench_step.py's report on `tiny` (step_benchmark.ARGS), one run shared with benchmarks/test_bench_step.py."""
    return step_benchmark.tiny_step_report(tmp_path_factory)


def test_step_benchmark_runs(step_report, capsys):
    assert f"{step_benchmark.TOKENS} target tokens" in step_report
    assert "command:" in step_report and "versions:" in step_report
    header, row = step_benchmark.markdown_table(step_report)
    for field in ("params", "batch", "tgt tokens", "median ms", "min ms", "tokens/s", "traced MB"):
        assert field in header, header
    assert not any("torch" in field for field in header)
    assert row[0] == "tiny"
    # the plain-text table (without --markdown) of the same figures: a header line, then the row
    load_script("benchmarks/bench_step.py").print_table(header, [row], markdown=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("preset") and all(field in lines[0] for field in header), lines
    assert set(lines[1]) == {"-", " "} and lines[2].startswith("tiny "), lines


def test_step_benchmark_markdown_table_holds_positive_figures(step_report):
    values = dict(zip(*step_benchmark.markdown_table(step_report)))
    assert values["preset"] == "tiny" and values["tgt tokens"] == str(step_benchmark.TOKENS)
    for field in ("median ms", "tokens/s", "traced MB"):
        assert float(values[field].replace(",", "")) > 0, values


def test_reverse_task_example_trains_and_decodes():
    out = run_script("examples/transformer_reverse_task.py", "--steps", "250")
    accuracy = float(out.rsplit("cached decoding):", 1)[1].strip().rstrip("%"))
    assert accuracy >= 30.0, out  # 50.0 % from seed 0; 47.5-66.5 % over seeds 0-9; 0.0 % after 1 step


# ---------------------------------------------------------------- train / translate / eval / average
@pytest.mark.parametrize("command", ["info", "train", "translate", "eval", "average", "gradcheck", "plot", "study"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    assert f"usage: tinyformer {command}" in capsys.readouterr().out


def test_translate_help_tells_both_length_normalizations_and_their_alpha(capsys):
    with pytest.raises(SystemExit):
        cli.main(["translate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--length-normalization {gnmt,hf}" in text
    assert "(default 0.6)" in text and "--length-normalization hf transformers' length_penalty" in text
    assert "(default 1.0)" in text


@pytest.mark.parametrize("argv, message", [
    (["train", "--max-steps", "many"], "invalid int value"),
    (["train", "--preset", "huge", "--save-dir", "unused"], "unknown preset"),
    (["train", "--data", "wmt", "--save-dir", "unused"], "data must be one of"),
    (["translate"], "--checkpoint"),
    (["eval"], "--checkpoint"),
    (["average", "--output", "x.npz"], "give checkpoint files or --dir"),
    (["translate", "--checkpoint", "x", "--length-normalization", "fairseq"], "invalid choice: 'fairseq'"),
    (["translate", "--checkpoint", "x", "--alpha", "-1"],
     "--alpha -1: GNMT's α must be a number in [0, 10] (negative ones: --length-normalization hf)"),
    (["translate", "--checkpoint", "x", "--alpha", "nan", "--length-normalization", "hf"], "argument --alpha"),
    (["translate", "--checkpoint", "x", "--length-normalization", "hf", "--plot-attention", "maps"],
     "--plot-attention decodes with --length-normalization gnmt only"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_runtime_errors_exit_1_with_one_line(tmp_path, capsys):
    code = cli.main(["translate", "--checkpoint", str(tmp_path / "missing.npz")])
    err = capsys.readouterr().err
    assert code == 1 and "missing.npz" in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A short synthetic run through the CLI (a few steps: the plumbing, not the quality)."""
    run = tmp_path_factory.mktemp("run")
    code = cli.main(["train", "--save-dir", str(run), "--max-steps", "4", "--max-tokens", "256",
                     "--vocab-size", "120", "--save-every", "2", "--eval-every", "4",
                     "--bleu-samples", "4", "--no-progress", "--no-test"])
    assert code == 0
    return run


def test_train_writes_checkpoints_tokenizer_and_log(trained_run):
    names = sorted(p.name for p in trained_run.iterdir())
    assert names == ["checkpoint_0000002.npz", "checkpoint_0000004.npz", "metrics.jsonl", "spm.model", "spm.vocab"]


def test_translate_keeps_one_line_per_input_line(trained_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("I see 3 red cats\n\nToday we buy 1 old car\n   \n", encoding="utf-8")
    out = tmp_path / "out.txt"
    code = cli.main(["translate", "--checkpoint", str(trained_run / "checkpoint_0000004.npz"),
                     "--input", str(source), "--output", str(out), "--beam", "2"])
    assert code == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[3] == "" and lines[4] == ""


def _thread_counts():
    """tinyformer's row-work threads and the BLAS libraries' threads, as they are now."""
    from threadpoolctl import threadpool_info

    return backend.get_num_threads(), {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


@pytest.mark.parametrize("command", ["translate", "eval", "explain"])
def test_threads_limits_decoding_and_is_given_back(trained_run, tmp_path, monkeypatch, command):
    """--threads 1 holds BLAS and tinyformer's own threads to one while the command decodes, and the
    old settings come back after; explain decodes on one thread unless told otherwise."""
    from tinyformer.translation import prediction, train
    from tinyformer.study import viz

    from threadpoolctl import threadpool_limits

    monkeypatch.setattr(backend.threads, "_num_threads", 3)  # a setting of neither the default nor --threads
    limits = threadpool_limits(limits=3, user_api="blas")
    seen, before = [], _thread_counts()
    assert before == (3, {3})

    def recording(real):
        def run(*args, **kwargs):
            seen.append((_thread_counts(), kwargs.get("threads")))
            return real(*args, **kwargs)
        return run

    target = {"translate": (prediction, "translate"), "eval": (train, "evaluate"), "explain": (viz, "explain")}[command]
    monkeypatch.setattr(*target, recording(getattr(*target)))
    checkpoint = str(trained_run / "checkpoint_0000004.npz")
    source = tmp_path / "in.txt"
    source.write_text("I see 3 red cats\n", encoding="utf-8")
    argv = {"translate": ["--input", str(source), "--output", str(tmp_path / "out.txt")],
            "eval": ["--split", "val", "--limit", "2"],
            "explain": ["--source", "I see 3 red cats", "--output", str(tmp_path / "page.html")]}[command]
    for threads in ([], ["--threads", "1"]) if command != "explain" else ([], ["--threads", "2"]):
        assert cli.main([command, "--checkpoint", checkpoint, "--beam", "1", *argv, *threads]) == 0
    if command == "explain":
        assert [asked for _, asked in seen] == [1, 2]  # explain limits the threads itself, to what it is given
    else:
        assert seen[0][0] == before and seen[1][0] == (1, {1})
    assert _thread_counts() == before
    limits.restore_original_limits()


def test_average_and_eval_through_the_cli(trained_run, tmp_path, capsys):
    averaged = tmp_path / "avg.npz"
    assert cli.main(["average", "--dir", str(trained_run), "--last", "2", "--output", str(averaged)]) == 0
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    (trained_run / "avg_copy.npz").write_bytes(averaged.read_bytes())
    code = cli.main(["eval", "--checkpoint", str(trained_run / "avg_copy.npz"), "--split", "val",
                     "--limit", "5", "--beam", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "BLEU" in out and "tok:13a" in out and "exact match" in out
    refs, hyps = tmp_path / "refs.txt", tmp_path / "hyps.txt"
    refs.write_text("Ich sehe drei rote Katzen\n", encoding="utf-8")
    hyps.write_text("Ich sehe drei rote Katzen\n", encoding="utf-8")
    assert cli.main(["eval", "--hypotheses", str(hyps), "--references", str(refs)]) == 0
    assert "BLEU 100.00" in capsys.readouterr().out


def test_resume_cannot_change_the_recipe(trained_run, capsys):
    code = cli.main(["train", "--save-dir", str(trained_run), "--resume", "--preset", "small"])
    assert code == 2 and "cannot change" in capsys.readouterr().err


def test_translate_plots_the_attention_of_the_first_non_empty_line(trained_synthetic, tmp_path):
    """On the trained model (an untrained one's hypotheses run to the length limit: each figure
    then holds some sixty target labels and takes seconds to draw)."""
    pytest.importorskip("matplotlib")
    source = tmp_path / "in.txt"
    source.write_text("\nI see 3 red cats\nToday we buy 1 old car\nWe sell 2 new houses\n", encoding="utf-8")
    out, maps = tmp_path / "out.txt", tmp_path / "maps"
    code = cli.main(["translate", "--checkpoint", str(trained_synthetic.checkpoint), "--input", str(source),
                     "--output", str(out), "--beam", "1", "--plot-attention", str(maps)])
    assert code == 0
    assert len(out.read_text(encoding="utf-8").split("\n")) == 5  # the translations are still written
    assert sorted(p.name for p in maps.iterdir()) == ["line2"]  # line 1 is empty; --plot-limit is 1
    expected = sorted(f"{kind}_layer{n}.png" for kind in ("encoder_self", "decoder_self", "decoder_cross")
                      for n in (1, 2))
    for folder in maps.iterdir():
        assert sorted(p.name for p in folder.iterdir()) == expected
        assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in folder.iterdir())


# ---------------------------------------------------------------- gradcheck
def tiny_transformer_parameters(vocab):
    """(tensors, elements) of the `tiny` preset's post-LN Transformer with one shared embedding and
    the tied output projection, counted from the paper's architecture, not from the model: each
    attention block has four d×d projections with biases, each feed-forward two linear layers, each
    sub-layer one LayerNorm (weight and bias)."""
    config = nn.PRESETS["tiny"]
    d, ff, layers = config.d_model, config.d_ff, config.num_layers
    attention, feed_forward, norm = (8, 4 * (d * d + d)), (4, d * ff + ff + ff * d + d), (2, 2 * d)
    encoder = [attention, feed_forward, norm, norm]
    decoder = [attention, attention, feed_forward, norm, norm, norm]
    blocks = [(1, vocab * d)] + layers * encoder + layers * decoder
    return sum(n for n, _ in blocks), sum(size for _, size in blocks)


def test_gradcheck_all_passes_and_counts_the_transformers_parameters(capsys):
    """``all`` runs every case, in full mode unless told otherwise; fast mode here (every case in
    full mode, 17 s, is testing/test_gradcheck_suite.py's test_full_mode_passes_and_reports_small_errors).
    The transformer row counts the parameters it checks (the case takes most of the run's time,
    so it is checked here, not again in a list of layers)."""
    assert cli.build_parser().parse_args(["gradcheck", "--layer", "all"]).mode == "full"
    assert cli.main(["gradcheck", "--layer", "all", "--mode", "fast"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.endswith(("PASS", "FAIL"))]
    assert [row.split()[0] for row in rows] == list(gradcheck_suite.CASES)
    assert all(row.endswith("PASS") for row in rows)
    assert "mode fast, device cpu" in out and f"{len(rows)} passed, 0 failed" in out
    tensors, elements = tiny_transformer_parameters(11)  # gradcheck_suite's transformer case: vocabulary 11
    row = next(line for line in out.splitlines() if line.startswith("transformer "))
    assert f" +{tensors} params ({elements}) " in row


def test_gradcheck_fast_mode_and_a_list_of_layers(capsys):
    assert cli.main(["gradcheck", "--layer", "softmax,feed_forward", "--mode", "fast"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line.endswith(("PASS", "FAIL"))]
    assert rows == ["softmax", "feed_forward"]
    assert "mode fast" in out and "2 passed, 0 failed" in out


def test_gradcheck_unknown_layer_exits_2_listing_the_names(capsys):
    assert cli.main(["gradcheck", "--layer", "attention"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "unknown --layer 'attention'; valid names: all, softmax," in err
    for name in [*gradcheck_suite.CASES, *gradcheck_suite.KERNEL_CASES]:
        assert name in err


def test_gradcheck_a_broken_backward_gives_a_fail_row_and_exit_1(monkeypatch, capsys):
    original = F.Softmax.backward
    monkeypatch.setattr(F.Softmax, "backward", lambda self, g: 1.5 * original(self, g))
    assert cli.main(["gradcheck", "--layer", "softmax,log_softmax"]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.endswith(("PASS", "FAIL"))}
    assert rows["softmax"].endswith("FAIL") and rows["log_softmax"].endswith("PASS")
    assert "softmax FAILED:" in out and "gradcheck FAILED" in out and "1 passed, 1 failed" in out


@pytest.mark.skipif(backend.is_gpu_available(), reason="a GPU is present")
def test_gradcheck_on_cuda_without_a_gpu_exits_2(capsys):
    assert cli.main(["gradcheck", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "no usable GPU" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- plot
def _png_size(path):
    return struct.unpack(">II", Path(path).read_bytes()[16:24])


def test_plot_schedule_through_the_cli(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "noam.png"
    assert cli.main(["plot", "schedule", "--d-model", "64", "--warmup", "200", "--steps", "1000",
                     "--output", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out and _png_size(out) == (800, 500)


def test_plot_the_curves_of_a_run(trained_run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "curves.png"
    assert cli.main(["plot", str(trained_run / "metrics.jsonl"), "--output", str(out)]) == 0
    assert _png_size(out) == (1300, 700)


def test_plot_a_bad_log_exits_1_naming_the_line(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n', encoding="utf-8")
    assert cli.main(["plot", str(log), "--output", str(tmp_path / "c.png")]) == 1
    err = capsys.readouterr().err
    assert f"{log}, line 2: not JSON" in err and len(err.strip().splitlines()) == 1


def test_plot_schedule_options_do_not_apply_to_a_log(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "metrics.jsonl"), "--warmup", "10"]) == 2
    assert "--warmup only applies to `tinyformer plot schedule`" in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["plot", "schedule", "--output", str(tmp_path / "s.png")]) == 1
    err = capsys.readouterr().err
    assert "install the 'plot' extra: pip install -e '.[plot]'" in err and len(err.strip().splitlines()) == 1
    code = cli.main(["translate", "--checkpoint", str(tmp_path / "missing.npz"), "--plot-attention", str(tmp_path)])
    assert code == 1 and "pip install -e '.[plot]'" in capsys.readouterr().err  # before loading anything
