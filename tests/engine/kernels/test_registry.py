"""kernels/registry.py is the one home of the launch geometry: no kernel source restates a block
size, and the sources get the registry's values at compile time."""

import fnmatch
import re

import pytest

import children
import mma_probes
from tinyformer.engine.kernels import registry
from tinyformer.testing import emulation

KERNEL_SOURCES = sorted(p for p in registry.KERNEL_DIR.iterdir() if p.suffix in (".cu", ".cuh"))
# The tests' own probe of the tensor-core instructions follows the same rule.
SOURCES = KERNEL_SOURCES + [mma_probes.SOURCE]

# A name bound to a decimal number, or a shared array sized by one: a block size restated.
_RESTATED = [
    (re.compile(r"#\s*define\s+(\w+)\s+\(?\d+\)?\s*$", re.M), "#define of a number"),
    (re.compile(r"\b(?:constexpr|const)\b[^;=(]*?\b(\w+)\s*=\s*\d+[uUlL]*\s*;"), "constant bound to a number"),
    (re.compile(r"\benum\b[^{]*\{[^}]*?\b(\w+)\s*=\s*\d+"), "enumerator bound to a number"),
    (re.compile(r"__shared__[^;]*?\b(\w+)\s*\[\s*\d+\s*\]"), "shared array of a literal size"),
    (re.compile(r"__launch_bounds__\s*\(\s*(\d+)"), "literal launch bounds"),
    (re.compile(r"\bconstexpr\b[^;=]*?\b(\w+)\s*=[^;]*?(?<![\w.])(?:[2-9]|\d{2,})(?![\w.])[^;]*;"),
     "constant computed from numbers"),
    (re.compile(r"\b(?:blockDim|threadIdx)\.\w\s*[/%]\s*(\d+)"), "literal warp or block arithmetic"),
    (re.compile(r"(?:[*/%]|\+=)\s*(32)\b|\b(32)\s*\*"), "literal warp width"),
]


