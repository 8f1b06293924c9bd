"""Cubins built ahead, on the CPU: every kernel source compiled with NVRTC for the architectures
asked into a folder with a manifest, which ``prebuilt`` loads on a GPU (``$TINYFORMER_CUBINS``)
instead of compiling there.

    python -m tinyformer.engine.kernels.cubins FOLDER [--arch sm_80 --arch sm_90]   (no GPU needed)

The compilation is ``nvrtc.compiled_module`` (the same NVRTC options and build cache as CI's
compile check, ``tinyformer.testing.compile_check``): the check and the cubins are one compilation.
Each cubin is checked to hold every instantiation's symbol (``cubin_symbols`` reads its ELF symbol
table) before the manifest names it.
"""

import argparse
import json
import struct
import sys
import time
from pathlib import Path

from ...common import atomic
from . import nvrtc as nvrtc_compiler, registry
from .prebuilt import DEFAULT_ARCHS, FORMAT, MANIFEST, module_key


def cubin_symbols(data):
    """The names of the symbols of an ELF64 file's symbol table (a cubin's kernels among them); a
    ValueError when ``data`` is not a little-endian ELF64 file for CUDA (e_machine 190)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    machine, = struct.unpack_from("<H", data, 18)
    if machine != 190:
        raise ValueError(f"ELF machine {machine}, not CUDA (190)")
    section_offset, = struct.unpack_from("<Q", data, 40)
    entry_size, count = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    names = []
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings_offset = sections[link][4]
        for start in range(offset, offset + size, symbol_size):
            name_offset, = struct.unpack_from("<I", data, start)
            end = data.index(b"\0", strings_offset + name_offset)
            names.append(data[strings_offset + name_offset:end].decode())
    return names


def build(folder, archs=DEFAULT_ARCHS, nvrtc=None):
    """Compile every kernel source for each of ``archs`` with NVRTC (no GPU needed) into ``folder``:
    one ``<source>.<arch>.cubin`` each, of the instantiations that architecture runs
    (``registry.instantiations_for``; none of attention_mma.cu below sm_80), and the manifest.
    Returns the manifest."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    nvrtc = nvrtc or nvrtc_compiler.Nvrtc()
    modules = {}
    for source in registry.KERNELS:
        for arch in archs:
            module = nvrtc_compiler.compiled_module(source, arch, nvrtc)  # what arch runs of it (None: nothing)
            if module is None:
                continue
            lowered, cubin = module
            missing = sorted(set(lowered.values()) - set(cubin_symbols(cubin)))
            if missing:
                raise ValueError(f"cubins: the cubin of {source} for {arch} lacks {missing[0]}")
            name = f"{source}.{arch}.cubin"
            atomic.write_atomically(folder / name, cubin)
            modules[module_key(source, arch)] = {"source": source, "arch": arch, "file": name, "lowered": lowered}
    manifest = {"format": FORMAT, "nvrtc": ".".join(map(str, nvrtc.version)), "modules": modules}
    atomic.write_atomically(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return manifest


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tinyformer.engine.kernels.cubins",
                                     description="compile every kernel source into FOLDER with NVRTC (no GPU needed)")
    parser.add_argument("folder")
    parser.add_argument("--arch", action="append", help="target architecture (repeatable; default sm_80, sm_90)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        manifest = build(args.folder, tuple(args.arch or DEFAULT_ARCHS))
    except nvrtc_compiler.NvrtcError as error:
        print(f"cubins: {error}", file=sys.stderr)
        return 1
    print(f"cubins: {len(manifest['modules'])} cubins (NVRTC {manifest['nvrtc']}) in {args.folder}, "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
