"""Which kernel path each op takes on each GPU a student may have (``kernels.paths``), tested over the
whole table of (capability, dtype, head size, options) with faked capabilities: no GPU needed.

The last tests run the dispatch for real on the CPU: the kernels through their C++ emulation (NumPy
arrays taken for GPU ones: ``kernels.on_gpu`` patched), the capability capped by
``$TINYFORMER_MAX_CAPABILITY`` as on a bigger GPU running a T4's paths.
"""

import devices
import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import backend, functional as F, kernels
from tinyformer.engine.kernels import launch, paths, registry

CAPABILITIES = [None, 61, 70, 75, 80, 86, 89, 90, 100]
DTYPES = ["float32", "float16", "bfloat16", "float64"]
HEAD_SIZES = [16, 32, 64, 96, 128]


def expected_attention(capability, dtype, head_size, kernels_on, fits):
    """The table as the manual states it (docs/gpu.md), restated independently of paths.py."""
    if capability is None or not kernels_on or capability < 70 or dtype == "float64":
        return "reference"
    if dtype == "bfloat16" and capability < 80:
        return "refused"
    if head_size not in (32, 64, 128) or not fits:
        return "reference"
    return "tensor cores" if dtype != "float32" and capability >= 80 else "CUDA cores"


@pytest.mark.parametrize("fits", [True, False])
@pytest.mark.parametrize("kernels_on", [True, False])
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_the_attention_path_over_the_whole_table(capability, kernels_on, fits):
    for dtype in DTYPES:
        for head_size in HEAD_SIZES:
            path = paths.attention_path(capability, dtype, head_size, kernels_on, fits)
            assert path.name == expected_attention(capability, dtype, head_size, kernels_on, fits), \
                (capability, dtype, head_size, path)
            assert path.source == {"tensor cores": "attention_mma.cu", "CUDA cores": "attention.cu"}.get(path.name)
            assert path.reason  # never silent
            if path.source:  # every kernel it launches is one its family runs there
                assert all(registry.runs_on(registry.source_of(k), dtype, capability) for k in path.kernels)


def test_the_rows_of_the_gpus_students_have():
    """T4 (7.5): fp16 on CUDA cores, bf16 refused; A100/RTX 30/RTX 40/H100: 16-bit on tensor cores."""
    row = {cap: {dtype: paths.attention_path(cap, dtype, 64).name for dtype in DTYPES[:3]}
           for cap in ("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90")}
    for cap in ("sm_70", "sm_75"):
        assert row[cap] == {"float32": "CUDA cores", "float16": "CUDA cores", "bfloat16": "refused"}
    for cap in ("sm_80", "sm_86", "sm_89", "sm_90"):
        assert row[cap] == {"float32": "CUDA cores", "float16": "tensor cores", "bfloat16": "tensor cores"}


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_every_other_op_runs_its_kernel_in_each_dtype_its_family_runs(capability):
    for op, source in paths.OPS.items():
        for dtype in DTYPES:
            path = paths.op_path(op, capability, dtype)
            want = expected_attention(capability, dtype, 64, True, True)
            assert path.name == ("CUDA cores" if want in ("tensor cores", "CUDA cores") else want), (op, dtype)
            assert path.source == (source if path.name == "CUDA cores" else None)


def test_bf16_below_sm80_is_refused_in_one_line_naming_the_device_and_what_to_use():
    message = paths.precision_problem("sm_75", "bf16", "Tesla T4")
    assert "\n" not in message and "Tesla T4" in message and "sm_75" in message and "7.5" in message
    assert "--precision fp16" in message and "sm_80" in message
    assert paths.precision_problem("sm_80", "bf16") is None and paths.precision_problem("sm_75", "fp16") is None
    assert paths.precision_problem(None, "bf16") is None  # the CPU runs bf16 (NumPy)


def test_the_capability_cap_lowers_but_never_raises_the_capability(monkeypatch):
    monkeypatch.setenv(backend.MAX_CAPABILITY, "sm_75")
    assert backend.capped_capability("sm_90") == "sm_75" and backend.capped_capability("sm_70") == "sm_70"
    assert paths.device_capability() == "sm_75"  # no GPU here: the emulation's sm_80, capped
    monkeypatch.setenv(backend.MAX_CAPABILITY, "7.5")
    assert backend.capped_capability("sm_86") == "sm_75"
    monkeypatch.setenv(backend.MAX_CAPABILITY, "turing")
    with pytest.raises(ValueError, match="TINYFORMER_MAX_CAPABILITY must look like sm_75"):
        backend.capped_capability("sm_90")
    monkeypatch.delenv(backend.MAX_CAPABILITY)
    assert paths.device_capability() == paths.EMULATION_CAPABILITY


