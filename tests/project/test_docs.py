"""The README and the manual (docs/) hold no unchecked code, and the manual builds strictly.

**Every code block runs.** The fenced code blocks of README.md and docs/**/*.md run page by page,
in order, each page in a temporary working directory of its own: ```python blocks in one
namespace (in this process), shell blocks (```bash, ```sh, ```shell, and the ``$ `` lines of
```console, the rest being their output) as one ``bash -e -o pipefail`` script each, with this checkout's ``tinyformer`` first on PATH, the test process's Python and MPI
beside it, one BLAS thread, and TINYFORMER_DATA passed on. A block that cannot run as it is
written says so in HTML comments right before it, one per line, ``<!-- docs-test: WORD ARGS -->``,
from this vocabulary (another word, or a comment followed by no block, fails):

- ``output``: the block is text, not code to run: a program's output, a listing, a diagram. Any
  block whose language is not Python or a shell must be declared so.
- ``install``: the block's installing commands (``python3 -m venv``, ``. .venv/bin/activate``,
  ``pip install``) are not run: the test runs in the environment they make. Each extra that a
  ``pip install -e ".[...]"`` names must be one pyproject.toml declares.
- ``shorten [SUBCOMMAND] OPTIONS``: every ``tinyformer SUBCOMMAND`` of the block (SUBCOMMAND
  ``train`` when not given) runs with OPTIONS: an option the command already has is replaced
  (with its value), one it lacks is appended. So a run of an hour runs for a few steps (or a
  ``--checkpoint`` names the checkpoint a shortened run wrote); a block may have several, and
  each must apply to a command of the block.
- ``the-test-command``: the block's line that is the test command is not run; it must be exactly
  the last line of .ci/run (which is what CI runs).
- ``the-manual-build``: the block's ``mkdocs build --strict`` is not run here:
  ``test_the_manual_builds_strictly`` runs it.
- ``gpu``, ``mpi``, ``multi30k``, ``torch``: the block runs only where CuPy sees a GPU, where mpi4py and an
  ``mpiexec`` are (Open MPI allowed to run as root), where TINYFORMER_DATA holds the Multi30k
  files, or where torch and transformers import (the test extra's; under CI the absence of the
  last two fails). Such blocks run apart from the page's others: the blocks
  of a page that need the same thing run together, in order, in a directory of their own.
- ``exit-status N``: the block must end with exit status N (a shell block; 0 otherwise).

**The manual builds.** ``mkdocs build --strict`` (the ``docs`` extra), into a temporary
directory: a broken link between pages, a broken anchor, a link out of docs/ that is not to a
benchmark report, a page missing from the navigation or an API page naming a missing object
fails it; a copy of the manual with broken links shows that it does. The README's own links
(into the manual, to the results files) are checked here too.
"""

import importlib.util
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import children
import pytest
import trained_models
from ci import in_ci

from tinyformer.engine import backend

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CI_RUN = ROOT / ".ci" / "run"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
NEEDS = ("gpu", "mpi", "multi30k", "torch")  # what a block may need from the machine
WORDS = {"output", "install", "shorten", "the-test-command", "the-manual-build", "exit-status", *NEEDS}
TAKES_ARGUMENTS = {"shorten", "exit-status"}
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
INSTALLING = re.compile(r"^(python3? -m venv \S+|\. \S+/bin/activate|source \S+/bin/activate|"
                        r"(python3? -m )?pip install .*)$")
