"""The numbered examples run as a reader runs them, and assert what they show.

(The two older examples, attention_from_scratch.py and transformer_reverse_task.py,
are run by cli/test_commands.py.) Each script runs in a subprocess from a scratch working
directory with TMPDIR inside tmp_path, so a test also sees that a script leaves
nothing behind.
"""

import os
import re
from pathlib import Path

import pytest

import children
from scripts import load_script
from ci import in_ci

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name, *args, tmp_path, env=None):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**(env or {}), "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = children.run([children.PYTHON, str(EXAMPLES / name), *args], cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert list(scratch.iterdir()) == [], "the example left temporary files behind"
    return result.stdout


def load_example(name):
    return load_script(f"examples/{name}", name.replace(".py", "").lstrip("0123456789_"))


# ------------------------------------------------------------------ 01: backprop through attention
def test_backprop_example_hand_autograd_and_finite_differences_agree(tmp_path):
    out = run_example("01_backprop_through_attention.py", tmp_path=tmp_path)
    assert "hand-derived backward, autograd and finite differences agree" in out
    assert "DISAGREE" not in out and "FAILED" not in out
    assert "3 query row(s) with every key masked" in out  # the fully padded sentence is covered
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+d[QKV]\s+\d", line)]
    assert len(rows) == 9  # dQ, dK, dV for each of the three cases
    for row in rows:
        hand_vs_auto, hand_vs_fd, auto_vs_fd = map(float, row[1:])
        assert hand_vs_auto <= 1e-12 and hand_vs_fd <= 1e-6 and auto_vs_fd <= 1e-6, row
    assert "mha.attention_probs.register_hook(fn) receives dL/dP, shape (2, 2, 4, 4)" in out
    assert re.search(r"max \|dL/dP \(hook\) − dO·Vᵀ \(hand\)\| = (\S+)", out)


def test_backprop_example_exits_1_when_the_derivation_is_wrong(capsys, monkeypatch):
    import tinyformer

    example = load_example("01_backprop_through_attention.py")
    right = example.attention_backward

    def forgets_the_scale_of_dk(q, k, v, p, d_o):
        d_q, d_k, d_v, d_p, d_s = right(q, k, v, p, d_o)
        return d_q, d_k * q.shape[-1] ** 0.5, d_v, d_p, d_s

    monkeypatch.setattr(example, "attention_backward", forgets_the_scale_of_dk)
    state = tinyformer.engine.random.get_rng_state()
    try:
        assert example.main([]) == 1
    finally:
        tinyformer.engine.random.set_rng_state(state)  # main() seeds the default generator
    out = capsys.readouterr().out
    assert "DISAGREE" in out and "FAILED" in out


# ------------------------------------------------------------------ 02: the copy task
def test_copy_task_example_learns_to_copy(tmp_path):
    # The example's default 600 steps: 95-100 % over seeds 0-9 (100 % from seed 0). At 400 steps
    # seed 0 also reached 100 %, but seeds 1 and 4 only 50.5 % and 92 %.
    out = run_example("02_copy_task.py", tmp_path=tmp_path)
    accuracy = float(re.search(r"cached decoding\): ([\d.]+)%", out).group(1))
    assert accuracy >= 90.0, out
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([\d.]+)", out, flags=re.M)]
    assert len(losses) >= 2 and losses[-1] < losses[0] - 1.5, losses


# ------------------------------------------------------------------ 03: Multi30k
REAL_DATA = os.environ.get("TINYFORMER_DATA")


def test_multi30k_example_trains_translates_and_scores(tmp_path):
    """Twenty steps of the real recipe at `tiny` size (the docstring's smoke test, which runs 30): the
    loss falls (from seed 0, by 0.8 at step 20, by 1.0 at step 30), beam search and sacreBLEU run."""
    if not REAL_DATA:
        if in_ci():
            pytest.fail("CI must set TINYFORMER_DATA to the directory holding multi30k/")
        pytest.skip("TINYFORMER_DATA is not set (the Multi30k files are not here)")
    out = run_example("03_translate_multi30k.py", "--steps", "20", "--preset", "tiny", "--max-tokens", "1500",
                      "--vocab-size", "2000", "--warmup", "10", "--lr-factor", "2", "--sentences", "10",
                      "--threads", "1", "--data-dir", REAL_DATA, tmp_path=tmp_path,
                      env={"TINYFORMER_DATA": ""})  # found through --data-dir alone
    assert "trained 20 steps (tiny, 1500 target tokens per batch" in out
    first, last = map(float, re.search(r"training loss: ([\d.]+) .*-> ([\d.]+)", out).groups())
    assert last < first - 0.5, (first, last)
    assert "first 10 sentences, beam 4, α 0.6" in out
    assert re.search(r"^sacreBLEU \d+\.\d\d  nrefs:1\|case:mixed\|eff:no\|tok:13a", out, flags=re.M), out
    assert "the training loss went down" in out
