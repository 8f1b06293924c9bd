"""The test run's slow builds, started in the background as it begins so that they run beside
the first tests instead of inside the tests that need them. Two processes, each making its part
in order (``PARTS``):

- ``kernels``: the CPU emulation of the kernels and of the tests' probes (tests/mma_probes.py);
  every kernel instantiation compiled with NVRTC for sm_70, 75, 80, 86, 89 and 90 (what each runs),
  where NVRTC is installed (a failure is left to the test that needs the compilation);
  the emulation under AddressSanitizer, where the compiler has its runtime, with the registry's
  geometry and with the tests' changed one;
- ``training``: the trained models of ``trained_models`` and the precision tests' loss curves
  (into the run's shared temporary directory); then it helps with NVRTC from the other end of
  the list of compilations (each is made once, under its own lock: the two meet in the middle).

Each product lands where the tests look for it (the kernels' build cache,
``toolchain.cached_product``; the trained runs' directory, ``trained_models.train_into``), under a
lock: a test that needs one before it is ready waits for it instead of building it again. A
failure here only costs time: the test that needs the product builds it and reports the error.

So that no test waits with a core idle, the tests that need a product run after all others, in
the order the products are ready (``WAITING``; conftest.py sorts them).

Run as ``python tests/background_builds.py SHARED_TMP_DIR PART``; the test run does that
(tests/conftest.py).
"""

import os
import shutil
import sys
from pathlib import Path

import children

# The tests that wait for a background product, in the order the products are ready: each as
# (product, the fixtures that hold it, words of the ids of tests that need it: those that ask
# for the fixture by name, request.getfixturevalue, are parametrized "trained").
WAITING = (
    ("trained synthetic model", ("trained_synthetic",), ("[trained]", "[trained-")),
    ("precision curves", ("curves",), ()),
    ("trained Multi30k model", ("trained_multi30k",), ("[trained tiny-",)),
    ("NVRTC compilations", (), ("engine/kernels/test_compile.py::test_every_architecture_compiles",
                                "engine/kernels/test_compile.py::test_every_kernel_the_dispatch_reaches",
                                "engine/kernels/test_compile.py::test_compile_check_for_a_t4",
                                "engine/kernels/test_compile.py::test_attention_kernels_do_not_spill",
                                "engine/kernels/test_compile.py::test_compiled_kernels_use_the_registry_geometry",
                                "engine/kernels/test_compile.py::test_compile_check_command",
                                "engine/kernels/test_prebuilt.py::test_build_writes")),
    ("AddressSanitizer emulation", (), ("test_emulation_under_address_sanitizer",)),
)


def waiting_rank(item):
    """Where ``item`` (a pytest item) goes: 0 for a test that needs no background product, else
    1 + the position in WAITING of the last product it needs."""
    fixtures = set(getattr(item, "fixturenames", ()))
    rank = 0
    for position, (_, names, words) in enumerate(WAITING, 1):
        if fixtures.intersection(names) or any(word in item.nodeid for word in words):
            rank = position
    return rank


def _compiler():
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def _nvrtc(reverse=False):
    from tinyformer.engine.kernels import registry, toolchain
    from tinyformer.testing import compile_check
    if toolchain.find_nvrtc() is not None and toolchain.cuda_include_dirs():
        sources = list(registry.KERNELS)
        compile_check.compile_all(sources=sources[::-1] if reverse else sources, failures=[])


def kernels(shared):
    import mma_probes
    import pytest
    from tinyformer.testing import emulation

    cxx = _compiler()
    if cxx:
        emulation.build(sanitize=False)
        mma_probes.build(sanitize=False)
    _nvrtc()
    if cxx:
        libasan = children.run([cxx, "-print-file-name=libasan.so"], timeout=60).stdout.strip()
        if os.path.isabs(libasan) and os.path.exists(libasan):
            emulation.build(sanitize=True)
            mma_probes.build(sanitize=True)
            from tests.engine.kernels import test_emulation
            with pytest.MonkeyPatch.context() as patch:
                test_emulation.change_geometry(patch)
                emulation.build(sanitize=True)


def training(shared):
    import trained_models

    from tests.translation.train import test_precision

    trained_models.train_into(shared, "synthetic", trained_models.SYNTHETIC)
    for precision in test_precision.CURVE_RUNS:
        test_precision.shared_curve(shared, precision)
    data = os.environ.get("TINYFORMER_DATA")
    if data and (Path(data) / "multi30k").is_dir():
        trained_models.train_into(shared, "multi30k", trained_models.MULTI30K)
    _nvrtc(reverse=True)


PARTS = {"kernels": kernels, "training": training}


if __name__ == "__main__":
    sys.exit(PARTS[sys.argv[2]](Path(sys.argv[1])))
