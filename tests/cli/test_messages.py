"""Every command speaks in one-line messages on stderr, each starting ``tinyformer CMD:`` (``error:``,
``warning:`` or a note): its own warnings, the library's (decoding, training) and other packages'
(NumPy's RuntimeWarning, a package's ``warnings.warn``) alike. No line in Python's own warning format
(``file.py:123: SomeWarning: ...`` and the source line under it) ever reaches stderr."""

import re
import sys

import children
import numpy as np
import pytest
from trained_models import make_tiny_run

from tinyformer import cli

PYTHON_WARNING = re.compile(r"^.*\.py:\d+: \w+: ")  # warnings.formatwarning's first line
LONG_LINE = " ".join(["I see 3 red cats"] * 20)


def messages(command, err):
    """The stderr lines of ``command``, each checked: none of Python's warning format, all ours."""
    lines = err.splitlines()
    for line in lines:
        assert not PYTHON_WARNING.match(line), err
        assert line.startswith(f"tinyformer {command}: "), err
    return lines


def run_cli(capsys, *argv):
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    return code, messages(argv[0], capsys.readouterr().err)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A random tiny run (its checkpoint, spm.model), a file with an undecodable byte and a line longer
    than the model takes, and two references."""
    root = tmp_path_factory.mktemp("messages")
    (root / "run").mkdir()
    make_tiny_run(root / "run")
    (root / "bad.txt").write_bytes(b"I see \xff cats\n" + LONG_LINE.encode() + b"\n")
    (root / "refs.txt").write_text("Ich sehe Katzen\nIch sehe\n", encoding="utf-8")
    return root


BEAM = "--beam 1,000,000 is wider than the 148 tokens this model can emit"
# (command line with {run}, {bad}, {refs}, {out} for a new path; what its warnings must say)
COMMANDS = {
    "translate": ("translate --checkpoint {run} --input {bad} --beam 1000000",
                  ["replaced 1 undecodable byte", BEAM, "truncated 1 line longer than 23 tokens"]),
    "eval-sources": ("eval --checkpoint {run} --sources {bad} --references {refs} --beam 1000000",
                     ["--sources", BEAM, "truncated 1 line longer than 23 tokens"]),
    "eval-hypotheses": ("eval --hypotheses {bad} --references {refs}", ["--hypotheses"]),
    "explain": ("explain --checkpoint {run} --source x --output {out} --beam 1000000", [BEAM, "wrote "]),
    "train": ("train --save-dir {out} --max-steps 2 --max-tokens 256 --eval-every 2 --bleu-samples 2 --no-test "
              "--no-progress --threads 1 --cuda-graphs on", ["--cuda-graphs on: CUDA graphs need --device cuda"]),
    "average": ("average --dir {run} --last 1 --output {out}", []),
    "export": ("export {run} --output {out}", []),
    "gradcheck": ("gradcheck --layer softmax --mode fast", []),
    "study": ("study", []),
    "info": ("info", []),
}


@pytest.mark.parametrize("case", list(COMMANDS))
def test_every_message_of_every_command_is_one_of_our_lines(case, files, tmp_path, capsys):
    line, expected = COMMANDS[case]
    out = tmp_path / ("out.safetensors" if case == "export" else "out.npz" if case == "average" else "out")
    argv = line.format(run=files / "run", bad=files / "bad.txt", refs=files / "refs.txt", out=out).split()
    code, lines = run_cli(capsys, *argv)
    assert code == 0, lines
    for part in expected:
        assert [x for x in lines if part in x], (part, lines)
    assert len([x for x in lines if ": warning: " in x]) == len([p for p in expected if p != "wrote "]), lines


def test_export_and_import_speak_in_our_lines(files, tmp_path, capsys):
    weights = tmp_path / "model.safetensors"
    assert run_cli(capsys, "export", files / "run", "--format", "torch", "--output", weights) == (0, [])
    assert run_cli(capsys, "import", "torch", weights, "--tokenizer", files / "run" / "spm.model",
                   "--output", tmp_path / "imported") == (0, [])


def test_plot_speaks_in_our_lines(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert run_cli(capsys, "plot", "schedule", "--steps", "10", "--output", tmp_path / "s.png") == (0, [])


def test_other_packages_warnings_are_reworded_in_one_line(tmp_path, monkeypatch, capsys):
    """NumPy's RuntimeWarning and a package's ``warnings.warn`` of two lines become one ``tinyformer CMD:
    warning:`` line each, naming their kind and the package they come from (NumPy's: the package of
    the module whose line computed, here this one's, ``tests``)."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "__init__.py").write_text(
        "import warnings\n\ndef call():\n    warnings.warn('this call is old;\\n  use another', FutureWarning)\n",
        encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import elsewhere

    def run(args):
        np.log(np.zeros(1))
        elsewhere.call()
        raise ValueError("and then it failed")

    monkeypatch.setattr(cli.info, "run", run)
    code, lines = run_cli(capsys, "info")
    assert code == 1 and lines == [
        "tinyformer info: warning: divide by zero encountered in log (RuntimeWarning from tests)",
        "tinyformer info: warning: this call is old; use another (FutureWarning from elsewhere)",
        "tinyformer info: error: and then it failed"], lines
    monkeypatch.delitem(sys.modules, "elsewhere")


def test_a_warning_of_the_library_in_a_command_of_its_own_process_is_one_line(files):
    """The same through ``tinyformer`` itself: Python's default warning filters, nothing of pytest's."""
    done = children.run(children.tinyformer("eval", "--checkpoint", files / "run", "--sources", files / "bad.txt",
                                            "--references", files / "refs.txt", "--beam", "2"))
    assert done.returncode == 0, done.stderr
    lines = messages("eval", done.stderr)
    assert len(lines) == 2 and "truncated 1 line longer than 23 tokens to their first 23: line 2" in lines[1], lines
