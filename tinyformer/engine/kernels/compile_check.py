"""Compile every kernel and every template instantiation with NVRTC, without a GPU.

    python -m tinyformer.engine.kernels.compile_check [-v] [--arch sm_75 --arch sm_90]

NVRTC (the ``nvidia-cuda-nvrtc`` wheel) compiles to a cubin for each architecture; no
driver is needed. Each architecture gets what it runs (``registry.instantiations_for``: sm_70/75
no tensor-core attention and no bfloat16), by default those of every GPU a student may have
(``STUDENT_ARCHS``). CUDA 13's NVRTC no longer targets sm_70: that one is compiled with CUDA 12's
(``nvidia-cuda-nvrtc-cu12``, ``toolchain.find_nvrtc``). ``-v`` prints, per kernel and architecture,
the registers, spills and static shared memory reported by ptxas (the tensor-core attention's tiles
are dynamic shared memory, not counted there: ``registry.mma_attention_shared_bytes``). Every
source is compiled for every architecture and every failure reported; the exit status is non-zero
when one failed or an attention kernel spills registers.
"""

import argparse
import base64
import ctypes
import glob
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass

from . import registry, toolchain

STUDENT_ARCHS = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
"""V100, T4 (Colab, Kaggle), A100, RTX 30, RTX 40 / L4, H100."""
DEFAULT_ARCHS = STUDENT_ARCHS


class NvrtcError(RuntimeError):
    """NVRTC is missing or a source did not compile (the message holds the compiler log)."""


@dataclass
class KernelReport:
    source: str
    arch: str
    expression: str
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int

    @property
    def spills(self):
        return self.spill_stores + self.spill_loads

    @property
    def dynamic_shared_bytes(self):
        """The launch's dynamic shared memory (the tensor-core attention's tiles), 0 for the others."""
        name, _, args = self.expression.partition("<")
        if self.source != "attention_mma.cu":
            return 0
        return registry.mma_attention_shared_bytes(name, int(args.split(",")[1]))


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


_FUNCTION = re.compile(r"Function properties for (\S+)")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Compiling entry function '(\S+)'|Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log):
    """{mangled name: (registers, spill stores, spill loads, shared bytes)} from ptxas -v output."""
    stats, current = {}, None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            current = m.group(1)
            stats[current] = [0, 0, 0, 0]
        elif current and (m := _SPILLS.search(line)):
            stats[current][1:3] = int(m.group(1)), int(m.group(2))
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            stats[current][0] = int(m.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                stats[current][3] = int(s.group(1))
    return {k: tuple(v) for k, v in stats.items()}


_COMPILED = {}


def _compiled(nvrtc, source, expressions, options):
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
    runs (the compilation ``compile_all`` makes, from the same cache); None where it runs none."""
    expressions = tuple(registry.instantiations_for(source, arch))
    if not expressions:
        return None
    compiler = nvrtc_for(arch, nvrtc)
    _, lowered, cubin = _compiled(compiler, source, expressions, tuple(compile_options(arch, compiler.version[0])))
    return lowered, cubin


@dataclass
class Failure:
    """A source that did not compile for an architecture: ``message`` holds the compiler's first errors."""
    source: str
    arch: str
    message: str


def _first_errors(message, count=3):
    """The first ``count`` error lines of a compiler log, and how many there were."""
    errors = [line.strip() for line in message.splitlines() if "error" in line.lower()]
    if not errors:
        return message.splitlines()[0] if message else "failed"
    return "; ".join(errors[:count]) + (f" (and {len(errors) - count} more errors)" if len(errors) > count else "")


def compile_all(archs=DEFAULT_ARCHS, sources=None, nvrtc=None, only=None, failures=None):
    """Compile each source for each architecture, what that architecture runs
    (``registry.instantiations_for``); returns the per-kernel reports. ``only``: the instantiations
    to compile (name expressions), where not every one is wanted. ``failures``: a list to append
    every ``Failure`` to and go on; without it the first failure raises NvrtcError."""
    nvrtc = nvrtc or Nvrtc()
    reports = []
    for source in sources or registry.KERNELS:
        for arch in archs:
            expressions = [e for e in registry.instantiations_for(source, arch) if only is None or e in only]
            if not expressions:
                continue
            try:
                compiler = nvrtc_for(arch, nvrtc)
                log, lowered, _ = _compiled(compiler, source, tuple(expressions),
                                            tuple(compile_options(arch, compiler.version[0])))
            except NvrtcError as error:
                if failures is None:
                    raise
                failures.append(Failure(source, arch, _first_errors(str(error))))
                continue
            stats = parse_ptxas(log)
            for expression in expressions:
                regs, stores, loads, smem = stats.get(lowered[expression], (0, 0, 0, 0))
                reports.append(KernelReport(source, arch, expression, regs, stores, loads, smem))
    return reports


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tinyformer.engine.kernels.compile_check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="registers, spills and shared memory per kernel and architecture")
    parser.add_argument("--arch", action="append",
                        help=f"target architecture (repeatable; default {', '.join(DEFAULT_ARCHS)})")
    args = parser.parse_args(argv)
    archs = tuple(args.arch or DEFAULT_ARCHS)
    failures = []
    try:
        for arch in archs:
            registry.instantiations_for("softmax.cu", arch)  # a malformed name: one line, before compiling
        nvrtc = Nvrtc()
        reports = compile_all(archs, nvrtc=nvrtc, failures=failures)
    except (NvrtcError, ValueError) as error:
        print(f"compile_check: {error}", file=sys.stderr)
        return 1
    for arch in archs:
        mine = [r for r in reports if r.arch == arch]
        print(f"{arch}: {len(mine)} kernel instantiations compiled from "
              f"{len({r.source for r in mine})} sources{_compiler_of(arch, nvrtc)}"
              + (f", {sum(f.arch == arch for f in failures)} sources failed" if any(f.arch == arch for f in failures)
                 else ""))
    if args.verbose:
        print(f"{'arch':6} {'kernel':52} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'smem':>7} {'dyn smem':>9}")
        for r in sorted(reports, key=lambda r: (r.expression, r.arch)):
            print(f"{r.arch:6} {r.expression:52} {r.registers:5d} {r.spill_stores:9d} {r.spill_loads:9d} "
                  f"{r.shared_bytes:7d} {r.dynamic_shared_bytes:9d}")
    for f in failures:
        print(f"compile_check: {f.source} failed for {f.arch}: {f.message}", file=sys.stderr)
    spilling = [r for r in reports if r.source in ("attention.cu", "attention_mma.cu") and r.spills]
    for r in spilling:
        print(f"compile_check: {r.expression} spills {r.spills} bytes on {r.arch}", file=sys.stderr)
    return 1 if spilling or failures else 0


def _compiler_of(arch, nvrtc):
    try:
        version = nvrtc_for(arch, nvrtc).version
    except NvrtcError:
        return ""
    return f" (NVRTC {version[0]}.{version[1]})"


if __name__ == "__main__":
    sys.exit(main())
