"""What the benchmarks may lean on: the library (``tinyformer``, its verification room
``tinyformer.testing`` included), their own modules and third-party packages, never the tests;
the lines that say where a report ran computed one way (``benchmarks/provenance.py``); the step
benchmark's batch in the package's special ids."""

import ast
from pathlib import Path

import numpy as np

from scripts import load_script

from tinyformer.translation.data.special import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
TESTS = ROOT / "tests"
PROVENANCE = ("git_commit", "header", "command_line", "cpu_model", "usable_cores", "machine_line", "blas_info")


def imported_names(source):
    """The top-level module names a source imports, anywhere in it (inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def imports_of_tests(benchmarks, tests):
    """['file: name'] of every import in ``benchmarks`` of a module that lives in ``tests``, and
    every line that puts ``tests`` on sys.path."""
    test_modules = {path.stem for path in tests.rglob("*.py")} | {tests.name}
    own = {path.stem for path in benchmarks.glob("*.py")}
    found = []
    for path in sorted(benchmarks.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        found += [f"{path.name}: {name}" for name in sorted(imported_names(source) & (test_modules - own))]
        found += [f"{path.name}: {line.strip()}" for line in source.splitlines()
                  if "sys.path" in line and f'"{tests.name}"' in line]
    return found


def redefined_provenance(benchmarks):
    """['file: function'] of the provenance helpers a benchmark defines again instead of importing them."""
    return [f"{path.name}: {node.name}" for path in sorted(benchmarks.glob("*.py")) if path.name != "provenance.py"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef) and node.name in PROVENANCE]


def test_no_benchmark_imports_the_tests():
    assert imports_of_tests(BENCHMARKS, TESTS) == []


def test_an_import_of_the_tests_is_found(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "helpers.py").write_text("")
    (tmp_path / "benchmarks" / "own.py").write_text("")
    (tmp_path / "benchmarks" / "bench.py").write_text(
        'import sys\nsys.path.insert(0, str(ROOT / "tests"))\nimport own\n\ndef f():\n    from helpers import x\n')
    assert imports_of_tests(tmp_path / "benchmarks", tmp_path / "tests") == [
        "bench.py: helpers", 'bench.py: sys.path.insert(0, str(ROOT / "tests"))']


def test_the_provenance_helpers_are_defined_once():
    provenance = load_script("benchmarks/provenance.py")
    assert all(callable(getattr(provenance, name)) for name in PROVENANCE)
    assert redefined_provenance(BENCHMARKS) == []


def test_a_redefined_provenance_helper_is_found(tmp_path):
    (tmp_path / "table.py").write_text("def report():\n    def git_commit():\n        return 'x'\n")
    (tmp_path / "provenance.py").write_text("def git_commit():\n    return 'y'\n")
    assert redefined_provenance(tmp_path) == ["table.py: git_commit"]


def test_the_step_benchmark_batch_uses_the_package_special_ids():
    batch = load_script("benchmarks/bench_step.py").make_batch(300, 16, 40, seed=0)
    src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
    assert (tgt_in[:, 0] == BOS_ID).all()
    lengths = (tgt_out != PAD_ID).sum(axis=1)
    assert (tgt_out[np.arange(len(tgt_out)), lengths - 1] == EOS_ID).all()
    words = np.concatenate([src[src != PAD_ID], tgt_in[:, 1:][tgt_in[:, 1:] != PAD_ID]])
    assert words.min() == len(SPECIAL_IDS) and words.max() == 39  # no special id among the words, all 36 drawn
    assert batch["tgt_tokens"] == 300 == int(lengths.sum())
