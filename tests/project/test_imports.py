"""No import cycle inside tinyformer: every module's imports, read with ``ast`` (nothing is imported).

The graph has an edge M → T when running M's imports runs module T of the package:

* ``import a.b.c`` runs ``a.b.c`` and the ``__init__`` of each package on the way (``a``, ``a.b``);
* ``from X import n`` runs ``X.n`` when that is a module, else ``X``, whose ``__init__`` must have
  defined ``n`` (so a re-export through a package ``__init__`` is an edge to that ``__init__``, which
  in turn has edges to the modules it re-exports from), and the packages on the way to ``X``;
* relative imports are resolved against M's package (``__init__.py`` is its own package);
* a package that is an ancestor of M is already being imported when M runs, so it is an edge only
  where M asks it for a name that is not a submodule (``from .. import Tensor``); an
  ``if TYPE_CHECKING:`` block runs nothing.

Two graphs are checked: the imports that run when a module is imported (module and class level),
where a cycle is an import-order bug waiting to happen, and the same plus the imports inside
functions, where a cycle means two modules that need each other and hide it with a late import
(the way ``nn/presets.py`` once asked ``nn/transformer.py`` for its arguments). Both must be acyclic.
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "tinyformer"


# ---------------------------------------------------------------------------- the walk
def package_modules(package_dir):
    """{dotted name: (path, is_package)} for every ``.py`` file under ``package_dir``."""
    root = Path(package_dir)
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _ImportCollector(ast.NodeVisitor):
    """(import node, inside a function?) for every import statement that can run."""

    def __init__(self):
        self.found, self._depth = [], 0

    def _function(self, node):
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node):
        if _is_type_checking(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node):
        self.found.append((node, self._depth > 0))

    visit_ImportFrom = visit_Import


def _ancestors(name):
    """'a.b.c' -> ['a', 'a.b']."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _resolve_from(node, module, is_package):
    """The absolute module name ``from <...> import`` refers to."""
    if not node.level:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(package_dir):
    """[(importer, imported, line, lazy)] between modules of the package under ``package_dir``."""
    modules = package_modules(package_dir)
    edges = []
    for module, (path, is_package) in modules.items():
        collector = _ImportCollector()
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        running = set(_ancestors(module)) | ({module} if is_package else set())
        for node, lazy in collector.found:
            if isinstance(node, ast.Import):
                targets = [t for alias in node.names for t in (*_ancestors(alias.name), alias.name)]
                needed = set()
            else:
                source = _resolve_from(node, module, is_package)
                submodules = [f"{source}.{alias.name}" for alias in node.names]
                targets = [*_ancestors(source), source, *(s for s in submodules if s in modules)]
                needed = {source} if any(s not in modules for s in submodules) else set()
            for target in dict.fromkeys(targets):
                if target in modules and target != module and (target not in running or target in needed):
                    edges.append((module, target, node.lineno, lazy))
    return edges


def find_cycles(edges):
    """One cycle per strongly connected component of more than one module, as [m0, m1, ..., m0]."""
    graph = {}
    for importer, imported, _, _ in edges:
        graph.setdefault(importer, []).append(imported)
        graph.setdefault(imported, [])
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:  # Tarjan's algorithm, iteratively
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [_a_cycle_in(component, graph) for component in components]


def _a_cycle_in(component, graph):
    """A shortest cycle through the component's first module (breadth first inside the component)."""
    start = min(component)
    parents, frontier = {start: None}, [start]
    while frontier:
        following = []
        for node in frontier:
            for child in graph[node]:
                if child == start:
                    path = [node]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if child in component and child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def describe(cycle, edges):
    """'a (line 3) -> b (line 9, in a function) -> a': the line of each import taken."""
    lines = {}
    for importer, imported, line, lazy in edges:
        lines.setdefault((importer, imported), (line, lazy))
    steps = []
    for importer, imported in zip(cycle, cycle[1:]):
        line, lazy = lines[importer, imported]
        steps.append(f"{importer} (line {line}{', in a function' if lazy else ''}) -> ")
    return "".join(steps) + cycle[-1]


def check_acyclic(edges, what):
    cycles = find_cycles(edges)
    assert not cycles, f"import cycles among {what}: " + "; ".join(describe(c, edges) for c in cycles)


# ---------------------------------------------------------------------------- tinyformer
@pytest.fixture(scope="module")
def package_edges():
    """tinyformer's import graph, read once for the tests below (a second a walk)."""
    return import_edges(PACKAGE_DIR)


