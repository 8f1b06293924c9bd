"""Every CUDA source and template instantiation compiles with NVRTC (no GPU needed)."""

import sys

import children
import mma_probes
import pytest
from ci import in_ci

from tinyformer.engine.kernels import nvrtc as nvrtc_compiler, paths, registry, toolchain
from tinyformer.testing import compile_check, emulation


def _nvrtc_or_skip():
    """NVRTC comes with the test extra; CI must have it, a developer's machine may not."""
    if toolchain.find_nvrtc() is None or not toolchain.cuda_include_dirs():
        if in_ci():
            pytest.fail("NVRTC or the CUDA headers are missing: install the 'test' extra "
                        "(nvidia-cuda-nvrtc, nvidia-cuda-runtime)")
        pytest.skip("NVRTC not installed (pip install -e '.[test]')")
    return nvrtc_compiler.Nvrtc()


def _cuda12_nvrtc_or_skip():
    """sm_70 needs CUDA 12's NVRTC (nvidia-cuda-nvrtc-cu12, in the test extra): CUDA 13's dropped it."""
    if toolchain.find_nvrtc(12) is None:
        if in_ci():
            pytest.fail("CUDA 12's NVRTC is missing: install the 'test' extra (nvidia-cuda-nvrtc-cu12)")
        pytest.skip("nvidia-cuda-nvrtc-cu12 not installed: sm_70 cannot be compiled")


@pytest.fixture(scope="module")
def reports():
    nvrtc = _nvrtc_or_skip()
    _cuda12_nvrtc_or_skip()
    return compile_check.compile_all(nvrtc=nvrtc)


