"""The architecture page's tree of the package (docs/architecture.md) is the package's tree.

The tree is the ```text block after "The package's own `__init__.py` is the public surface". It
stays prose, read by these rules:

- An **entry** is a name at the start of a line, indented two spaces per level below the folder
  entry it belongs to (``tinyformer/``, ``tests/``, ... at the margin); what follows it on its line,
  and on the lines indented at least as far as that text (its continuation lines), annotates it.
- Every file name with a source or notebook suffix (``.py``, ``.cu``, ``.cuh``, ``.h``, ``.js``, ``.html``,
  ``.css``, ``.ipynb``, ``.md``) and every ``folder/`` in an annotation is a **mention**, read in the
  entry's folder (a folder entry's own, a file entry's parent); ``kernels/mma_probe.cu`` goes down
  from there. A path starting with a top-level folder of the repository (``tests/``,
  ``tinyformer/``, ...) is read from the repository's root.
- Every entry and mention must exist where it is read (a name in the wrong folder fails), and
  every file and folder of ``tinyformer/`` must be named (its source files, not ``__pycache__``;
  a package's ``__init__.py`` and ``__main__.py`` only where the page has something to say of them).

So a module added, moved or removed without its line on the page fails here, naming it. Two
further claims of the page are checked against the code: the paths its prose writes in
backquotes exist, and its list of the modules that import CuPy is the list of those that do.
"""

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = "tinyformer"
ANCHOR = "The package's own `__init__.py` is the public surface"
SUFFIXES = (".py", ".cu", ".cuh", ".h", ".js", ".html", ".css", ".ipynb", ".md")
PACKAGE_SUFFIXES = {".py", ".cu", ".cuh", ".h", ".js", ".html", ".css"}  # the package's files the tree names
UNNAMED = {"__init__.py", "__main__.py"}  # a package's own: its folder's entry stands for them
MENTION = re.compile(r"(?<![\w./-])((?:[\w-]+/)*(?:[\w-]+(?:" + "|".join(re.escape(s) for s in SUFFIXES)
                     + r")|[\w-]+/))(?![\w/])")
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>\S+)(?P<gap> *)(?P<annotation>.*)$")


class TreeError(ValueError):
    """A line of the tree that is not an entry, a continuation or in its folder."""


@dataclass(frozen=True)
class Named:
    path: str  # from the repository root; a folder ends in "/"
    line: int  # of the page
    entry: bool  # an entry (else a mention in an annotation)


def tree_block(text):
    """(first line number, lines) of the ```text block after ANCHOR."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if ANCHOR in line), None)
    if start is None:
        raise TreeError(f"{PAGE.name}: no paragraph with {ANCHOR!r} before the tree")
    fence = next(i for i in range(start, len(lines)) if lines[i].strip() == "```text")
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```")
    return fence + 2, lines[fence + 1:end]


def parse_tree(lines, first_line=1, top_level=()):
    """Every Named path of the tree's lines (see the module docstring)."""
    named, folders, entry = [], [], None  # folders[d]: the folder entry at depth d; entry: (folder, column)
    for number, line in enumerate(lines, first_line):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if entry is None or entry[1] is None or indent < entry[1]:
            match = ENTRY.match(line)
            depth, name = len(match["indent"]) // 2, match["name"]
            if indent % 2 or depth > len(folders):
                raise TreeError(f"line {number}: {name!r} is indented {indent} spaces, not two per level "
                                f"below a folder entry, nor as far as the annotation it would continue")
            folders = folders[:depth]
            path = "".join(folders) + name
            named.append(Named(path, number, True))
            if name.endswith("/"):
                folders.append(name)
            folder = path if name.endswith("/") else "".join(folders)
            entry = (folder, indent + len(name) + len(match["gap"]) if match["annotation"] else None)
            text = match["annotation"]
        else:
            text = line
        for mention in MENTION.findall(text):
            top = mention.split("/", 1)[0] + "/"
            named.append(Named(mention if top in top_level else entry[0] + mention, number, False))
    return named


def top_level_folders(root=ROOT):
    return {p.name + "/" for p in root.iterdir() if p.is_dir()}