@pytest.mark.parametrize("capability", ["sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90"])
def test_what_an_architecture_compiles_holds_everything_its_dispatch_reaches(capability):
    compiled = {e for source in registry.KERNELS for e in registry.instantiations_for(source, capability)}
    reached = set(paths.reachable_instantiations(capability))
    assert reached <= compiled
    # nothing compiled that the architecture refuses: no bfloat16, no tensor cores below sm_80
    old = capability in ("sm_70", "sm_75")
    assert any("__nv_bfloat16" in e for e in compiled) != old and any("_mma_" in e for e in compiled) != old
    assert ("attention_forward<__half, 64, 4>" in reached) == old


def test_the_training_line_names_device_precision_and_attention_path():
    line = paths.training_line("cuda", "fp16", 64, capability="sm_75", name="Tesla T4")
    assert line.startswith("device cuda Tesla T4 (sm_75), precision fp16, dynamic loss scaling: attention on "
                           "CUDA cores (attention.cu)")
    line = paths.training_line("cuda", "bf16", 64, capability="sm_90", name="NVIDIA H100")
    assert "attention on tensor cores (attention_mma.cu)" in line
    assert paths.training_line("cpu", "fp32", 64).startswith("device cpu, precision fp32")


# ------------------------------------------------------------------ the dispatch for real, emulated on the CPU
@pytest.fixture
def emulated_gpu(monkeypatch, cxx_compiler):
    """NumPy arrays taken for GPU arrays: the kernels run through their C++ emulation; launches recorded."""
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)
    launched = []
    real = launch.function

    def recording(kernel, dtype, head_dim=None, gpu=True, shared_mem=0):
        launched.append(registry.name_expression(kernel, dtype, head_dim))
        return real(kernel, dtype, head_dim, gpu, shared_mem)

    monkeypatch.setattr(launch, "function", recording)
    return launched


def _attention(dtype):
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rng.standard_normal((2, 2, 9, 32)).astype(dtype), requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, causal=True)
    out.sum().backward()
    return out, q.grad


@pytest.mark.parametrize("cap,want", [("sm_75", "attention_forward<__half, 32, 4>"),
                                      ("sm_80", "attention_mma_forward<__half, 32, 64>")])
