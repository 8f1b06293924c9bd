"""The test run's slow builds, started in the background as it begins so that they run beside
the first tests instead of inside the tests that need them: the CPU emulation of the kernels
(plain, and under AddressSanitizer when the compiler has its runtime), and every kernel
instantiation compiled with NVRTC for sm_80 and sm_90 where NVRTC is installed. Each product lands
in the kernels' build cache (``toolchain.cached_product``), under a lock: a test that needs one
before it is ready waits for it instead of building it a second time.

Run as ``python tests/background_builds.py``; the test run does that (tests/conftest.py)."""

import shutil
import subprocess
import sys


def main():
    from tinyformer.kernels import compile_check, emulation, toolchain

    cxx = emulation._compiler() if (shutil.which("g++") or shutil.which("clang++")) else None
    if cxx:
        emulation.build(sanitize=False)
    if toolchain.find_nvrtc() is not None and toolchain.cuda_include_dirs():
        compile_check.compile_all()
    if cxx:
        libasan = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
        if libasan.startswith("/"):
            emulation.build(sanitize=True)


if __name__ == "__main__":
    sys.exit(main())
