"""The C++ compiler that the CPU emulation's tests build with, found as
tinyformer/testing/emulation/ finds it: ``$CXX`` when set, else g++, else clang++.

Without one those tests (the PTX layouts, the kernels through the emulation) are skipped on a
developer's machine, and FAIL in CI: .ci/run installs g++ and exports ``TINYFORMER_CI=1``, so that
a missing compiler there is an error instead of a run that passes with the layouts never checked.
A test module asks for it with ``pytestmark = pytest.mark.usefixtures("cxx_compiler")`` (the
fixture is in conftest.py).
"""

import os
import shutil

import pytest

from ci import CI_VARIABLE, CI_VARIABLES, ci_setting  # noqa: F401  (re-exported: conftest keeps CI_VARIABLE in the tests' environment)


def find(environ=None, which=None):
    """The compiler's path, or None: ``$CXX`` (which must then exist), else g++, else clang++."""
    environ = os.environ if environ is None else environ
    which = shutil.which if which is None else which
    if environ.get("CXX"):
        return which(environ["CXX"])
    return which("g++") or which("clang++")


def require(environ=None, which=None):
    """The compiler's path; without one, ``pytest.fail`` in CI and ``pytest.skip`` elsewhere."""
    environ = os.environ if environ is None else environ
    found = find(environ, which)
    if found:
        return found
    wanted = f"CXX={environ['CXX']!r}" if environ.get("CXX") else "g++ or clang++"
    setting = ci_setting(environ)
    if setting:
        pytest.fail(f"{setting} is set but no C++ compiler ({wanted}) is on the PATH: CI must install one "
                    "(.ci/run does, with apt) so that the CPU emulation's tests run", pytrace=False)
    pytest.skip(f"no C++ compiler ({wanted}) for the CPU emulation")
