"""What the docstrings and the manual's pages show of the package still exists.

tests/project/test_docs.py runs the pages' Python blocks, but not the examples inside docstrings, nor the
import lines of blocks it does not run (output blocks, the blocks a machine skips) or of the
prose. Here, read without running anything else:

- every ``from tinyformer... import ...`` and ``import tinyformer...`` statement shown in a
  docstring of the package, in a code block of README.md or docs/**/*.md (whatever its language),
  or in a page's inline code, imports;
- every dotted name ``tinyformer.a.b`` they write resolves to a module or an attribute;
- every file a docstring names (``name.py``, ``tests/test_x.py``, ``kernel.cu``, ...) is a file of
  the repository, by its path or the tail of one, except the CUDA toolkit's headers and the
  placeholders of a file name (``NN_name.py``).
"""

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest
from tests.project.test_docs import blocks_of

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tinyformer"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
IMPORT = re.compile(r"^\s*(?:>>> |\.\.\. )?((?:from\s+tinyformer[\w.]*\s+import\s|import\s+tinyformer\b).*)$")
INLINE_IMPORT = re.compile(r"`((?:from\s+tinyformer[\w.]*\s+import\s|import\s+tinyformer\b)[^`]*)`")
DOTTED = re.compile(r"(?<![\w./-])tinyformer(?:\.[A-Za-z_]\w*)+")
FILE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|cu|cuh|h|js|html|css|ipynb))(?![\w/])")
NOT_OURS = {"cuda.h", "cuda_fp16.h", "cuda_bf16.h"}  # the CUDA toolkit's headers the kernels include
PLACEHOLDER = re.compile(r"(^|/)(NN|DIR)[_/.]")  # templates/NN_name.py: a pattern, not a file


@functools.cache
def docstrings(root=PACKAGE):
    """[(where, text)] of every module, class and function docstring under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node, clean=False)
                if text:
                    line = getattr(node, "lineno", 1)
                    found.append((f"{path.relative_to(root.parent)}:{line}", text))
    return found


def import_statements(text):
    """The import statements shown in ``text``: a line starting one, with the lines after it
    that an open parenthesis or a backslash carries (a doctest's ``>>>`` prompts removed)."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        match = IMPORT.match(line)
        if not match:
            continue
        statement = match.group(1)
        for more in lines[i + 1:i + 20]:
            try:
                ast.parse(statement)
                break
            except SyntaxError:
                statement += "\n" + re.sub(r"^\s*(\.\.\. )?", "", more)
        found.append(statement)
    return found


def shown_imports():
    """[(where, statement)] of every import of the package a docstring or page shows."""
    found = [(where, s) for where, text in docstrings() for s in import_statements(text)]
    for page in PAGES:
        name = page.relative_to(ROOT)
        found += [(f"{name}:{block.line}", s) for block in blocks_of(page) for s in import_statements(block.text)]
        found += [(f"{name}", s) for s in INLINE_IMPORT.findall(page.read_text(encoding="utf-8"))]
    return found


def failed_import(statement):
    """None where ``statement`` runs; else why not (its imports only: the rest of a line is not run)."""
    try:
        tree = ast.parse(statement)
    except SyntaxError as error:
        return f"not Python: {error.msg}"
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module([node], []), "<shown>", "exec"), {})  # noqa: S102
            except ImportError as error:
                if error.name and not error.name.startswith("tinyformer"):
                    pytest.skip(f"{statement!r} needs {error.name}, which is not installed here")
                return f"{type(error).__name__}: {error}"
    return None


def test_every_import_a_docstring_or_a_page_shows_imports():
    shown = shown_imports()
    assert len(shown) > 10
    failures = [f"{where}: {statement!r}: {why}" for where, statement in dict.fromkeys(shown)
                if (why := failed_import(statement))]
    assert failures == [], "imports shown to readers that fail:\n" + "\n".join(failures)


def resolves(name):
    """Whether ``tinyformer.a.b`` is a module, or an attribute of the longest module it starts with."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as error:
            if error.name and not error.name.startswith("tinyformer"):
                pytest.skip(f"{name} needs {error.name}, which is not installed here")
            continue
        for attribute in parts[end:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_every_dotted_name_of_the_package_resolves():
    texts = [*docstrings(), *((str(page.relative_to(ROOT)), page.read_text(encoding="utf-8")) for page in PAGES)]
    named = {}
    for where, text in texts:
        for name in DOTTED.findall(text):
            named.setdefault(name, where)
    assert len(named) > 30
    assert [f"{where}: {name}" for name, where in named.items() if not resolves(name)] == []


def repository_files(root=ROOT):
    skip = {".git", ".venv", "__pycache__", "site", "node_modules"}
    return {path.relative_to(root).as_posix() for path in root.rglob("*")
            if path.is_file() and not skip.intersection(path.relative_to(root).parts)}


def missing_files(texts, files):
    """["where: name"] of the file names in ``texts`` that no file of ``files`` is or ends with."""
    tails = {f"/{f}" for f in files}
    missing = []
    for where, text in texts:
        for name in FILE.findall(text):
            if name in NOT_OURS or PLACEHOLDER.search(name) or name in files:
                continue
            if not any(tail.endswith(f"/{name}") for tail in tails):
                missing.append(f"{where}: {name}")
    return missing


def test_every_file_a_docstring_names_exists():
    assert missing_files(docstrings(), repository_files()) == []


# ---------------------------------------------------------------------------- the checks find stale text
def test_a_stale_import_a_missing_name_and_a_moved_file_are_found():
    doc = ('Example:\n\n    from tinyformer import distributed\n    >>> from tinyformer.engine import (\n'
           '    ...     backend, tensor)\n    import tinyformer as tf; tf.no_grad()\n')
    assert import_statements(doc) == ["from tinyformer import distributed",
                                      "from tinyformer.engine import (\n    backend, tensor)",
                                      "import tinyformer as tf; tf.no_grad()"]
    assert "cannot import name 'distributed'" in failed_import(import_statements(doc)[0])
    assert failed_import(import_statements(doc)[1]) is None and failed_import(import_statements(doc)[2]) is None
    assert resolves("tinyformer.translation.distributed.init") and not resolves("tinyformer.distributed")
    assert not resolves("tinyformer.engine.tensor.NoSuchThing")
    texts = [("a.py:1", "one module per case (mma_probe.py the instructions); tests/engine/kernels/test_emulation.py, "
                        "cuda_fp16.h, templates/NN_name.py, kernels/softmax.cu")]
    assert missing_files(texts, {"tests/engine/kernels/test_emulation.py", "tinyformer/engine/kernels/softmax.cu"}) == [
        "a.py:1: mma_probe.py"]
