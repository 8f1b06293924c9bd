"""metrics.jsonl: appended one record a line; on resume cut back to the checkpoint's step (torn
lines dropped too) through a temporary file and a rename; and the tokens-per-second window."""

import json

from tinyformer.translation.train import metrics_log
from tinyformer.translation.train.metrics_log import LOG_FILE, MetricsLog, TokenRate


def read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_records_are_appended_one_line_each(tmp_path):
    log = MetricsLog(tmp_path / LOG_FILE)
    log.append({"step": 1, "loss": 2.5})
    log.append({"step": 1, "split": "val", "bleu_greedy": 3.0, "note": "ü"})
    assert read(tmp_path / LOG_FILE) == [{"step": 1, "loss": 2.5},
                                         {"step": 1, "split": "val", "bleu_greedy": 3.0, "note": "ü"}]


def test_truncation_drops_later_steps_and_torn_lines(tmp_path):
    path = tmp_path / LOG_FILE
    lines = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}, {"step": 2, "split": "val"},
             {"step": 3, "loss": 1.0}, {"step": 3, "skipped": "non-finite loss (nan)"}, {"note": "no step"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "lo', encoding="utf-8")
    assert MetricsLog(path).truncate_after(2) == 3  # two of step 3, and the torn line
    assert read(path) == lines[:3] + [{"note": "no step"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOG_FILE]


def test_truncation_with_nothing_to_drop_leaves_the_file_alone(tmp_path, monkeypatch):
    path = tmp_path / LOG_FILE
    path.write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n", encoding="utf-8")
    renamed = []
    monkeypatch.setattr(metrics_log.os, "replace", lambda *a: renamed.append(a))
    assert MetricsLog(path).truncate_after(5) == 0
    assert renamed == [] and read(path) == [{"step": 1, "loss": 3.0}]
    assert MetricsLog(tmp_path / "missing.jsonl").truncate_after(0) == 0
    assert not (tmp_path / "missing.jsonl").exists()


def test_a_repair_replaces_the_temporary_a_killed_repair_left(tmp_path):
    path = tmp_path / LOG_FILE
    path.write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n", encoding="utf-8")
    (tmp_path / (LOG_FILE + ".tmp")).write_text("half of an old repair", encoding="utf-8")
    assert MetricsLog(path).truncate_after(1) == 1
    assert read(path) == [{"step": 1}] and sorted(p.name for p in tmp_path.iterdir()) == [LOG_FILE]


def test_the_token_rate_covers_the_updates_since_the_last_reading():
    clock = iter([10.0, 12.0, 13.0])
    rate = TokenRate(clock=lambda: next(clock))  # starts at 10 s
    rate.add(300)
    rate.add(100)
    assert rate.take() == 200.0  # 400 tokens in 2 s
    rate.add(50)
    assert rate.take() == 50.0  # a new window: 50 tokens in 1 s