EXTRAS = re.compile(r"""pip install -e ["']?\.\[([\w,-]+)\]""")
MANUAL_BUILD = "mkdocs build --strict"
MKDOCS_ENV = {"NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor, not a warning


class DocsError(ValueError):
    """A page's code block that the test cannot run: undeclared, or declared wrongly."""


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, counted from 1
    language: str
    text: str
    directives: list = field(default_factory=list)  # [(word, argument string)]

    @property
    def where(self):
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"

    def has(self, word):
        return any(w == word for w, _ in self.directives)

    def arguments(self, word):
        return [a for w, a in self.directives if w == word]

    @property
    def need(self):
        needs = [w for w in NEEDS if self.has(w)]
        if len(needs) > 1:
            raise DocsError(f"{self.where}: a block needs one of {NEEDS} at most, not {needs}")
        return needs[0] if needs else None


def blocks_of(path, text=None):
    """The fenced code blocks of a Markdown file, with the docs-test directives right before each."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks, pending, i = [], [], 0
    while i < len(lines):
        directive = DIRECTIVE.match(lines[i])
        fence = FENCE.match(lines[i])
        if directive:
            word, _, argument = directive.group(1).partition(" ")
            if word not in WORDS:
                raise DocsError(f"{path.name}:{i + 1}: unknown docs-test word {word!r} (known: {sorted(WORDS)})")
            if bool(argument.strip()) != (word in TAKES_ARGUMENTS):
                raise DocsError(f"{path.name}:{i + 1}: docs-test {word} "
                                + ("needs arguments" if word in TAKES_ARGUMENTS else "takes no arguments"))
            pending.append((word, argument.strip()))
        elif fence:
            indent, ticks, language = fence.groups()
            body, j = [], i + 1
            while j < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[j]):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
                j += 1
            if j == len(lines):
                raise DocsError(f"{path.name}:{i + 1}: a code block that is never closed")
            blocks.append(Block(path, i + 1, language.lower(), "\n".join(body) + "\n", pending))
            pending, i = [], j
        elif pending:
            raise DocsError(f"{path.name}:{i + 1}: a docs-test comment must come right before a code block")
        i += 1
    if pending:
        raise DocsError(f"{path.name}: a docs-test comment at the end, before no code block")
    return blocks


# ------------------------------------------------------------------ turning a shell block into a script
def logical_lines(text, language="bash"):
    """Shell lines with their backslash continuations joined; blank and comment lines left out
    (of a console block, the commands after its ``$ `` prompts)."""
    if language == "console":
        commands, continued = [], False
        for line in text.splitlines():
            if line.startswith("$ ") or continued:
                commands.append(line[2:] if line.startswith("$ ") and not continued else line)
                continued = line.rstrip().endswith("\\")
        text = "\n".join(commands) + "\n"
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def ci_test_command():
    """The README's test command: the last line of .ci/run."""
    return CI_RUN.read_text(encoding="utf-8").rstrip("\n").splitlines()[-1].strip()


def declared_extras():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, re.M))


def without_comment(line):
    """The command of a line, without a trailing ``# comment`` (quotes respected)."""
    out, quote = [], None
    for position, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            break
        out.append(char)
    return "".join(out).rstrip()


