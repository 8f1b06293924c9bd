"""The test run's slow builds, started in the background as it begins so that they run beside
the first tests instead of inside the tests that need them, in the order the tests need them:

- the CPU emulation of the kernels;
- the trained models of ``trained_models`` and the precision tests' loss curves (into the run's
  shared temporary directory);
- every kernel instantiation compiled with NVRTC for sm_80 and sm_90, where NVRTC is installed;
- the emulation under AddressSanitizer, where the compiler has its runtime.

Each product lands where the tests look for it (the kernels' build cache,
``toolchain.cached_product``; the trained runs' directory, ``trained_models.train_into``), under a
lock: a test that needs one before it is ready waits for it instead of building it again. A
failure here only costs time: the test that needs the product builds it and reports the error.

Run as ``python tests/background_builds.py SHARED_TMP_DIR``; the test run does that
(tests/conftest.py).
"""

import os
import shutil
import sys
from pathlib import Path

import children


def main(shared):
    import trained_models
    from tinyformer.kernels import compile_check, emulation, toolchain

    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if cxx:
        emulation.build(sanitize=False)
    trained_models.train_into(shared, "synthetic", trained_models.SYNTHETIC)
    import test_train_precision
    for run in test_train_precision.CURVE_RUNS:
        test_train_precision.shared_curve(shared, *run)
    if toolchain.find_nvrtc() is not None and toolchain.cuda_include_dirs():
        compile_check.compile_all()
    if cxx:
        libasan = children.run([cxx, "-print-file-name=libasan.so"], timeout=60).stdout.strip()
        if os.path.isabs(libasan) and os.path.exists(libasan):
            emulation.build(sanitize=True)
    data = os.environ.get("TINYFORMER_DATA")
    if data and (Path(data) / "multi30k").is_dir():
        trained_models.train_into(shared, "multi30k", trained_models.MULTI30K)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
