"""NVRTC: one kernel source compiled for one architecture to a cubin, without a GPU, its errors,
and its build cache.

``compiled_module(source, arch)`` is what ``cubins.build`` writes for an architecture (the
instantiations it runs, ``registry.instantiations_for``); the options are those CuPy compiles with
at run time (``launch``) plus ptxas's report. CUDA 13's NVRTC no longer targets sm_70: that one
is compiled with CUDA 12's (``nvidia-cuda-nvrtc-cu12``, ``nvrtc_for``). Every compilation is kept
in the build cache (``compiled``), so that the CI check of every architecture
(``python -m tinyformer.testing.compile_check``) and the cubins are one compilation.
"""

import base64
import ctypes
import glob
import hashlib
import json
import os

from . import registry, toolchain


class NvrtcError(RuntimeError):
    """NVRTC is missing or a source did not compile (the message holds the compiler log)."""


def _load_builtins_beside(path):
    """Load the libnvrtc-builtins beside ``path`` into the process first (RTLD_GLOBAL): libnvrtc opens it by
    its bare name when it compiles, which some wheels' layouts (nvidia/cu13/lib) leave the loader unable to
    find unless a library of that name is already loaded (as importing torch does)."""
    folder = os.path.dirname(path)
    for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*")), reverse=True):
        if ".alt." in os.path.basename(builtins):
            continue
        try:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return


class Nvrtc:
    """The few NVRTC entry points we need, through ctypes."""

    def __init__(self, path=None):
        path = path or toolchain.find_nvrtc()
        if not path:
            raise NvrtcError("libnvrtc not found: pip install nvidia-cuda-nvrtc (part of the 'test' extra)")
        _load_builtins_beside(path)
        self.lib = ctypes.CDLL(path)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        self.path = path
        count = ctypes.c_int()
        self._check(self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
        archs = (ctypes.c_int * count.value)()
        self._check(self.lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        self.archs = tuple(archs)

    def targets(self, arch):
        """Whether this NVRTC compiles for ``arch`` ("sm_70")."""
        return int(arch.removeprefix("sm_")) in self.archs

    def _check(self, status, what):
        if status != 0:
            raise NvrtcError(f"{what}: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, source, name, expressions, options):
        """Returns (log, {expression: lowered name}); raises NvrtcError with the log on failure."""
        log, lowered, _ = self.compile_cubin(source, name, expressions, options)
        return log, lowered

    def compile_cubin(self, source, name, expressions, options):
        """Returns (log, {expression: lowered name}, the cubin's bytes); ``options`` must name a real
        architecture (``-arch=sm_XX``) for NVRTC to produce a cubin. Raises NvrtcError with the log on
        failure."""
        program = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            for expression in expressions:
                self._check(self.lib.nvrtcAddNameExpression(program, expression.encode()), "nvrtcAddNameExpression")
            encoded = [o.encode() for o in options]
            status = self.lib.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            buffer = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(program, buffer)
            log = buffer.value.decode(errors="replace")
            if status != 0:
                raise NvrtcError(f"{name} ({' '.join(options)}) failed to compile:\n{log}")
            lowered = {}
            for expression in expressions:
                out = ctypes.c_char_p()
                self._check(self.lib.nvrtcGetLoweredName(program, expression.encode(), ctypes.byref(out)),
                            "nvrtcGetLoweredName")
                lowered[expression] = out.value.decode()
            self._check(self.lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
            return log, lowered, cubin.raw
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(program))


_COMPILED = {}


def compiled(nvrtc, source, expressions, options):
    """``nvrtc.compile_cubin``'s (log, lowered names, cubin), once for the same compiler, sources (the
    file and every header beside it) and options: in memory for this process, and in the build cache
    (``toolchain.cached_product``) for the next one — the tests, the command, the test run's background
    build and ``cubins.build`` ask for the same compilations, which take a minute."""
    text = registry.read_source(source)
    digest = hashlib.sha256(repr((nvrtc.path, nvrtc.version, source, expressions, options)).encode())
    for path in registry.kernel_files():
        digest.update(path.read_bytes())
    key = digest.hexdigest()
    if key not in _COMPILED:
        def compile_into(partial):
            log, lowered, cubin = nvrtc.compile_cubin(text, source, list(expressions), list(options))
            partial.write_text(json.dumps({"log": log, "lowered": lowered, "cubin": base64.b64encode(cubin).decode()}),
                               encoding="utf-8")

        product = toolchain.cached_product(f"nvrtc-cubin-{key[:24]}.json", compile_into)
        stored = json.loads(product.read_text(encoding="utf-8"))
        _COMPILED[key] = stored["log"], stored["lowered"], base64.b64decode(stored["cubin"])
    return _COMPILED[key]


def compile_options(arch, cuda_major=None):
    """NVRTC's options for ``arch``: those CuPy compiles with at run time (``launch``), and ptxas's report;
    the CUDA headers of ``cuda_major`` where given (the compiler's own: CUDA 12's for sm_70)."""
    includes = [f"-I{registry.KERNEL_DIR}"] + [f"-I{d}" for d in toolchain.cuda_include_dirs(cuda_major)]
    return [f"-arch={arch}", "-std=c++17", "-Xptxas", "-v", *includes, *registry.compile_options()]


_FOR_ARCH = {}  # (path of the NVRTC given, arch) -> the Nvrtc that compiles for arch


def nvrtc_for(arch, nvrtc=None):
    """An NVRTC that targets ``arch``: ``nvrtc`` (default: the newest installed) where it does, else
    another CUDA's (sm_70: CUDA 12's wheel); NvrtcError naming the wheel to install otherwise."""
    nvrtc = nvrtc or Nvrtc()
    if nvrtc.targets(arch):
        return nvrtc
    key = (nvrtc.path, arch)
    if key not in _FOR_ARCH:
        for major in toolchain.NVRTC_MAJORS:
            path = toolchain.find_nvrtc(major)
            if path and path != nvrtc.path and (other := Nvrtc(path)).targets(arch):
                _FOR_ARCH[key] = other
                break
        else:
            raise NvrtcError(f"NVRTC {nvrtc.version[0]}.{nvrtc.version[1]} does not target {arch} and no other is "
                             f"installed that does: pip install nvidia-cuda-nvrtc-cu12 (CUDA 12 targets sm_50 to sm_90)")
    return _FOR_ARCH[key]


def compiled_module(source, arch, nvrtc=None):
    """({expression: lowered name}, cubin bytes) of every instantiation of ``source`` that ``arch``
    runs (the compilation the CI check makes, from the same cache); None where it runs none."""
    expressions = tuple(registry.instantiations_for(source, arch))
    if not expressions:
        return None
    compiler = nvrtc_for(arch, nvrtc)
    _, lowered, cubin = compiled(compiler, source, expressions, tuple(compile_options(arch, compiler.version[0])))
    return lowered, cubin