def shortened(command, subcommand, options):
    """``command`` with every ``tinyformer SUBCOMMAND`` given ``options`` (replaced or appended),
    and how many such commands there were."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    operators = {"|", "||", "&&", ";", "<", ">", ">>", "&"}
    segments, current = [], []
    for token in tokens:
        if token in operators:
            segments += [current, token]
            current = []
        else:
            current.append(token)
    segments.append(current)
    count = 0
    for segment in segments:
        if isinstance(segment, list) and segment[:2] == ["tinyformer", subcommand]:
            count += 1
            for name, value in options:
                if name in segment:
                    at = segment.index(name)
                    if value is not None:
                        segment[at + 1] = value
                else:
                    segment += [name] + ([value] if value is not None else [])
    if not count:
        return command, 0
    words = [token if isinstance(token, str) else " ".join(shlex.quote(w) for w in token) for token in segments]
    return " ".join(w for w in words if w), count


def parse_options(argument):
    """``[SUBCOMMAND] --a 1 --flag --b 2`` -> (SUBCOMMAND, [("--a", "1"), ("--flag", None), ("--b", "2")])."""
    words = shlex.split(argument)
    subcommand = "train" if words and words[0].startswith("--") else words.pop(0)
    options = []
    for word in words:
        if word.startswith("--"):
            options.append([word, None])
        elif options and options[-1][1] is None:
            options[-1][1] = word
        else:
            raise DocsError(f"shorten: {word!r} follows no option")
    return subcommand, [tuple(o) for o in options]


def shell_script(block):
    """The commands of a shell block as the test runs them (see the module docstring)."""
    shorten = [parse_options(a) for a in block.arguments("shorten")]
    used = [0] * len(shorten)
    script = []
    for line in logical_lines(block.text, block.language):
        command = without_comment(line)
        if block.has("the-test-command") and command == ci_test_command():
            block.found_test_command = True
            continue
        parts = [part.strip() for part in command.split(" && ")]
        installing = [p for p in parts if INSTALLING.match(p)]
        if installing and not block.has("install"):
            raise DocsError(f"{block.where}: {installing[0]!r} installs: declare <!-- docs-test: install -->")
        for part in installing:
            for extras in EXTRAS.findall(part):
                unknown = set(extras.split(",")) - declared_extras()
                if unknown:
                    raise DocsError(f"{block.where}: {part!r} names extras pyproject.toml lacks: {sorted(unknown)}")
        parts = [p for p in parts if p not in installing]
        if not parts:
            continue
        command = " && ".join(parts)
        if command == MANUAL_BUILD and block.has("the-manual-build"):
            block.found_manual_build = True
            continue
        if command.startswith("mkdocs"):
            raise DocsError(f"{block.where}: {command!r}: the manual is built by test_the_manual_builds_strictly; "
                            f"write it as `{MANUAL_BUILD}` and declare the-manual-build")
        for n, (subcommand, options) in enumerate(shorten):
            command, count = shortened(command, subcommand, options)
            used[n] += count
        script.append(command)
    for (subcommand, _), count in zip(shorten, used):
        if not count:
            raise DocsError(f"{block.where}: shorten {subcommand}: the block has no `tinyformer {subcommand}`")
    for word, attribute in (("the-test-command", "found_test_command"), ("the-manual-build", "found_manual_build")):
        if block.has(word) and not getattr(block, attribute, False):
            raise DocsError(f"{block.where}: declared {word}, but no line of the block is "
                            + (repr(ci_test_command()) + " (the last line of .ci/run)" if word == "the-test-command"
                               else repr(MANUAL_BUILD)))
    return script


def check_declared(block):
    """Raise DocsError unless the block is runnable as declared; return how it runs."""
    if block.has("output"):
        if len(block.directives) > 1:
            raise DocsError(f"{block.where}: an output block takes no other docs-test word")
        return "output"
    if block.language == "python":
        shell_only = {w for w, _ in block.directives} - set(NEEDS)
        if shell_only:
            raise DocsError(f"{block.where}: {sorted(shell_only)} apply to shell blocks only")
        return "python"
    if block.language in SHELLS:
        block.need  # noqa: B018  (raises on two needs)
        shell_script(block)
        return "shell"
    raise DocsError(f"{block.where}: a ```{block.language or ''} block is neither Python nor a shell: "
                    "run it, or declare it <!-- docs-test: output -->")


# ------------------------------------------------------------------ what the machine has
def has_mpi():
    from mpi_helpers import MPIEXEC
    return importlib.util.find_spec("mpi4py") is not None and MPIEXEC is not None


def has_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def skip_unless(need):
    if need == "gpu" and not backend.is_gpu_available():
        pytest.skip("needs a GPU: no usable CUDA GPU (cupy.is_available() is false)")
    if need == "mpi" and not has_mpi():
        pytest.skip('needs mpi4py and mpiexec: pip install -e ".[mpi]"')
    if need == "multi30k":
        trained_models.multi30k_or_skip()
    if need == "torch" and not has_torch():
        if in_ci():
            pytest.fail('CI installs the test extra, whose torch and transformers these blocks need')
        pytest.skip('needs torch and transformers: pip install -e ".[test]"')


# ------------------------------------------------------------------ running a page
def groups():
    """(page, need) for every page and every need among its runnable blocks."""
    found = []
    for page in PAGES:
        needs = []
        try:
            for block in blocks_of(page):
                if not block.has("output") and block.need not in needs:
                    needs.append(block.need)
        except DocsError:
            needs = [None]  # the page's run reports it; so does test_every_block_is_runnable_or_declared
        found += [(page, need) for need in needs]
    return found


def group_id(group):
    page, need = group
    return str(page.relative_to(ROOT)) + (f"[{need}]" if need else "")


def shim(directory):
    """A directory with ``tinyformer`` (this checkout, this Python) to put first on PATH."""
    directory.mkdir()
    script = directory / "tinyformer"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m tinyformer.cli "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    return directory


def run_shell(block, cwd, bin_dir):
    from mpi_helpers import MPI_ENV

    script = "\n".join(shell_script(block))
    env = {"PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if os.environ.get("TINYFORMER_DATA"):
        env["TINYFORMER_DATA"] = os.environ["TINYFORMER_DATA"]
    if block.need == "mpi":
        env.update(MPI_ENV)
    result = children.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, timeout=600)
    expected = int(block.arguments("exit-status")[0]) if block.has("exit-status") else 0
    assert result.returncode == expected, (
        f"{block.where}: exit status {result.returncode}, not {expected}, running\n{script}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}")


@pytest.mark.parametrize("group", groups(), ids=group_id)
def test_every_code_block_runs(group, tmp_path, monkeypatch):
    page, need = group
    skip_unless(need)
    work, bin_dir = tmp_path / "work", shim(tmp_path / "bin")
    work.mkdir()
    monkeypatch.chdir(work)
    namespace = {"__name__": "__docs__"}
    timings = []
    for block in blocks_of(page):
        if block.has("output") or block.need != need:
            continue
        how, start = check_declared(block), time.perf_counter()
        if how == "python":
            exec(compile(block.text, block.where, "exec"), namespace)  # noqa: S102
        else:
            run_shell(block, work, bin_dir)
        timings.append(f"{block.where} ({how}): {time.perf_counter() - start:.1f} s")
    print("\n".join(timings))


# ------------------------------------------------------------------ the declarations themselves
def test_every_block_is_runnable_or_declared():
    """Checked for every page here, also for the blocks a machine without a GPU or MPI skips."""
    kinds = {}
    for page in PAGES:
        for block in blocks_of(page):
            how = check_declared(block)
            kind = "output" if how == "output" else block.need or ("shortened" if block.has("shorten") else how)
            kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds.get("python") and kinds.get("shell") and kinds.get("output"), kinds


def test_the_readme_quick_start_is_what_ci_runs():
    """The quick start's two commands: the first installs the package alone (no extra) and trains;
    the second installs the test extra itself and runs the tests, and is the last line of .ci/run,
    which runs it in a fresh environment."""
    (quick_start, *_) = [b for b in blocks_of(ROOT / "README.md") if b.has("the-test-command")]
    first, second = logical_lines(quick_start.text)
    assert first == "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && tinyformer train"
    assert second == ci_test_command() == 'pip install -e ".[test]" && python -m pytest'
    ci = CI_RUN.read_text(encoding="utf-8")
    assert "python3 -m venv" in ci and re.search(r'pip install .*-e "\.\[test[],]', ci)
    assert re.search(rf"^(\w+=\S+ )*{re.escape(MANUAL_BUILD)} --site-dir ", ci, re.M), "CI builds the manual strictly"


MARKDOWN = {
    "an undeclared text block": "Text.\n\n```\nsome output\n```\n",
    "an unknown word": "<!-- docs-test: gpus -->\n```bash\ntinyformer info\n```\n",
    "a comment before no block": "<!-- docs-test: gpu -->\n\nText.\n",
    "an undeclared install": "```bash\npip install -e \".[gpu]\"\n```\n",
    "an extra that does not exist": "<!-- docs-test: install -->\n```bash\npip install -e \".[cuda]\"\n```\n",
    "a shortening that applies to nothing":
        "<!-- docs-test: shorten --max-steps 2 -->\n```bash\ntinyformer info\n```\n",
    "a test command that is not CI's": "<!-- docs-test: the-test-command -->\n```bash\npython -m pytest -x\n```\n",
    "an undeclared build of the manual": "```bash\nmkdocs build\n```\n",
}


@pytest.mark.parametrize("case", MARKDOWN)
def test_a_block_the_test_cannot_run_fails(case, tmp_path):
    page = tmp_path / "page.md"
    page.write_text(MARKDOWN[case], encoding="utf-8")
    with pytest.raises(DocsError):
        for block in blocks_of(page):
            check_declared(block)


def test_shorten_replaces_and_appends_options():
    command = 'echo "a b" | tinyformer train --preset small --max-steps 6000 && tinyformer eval --split test'
    assert shortened(command, "train", [("--max-steps", "3"), ("--no-test", None)]) == (
        "echo 'a b' | tinyformer train --preset small --max-steps 3 --no-test && tinyformer eval --split test", 1)
    assert shortened(command, "eval", [("--limit", "4")])[0].endswith("tinyformer eval --split test --limit 4")


def test_a_failing_block_fails(tmp_path, monkeypatch):
    """A Python block that raises, and a shell block whose command fails, fail the test."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ZeroDivisionError):
        exec(compile("1 / 0\n", "page.md:1", "exec"), {})  # noqa: S102
    block = Block(tmp_path / "page.md", 1, "bash", "tinyformer translate --checkpoint missing.npz\n")
    with pytest.raises(AssertionError, match="exit status 1, not 0"):
        run_shell(block, tmp_path, shim(tmp_path / "bin"))