def _code(text):
    """The source without comments and string literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def restated_geometry(text):
    """[(what, name)] for each place that binds a launch-geometry number in the source itself."""
    code = _code(text)
    found = [(what, next(g for g in m.groups() if g)) for pattern, what in _RESTATED for m in pattern.finditer(code)]
    defined = re.findall(r"#\s*define\s+(TF_\w+)", code)
    geometry = {option[2:].split("=")[0] for option in registry.compile_options()}
    return found + [("geometry define in the source", name) for name in defined if name in geometry]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_kernel_source_defines_a_block_size(source):
    assert restated_geometry(source.read_text(encoding="utf-8")) == []


def test_the_check_catches_a_restated_block_size():
    text = """
    // constexpr int kCommented = 4;   (comments do not count)
    #define TF_ROW_BLOCK 256
    #define ROWS 4
    constexpr int kWarps = 4;
    static constexpr int kRows = 2;
    static constexpr int kRowsPerWarp = D >= 128 ? 2 : 4;
    __shared__ float scratch[32];
    __global__ void __launch_bounds__(128) k() { const int lane = threadIdx.x % kWarp; x[lane + 32 * c] = 0; }
    const int warp = threadIdx.x / 32;
    """
    found = restated_geometry(text)
    assert sorted(name for _, name in found) == sorted(
        ["TF_ROW_BLOCK", "TF_ROW_BLOCK", "ROWS", "kWarps", "kWarps", "kRows", "kRows", "kRowsPerWarp", "scratch",
         "128", "32", "32", "32"])


def test_every_geometry_definition_is_used_by_the_sources():
    code = "\n".join(_code(p.read_text(encoding="utf-8")) for p in SOURCES)
    for option in registry.compile_options():
        name = option[2:].split("=")[0]
        assert re.search(rf"\b{name}\b", code), f"{name} is passed to the compiler but no source reads it"


def test_compile_options_follow_the_registry(monkeypatch):
    assert "-DTF_ROW_BLOCK=256" in registry.compile_options()
    monkeypatch.setattr(registry, "ROW_BLOCK", 512)
    monkeypatch.setattr(registry, "ATTENTION_WARPS", 2)
    assert {"-DTF_ROW_BLOCK=512", "-DTF_ATTENTION_WARPS=2"} <= set(registry.compile_options())
    assert "-DTF_ROW_BLOCK=512" in emulation.compile_flags(sanitize=False)


def test_attention_instantiations_carry_the_rows_per_warp_of_the_registry(monkeypatch):
    assert registry.name_expression("attention_forward", "float16", 128) == "attention_forward<__half, 128, 2>"
    assert registry.name_expression("attention_backward_delta", "float32", 64) == "attention_backward_delta<float, 64>"
    monkeypatch.setitem(registry.ATTENTION_ROWS_PER_WARP, 64, 3)
    assert registry.name_expression("attention_backward_q", "float32", 64) == "attention_backward_q<float, 64, 3>"
    assert "attention_backward_kv<__nv_bfloat16, 64, 3>" in registry.instantiations("attention.cu")
    assert registry.attention_rows_per_block(64) == 3 * registry.ATTENTION_WARPS


def test_row_threads_are_whole_warps_up_to_the_row_block(monkeypatch):
    assert [registry.row_threads(n) for n in (1, 32, 33, 255, 10_000)] == [32, 32, 64, 256, 256]
    monkeypatch.setattr(registry, "ROW_BLOCK", 64)
    assert registry.row_threads(10_000) == 64


@pytest.mark.parametrize("name,value,message", [
    ("ROW_BLOCK", 100, "ROW_BLOCK must be a multiple of 32"),
    ("ROW_BLOCK", 2048, "ROW_BLOCK must be a multiple of 32 in"),
    ("ATTENTION_KEY_TILE", 16, "ATTENTION_KEY_TILE must equal WARP_SIZE"),
    ("ATTENTION_WARPS", 64, "ATTENTION_WARPS: 64 warps do not fit a block"),
])
def test_a_geometry_the_kernels_cannot_run_is_refused(monkeypatch, name, value, message):
    monkeypatch.setattr(registry, name, value)
    with pytest.raises(ValueError, match=message):
        registry.compile_options()


def test_a_source_compiled_without_the_registry_geometry_stops_with_an_error(tmp_path, cxx_compiler):
    unit = tmp_path / "unit.cpp"
    unit.write_text('#include "cpu_emulation.h"\n#include "softmax.cu"\n')
    result = children.run([cxx_compiler, "-std=c++20", "-fsyntax-only", f"-I{registry.KERNEL_DIR}",
                           f"-I{emulation.HEADER_DIR}", str(unit)], timeout=120)
    assert result.returncode != 0 and "registry.compile_options()" in result.stderr


def _included(folder, header, seen=None):
    """The files of ``folder`` that ``header`` includes by name, directly or through another one."""
    seen = set() if seen is None else seen
    for name in re.findall(r'^#include "([^"]+)"', (folder / header).read_text(encoding="utf-8"), re.M):
        if name not in seen and (folder / name).is_file():
            seen.add(name)
            _included(folder, name, seen)
    return seen


def _package_data(package):
    """The file patterns pyproject.toml ships with ``package``."""
    found = re.search(rf'"{re.escape(package)}" = \[([^\]]*)\]',
                      (registry.KERNEL_DIR.parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    return re.findall(r'"([^"]+)"', found.group(1)) if found else []


def test_the_emulation_build_and_the_package_cover_every_header_it_includes():
    """cpu_emulation.h is split into parts it includes: each is hashed into the emulation's build
    key (an edit rebuilds), shipped (pyproject's package-data), and within the 500-line limit; so
    is every source and header of kernels/, which the NVRTC and prebuilt keys hash."""
    parts = _included(emulation.HEADER_DIR, "cpu_emulation.h")
    assert {"cpu_emulation_threads.h", "cpu_emulation_half.h", "cpu_emulation_warp.h"} <= parts
    headers = {p.name for p in emulation.header_files()}
    assert parts | {"cpu_emulation.h"} <= headers
    kernel_files = {p.name for p in registry.kernel_files()}
    assert set(registry.KERNELS) | _included(registry.KERNEL_DIR, "attention_mma.cu") <= kernel_files
    assert not kernel_files & headers  # the engine's kernels/ holds no part of the CPU build
    for folder, package, names in ((registry.KERNEL_DIR, "tinyformer.engine.kernels", kernel_files),
                                   (emulation.HEADER_DIR, "tinyformer.testing.emulation", headers)):
        patterns = _package_data(package)
        for name in names:
            assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), f"{name} is not in {package}'s data"
            assert len((folder / name).read_text(encoding="utf-8").splitlines()) <= 500, name


def test_the_emulation_rebuilds_when_a_part_of_its_header_changes(tmp_path, monkeypatch):
    """The build key hashes every part of cpu_emulation.h: in a copy of its folder, a comment added
    to cpu_emulation_warp.h alone gives the library another name, and taking it out the same one."""
    names = []
    monkeypatch.setattr(emulation.toolchain, "cached_product", lambda name, make: names.append(name) or name)
    copy = tmp_path / "emulation"
    copy.mkdir()
    for path in emulation.header_files():
        (copy / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(emulation, "HEADER_DIR", copy)
    header = copy / "cpu_emulation_warp.h"
    original = header.read_text(encoding="utf-8")
    for text in (original, original + "// changed\n", original):
        header.write_text(text, encoding="utf-8")
        emulation.build(sanitize=False)
    assert names[0] != names[1] and names[0] == names[2], names
