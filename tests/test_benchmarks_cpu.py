"""The CPU benchmarks' arithmetic: model FLOPs and the MFU column of bench_step.py."""

import os

import numpy as np

import children
from scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name):
    return load_script(f"benchmarks/{name}.py")


def test_model_flops_is_six_n_t_plus_attention():
    bench = load("bench_step")
    batch = {"src": np.zeros((3, 5)), "tgt_in": np.zeros((3, 4)), "tgt_tokens": 10}
    config = {"d_model": 8, "num_layers": 2}
    attention = 3 * 4 * 3 * 2 * (5 * 5 + 4 * 4 + 4 * 5) * 8
    assert bench.model_flops(config, 1000, batch) == 6 * 1000 * 10 + attention == 60000 + 35136


def test_step_benchmark_reports_model_flop_utilisation():
    result = children.run([children.PYTHON, os.path.join(ROOT, "benchmarks", "bench_step.py"), "--preset", "tiny",
                           "--tokens", "64", "--repeats", "1", "--warmup", "0", "--markdown"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "sgemm peak" in out and "GFLOP/s" in out
    header, row = ([c.strip() for c in line.strip("|").split("|")]
                   for line in [line for line in out.splitlines() if line.startswith("| ")][:2])
    mfu = dict(zip(header, row))["MFU"]
    assert mfu.endswith("%") and 0 <= float(mfu[:-1]) <= 100