def test_the_walk_sees_the_package(package_edges):
    edges = package_edges
    pairs = {(a, b) for a, b, _, _ in edges}
    assert ("tinyformer", "tinyformer.model.nn") in pairs  # from .model import nn, optim
    assert ("tinyformer.model.nn.transformer", "tinyformer.model.nn.attention") in pairs  # from .attention import ...
    assert ("tinyformer.model.nn.transformer", "tinyformer.engine.functional") in pairs  # from .. import functional as F
    assert not any(b == "tinyformer" for a, b, _, _ in edges if a.startswith("tinyformer.model.nn"))


def test_no_import_cycle_at_import_time(package_edges):
    check_acyclic([e for e in package_edges if not e[3]], "tinyformer's module-level imports")


def test_no_import_cycle_counting_imports_inside_functions(package_edges):
    check_acyclic(package_edges, "tinyformer's imports, those inside functions included")



# The layers, bottom first (docs/architecture.md): a module imports only modules of its own layer and of
# the layers below it, inside functions too. Only the package's own ``__init__`` (the public surface)
# reaches into every layer, and no layer asks it for anything.
LAYERS = ("common", "engine", "model", "translation", "study", "cli")

# The verification room (``tinyformer.testing``, as numpy.testing): it may import every layer, and no module
# of the library imports it, but for the two that run its machinery on a user's request (each with why).
VERIFICATION = "testing"
USERS_OF_VERIFICATION = {
    "tinyformer.cli.gradcheck": "`tinyformer gradcheck` runs the gradcheck suite and the kernels' cases",
    "tinyformer.study.course.flash_kernel": "`tinyformer study trace` runs attention.cu through the CPU emulation",
}


def _layer(module):
    """The layer a module belongs to: ``tinyformer.model.nn.layers`` → ``model``; the root → None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_lives_in_a_layer_and_the_root_holds_at_most_three():
    stray = [name for name in package_modules(PACKAGE_DIR)
             if name != "tinyformer" and _layer(name) not in (*LAYERS, VERIFICATION)]
    assert stray == [], f"modules outside the layer folders {LAYERS} and {VERIFICATION}/: {stray}"
    assert len(list(PACKAGE_DIR.glob("*.py"))) <= 3


MAX_LINES = 500  # no file a reader cannot hold
SOURCE_SUFFIXES = {".py", ".js", ".cu", ".cuh", ".h", ".html", ".css"}


def long_files(package_dir, limit=MAX_LINES):
    """[(relative path, lines)] of the sources under ``package_dir`` longer than ``limit`` lines."""
    root = Path(package_dir)
    return [(path.relative_to(root.parent).as_posix(), lines) for path in sorted(root.rglob("*"))
            if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts
            and (lines := len(path.read_text(encoding="utf-8").splitlines())) > limit]


def test_no_source_file_in_the_package_is_over_500_lines():
    assert long_files(PACKAGE_DIR) == []


def test_a_long_file_is_found(toy):
    root = toy({"engine/kernel.cu": "x\n" * 501, "engine/short.py": "x\n" * 500, "notes.txt": "x\n" * 900})
    assert long_files(root) == [("toy/engine/kernel.cu", 501)]


def test_each_layer_imports_only_itself_and_the_layers_below(package_edges):
    upward = [f"{a} (line {line}{', in a function' if late else ''}) -> {b}" for a, b, line, late in package_edges
              if _layer(a) in LAYERS and _layer(b) != VERIFICATION
              and (_layer(b) is None or LAYERS.index(_layer(b)) > LAYERS.index(_layer(a)))]
    assert upward == [], "imports against the layers " + " < ".join(LAYERS) + ": " + "; ".join(upward)


def test_nothing_in_the_library_imports_the_verification_room_but_its_two_users(package_edges):
    """tinyformer.testing imports the library; the library (its root included) does not import it, inside
    functions neither, except ``USERS_OF_VERIFICATION``. It is no layer: nothing may build on it."""
    found = [f"{a} (line {line}{', in a function' if late else ''}) -> {b}" for a, b, line, late in package_edges
             if _layer(b) == VERIFICATION and _layer(a) != VERIFICATION and a not in USERS_OF_VERIFICATION]
    assert found == [], f"imports of tinyformer.{VERIFICATION} from the library: " + "; ".join(found)
    users = {a for a, b, _, _ in package_edges if _layer(b) == VERIFICATION and _layer(a) != VERIFICATION}
    assert users == set(USERS_OF_VERIFICATION), f"the allowed users of tinyformer.{VERIFICATION}: {sorted(users)}"
    assert any(_layer(a) == VERIFICATION and _layer(b) == "model" for a, b, _, _ in package_edges)


def toy_edges(toy, files):
    """The import edges of a toy package of ``files``, its modules named as tinyformer's."""
    return [(a.replace("toy", "tinyformer", 1), b.replace("toy", "tinyformer", 1), line, late)
            for a, b, line, late in import_edges(toy(files))]


