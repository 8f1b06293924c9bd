"""benchmarks/bench_hour.py's reading of a run (issue 49): the figures it reports come from the run's
own output and metrics.jsonl, and the target is judged on them. The hour itself is a benchmark."""

import argparse
import json

from scripts import load_script

bench = load_script("benchmarks/bench_hour.py")

OUTPUT = ["--recipe hour: --time-limit 56.0, ...",
          "step 698: val loss 3.202, ppl 8.95, BLEU 29.61 (greedy, 500 sentences)",
          "trained 3046 steps in 56.1 min", "averaged the last 5 checkpoints (steps 2738..3046) into x/averaged.npz",
          "test, averaged over the last 5 checkpoints (steps 2738..3046)", "  source: A man.",
          "test: BLEU 39.39  (nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0)",
          "test: tokenized lowercased BLEU 39.88  (nrefs:1|case:lc)"]
VALIDATIONS = [{"split": "val", "step": 698, "loss": 3.20237, "nll": 2.19189, "bleu_greedy": 29.61},
               {"split": "val", "step": 3046, "loss": 2.8528, "nll": 1.74841, "bleu_greedy": 41.15, "averaged": 5}]


def parsed(tmp_path, output=OUTPUT, seconds=(1.0, 900.0, 3365.3, 3365.5, 3368.9, 3370.0, 3378.6, 3378.6)):
    records = [{"step": 1, "loss": 9.0, "minutes_left": 55.9}] + VALIDATIONS
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return bench.parse(list(zip(seconds, output)), tmp_path)


def test_the_run_is_read_from_its_output_and_metrics(tmp_path):
    found = parsed(tmp_path)
    assert (found["bleu"], found["steps"], found["train_minutes"]) == (39.39, 3046, 56.1)
    assert found["decode_s"] == 9.7  # from the line that starts the test to the BLEU line
    assert found["validations"] == VALIDATIONS and found["minutes_left"] == {1: 55.9}


def test_the_command_is_the_recipe_from_a_fresh_directory_with_given_flags_last():
    command = bench.train_command(3, "runs/x/seed-3", ["--lr-factor", "1.0"])
    assert command[command.index("--recipe") + 1] == "hour" and command[command.index("--seed") + 1] == "3"
    assert command[-2:] == ["--lr-factor", "1.0"] and "--no-progress" in command


def test_the_target_is_judged_on_the_measured_figures(tmp_path):
    found = parsed(tmp_path)
    args = argparse.Namespace(seed=0, extra=[])
    text = bench.report(args, 56.3 * 60, found, 0, ["0.1", "2.0"])
    assert "| 0 | 56.3 | 56.1 | 3046 | **39.39** | 9.7 |" in text
    assert "| 3046 | 5 | 2.8528 | 1.74841 | 41.15 |" in text
    assert text.rstrip().endswith("met (39.39 BLEU in 56.3 min).") and "not met" not in text
    assert "not met (39.39 BLEU in 60.5 min)" in bench.report(args, 60.5 * 60, found, 0, ["0", "0"])
    low = parsed(tmp_path, OUTPUT[:6] + ["test: BLEU 35.9  (nrefs:1)"], seconds=(1.0,) * 7)
    assert "not met (35.9 BLEU" in bench.report(args, 50 * 60, low, 0, ["0", "0"])
    failed = bench.report(args, 60, parsed(tmp_path, OUTPUT[:2], seconds=(1.0, 2.0)), 1, ["0", "0"])
    assert "**n/a**" in failed and "exit status 1" in failed
