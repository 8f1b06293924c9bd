"""The CI check of the kernels: every source and every template instantiation compiled with NVRTC
for every architecture a student may have, without a GPU.

    python -m tinyformer.testing.compile_check [-v] [--arch sm_75 --arch sm_90]

NVRTC (the ``nvidia-cuda-nvrtc`` wheel) compiles to a cubin for each architecture; no
driver is needed. Each architecture gets what it runs (``registry.instantiations_for``: sm_70/75
no tensor-core attention and no bfloat16), by default those of every GPU a student may have
(``STUDENT_ARCHS``). CUDA 13's NVRTC no longer targets sm_70: that one is compiled with CUDA 12's
(``nvidia-cuda-nvrtc-cu12``, ``nvrtc.nvrtc_for``). ``-v`` prints, per kernel and architecture,
the registers, spills and static shared memory reported by ptxas (the tensor-core attention's tiles
are dynamic shared memory, not counted there: ``registry.mma_attention_shared_bytes``). Every
source is compiled for every architecture and every failure reported; the exit status is non-zero
when one failed or an attention kernel spills registers. The compilation itself is the engine's
(``engine/kernels/nvrtc.py``, with its build cache: the cubins built ahead are the same one).
"""

import argparse
import re
import sys
from dataclasses import dataclass

from ..engine.kernels import registry
from ..engine.kernels.nvrtc import Nvrtc, NvrtcError, compile_options, compiled, nvrtc_for

STUDENT_ARCHS = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
"""V100, T4 (Colab, Kaggle), A100, RTX 30, RTX 40 / L4, H100."""
DEFAULT_ARCHS = STUDENT_ARCHS


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
                log, lowered, _ = compiled(compiler, source, tuple(expressions),
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
    parser = argparse.ArgumentParser(prog="python -m tinyformer.testing.compile_check",
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
