"""Kernel modules built ahead with NVRTC on the CPU (``kernels.prebuilt``) and loaded on a GPU
without compiling: the cubins hold every instantiation, the loader takes the cubin of the device's
architecture and falls back to compiling where it has none or the driver refuses it."""

import json
import os
import struct

import pytest
from ci import in_ci

from tinyformer.engine import backend
from tinyformer.engine.kernels import cubins, launch, nvrtc as nvrtc_compiler, prebuilt, registry, toolchain


@pytest.fixture
def fresh_modules(monkeypatch):
    """``launch``'s modules and ``prebuilt``'s record of them, empty before and after the test."""
    launch._module.cache_clear()
    monkeypatch.setattr(prebuilt, "_origins", {})
    yield
    launch._module.cache_clear()


class FakeModule:
    """A loaded module whose functions are their lowered names."""

    def __init__(self, path=None):
        self.path = path

    def get_function(self, name):
        return f"function {name}"


def manifest_for(folder, sources, arch="sm_90"):
    """A manifest in ``folder`` naming a cubin for each of ``sources`` on ``arch`` (lowered names made up)."""
    modules = {}
    for source in sources:
        lowered = {e: f"lowered<{e}>" for e in registry.instantiations(source)}
        modules[prebuilt.module_key(source, arch)] = {"source": source, "arch": arch, "file": f"{source}.{arch}.cubin",
                                                      "lowered": lowered}
        (folder / f"{source}.{arch}.cubin").write_bytes(b"cubin")
    (folder / prebuilt.MANIFEST).write_text(json.dumps({"format": prebuilt.FORMAT, "nvrtc": "13.0",
                                                        "modules": modules}))


@pytest.fixture
def on_a_fake_gpu(monkeypatch, tmp_path, fresh_modules):
    """A device of sm_90 whose modules load (recording the paths) and compile (recording the sources)."""
    loaded, compiled = [], []
    monkeypatch.setattr(backend, "compute_capability", lambda capped=True: "sm_90")
    monkeypatch.setattr(backend, "load_module", lambda path: loaded.append(path) or FakeModule(path))
    monkeypatch.setattr(backend, "raw_module", lambda code, options, names: compiled.append(names) or FakeModule())
    monkeypatch.setenv(prebuilt.ENVIRONMENT, str(tmp_path))
    return tmp_path, loaded, compiled


def test_the_loader_takes_the_cubin_of_the_devices_architecture(on_a_fake_gpu):
    folder, loaded, compiled = on_a_fake_gpu
    manifest_for(folder, ["softmax.cu"])
    function = launch.function("softmax_forward", "float32")
    assert function == "function lowered<softmax_forward<float>>"
    assert loaded == [str(folder / "softmax.cu.sm_90.cubin")] and compiled == []
    assert prebuilt.origins() == {"softmax.cu": "prebuilt sm_90"}


def test_a_module_of_other_sources_or_another_architecture_is_compiled(on_a_fake_gpu, monkeypatch):
    folder, loaded, compiled = on_a_fake_gpu
    manifest_for(folder, ["softmax.cu"], arch="sm_80")
    launch.function("softmax_forward", "float32")
    assert loaded == [] and compiled == [registry.instantiations("softmax.cu")]
    assert prebuilt.origins()["softmax.cu"].startswith("compiled (no cubin of these sources for sm_90")

    manifest_for(folder, ["layer_norm.cu"])  # built for sm_90, but with another geometry than this process's
    options = registry.compile_options
    monkeypatch.setattr(registry, "compile_options", lambda: options() + ["-DTF_CHANGED=1"])
    launch.function("layer_norm_forward", "float32")
    assert loaded == [] and "compiled" in prebuilt.origins()["layer_norm.cu"]


def test_a_cubin_the_driver_refuses_is_compiled_instead(on_a_fake_gpu, monkeypatch):
    folder, loaded, compiled = on_a_fake_gpu
    manifest_for(folder, ["softmax.cu"])

    def refuse(path):
        raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU")

    monkeypatch.setattr(backend, "load_module", refuse)
    assert launch.function("softmax_forward", "float32") == "function softmax_forward<float>"
    assert compiled and "did not load: RuntimeError" in prebuilt.origins()["softmax.cu"]


def test_without_the_variable_or_a_manifest_nothing_is_looked_up(on_a_fake_gpu, monkeypatch):
    folder, loaded, compiled = on_a_fake_gpu
    (folder / prebuilt.MANIFEST).write_text("[1, 2]")  # not a manifest
    launch.function("softmax_forward", "float32")
    assert loaded == [] and len(compiled) == 1
    launch._module.cache_clear()
    monkeypatch.delenv(prebuilt.ENVIRONMENT)
    manifest_for(folder, ["softmax.cu"])
    launch.function("softmax_forward", "float32")
    assert loaded == [] and len(compiled) == 2


def _elf(machine):
    """A minimal little-endian ELF64 header with no sections."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", header, 18, machine)
    struct.pack_into("<QHH", header, 40, 64, 64, 0)  # section headers at 64, 64 bytes each, none
    return bytes(header)


def test_cubin_symbols_refuses_what_is_not_a_cuda_elf():
    assert cubins.cubin_symbols(_elf(190)) == []
    with pytest.raises(ValueError, match="not CUDA"):
        cubins.cubin_symbols(_elf(62))  # x86-64
    with pytest.raises(ValueError, match="ELF64"):
        cubins.cubin_symbols(b"#!/bin/sh\n" + bytes(64))


def _nvrtc_or_skip():
    if toolchain.find_nvrtc() is None or not toolchain.cuda_include_dirs():
        if in_ci():
            pytest.fail("NVRTC or the CUDA headers are missing: install the 'test' extra")
        pytest.skip("NVRTC not installed (pip install -e '.[test]')")
    return nvrtc_compiler.Nvrtc()


def test_build_writes_a_cubin_of_every_source_holding_every_instantiation(tmp_path, fresh_modules):
    """The build reuses the compile check's compilations (nvrtc.compiled) (the test run's background build makes them)."""
    nvrtc = _nvrtc_or_skip()
    manifest = cubins.build(tmp_path, ("sm_80", "sm_90"), nvrtc)
    assert len(manifest["modules"]) == 2 * len(registry.KERNELS)
    for key, entry in manifest["modules"].items():
        assert key == prebuilt.module_key(entry["source"], entry["arch"])
        assert set(entry["lowered"]) == set(registry.instantiations(entry["source"]))
        symbols = set(cubins.cubin_symbols((tmp_path / entry["file"]).read_bytes()))
        assert set(entry["lowered"].values()) <= symbols, entry["file"]
    assert json.loads((tmp_path / prebuilt.MANIFEST).read_text()) == manifest


def test_warming_loads_every_module_once_and_says_which_were_compiled(on_a_fake_gpu):
    from tinyformer.engine.kernels import warm

    folder, loaded, compiled = on_a_fake_gpu
    manifest_for(folder, [s for s in registry.KERNELS if s != "attention_mma.cu"])
    lines = []
    warm.warm_every_module(out=lines.append)
    assert len(loaded) == len(registry.KERNELS) - 1 and compiled == [registry.instantiations("attention_mma.cu")]
    assert lines[-1].startswith(f"kernel modules: {len(registry.KERNELS)} in ")
    assert lines[-1].endswith("1 of them compiled on this machine")
    assert sum("prebuilt sm_90" in line for line in lines) == len(registry.KERNELS) - 1
    warm.warm_every_module(out=lines.append)  # a second time: nothing loaded or compiled again
    assert len(loaded) == len(registry.KERNELS) - 1 and len(compiled) == 1
