"""Kernel modules compiled ahead, on any machine, and loaded on the GPU without compiling.

NVRTC compiles for any architecture without a GPU (``compile_check``). ``cubins.build`` writes every
kernel source's cubin for the architectures asked (sm_80, sm_90, ...) into a folder with a
manifest; a process whose ``TINYFORMER_CUBINS`` names that folder loads the module of its device's
architecture from it (``cupy.RawModule(path=...)``) instead of compiling it with NVRTC on the
device — about 30 s for the tensor-core attention alone, paid again by every process that finds
CuPy's disk cache cold. A module whose sources, geometry or architecture differ from the manifest's
(``module_key``), or that the driver refuses to load, is compiled as before; ``origins()`` says
which happened to each source.

    python -m tinyformer.engine.kernels.cubins FOLDER [--arch sm_80 --arch sm_90]   (no GPU needed)

On the GPU, ``python -m tinyformer.engine.kernels.warm`` loads (or compiles) every module once.
"""

import hashlib
import json
import os
from pathlib import Path

from .. import backend
from . import registry

ENVIRONMENT = "TINYFORMER_CUBINS"
"""The environment variable naming the folder of prebuilt cubins."""
MANIFEST = "manifest.json"
FORMAT = "tinyformer-cubins-1"
DEFAULT_ARCHS = ("sm_80", "sm_90")

_origins = {}  # source -> how its module came to this process: "prebuilt sm_90 (folder)" or "compiled (...)"


def module_key(source, arch):
    """What a module is built from, as a hash: every source and header of the kernel folder (they
    include one another), the geometry's definitions and the architecture. Compiler versions are not
    part of it: a cubin runs on every driver of its architecture's major CUDA version and later."""
    digest = hashlib.sha256(repr((source, arch, registry.compile_options(), "-std=c++17")).encode())
    for path in registry.kernel_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class PrebuiltModule:
    """A loaded cubin and its name expressions' lowered names: ``get_function(expression)`` as
    ``cupy.RawModule``'s, for the same expressions ``launch`` asks a compiled module for."""

    def __init__(self, module, lowered):
        self.module, self.lowered = module, lowered

    def get_function(self, expression):
        return self.module.get_function(self.lowered[expression])


def _entry(source, arch, folder):
    """The manifest's entry for ``source`` on ``arch``, or None (no manifest, another build)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    entry = manifest.get("modules", {}).get(module_key(source, arch))
    return entry if isinstance(entry, dict) and entry.get("source") == source else None


def load(source):
    """The prebuilt module of ``source`` for the current device, or None where ``TINYFORMER_CUBINS``
    is unset, holds no cubin of these sources for this architecture, or the driver refuses it (the
    caller then compiles it). ``origins()`` records which."""
    folder = os.environ.get(ENVIRONMENT)
    arch = backend.compute_capability(capped=False)  # the binary's architecture, whatever the paths' cap
    if not folder or arch is None:
        return None
    entry = _entry(source, arch, Path(folder))
    if entry is None:
        _origins[source] = f"compiled (no cubin of these sources for {arch} in ${ENVIRONMENT})"
        return None
    try:
        module = backend.load_module(str(Path(folder) / entry["file"]))
    except Exception as error:  # the driver's refusal (an older driver, a damaged file): compile instead
        _origins[source] = f"compiled (the prebuilt {entry['file']} did not load: {type(error).__name__})"
        return None
    _origins[source] = f"prebuilt {arch}"
    return PrebuiltModule(module, entry["lowered"])


def origins():
    """{source: how its module came to this process} for the modules looked up so far."""
    return dict(_origins)


def note_compiled(source, seconds):
    """Record that ``source`` was compiled here (``launch``), where no prebuilt module was taken."""
    reason = _origins.get(source, "compiled")
    _origins[source] = f"{reason}, {seconds:.1f} s" if reason.startswith("compiled") else reason
