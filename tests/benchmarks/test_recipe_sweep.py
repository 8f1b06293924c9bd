"""benchmarks/recipe_sweep.sh: issue 49's recipe sweep in short runs (bench_quality.py, tinyformer
alone). A rehearsal on the built-in synthetic data: each point and seed trains and reports under a
name of its own, a second invocation skips what is done, and an unknown point is named."""

import json

import pytest

import children

SWEEP = children.ROOT / "benchmarks" / "recipe_sweep.sh"


def sweep(tmp_path, points, **env):
    settings = {"WORK": str(tmp_path / "work"), "REPORT": str(tmp_path / "sweep.md"), "STEPS": "8",
                "SEEDS": "0", "POINTS": points, "PYTHON": children.PYTHON,
                "ARGS": "--data synthetic --preset tiny --vocab-size 120 --max-tokens 512", **env}
    return children.run(["bash", str(SWEEP)], env=settings, timeout=120)


def results_paths(tmp_path):
    return (tmp_path / "work" / "results").glob("*.json")


def test_each_point_trains_under_its_own_name_with_its_own_options_and_a_rerun_skips_them(tmp_path):
    done = sweep(tmp_path, "base dropout")
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "sweep.md").read_text(encoding="utf-8")
    assert report.count("\n## tinyformer alone") == 2, report
    results = sorted(p.name for p in results_paths(tmp_path))
    assert len(results) == 2 and sum("-drop0.2" in name for name in results) == 1, results
    # base: a warm-up of STEPS/4 to the hour's peak of 2.5e-3 (factor * 256^-0.5 * 2^-0.5)
    assert all("linear_w2_f0.0565685" in name for name in results), results
    table = children.run([children.PYTHON, "benchmarks/recipe_summary.py", str(tmp_path / "work"),
                          "--data", "synthetic", "--preset", "tiny"], timeout=60)
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if line.startswith("| 8 | 2 |")]
    assert len(rows) == 4, table.stdout  # two points, in the final table and along the way
    finals = {json.loads(p.read_text(encoding="utf-8"))["model_config"]["dropout"]:
              json.loads(p.read_text(encoding="utf-8"))["validations"][-1][2] for p in results_paths(tmp_path)}
    base, dropout = rows[0].split(" | "), rows[1].split(" | ")
    assert (base[3], dropout[3]) == ("0.1", "0.2")  # ordered by dropout at the same peak
    assert float(base[5]) == pytest.approx(finals[0.1], abs=1e-4)
    assert float(dropout[7]) == pytest.approx(finals[0.2] - finals[0.1], abs=2e-4)  # vs the first row
    again = sweep(tmp_path, "base dropout")
    assert again.returncode == 0 and again.stdout.count("done already") == 2, again.stdout
    assert (tmp_path / "sweep.md").read_text(encoding="utf-8") == report  # nothing appended twice


def test_an_unknown_point_is_named(tmp_path):
    done = sweep(tmp_path, "base sideways")
    assert done.returncode == 2
    assert "unknown point 'sideways'" in done.stderr and "known: base peak" in done.stderr
    assert not (tmp_path / "work" / "results").exists()  # it stops before training anything