# ------------------------------------------------------------------ links
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def test_the_readme_links_resolve():
    """Every relative link of the README names a file of the repository (the manual's pages among
    them): they work on GitHub; the manual's own links are checked by its strict build."""
    links = [target for target, _ in LINK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
             if "://" not in target]
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
    for target, anchor in LINK.findall((ROOT / "README.md").read_text(encoding="utf-8")):
        if anchor and target.endswith(".md") and "://" not in target:
            headings = re.findall(r"^#+ (.+)$", (ROOT / target).read_text(encoding="utf-8"), re.M)
            assert anchor[1:] in {slug(h) for h in headings}, f"README links {target}{anchor}: no such heading"


def slug(heading):
    """A heading's anchor, as GitHub and MkDocs make it (for the headings of these pages)."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).strip().replace(" ", "-")


# ------------------------------------------------------------------ building the manual
def mkdocs_or_skip():
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        pytest.skip('the manual needs the docs extra: pip install -e ".[docs]"')


def build(config, site):
    return children.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config,
                         "--site-dir", site], cwd=Path(config).parent, env=MKDOCS_ENV, timeout=600)


def test_the_manual_builds_strictly(tmp_path):
    """``mkdocs build --strict``, as .ci/run runs it: no warning, and every page and report there."""
    mkdocs_or_skip()
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in DOCS.rglob("*.md"):
        name = page.relative_to(DOCS).with_suffix("").as_posix()
        assert ("index.html" if name == "index" else f"{name}/index.html") in built, name
    for report in (ROOT / "benchmarks" / "results").glob("*.md"):
        assert f"results/{report.stem}/index.html" in built, report.name
    assert not (tmp_path / "site" / "hooks.py").exists()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """A copy of the manual (without its API pages, for speed) builds; with a link to a missing
    page, a missing anchor, a missing report or a file outside docs/, the strict build fails and
    names each."""
    mkdocs_or_skip()
    copy = tmp_path / "repo"
    shutil.copytree(DOCS, copy / "docs", ignore=shutil.ignore_patterns("api"))
    shutil.copytree(ROOT / "benchmarks" / "results", copy / "benchmarks" / "results")
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = re.sub(r"\n  - API reference:\n(      - .*\n)+", "\n", config)
    config = re.sub(r"\n  - mkdocstrings:\n(        .*\n|      .*\n)+", "\n", config)
    assert "api/" not in config and "- mkdocstrings:" not in config
    (copy / "mkdocs.yml").write_text(config, encoding="utf-8")
    for page in (copy / "docs").glob("*.md"):
        page.write_text(re.sub(r"\]\(api/[^)]*\)", "](index.md)", page.read_text(encoding="utf-8")), encoding="utf-8")
    clean = build(copy / "mkdocs.yml", tmp_path / "clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr

    broken = ["engine.md#no-such-section", "no-such-page.md", "../benchmarks/results/no-such-report.md",
              "../tests/project/test_docs.py"]
    page = copy / "docs" / "training.md"
    page.write_text(page.read_text(encoding="utf-8") + "".join(f"\n[broken]({link})\n" for link in broken),
                    encoding="utf-8")
    result = build(copy / "mkdocs.yml", tmp_path / "broken")
    assert result.returncode != 0, result.stdout + result.stderr
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("WARNING")]
    for shown in ["'engine.md#no-such-section'", "'no-such-page.md'", "'results/no-such-report.md'",
                  "'../tests/project/test_docs.py'"]:
        assert any(shown in line for line in warnings), (shown, warnings)
    assert len(warnings) == len(broken), warnings


def test_a_console_block_runs_the_commands_after_its_prompts():
    text = "$ tinyformer study start 4 \\\n    course/\nwrote course/04_attention.py\n$ echo done\ndone\n"
    assert logical_lines(text, "console") == ["tinyformer study start 4 course/", "echo done"]
