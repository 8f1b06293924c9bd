"""Loading the repository's scripts (benchmarks/, examples/) in tests: they are files, not
modules of the package."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script(relative_path, name=None):
    """A fresh module executed from ``ROOT / relative_path``, named ``name`` (default: the file's stem)."""
    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
