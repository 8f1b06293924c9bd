"""tinyformer.testing, the verification room, and the one seam through which its CPU emulation of the
kernels reaches the engine (``kernels.launch.install_host_loader``): the library alone runs no kernel
on NumPy arrays; importing ``tinyformer.testing`` installs the emulation, and a loader put in its place
is the one asked. (The emulation's results are engine/kernels/test_emulation.py's; the import rules are
project/test_imports.py's.)"""

import sys

import children
import numpy as np
import pytest

from tinyformer.engine.kernels import launch, softmax as softmax_kernel
from tinyformer.testing import emulation


def test_the_library_installs_no_host_loader_and_importing_testing_installs_the_emulation():
    code = ("import numpy\n"
            "import tinyformer\n"
            "from tinyformer.cli import main\n"  # every command's module is imported lazily: none installs it
            "from tinyformer.engine.kernels import launch, softmax\n"
            "assert launch.host_loader() is None, launch.host_loader()\n"
            "try:\n"
            "    softmax.softmax_forward(numpy.ones((2, 3), numpy.float32))\n"
            "except RuntimeError as error:\n"
            "    print(error)\n"
            "import tinyformer.testing\n"
            "from tinyformer.testing import emulation\n"
            "assert launch.host_loader() is emulation.function\n"
            "assert 'tinyformer.testing.gradcheck_suite' not in __import__('sys').modules\n"
            "print('installed')\n")
    done = children.run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "softmax_forward<float>: launched on NumPy arrays, and no host loader is installed to run it there "
        "(kernels.launch.install_host_loader)", "installed"]


def test_a_launch_on_numpy_arrays_asks_the_installed_loader_for_its_name_expression(monkeypatch):
    calls = []

    def loader(expression):
        def run(grid, block, args, shared_mem=0):
            calls.append((expression, grid, block, len(args), shared_mem))
            args[1][...] = 7.0  # the output: written by the "kernel"
        return run

    assert launch.host_loader() is emulation.function  # the test run's conftest imports tinyformer.testing
    monkeypatch.setattr(launch, "_host_loader", launch.host_loader())  # restored after the test
    assert launch.install_host_loader(loader) is emulation.function
    y = softmax_kernel.softmax_forward(np.ones((2, 3), np.float32))
    assert calls and calls[0][0] == "softmax_forward<float>" and (y == 7.0).all()
    assert launch.install_host_loader(None) is loader
    with pytest.raises(RuntimeError, match=r"^softmax_forward<float>: launched on NumPy arrays, and no host loader"):
        softmax_kernel.softmax_forward(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="install_host_loader: loader must be callable or None, got str"):
        launch.install_host_loader("emulation")
    assert launch.host_loader() is None  # a refused loader leaves the one installed


def test_the_emulation_refuses_a_kernel_it_does_not_build_before_building_anything(monkeypatch):
    monkeypatch.setattr(emulation, "build", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(TypeError, match=r"attention_forward<__nv_bfloat16, 64, 4>: the CPU emulation does not "
                                        r"build this kernel"):
        emulation.function("attention_forward<__nv_bfloat16, 64, 4>")


def test_install_returns_the_loader_it_replaced(monkeypatch):
    monkeypatch.setattr(launch, "_host_loader", None)
    assert emulation.install() is None and launch.host_loader() is emulation.function
    assert emulation.install() is emulation.function