def test_float16_attention_takes_the_architectures_path_and_matches_the_reference(cap, want, emulated_gpu,
                                                                                  monkeypatch):
    monkeypatch.setenv(backend.MAX_CAPABILITY, cap)
    out, grad = _attention(np.float16)
    assert want in emulated_gpu
    assert not any("_mma_" in e for e in emulated_gpu) or cap == "sm_80"
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: False)
    ref_out, ref_grad = _attention(np.float16)  # the NumPy reference (in float32, rounded)
    np.testing.assert_allclose(out.data.astype(np.float32), ref_out.data.astype(np.float32), atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(grad.astype(np.float32), ref_grad.astype(np.float32), atol=5e-3, rtol=5e-3)


def test_bfloat16_attention_below_sm80_is_refused_before_any_launch(emulated_gpu, monkeypatch):
    monkeypatch.setenv(backend.MAX_CAPABILITY, "sm_75")
    with pytest.raises(RuntimeError, match=r"precision bf16 needs compute capability 8\.0 .* is 7\.5 \(sm_75\)"):
        _attention(backend.bfloat16)
    assert emulated_gpu == []
    with pytest.raises(RuntimeError, match="precision bf16 needs"):  # a launcher called directly refuses too
        launch.function("softmax_forward", "bfloat16", gpu=False)


# ------------------------------------------------------------------ training on a faked T4
def _train(tmp_path, precision, lines):
    from tinyformer.translation.train import Trainer
    from tinyformer.translation.train.config import TrainConfig

    config = TrainConfig(data="synthetic", preset="tiny", vocab_size=120, max_tokens=96, max_steps=2, warmup_steps=2,
                         save_every=2, eval_every=2, bleu_samples=2, save_dir=str(tmp_path), threads=1,
                         precision=precision, model_overrides={"heads": 2, "num_layers": 1})
    return Trainer(config, echo=lines.append, progress=False).run()


def test_fp16_training_on_a_capped_sm75_runs_the_cuda_core_attention(emulated_gpu, monkeypatch, tmp_path):
    """Every kernel of a training step (head size 32) through the emulation, the capability capped at 7.5."""
    monkeypatch.setenv(backend.MAX_CAPABILITY, "sm_75")
    lines = []
    record = _train(tmp_path, "fp16", lines)
    assert record["step"] == 2 and np.isfinite(record["loss"])
    assert "attention_forward<__half, 32, 4>" in emulated_gpu and "attention_backward_q<__half, 32, 4>" in emulated_gpu
    assert not [e for e in emulated_gpu if "_mma_" in e or "bfloat16" in e]
    assert any(line.startswith("device cpu, precision fp16") for line in lines[:4]), lines


def test_train_bf16_on_a_faked_sm75_gpu_exits_with_one_line_before_any_work(monkeypatch, tmp_path, capsys):
    from tinyformer import cli
    from tinyformer.engine.backend import devices

    monkeypatch.setattr(devices, "_gpu_available", True)  # check_device's question: a GPU is there
    monkeypatch.setattr(backend, "compute_capability", lambda capped=True: "sm_75")
    monkeypatch.setattr(backend, "device_name", lambda: "Tesla T4")
    code = cli.main(["train", "--device", "cuda", "--precision", "bf16", "--save-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--precision bf16 needs compute capability 8.0 (sm_80) or newer, and Tesla T4 is 7.5 (sm_75)" in err
    assert "use --precision fp16" in err and not (tmp_path / "run").exists()
    for command in ("translate", "eval"):  # refused before the (missing) checkpoint is read
        code = cli.main([command, "--checkpoint", str(tmp_path / "missing.npz"), "--device", "cuda",
                         "--precision", "bf16"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "--precision bf16 needs compute capability 8.0" in err, err
    from tinyformer.translation.train.config import TrainConfig

    assert TrainConfig(device="cuda", precision="fp16", save_dir=str(tmp_path)).resolved().precision == "fp16"


# ------------------------------------------------------------------ sm_70/75's fp16 attention, kernel by kernel
@pytest.mark.parametrize("dim", [32, 64, 128])
@pytest.mark.parametrize("shape", [dict(batch=1, heads=2, len_q=13, len_k=17, lengths=[15], causal=True),
                                   dict(batch=2, heads=1, len_q=6, len_k=6, lengths=[0, 6]),
                                   dict(batch=2, heads=1, len_q=9, len_k=40, lengths=[40, 33], causal=True,
                                        dropout_p=0.3, seed=1234567)])
def test_the_cuda_core_attention_in_float16_matches_the_reference(dim, shape, cxx_compiler, monkeypatch):
    """attention.cu's float16 kernels (a T4's fp16 path) through the emulation, against the reference:
    padding, a sequence with no key, causal masks, dropout, every head size."""
    from tinyformer.testing import kernel_cases as cases

    monkeypatch.setenv(backend.MAX_CAPABILITY, "sm_75")
    shape = dict(shape)
    cases.attention(cases.Device("cpu", "float16"), shape.pop("batch"), shape.pop("heads"), shape.pop("len_q"),
                    shape.pop("len_k"), dim, rng_seed=dim, **shape).check()


# ------------------------------------------------------------------ on a GPU: its capability capped at a T4's
@devices.needs_gpu
def test_on_a_gpu_capped_at_sm75_fp16_attention_runs_on_cuda_cores_and_bf16_is_refused(monkeypatch):
    import cupy

    monkeypatch.setenv(backend.MAX_CAPABILITY, "sm_75")
    assert paths.capability_number(backend.compute_capability()) <= 75
    launched = []
    real = launch.function
    monkeypatch.setattr(launch, "function", lambda kernel, dtype, *a, **kw: launched.append(kernel)
                        or real(kernel, dtype, *a, **kw))
    rng = np.random.default_rng(1)
    q, k, v = (Tensor(cupy.asarray(rng.standard_normal((2, 3, 50, 64)).astype(np.float16)), requires_grad=True)
               for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, causal=True)
    out.sum().backward()
    assert launched[:1] == ["attention_forward"] and not [name for name in launched if "_mma_" in name]
    reference = F.scaled_dot_product_attention(*(Tensor(x.data.astype(np.float64)) for x in (q, k, v)), causal=True)
    np.testing.assert_allclose(cupy.asnumpy(out.data).astype(np.float64), cupy.asnumpy(reference.data), atol=1e-2)
    assert all(bool(cupy.isfinite(x.grad).all()) for x in (q, k, v))
    with pytest.raises(RuntimeError, match=r"precision bf16 needs compute capability 8\.0"):
        F.scaled_dot_product_attention(*(Tensor(x.data.astype(backend.bfloat16)) for x in (q, k, v)))