def test_every_architecture_compiles_what_it_runs(reports):
    """sm_70, 75, 80, 86, 89 and 90 (compile_check's default), each what the registry lets it run."""
    archs = compile_check.STUDENT_ARCHS
    assert archs == ("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
    expected = {(arch, e) for arch in archs for s in registry.KERNELS for e in registry.instantiations_for(s, arch)}
    assert {(r.arch, r.expression) for r in reports} == expected
    # arch × dtype × (kernel [× head dim]); the tensor-core attention in 2 dtypes from sm_80, bfloat16 from
    # sm_80 (the probes of its instructions are the tests' own: test_the_test_probes_compile_with_their_shared_memory)
    per_dtype = 2 + 3 + 2 + 2 + 1 + 2 + 4 + 2 + 4 * 3
    assert len(expected) == 4 * (3 * per_dtype + 2 * (3 * 3)) + 2 * 2 * per_dtype
    assert not any("probe" in e for _, e in expected), "a test probe is registered as a shipped kernel"
    assert all(r.registers > 0 for r in reports), "ptxas -v statistics were not parsed"


@pytest.mark.parametrize("arch", compile_check.STUDENT_ARCHS)
def test_every_kernel_the_dispatch_reaches_on_an_architecture_compiles_for_it(reports, arch):
    compiled = {r.expression for r in reports if r.arch == arch}
    reached = paths.reachable_instantiations(arch)
    assert reached and not [e for e in reached if e not in compiled]


def test_every_failure_is_reported_and_the_other_sources_still_compile(tmp_path, monkeypatch):
    """compile_all(failures=[...]) goes on after a source fails, for every architecture."""

    class HalfBroken:  # an NVRTC whose softmax.cu and dropout.cu do not compile
        path, version, archs = "fake-nvrtc", (0, 0), (70, 75, 80)

        def targets(self, arch):
            return int(arch[3:]) in self.archs

        def compile_cubin(self, text, name, expressions, options):
            if name in ("softmax.cu", "dropout.cu"):
                raise nvrtc_compiler.NvrtcError(f"{name} failed:\nline 1: error: broken\nline 2: error: again")
            return "", {e: e for e in expressions}, b""

    monkeypatch.setattr(toolchain, "build_cache", lambda: tmp_path)
    failures = []
    reports = compile_check.compile_all(("sm_70", "sm_80"), sources=["softmax.cu", "dropout.cu", "embedding.cu"],
                                        nvrtc=HalfBroken(), failures=failures)
    assert [(f.source, f.arch) for f in failures] == [("softmax.cu", "sm_70"), ("softmax.cu", "sm_80"),
                                                      ("dropout.cu", "sm_70"), ("dropout.cu", "sm_80")]
    assert failures[0].message == "line 1: error: broken; line 2: error: again"
    assert {(r.source, r.arch) for r in reports} == {("embedding.cu", "sm_70"), ("embedding.cu", "sm_80")}
    with pytest.raises(nvrtc_compiler.NvrtcError, match="softmax.cu"):  # without the list: the first one raises
        compile_check.compile_all(("sm_70",), sources=["softmax.cu"], nvrtc=HalfBroken())
    with pytest.raises(nvrtc_compiler.NvrtcError, match="does not target sm_90.*nvidia-cuda-nvrtc-cu12"):
        monkeypatch.setattr(toolchain, "find_nvrtc", lambda cuda_major=None: None)
        nvrtc_compiler.nvrtc_for("sm_90", HalfBroken())


def test_sm70_is_compiled_by_cuda12s_nvrtc():
    nvrtc = _nvrtc_or_skip()
    _cuda12_nvrtc_or_skip()
    compiler = nvrtc_compiler.nvrtc_for("sm_70", nvrtc)
    assert compiler.version[0] == 12 and compiler.targets("sm_70")
    assert nvrtc_compiler.nvrtc_for("sm_75", nvrtc) is nvrtc
    assert nvrtc.version[0] < 13 or not nvrtc.targets("sm_70")  # CUDA 13 dropped Volta


def test_attention_kernels_do_not_spill_at_their_default_tiles(reports):
    attention = [r for r in reports if r.source in ("attention.cu", "attention_mma.cu")]
    assert {r.source for r in attention} == {"attention.cu", "attention_mma.cu"}
    assert not [r.expression for r in attention if r.spills]
    assert max(r.shared_bytes for r in attention) <= 48 * 1024  # static shared memory limit


def test_tensor_core_attention_shared_memory_fits_an_sm80_block():
    """Their tiles are dynamic shared memory (opted in above 48 KB): within the 99 KB an sm_86/sm_89
    block may have (RTX 30 and 40; sm_80: 163 KB, sm_90: 227 KB)."""
    sizes = {(kernel, dim): registry.mma_attention_shared_bytes(kernel, dim)
             for kernel in registry.KERNELS["attention_mma.cu"] for dim in registry.HEAD_DIMS}
    assert max(sizes.values()) <= 99 * 1024
    rows, pad = registry.mma_attention_rows_per_block(), registry.MMA_PAD
    assert sizes["attention_mma_forward", 64] == (rows + 4 * registry.MMA_ATTENTION_TILE[64]) * (64 + pad) * 2


def _expected_shared_bytes(expression):
    """Static shared memory the registry's geometry gives each kernel (float words, as the sources declare it)."""
    name, args = expression.split("<")
    warps, keys = registry.ATTENTION_WARPS, registry.ATTENTION_KEY_TILE
    row_warps = registry.ROW_BLOCK // registry.WARP_SIZE
    if name.startswith("attention_") and name != "attention_backward_delta" and "_mma_" not in name:
        dim, rows = (int(a) for a in args.rstrip(">").split(", ")[1:])
        block_rows = warps * rows
        words = {"attention_forward": block_rows * dim + keys * (dim + 1) + keys * dim,
                 "attention_backward_kv": 2 * block_rows * dim + 2 * keys * (dim + 1) + 2 * keys,
                 "attention_backward_q": 2 * block_rows * dim + 2 * keys * (dim + 1)}[name]
    elif name.startswith("adam_"):  # the norm's scratch: a double per warp of a block of up to 1024 threads
        words = 2 * registry.WARP_SIZE
    elif name == "embedding_backward":  # the chunk's matches and prefix counts: two ints per thread of the row block
        words = 2 * registry.ROW_BLOCK
    else:  # the row kernels' reduction scratch: one float (or max-sum pair) per warp of the row block
        words = {"softmax_forward": 2, "softmax_backward": 1, "cross_entropy_forward": 3, "layer_norm_forward": 1,
                 "layer_norm_backward_input": 1, "residual_layer_norm_forward": 1,
                 "residual_layer_norm_backward": 1, "residual_layer_norm_forward_mixed": 1,
                 "residual_layer_norm_backward_mixed": 1}.get(name, 0) * row_warps
        words += name == "cross_entropy_forward"  # and its last-block flag (the reduction's)
    return 4 * words


def test_compiled_kernels_use_the_registry_geometry(reports):
    """The tiles and scratch arrays the compiler reports are those of the registry's block sizes."""
    for r in reports:
        assert r.shared_bytes == _expected_shared_bytes(r.expression), r.expression


# Static shared memory of the test probes (tests/kernels/mma_probe.cu), in 16-byte chunks of one
# warp: ldmatrix's 64 rows; mma's 16 rows of A (2 chunks each) and 16 of B; cp.async's two groups
# of 32, and the drain's one.
PROBE_SHARED_CHUNKS = {"ldmatrix_probe": 64, "mma_probe": 48, "cp_async_probe": 64, "cp_async_drain_probe": 32}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_test_probes_compile_with_their_shared_memory(arch):
    """tests/kernels/mma_probe.cu is no shipped kernel (the registry does not list it) but compiles
    as the kernels do, every probe in both 16-bit types."""
    reports = mma_probes.nvrtc_reports(_nvrtc_or_skip(), arch)
    assert set(reports) == set(mma_probes.expressions()) and len(reports) == 2 * len(mma_probes.KERNELS)
    for expression, (registers, stores, loads, shared) in reports.items():
        assert registers > 0 and stores == loads == 0, expression
        assert shared == 16 * PROBE_SHARED_CHUNKS.get(expression.split("<")[0], 0), expression


def test_a_changed_registry_geometry_reaches_the_compiled_kernels(monkeypatch):
    nvrtc = _nvrtc_or_skip()
    monkeypatch.setattr(registry, "ROW_BLOCK", 512)
    monkeypatch.setattr(registry, "ATTENTION_WARPS", 2)
    monkeypatch.setattr(registry, "ATTENTION_ROWS_PER_WARP", {32: 8, 64: 3, 128: 1})
    # a row kernel and each attention kernel with tiles (the new rows per warp name the instantiation)
    only = ["softmax_backward<float>", "attention_forward<float, 64, 3>", "attention_backward_kv<__half, 32, 8>",
            "attention_backward_q<__nv_bfloat16, 128, 1>"]
    reports = compile_check.compile_all(("sm_80",), sources=["softmax.cu", "attention.cu"], nvrtc=nvrtc, only=only)
    assert sorted(r.expression for r in reports) == sorted(only)
    for r in reports:
        assert r.shared_bytes == _expected_shared_bytes(r.expression), r.expression
    assert {r.expression: r.shared_bytes for r in reports}["softmax_backward<float>"] == 4 * 512 // 32


def test_compile_check_command_prints_the_table(capsys):
    _nvrtc_or_skip()
    assert compile_check.main(["-v", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "attention_forward<__nv_bfloat16, 128, 2>" in out and "spill" in out


def test_compile_check_for_a_t4_leaves_out_what_it_cannot_run(capsys):
    _nvrtc_or_skip()
    assert compile_check.main(["-v", "--arch", "sm_75"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sm_75: 60 kernel instantiations compiled from 9 sources (NVRTC 13.")
    assert "attention_forward<__half, 64, 4>" in out and "_mma_" not in out and "bfloat16" not in out
    assert compile_check.main(["--arch", "sm_7x"]) == 1
    assert capsys.readouterr().err.strip() == "compile_check: architecture must look like sm_75, got 'sm_7x'"


def test_a_compile_error_names_the_source_and_shows_the_log():
    nvrtc = _nvrtc_or_skip()
    with pytest.raises(nvrtc_compiler.NvrtcError, match=r"broken\.cu[\s\S]*undefined_name"):
        nvrtc.compile("__global__ void k() { undefined_name(); }", "broken.cu", [], ["-arch=sm_80"])


def test_nvrtc_compiles_in_a_process_that_never_imported_torch():
    """libnvrtc opens its builtins library by name when it compiles; some wheels' layouts leave it findable
    only once a library of that name is loaded (importing torch does that): Nvrtc loads it itself."""
    _nvrtc_or_skip()
    code = ("import sys\n"
            "from tinyformer.engine.kernels.nvrtc import Nvrtc\n"
            "Nvrtc().compile('extern \"C\" __global__ void k(float* x) { x[0] = 1; }', 'k.cu', [], ['-arch=sm_80'])\n"
            "assert 'torch' not in sys.modules\n"
            "print('compiled')\n")
    done = children.run([sys.executable, "-c", code])
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr


def test_parse_ptxas_reads_registers_spills_and_shared_memory():
    log = """ptxas info    : Compiling entry function '_Z1kIfEvv' for 'sm_90'
ptxas info    : Function properties for _Z1kIfEvv
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem"""
    assert compile_check.parse_ptxas(log) == {"_Z1kIfEvv": (40, 4, 12, 2048)}


def test_emulation_launcher_symbols_are_valid_c_names():
    assert emulation.symbol("attention_forward<float, 64>") == "tf_attention_forward_float_64"
    assert "extern \"C\" void tf_softmax_forward_float" in emulation.translation_unit()


def test_headers_of_the_compilers_cuda_version_are_preferred(tmp_path, monkeypatch):
    for name in ("cu13", "cuda_runtime"):
        (tmp_path / "nvidia" / name / "include").mkdir(parents=True)
        (tmp_path / "nvidia" / name / "include" / "cuda_fp16.h").write_text("")
    monkeypatch.setattr(toolchain, "_toolkit_roots", lambda: [])
    monkeypatch.setattr(toolchain.sys, "path", [str(tmp_path)])
    monkeypatch.setattr(toolchain.site, "getsitepackages", lambda: [])
    monkeypatch.setattr(toolchain.site, "getusersitepackages", lambda: str(tmp_path / "none"))
    assert toolchain.cuda_include_dirs(12) == [tmp_path / "nvidia" / "cuda_runtime" / "include"]
    assert toolchain.cuda_include_dirs(13) == [tmp_path / "nvidia" / "cu13" / "include"]
    toolkit = tmp_path / "cuda-13.0"  # a toolkit comes first, unless another CUDA's headers are asked for
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "cuda_fp16.h").write_text("")
    (toolkit / "include" / "cuda.h").write_text("#define CUDA_VERSION 13000\n")
    monkeypatch.setattr(toolchain, "_toolkit_roots", lambda: [toolkit])
    assert toolchain.cuda_include_dirs() == toolchain.cuda_include_dirs(13) == [toolkit / "include"]
    assert toolchain.cuda_include_dirs(12) == [tmp_path / "nvidia" / "cuda_runtime" / "include"]