def package_paths(root=ROOT, package=PACKAGE):
    """The package's folders and its files the tree must name, from the repository root."""
    found = set()
    for path in (root / package).rglob("*"):
        relative = path.relative_to(root)
        if "__pycache__" in relative.parts:
            continue
        if path.is_dir() and any(p.suffix in PACKAGE_SUFFIXES for p in path.rglob("*")):
            found.add(relative.as_posix() + "/")
        elif path.suffix in PACKAGE_SUFFIXES and path.name not in UNNAMED:
            found.add(relative.as_posix())
    return found


def exists(path, root=ROOT):
    return (root / path).is_dir() if path.endswith("/") else (root / path).is_file()


def drift(named, root=ROOT, package=PACKAGE):
    """(paths of the package the tree does not name, "line N: path" named where nothing is)."""
    paths = {n.path for n in named}
    missing = sorted(package_paths(root, package) - paths)
    absent = [f"line {n.line}: {n.path}" for n in named if not exists(n.path, root)]
    return missing, absent


def page_tree(text=None):
    first, lines = tree_block(PAGE.read_text(encoding="utf-8") if text is None else text)
    return parse_tree(lines, first, top_level_folders())


def test_the_tree_names_every_module_and_folder_of_the_package_where_it_is():
    missing, absent = drift(page_tree())
    assert (missing, absent) == ([], []), (
        f"{PAGE.relative_to(ROOT)}'s tree is not the package's: it does not name {missing} (add each in its "
        f"folder's entry), and names what is not there (moved, renamed, removed, or under the wrong folder): {absent}")


def test_the_tree_is_read_whole():
    """Each layer and the repository's other folders are entries; every entry and continuation
    line was read (a line indented neither way raises TreeError in page_tree)."""
    named = page_tree()
    entries = {n.path for n in named if n.entry}
    assert {f"{PACKAGE}/{layer}/" for layer in ("common", "engine", "model", "translation", "study", "cli")} <= entries
    assert {"tests/", "examples/", "benchmarks/", "docs/"} <= entries
    assert len(named) > len(package_paths()), "a mention of each file and folder, and the tests' and examples'"


# ---------------------------------------------------------------------------- the reading, on a toy
TOY_TREE = """\
pkg/
  __init__.py       the surface
  core/             a.py (the first), b.py, and
                    sub/ with sub/c.py and sub/d.js; see tests/test_core.py
    e.py            e; f.py beside it
tests/            test_core.py
"""
TOY_FILES = ["pkg/__init__.py", "pkg/core/__init__.py", "pkg/core/a.py", "pkg/core/b.py", "pkg/core/sub/c.py",
             "pkg/core/sub/d.js", "pkg/core/e.py", "pkg/core/f.py", "tests/test_core.py", "pkg/core/data.bin"]


def toy(tmp_path, tree=TOY_TREE, files=TOY_FILES):
    """drift() of ``tree`` over a fresh repository holding ``files``."""
    root = tmp_path / str(len(list(tmp_path.iterdir())))
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("", encoding="utf-8")
    return drift(parse_tree(tree.splitlines(), 1, top_level_folders(root)), root, "pkg")


def test_a_toy_tree_is_read_entry_by_entry_each_name_in_its_folder(tmp_path):
    named = parse_tree(TOY_TREE.splitlines(), 1, {"pkg/", "tests/"})
    assert [(n.path, n.line) for n in named if n.entry] == [
        ("pkg/", 1), ("pkg/__init__.py", 2), ("pkg/core/", 3), ("pkg/core/e.py", 5), ("tests/", 6)]
    assert [(n.path, n.line) for n in named if not n.entry] == [
        ("pkg/core/a.py", 3), ("pkg/core/b.py", 3), ("pkg/core/sub/", 4), ("pkg/core/sub/c.py", 4),
        ("pkg/core/sub/d.js", 4), ("tests/test_core.py", 4), ("pkg/core/f.py", 5), ("tests/test_core.py", 6)]
    assert toy(tmp_path) == ([], [])  # data.bin and core's __init__.py need no name