def test_the_verification_rule_finds_an_import_of_it_from_the_engine(toy):
    edges = toy_edges(toy, {"engine/__init__.py": "", "engine/tensor.py": "def f():\n    from ..testing import cases\n",
                            "testing/__init__.py": "", "testing/cases.py": "from ..engine import tensor\n",
                            "cli/__init__.py": "", "cli/gradcheck.py": "from ..testing import cases\n"})
    with pytest.raises(AssertionError, match=r"from the library: tinyformer.engine.tensor \(line 2, in a function\) "
                                             r"-> tinyformer.testing; "):
        test_nothing_in_the_library_imports_the_verification_room_but_its_two_users(edges)
    test_each_layer_imports_only_itself_and_the_layers_below(edges)  # testing -> engine is no upward import


def _part(module):
    """A part of the engine (``tinyformer.engine.kernels.softmax`` → ``kernels``, ``tinyformer.engine.tensor`` →
    ``tensor``); None outside the engine."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "engine" else None


def test_the_parts_of_the_engine_import_one_way(package_edges):
    """Inside the engine, the parts (functional/, kernels/, ops/, backend, tensor, ...) form no circle,
    not even through modules that themselves form none (kernels/ asks nothing of functional/)."""
    edges = [(_part(a), _part(b), line, late) for a, b, line, late in package_edges
             if _part(a) and _part(b) and _part(a) != _part(b)]
    check_acyclic([(f"engine.{a}", f"engine.{b}", line, late) for a, b, line, late in edges],
                  "the parts of tinyformer's engine")
    parts = {(a, b) for a, b, _, _ in edges}
    assert ("functional", "kernels") in parts and ("kernels", "backend") in parts
    assert not {("kernels", "functional"), ("backend", "kernels"), ("backend", "tensor")} & parts


def test_the_layer_rule_finds_an_upward_import(toy):
    edges = toy_edges(toy, {"engine/__init__.py": "", "engine/tensor.py": "def f():\n    from ..model import nn\n",
                            "model/__init__.py": "", "model/nn.py": "from ..engine import tensor\n"})
    with pytest.raises(AssertionError, match=r"tinyformer.engine.tensor \(line 2, in a function\) -> "
                                             r"tinyformer.model"):
        test_each_layer_imports_only_itself_and_the_layers_below(edges)

# The CUDA graph capture emulated on NumPy arrays and its device memory are test machinery
# (tinyformer.testing.emulated_capture): they reach the library through one seam, the capture that
# ``translation.train.graphs.open_capture`` returns and its ``backend.capturing(memory=...)``, and
# no op, optimiser or backend function looks for them. The C++ emulation of the CUDA kernels
# (``tinyformer.testing.emulation``: cpu_emulation.h and its parts, its ctypes functions) reaches the
# engine through one seam too, ``kernels.launch.install_host_loader``: the engine and the model
# name none of its machinery (the kernels' sources keep their ``TF_CPU_EMULATION`` branches, and
# the word "emulation" may describe it).
TEST_MACHINERY = re.compile(
    r"EmulatedCapture|emulated_capture|DeviceArray|emulated[ _-]?(device|capture)"
    r"|cpu_emulation\w*\.h|EmulatedFunction|EmulationError|testing[./]emulation|import[^\n]*\bemulation\b"
    r"|\bemulation\.(function|build|library|install|symbol|translation_unit|header_files)\b", re.I)


def names_of_test_machinery(directory):
    """['path:line: text'] of every line under ``directory`` naming the emulated capture or its memory,
    or the kernels' CPU emulation's machinery."""
    return [f"{path.relative_to(directory.parent)}:{number}: {line.strip()}"
            for path in sorted(directory.rglob("*")) if path.is_file() and "__pycache__" not in path.parts
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if TEST_MACHINERY.search(line)]


@pytest.mark.parametrize("layer", ["engine", "model"])
def test_the_engine_and_the_model_name_no_emulated_capture(layer):
    assert names_of_test_machinery(PACKAGE_DIR / layer) == []


def test_the_check_for_test_machinery_finds_its_names(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "a.py").write_text("x = 1\nkind = type(first)  # the emulated device memory\n")
    (tmp_path / "b.py").write_text("from tests.emulated_capture import DeviceArray\n")
    (tmp_path / "c.cuh").write_text("// builds against cpu_emulation_warp.h on the CPU\n")
    (tmp_path / "d.py").write_text("from . import emulation, paths\nf = emulation.function(e)\n")
    assert names_of_test_machinery(tmp_path) == [
        f"{tmp_path.name}/b.py:1: from tests.emulated_capture import DeviceArray",
        f"{tmp_path.name}/c.cuh:1: // builds against cpu_emulation_warp.h on the CPU",
        f"{tmp_path.name}/d.py:1: from . import emulation, paths",
        f"{tmp_path.name}/d.py:2: f = emulation.function(e)",
        f"{tmp_path.name}/ops/a.py:2: kind = type(first)  # the emulated device memory"]
    assert not TEST_MACHINERY.search("registry.emulated_instantiations(): the kernels' CPU emulation")
    assert not TEST_MACHINERY.search("#ifdef TF_CPU_EMULATION  // the CPU emulation's header defines it")


# ---------------------------------------------------------------------------- the walk itself
def write_package(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def toy(tmp_path):
    return lambda files: write_package(tmp_path / "toy", {"__init__.py": "", **files})


def test_a_cycle_is_found_and_named_with_its_lines(toy):
    root = toy({"a.py": "from . import b\n", "b.py": "import os\n\nfrom .c import thing\n",
                "c.py": "from .a import other\n"})
    edges = import_edges(root)
    with pytest.raises(AssertionError) as error:
        check_acyclic(edges, "toy")
    assert "toy.a (line 1) -> toy.b (line 3) -> toy.c (line 1) -> toy.a" in str(error.value)


def test_a_late_import_closes_a_cycle_only_in_the_full_graph(toy):
    root = toy({"a.py": "from .b import B\n", "b.py": "def f():\n    from .a import A\n"})
    edges = import_edges(root)
    check_acyclic([e for e in edges if not e[3]], "toy")
    with pytest.raises(AssertionError, match=r"toy.b \(line 2, in a function\) -> toy.a"):
        check_acyclic(edges, "toy")


def test_a_reexport_through_a_package_init_is_an_edge_to_that_init(toy):
    root = toy({"sub/__init__.py": "from .inner import Thing\n", "sub/inner.py": "from ..user import helper\n",
                "user.py": "from .sub import Thing\n"})
    edges = import_edges(root)
    assert {(a, b) for a, b, _, _ in edges} == {("toy.sub", "toy.sub.inner"), ("toy.sub.inner", "toy.user"),
                                                ("toy.user", "toy.sub")}
    assert find_cycles(edges) == [["toy.sub", "toy.sub.inner", "toy.user", "toy.sub"]]


def test_plain_imports_relative_levels_and_type_checking(toy):
    root = toy({"sub/__init__.py": "", "sub/deep.py": "from .. import x\nimport toy.other\n",
                "other.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import deep\n",
                "x.py": "import json\n"})
    # toy and toy.sub are already running when toy.sub.deep runs, and x is a submodule: no edge to them
    assert {(a, b) for a, b, _, _ in import_edges(root)} == {("toy.sub.deep", "toy.x"), ("toy.sub.deep", "toy.other")}


def test_a_name_asked_of_a_running_ancestor_package_is_an_edge(toy):
    root = toy({"__init__.py": "from .sub import thing\nVALUE = 1\n", "sub.py": "from . import VALUE\n"})
    assert find_cycles(import_edges(root)) == [["toy", "toy.sub", "toy"]]


# ---------------------------------------------------------------------------- the public names
# ``dir(tinyformer)`` before the package was re-rooted into layer folders (issue 47): still all there.
PUBLIC_NAMES = [
    "Function", "GradcheckError", "GradcheckReport", "Tensor", "abs", "amp", "backend", "backward", "broadcast_to",
    "clip", "concat", "enable_grad", "exp", "filecache", "functional", "grad", "gradcheck", "is_grad_enabled",
    "kernels", "log", "manual_seed", "masked_fill", "matmul", "max", "mean", "min", "nn", "no_grad", "ops", "optim",
    "random", "relu", "reshape", "sqrt", "stack", "sum", "swapaxes", "tanh", "tensor", "transpose", "validation",
    "var", "where"]


def test_import_tinyformer_gives_the_names_it_always_gave():
    import tinyformer as tf

    assert not [name for name in PUBLIC_NAMES if not hasattr(tf, name)]
    assert callable(tf.gradcheck) and callable(tf.tensor)
