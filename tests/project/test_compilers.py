"""The guard of the CPU emulation's tests (tests/compilers.py): a missing C++ compiler skips them on
a developer's machine and fails them in CI, where .ci/run installs g++ and exports TINYFORMER_CI=1."""

from pathlib import Path

import children
import compilers
import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = (pytest.fail.Exception, pytest.skip.Exception)
EMULATION_TESTS = ("engine/kernels/test_mma.py", "engine/kernels/test_emulation.py", "engine/kernels/test_device_seed.py")


def which_of(present):
    """A ``shutil.which`` that finds only the names in ``present`` (as /usr/bin/NAME)."""
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_the_compiler_is_cxx_else_gxx_else_clang():
    assert compilers.find({}, which_of({"g++", "clang++"})) == "/usr/bin/g++"
    assert compilers.find({}, which_of({"clang++"})) == "/usr/bin/clang++"
    assert compilers.find({"CXX": "c++-13"}, which_of({"c++-13", "g++"})) == "/usr/bin/c++-13"
    assert compilers.find({"CXX": "c++-13"}, which_of({"g++"})) is None  # a CXX that is not there is not replaced
    assert compilers.find({}, which_of(set())) is None


@pytest.mark.parametrize("name", ["TINYFORMER_CI", "CI"])
@pytest.mark.parametrize("value, ci", [("1", True), ("true", True), ("0", False), ("", False), (None, False)])
def test_without_a_compiler_ci_fails_and_elsewhere_skips(name, value, ci):
    environ = {} if value is None else {name: value}
    with pytest.raises(OUTCOMES, match="no C\\+\\+ compiler") as info:  # a skip caught too: not the test's own
        compilers.require(environ, which_of(set()))
    assert info.type is (pytest.fail.Exception if ci else pytest.skip.Exception)
    assert not ci or str(info.value).startswith(f"{name} is set")  # the setting that made it CI's run, named
    assert "\n" not in str(info.value)
    assert compilers.require(environ, which_of({"g++"})) == "/usr/bin/g++"


def test_the_fixture_fails_in_ci_without_a_compiler(monkeypatch, request):
    """The fixture the emulation's modules use, with TINYFORMER_CI=1 and no compiler found."""
    monkeypatch.setenv(compilers.CI_VARIABLE, "1")
    monkeypatch.setattr(compilers.shutil, "which", which_of(set()))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(OUTCOMES, match="TINYFORMER_CI is set but no C\\+\\+ compiler") as info:
        request.getfixturevalue("cxx_compiler")
    assert info.type is pytest.fail.Exception


@pytest.mark.parametrize("module", EMULATION_TESTS)
def test_the_emulation_modules_ask_for_the_guard(module):
    source = (ROOT / "tests" / module).read_text(encoding="utf-8")
    assert 'pytestmark = pytest.mark.usefixtures("cxx_compiler")' in source
    assert "skipif(shutil.which" not in source


def test_in_ci_a_ptx_layout_test_without_a_compiler_fails(tmp_path):
    """A child pytest of one PTX-layout test with no compiler on the PATH: failed with TINYFORMER_CI=1,
    skipped without it (conftest keeps TINYFORMER_CI for the tests while it removes other
    TINYFORMER_* settings, or the first would be skipped too)."""
    test = f"{ROOT / 'tests' / 'engine/kernels/test_mma.py'}::test_mma_ldmatrix_cp_async_and_conversions_follow_the_ptx_layouts"
    command = [children.PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", test + "[float16]"]
    bare = {"PATH": str(tmp_path), "CXX": None,  # nothing on the PATH: no g++, no clang++
            **dict.fromkeys(compilers.CI_VARIABLES)}  # and not CI's run, even where the CI service sets CI
    failed = children.run(command, env={**bare, compilers.CI_VARIABLE: "1"}, timeout=300)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-2000:]
    assert "1 error" in failed.stdout and "TINYFORMER_CI is set but no C++ compiler" in failed.stdout, failed.stdout
    skipped = children.run(command, env=bare, timeout=300)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-3000:]


def test_ci_installs_gxx_and_says_it_is_ci():
    """.ci/run installs g++ when it is missing (as it does Chromium) and exports TINYFORMER_CI=1 before
    its last line, the test command."""
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert "install_if_missing g++ g++" in lines
    assert lines[-1] == 'pip install -e ".[test]" && python -m pytest' and f"export {compilers.CI_VARIABLE}=1" in lines[:-1]