def test_a_missing_a_misplaced_and_an_absent_module_are_named(tmp_path):
    assert toy(tmp_path, files=TOY_FILES + ["pkg/core/new.py", "pkg/extra/g.py"]) == (
        ["pkg/core/new.py", "pkg/extra/", "pkg/extra/g.py"], [])
    beside = TOY_TREE.replace("e; f.py beside it", "e; f.py beside it, b.py")  # in core/e.py's line: core's
    assert toy(tmp_path, beside) == ([], [])
    wrong = TOY_TREE.replace("a.py (the first), b.py", "a.py (the first), sub/b.py")
    assert toy(tmp_path, wrong) == (["pkg/core/b.py"], ["line 3: pkg/core/sub/b.py"])
    flat = TOY_TREE.replace("sub/ with sub/c.py and sub/d.js", "sub/ with c.py and d.js")
    assert toy(tmp_path, flat) == (["pkg/core/sub/c.py", "pkg/core/sub/d.js"],
                                   ["line 4: pkg/core/c.py", "line 4: pkg/core/d.js"])
    gone = TOY_TREE.replace("see tests/test_core.py", "see tests/test_gone.py")
    assert toy(tmp_path, gone) == ([], ["line 4: tests/test_gone.py"])


@pytest.mark.parametrize("tree", [
    "pkg/\n   a.py    three spaces\n",
    "pkg/\n    a.py    two levels at once\n",
    "pkg/\n  a.py              an annotation\n          continued less far than it\n",
])
def test_a_line_indented_neither_as_an_entry_nor_as_a_continuation_is_refused(tree):
    with pytest.raises(TreeError, match="line 2|line 3"):
        parse_tree(tree.splitlines(), 1, {"pkg/"})


# ---------------------------------------------------------------------------- the page's other claims
BACKQUOTED_PATH = re.compile(r"`([\w.-]*[\w-](?:/[\w.-]+)*/?)`")


def prose(text):
    """The page without its fenced blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


@functools.cache
def bases(root=ROOT):
    """The folders a path in the prose may start from: the root, and every folder of the package."""
    return [p for p in (root, root / PACKAGE, *(root / PACKAGE).rglob("*/")) if "__pycache__" not in p.parts]


def resolves(path, root=ROOT):
    """A path as the prose writes it: from the root, from a layer, or from a folder deeper down."""
    path = (PAGE.parent / path).resolve().relative_to(root).as_posix() if path.startswith("../") else path
    return any((base / path).exists() for base in bases(root))


def test_the_paths_in_the_pages_prose_exist():
    paths = [p for p in BACKQUOTED_PATH.findall(prose(PAGE.read_text(encoding="utf-8")))
             if ("/" in p or p.endswith(SUFFIXES)) and not re.fullmatch(r"\.\w+", p)]  # not a bare `.md`
    assert len(paths) > 30
    assert [p for p in paths if not resolves(p)] == []
    assert not resolves("train/no_such_module.py") and not resolves("kernels/layers.py")


def imports_of(path):
    """The top modules every import statement of a file names (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module.split(".")[0])
    return found


CUPY_MODULES = {"cupy", "cupyx", "cupy_backends"}


def test_the_modules_that_import_cupy_are_those_the_page_names():
    """The sentence "CuPy is imported by ..." names each module of the package that imports
    cupy, cupyx or cupy_backends, and no other."""
    [sentence] = re.findall(r"CuPy is imported by .*?\.(?=\s|$)", " ".join(PAGE.read_text(encoding="utf-8").split()))
    named = {path for path in BACKQUOTED_PATH.findall(sentence) if path.endswith(".py")}
    importing = {path.relative_to(ROOT / PACKAGE).as_posix() for path in sorted((ROOT / PACKAGE).rglob("*.py"))
                 if "cupy" in path.read_text(encoding="utf-8") and imports_of(path) & CUPY_MODULES}
    assert importing, "no module imports CuPy?"
    unnamed = sorted(p for p in importing if not any(p == n or p.endswith("/" + n) for n in named))
    wrong = sorted(n for n in named if not any(p == n or p.endswith("/" + n) for p in importing))
    assert (unnamed, wrong) == ([], []), f"{PAGE.name}: modules importing CuPy it does not name, names that do not"
