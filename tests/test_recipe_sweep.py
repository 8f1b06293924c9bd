"""benchmarks/recipe_sweep.sh: issue 49's recipe sweep in short runs (bench_quality.py, tinyformer
alone). A rehearsal on the built-in synthetic data: each point and seed trains and reports under a
name of its own, a second invocation skips what is done, and an unknown point is named."""

import children

SWEEP = children.ROOT / "benchmarks" / "recipe_sweep.sh"


def sweep(tmp_path, points, **env):
    settings = {"WORK": str(tmp_path / "work"), "REPORT": str(tmp_path / "sweep.md"), "STEPS": "8",
                "SEEDS": "0", "POINTS": points, "PYTHON": children.PYTHON,
                "ARGS": "--data synthetic --preset tiny --vocab-size 120 --max-tokens 512", **env}
    return children.run(["bash", str(SWEEP)], env=settings, timeout=120)


def test_each_point_trains_under_its_own_name_with_its_own_options_and_a_rerun_skips_them(tmp_path):
    done = sweep(tmp_path, "base dropout")
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "sweep.md").read_text(encoding="utf-8")
    assert report.count("\n## tinyformer alone") == 2, report
    results = sorted(p.name for p in (tmp_path / "work" / "results").glob("*.json"))
    assert len(results) == 2 and sum("-drop0.2" in name for name in results) == 1, results
    # base: a warm-up of STEPS/4 to the hour's peak of 2.5e-3 (factor * 256^-0.5 * 2^-0.5)
    assert all("linear_w2_f0.0565685" in name for name in results), results
    again = sweep(tmp_path, "base dropout")
    assert again.returncode == 0 and again.stdout.count("done already") == 2, again.stdout
    assert (tmp_path / "sweep.md").read_text(encoding="utf-8") == report  # nothing appended twice


def test_an_unknown_point_is_named(tmp_path):
    done = sweep(tmp_path, "base sideways")
    assert done.returncode == 2
    assert "unknown point 'sideways'" in done.stderr and "known: base peak" in done.stderr
    assert not (tmp_path / "work" / "results").exists()  # it stops before training anything
