"""The CUDA kernels on their own: fused attention in TFLOP/s, the row kernels in GB/s.

Attention: tinyformer's fused kernels as training calls them — the tensor-core kernels
(``kernels.attention.attention_mma_forward`` / ``attention_mma_backward``) for fp16 and bf16 on q, k, v
in the projections' (B, S, H, D) layout, the exact CUDA-core kernel (``attention_forward`` /
``attention_backward``) for fp32 — next to, when PyTorch with CUDA is installed,
``torch.nn.functional.scaled_dot_product_attention`` on the same values with each backend it
offers forced in turn (flash, cuDNN, memory-efficient; "n/a" where a backend refuses the case),
the best of them as a percentage, and the kernel's output checked against SDPA's default
choice. ``--unfused`` adds the unfused CuPy path (``functional.scaled_dot_product_attention``
with the kernels off, as ``TINYFORMER_KERNELS=0``), ``--cuda-core`` the CUDA-core kernel in the
16-bit types too. Throughput is counted
as FlashAttention's benchmarks count it (``attention_flops``): 4·B·S²·H·D for the forward,
3.5 times that for forward + backward, half of it when causal. Each shape holds about
``--tokens`` tokens (B = tokens / S) and ``--model-dim`` channels (H = model_dim / D).

Row kernels: softmax, layer norm, cross entropy, the dropout forward (and Adam) in GB/s,
counting the bytes a pass must read and write at least (inputs once, outputs once, no
intermediates), next to a plain device-to-device copy as the achievable figure.

Timing: CUDA events (``cupy.cuda.Event``; ``torch.cuda.Event`` for PyTorch) around each call,
warm-up calls first, then the median of up to ``--repeats`` calls (fewer when a cell exceeds
``--cell-seconds``). Without a usable GPU it prints one line and exits 0 ("skipped").

    python benchmarks/bench_attention.py [--quick] [--markdown] [--dtypes bf16,fp16,fp32] [--causal both]
"""

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
from dataclasses import dataclass

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402  (benchmarks/ is not a package)
from tinyformer.engine import backend  # noqa: E402
from tinyformer.engine.kernels import adam as adam_kernel, attention as attention_kernel  # noqa: E402
from tinyformer.engine.kernels import cross_entropy as cross_entropy_kernel, dropout as dropout_kernel  # noqa: E402
from tinyformer.engine.kernels import layer_norm as layer_norm_kernel, softmax as softmax_kernel  # noqa: E402

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
SHORT = {v: k for k, v in DTYPES.items()}
UNFUSED_DTYPES = ("float32", "float16")  # CuPy has no bfloat16: the unfused path runs without it
CHECK_TOLERANCE = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2}  # max|Δo| / max|o_ref|
MIN_REPEATS = 3
FULL = {"seq_lens": (128, 512, 1024, 4096), "head_dims": (64, 128), "causal": "both"}
QUICK = {"seq_lens": (512, 4096), "head_dims": (64, 128), "causal": "no"}
ROW_SHAPES = {"softmax": [(8192, 1024), (8192, 4096)], "layer_norm": [(8192, 1024), (8192, 4096)],
              "cross_entropy": [(8192, 8000), (8192, 32000)], "dropout": [(8192, 1024), (8192, 4096)]}
DROPOUT_P = 0.1
ADAM_PARAMS = [16 * 2**20, 64 * 2**20]  # float32 parameters, split into 1 Mi-element tensors


# ----------------------------------------------------------------------------- counting
def attention_flops(batch, seq_len, heads, head_dim, causal=False, backward=False):
    """FlashAttention's FLOP count: 4·B·S²·H·D forward (QKᵀ and PV, 2 FLOPs a multiply-add),
    3.5 times that for forward + backward (backward = 2.5 forwards), halved when causal."""
    flops = 4 * batch * seq_len ** 2 * heads * head_dim
    if backward:
        flops = flops * 7 // 2
    return flops // 2 if causal else flops


def itemsize(dtype):
    """Bytes per element of a kernel dtype name."""
    return 2 if dtype == "bfloat16" else numpy.dtype(dtype).itemsize


def row_op_bytes(op, passname, rows, cols, dtype):
    """Least bytes read + written by one pass of a row kernel on a (rows, cols) input.

    Every input is read once and every output written once: activations in ``dtype``, per-row
    statistics (mean, rstd, lse, loss, nll, upstream row gradients) in float32, targets int64,
    dropout's keep mask 1 byte per element.
    """
    n, e, f32, i64 = rows * cols, itemsize(dtype), 4, 8
    if op == "softmax":
        return {"forward": 2 * n * e, "backward": 3 * n * e}[passname]  # x→y; y, dy→dx
    if op == "layer_norm":
        if passname == "forward":  # x, weight, bias → y, mean, rstd
            return 2 * n * e + 2 * cols * e + 2 * rows * f32
        return 3 * n * e + 3 * cols * e + 2 * rows * f32  # x, dy, weight, mean, rstd → dx, dweight, dbias
    if op == "cross_entropy":
        if passname == "forward":  # logits, target → loss, nll, lse
            return n * e + rows * i64 + 3 * rows * f32
        return 2 * n * e + rows * i64 + 3 * rows * f32  # logits, target, lse, dloss, dnll → dlogits
    if op == "dropout" and passname == "forward":
        return 2 * n * e + n  # x → y, keep
    raise ValueError(f"unknown row op or pass {op!r} {passname!r}")


def adam_bytes(params, dtype="float32"):
    """Adam reads parameters, gradients and both moments and writes parameters and moments; its
    gradient-norm pass reads the gradients once more."""
    return 8 * params * itemsize(dtype)


# ----------------------------------------------------------------------------- bfloat16
bfloat16_bits = backend.to_bfloat16
bfloat16_to_float32 = backend.from_bfloat16


def _xp(array):
    from tinyformer.engine import backend

    return backend.get_array_module(array)


def as_kernel_dtype(x, dtype):
    """A float32 array in the storage the kernels take for ``dtype``."""
    return bfloat16_bits(x) if dtype == "bfloat16" else x.astype(dtype)


# ----------------------------------------------------------------------------- timing
class CupyClock:
    def __init__(self):
        import cupy

        self.cupy = cupy

    def event(self):
        return self.cupy.cuda.Event()

    def seconds(self, start, end):
        return self.cupy.cuda.get_elapsed_time(start, end) / 1e3


class TorchClock:
    def __init__(self):
        import torch

        self.torch = torch

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def seconds(self, start, end):
        return start.elapsed_time(end) / 1e3


def median_seconds(fn, clock, warmup, repeats, cell_seconds):
    """Median GPU time of ``fn()`` between two events, after ``warmup`` untimed calls.

    Stops early (after at least MIN_REPEATS calls) once the timed calls add up to ``cell_seconds``.
    """
    for _ in range(warmup):
        fn()
    start, end = clock.event(), clock.event()
    times = []
    while len(times) < repeats:
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(clock.seconds(start, end))
        if len(times) >= min(MIN_REPEATS, repeats) and sum(times) >= cell_seconds:
            break
    return statistics.median(times)


class Failures:
    """Cells that failed: out of memory is a note ("OOM"), anything else an error ("err")."""

    def __init__(self):
        self.errors, self.notes = [], []

    def cell(self, label, fn):
        """``fn()``, or the text to put in the table cell when it raised."""
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 - a benchmark reports, it does not stop
            if _is_out_of_memory(error):
                self.notes.append(f"{label}: out of GPU memory")
                return "OOM"
            self.errors.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            return "err"
        finally:
            free_gpu_memory()


def _is_out_of_memory(error):
    import cupy

    if isinstance(error, cupy.cuda.memory.OutOfMemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch else None
    return oom is not None and isinstance(error, oom)


def free_gpu_memory():
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def kernels_disabled():
    """``TINYFORMER_KERNELS=0`` for the duration: functional ops take their unfused path."""
    old = os.environ.get("TINYFORMER_KERNELS")
    os.environ["TINYFORMER_KERNELS"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TINYFORMER_KERNELS"]
        else:
            os.environ["TINYFORMER_KERNELS"] = old


# ----------------------------------------------------------------------------- attention
@dataclass(frozen=True)
class AttentionCase:
    dtype: str
    causal: bool
    seq_len: int
    head_dim: int
    batch: int
    heads: int

    def flops(self, backward):
        return attention_flops(self.batch, self.seq_len, self.heads, self.head_dim, self.causal, backward)

    @property
    def label(self):
        return (f"{SHORT[self.dtype]} {'causal' if self.causal else 'full'} S={self.seq_len} D={self.head_dim} "
                f"B={self.batch} H={self.heads}")


def attention_cases(args):
    causal = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    return [AttentionCase(dtype, c, s, d, max(1, args.tokens // s), max(1, args.model_dim // d))
            for dtype in args.dtypes for c in causal for s in args.seq_lens for d in args.head_dims]


def attention_inputs(case, seed):
    """q, k, v and the upstream gradient dO: float32 CuPy arrays (B, H, S, D), N(0, 1)."""
    import cupy

    rng = cupy.random.default_rng(seed)
    shape = (case.batch, case.heads, case.seq_len, case.head_dim)
    return [rng.standard_normal(shape, dtype=cupy.float32) for _ in range(4)]


class TensorCoreAttention:
    """The tensor-core kernels on (B, H, S, D) views of (B, S, H, D) arrays: the layout the Q/K/V
    projections produce (fp16 and bf16 arrays)."""

    def __init__(self, case, inputs):
        self.case = case
        self.q, self.k, self.v, self.do = (
            _xp(a).ascontiguousarray(as_kernel_dtype(a, case.dtype).transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
            for a in inputs)
        self.kw = {"causal": case.causal}

    def forward(self):
        return attention_kernel.attention_mma_forward(self.q, self.k, self.v, **self.kw)

    def forward_backward(self):
        o, lse = self.forward()
        return attention_kernel.attention_mma_backward(self.q, self.k, self.v, o, lse, self.do, **self.kw)

    def output(self):
        o = self.forward()[0]
        return bfloat16_to_float32(o) if self.case.dtype == "bfloat16" else o.astype("float32")


class CudaCoreAttention:
    """The CUDA-core kernels (attention.cu), called directly on (B·H, S, D) arrays."""

    def __init__(self, case, inputs):
        self.case = case
        flat = (case.batch * case.heads, case.seq_len, case.head_dim)
        self.q, self.k, self.v, self.do = (as_kernel_dtype(a, case.dtype).reshape(flat) for a in inputs)
        self.kw = {"causal": case.causal}

    def forward(self):
        return attention_kernel.attention_forward(self.q, self.k, self.v, self.case.heads, **self.kw)

    def forward_backward(self):
        o, lse = self.forward()
        return attention_kernel.attention_backward(self.q, self.k, self.v, o, lse, self.do, self.case.heads, **self.kw)

    def output(self):
        o = self.forward()[0]
        o = bfloat16_to_float32(o) if self.case.dtype == "bfloat16" else o.astype("float32")
        return o.reshape(self.case.batch, self.case.heads, self.case.seq_len, self.case.head_dim)


class UnfusedAttention:
    """``functional.scaled_dot_product_attention`` with the kernels off: the CuPy reference path."""

    def __init__(self, case, inputs):
        import tinyformer as tf
        from tinyformer.engine import functional as F

        self.tf, self.F, self.case = tf, F, case
        q, k, v, do = (a.astype(case.dtype) for a in inputs)
        self.plain = [tf.Tensor(a) for a in (q, k, v)]
        self.leaves = [tf.Tensor(a, requires_grad=True) for a in (q, k, v)]
        self.do = do

    def _attend(self, q, k, v):
        with kernels_disabled():
            return self.F.scaled_dot_product_attention(q, k, v, causal=self.case.causal)

    def forward(self):
        with self.tf.no_grad():
            return self._attend(*self.plain)

    def forward_backward(self):
        out = self._attend(*self.leaves)
        with kernels_disabled():
            return self.tf.grad(out, self.leaves, self.do)

    def output(self):
        return self.forward().data.astype("float32")


TORCH_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


class TorchAttention:
    """``torch.nn.functional.scaled_dot_product_attention`` on the same values (shared via DLPack),
    with ``backend`` (a key of TORCH_BACKENDS) forced, or PyTorch's own choice when None."""

    backend = None

    def __init__(self, case, inputs):
        import torch

        self.torch, self.case = torch, case
        self.context = contextlib.nullcontext
        if self.backend is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            chosen = getattr(SDPBackend, TORCH_BACKENDS[self.backend])
            self.context = lambda: sdpa_kernel([chosen])
        dtype = getattr(torch, case.dtype)
        q, k, v, do = (torch.from_dlpack(a).to(dtype) for a in inputs)
        self.plain, self.do = (q, k, v), do
        self.leaves = tuple(t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def _attend(self, q, k, v):
        with self.context():
            return self.torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.case.causal)

    def forward(self):
        with self.torch.no_grad():
            return self._attend(*self.plain)

    def forward_backward(self):
        out = self._attend(*self.leaves)
        return self.torch.autograd.grad(out, self.leaves, self.do)

    def output(self):
        import cupy

        return cupy.from_dlpack(self.forward().float().contiguous())


def relative_difference(output, reference):
    """max|output − reference| / max|reference|, on the GPU."""
    import cupy

    scale = float(cupy.abs(reference).max()) or 1.0
    return float(cupy.abs(output - reference).max()) / scale


def tflops(seconds, flops):
    value = flops / seconds / 1e12
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def torch_backend(name):
    return type(f"Torch{name.title()}Attention", (TorchAttention,), {"backend": name})


def attention_impls(case, args, torch_ok):
    """name -> (runner class, clock class), or None where that implementation does not run. The
    "kernel" is what training runs: tensor cores for fp16/bf16, the CUDA-core kernel for fp32."""
    impls = {"kernel": (CudaCoreAttention if case.dtype == "float32" else TensorCoreAttention, CupyClock)}
    if args.cuda_core:
        impls["cuda-core"] = (CudaCoreAttention, CupyClock) if case.dtype != "float32" else None
    if args.unfused:
        impls["unfused"] = (UnfusedAttention, CupyClock) if case.dtype in UNFUSED_DTYPES else None
    for name in TORCH_BACKENDS:
        impls[name] = (torch_backend(name), TorchClock) if torch_ok else None
    return impls


def timed_columns(args):
    """The implementations of the table's columns, in order (as attention_impls names them)."""
    return ["kernel"] + (["cuda-core"] if args.cuda_core else []) + (["unfused"] if args.unfused else []) + list(
        TORCH_BACKENDS)


def best_torch(cells):
    """(backend, TFLOP/s) of the fastest SDPA backend among the timed cells, or None."""
    timed = [(name, float(cells[name])) for name in TORCH_BACKENDS if _is_number(cells.get(name))]
    return max(timed, key=lambda item: item[1]) if timed else None


def _is_number(text):
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def share_of_best(kernel_cell, best):
    """The kernel's TFLOP/s as a percentage of the best SDPA backend's, with that backend's name."""
    if best is None or not _is_number(kernel_cell):
        return "n/a"
    return f"{100 * float(kernel_cell) / best[1]:.0f}% {best[0]}"


def reference_of(impls, torch_ok):
    """What the kernel's output is checked against: SDPA's own backend choice when PyTorch runs,
    else the unfused path where it runs."""
    if torch_ok:
        return "torch"
    return "unfused" if impls.get("unfused") is not None else None


def time_attention(name, impl, case, inputs, args, failures, want_output):
    """((forward cell, forward+backward cell), output or None) for one implementation."""
    if impl is None:
        return ("n/a", "n/a"), None
    runner_class, clock_class = impl
    runner = failures.cell(f"{case.label} {name} setup", lambda: runner_class(case, inputs))
    if isinstance(runner, str):
        return (runner, runner), None
    clock, cells = clock_class(), []
    for backward in (False, True):
        fn = runner.forward_backward if backward else runner.forward
        seconds = failures.cell(f"{case.label} {name} {'fwd+bwd' if backward else 'fwd'}",
                                lambda: median_seconds(fn, clock, args.warmup, args.repeats, args.cell_seconds))
        cells.append(seconds if isinstance(seconds, str) else tflops(seconds, case.flops(backward)))
    output = failures.cell(f"{case.label} {name} output", runner.output) if want_output else None
    return tuple(cells), (None if isinstance(output, str) else output)


def measure_attention(case, args, torch_ok, failures):
    """One table row: TFLOP/s of each implementation, forward and forward + backward, and the check."""
    row = [SHORT[case.dtype], "yes" if case.causal else "no", str(case.seq_len), str(case.head_dim),
           f"{case.batch}x{case.heads}"]
    impls = attention_impls(case, args, torch_ok)
    inputs = failures.cell(f"{case.label} inputs", lambda: attention_inputs(case, args.seed))
    if isinstance(inputs, str):
        return row + [inputs] * (2 * len(impls) + 3)
    reference = reference_of(impls, torch_ok)
    cells, outputs = {}, {}
    for name, impl in impls.items():
        cells[name], output = time_attention(name, impl, case, inputs, args, failures, name == "kernel")
        if output is not None:
            outputs[name] = output
        free_gpu_memory()
    if reference == "torch":
        outputs["torch"] = failures.cell(f"{case.label} torch output", lambda: TorchAttention(case, inputs).output())
    elif reference == "unfused":
        outputs["unfused"] = failures.cell(f"{case.label} unfused output",
                                           lambda: UnfusedAttention(case, inputs).output())
    check = check_cell(case, reference, {k: v for k, v in outputs.items() if not isinstance(v, str)}, failures)
    del inputs, outputs
    free_gpu_memory()
    columns = list(impls)  # the order of timed_columns
    forward = {name: cells[name][0] for name in columns}
    both = {name: cells[name][1] for name in columns}
    return (row + [forward[n] for n in columns] + [share_of_best(forward["kernel"], best_torch(forward))]
            + [both[n] for n in columns] + [share_of_best(both["kernel"], best_torch(both))] + [check])


def check_cell(case, reference, outputs, failures):
    """The kernel's relative error against the reference output, "n/a" without both."""
    if reference is None or "kernel" not in outputs or reference not in outputs:
        return "n/a"
    diff = relative_difference(outputs["kernel"], outputs[reference])
    text = f"{diff:.1e} ({'ref' if reference == 'unfused' else 'torch'})"
    if not diff <= CHECK_TOLERANCE[case.dtype]:  # also catches NaN
        failures.errors.append(f"{case.label}: kernel output differs from {reference} by {diff:.2e} of "
                               f"max|o| (tolerance {CHECK_TOLERANCE[case.dtype]:.0e})")
        text += " MISMATCH"
    return text


# ----------------------------------------------------------------------------- row kernels
def row_inputs(op, rows, cols, dtype, seed):
    """Callables running the forward and the backward kernel of ``op`` on a (rows, cols) input
    (dropout: the forward only)."""
    import cupy

    rng = cupy.random.default_rng(seed)
    x = as_kernel_dtype(rng.standard_normal((rows, cols), dtype=cupy.float32), dtype)
    dy = as_kernel_dtype(rng.standard_normal((rows, cols), dtype=cupy.float32), dtype)
    if op == "softmax":
        y = softmax_kernel.softmax_forward(x)
        return (lambda: softmax_kernel.softmax_forward(x)), (lambda: softmax_kernel.softmax_backward(y, dy))
    if op == "layer_norm":
        weight = as_kernel_dtype(cupy.ones(cols, dtype=cupy.float32), dtype)
        bias = as_kernel_dtype(cupy.zeros(cols, dtype=cupy.float32), dtype)
        _, mean, rstd = layer_norm_kernel.layer_norm_forward(x, weight, bias)
        return ((lambda: layer_norm_kernel.layer_norm_forward(x, weight, bias)),
                (lambda: layer_norm_kernel.layer_norm_backward(x, weight, dy, mean, rstd)))
    if op == "cross_entropy":
        target = rng.integers(0, cols, rows, dtype=cupy.int64)
        _, _, lse = cross_entropy_kernel.cross_entropy_forward(x, target, smoothing=0.1)
        grad_loss = cupy.full(rows, 1.0 / rows, dtype=cupy.float32)
        grad_nll = cupy.zeros(rows, dtype=cupy.float32)
        return ((lambda: cross_entropy_kernel.cross_entropy_forward(x, target, smoothing=0.1)),
                (lambda: cross_entropy_kernel.cross_entropy_backward(x, target, lse, grad_loss, grad_nll,
                                                                     smoothing=0.1)))
    if op == "dropout":  # forward only: the backward is a CuPy multiply by the saved mask
        return ((lambda: dropout_kernel.dropout_forward(x, DROPOUT_P, seed)),)
    raise ValueError(f"unknown row op {op!r}")


def adam_runner(params, seed, tensor_size=2**20):
    """One Adam step on the device (the gradient-norm pass and the fused update) over ``params``
    float32 values in tensors of ``tensor_size``."""
    import cupy

    rng = cupy.random.default_rng(seed)
    sizes = [min(tensor_size, params - start) for start in range(0, params, tensor_size)]
    p = [rng.standard_normal(n, dtype=cupy.float32) for n in sizes]
    g = [rng.standard_normal(n, dtype=cupy.float32) for n in sizes]
    m = [cupy.zeros(n, dtype=cupy.float32) for n in sizes]
    v = [cupy.zeros(n, dtype=cupy.float32) for n in sizes]
    plan = adam_kernel.AdamPlan(p, g, m, v)
    hyper = cupy.asarray(numpy.array([1e-4, 1.0 - 0.98, 1.0, 0.0, 1.0], dtype=numpy.float32))  # adam_kernel.ADAM_HYPER
    result = cupy.zeros(2, dtype=cupy.float32)
    return lambda: adam_kernel.grad_norm_adam_update(plan, hyper, result, 0.9, 0.98, 1e-9)


def copy_runner(nbytes):
    """A device-to-device copy of ``nbytes``: the bandwidth a streaming kernel can reach."""
    import cupy

    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    return lambda: cupy.copyto(dst, src)


def bandwidth_row(label, shape, dtype, nbytes, seconds, peak):
    gbs = nbytes / seconds / 1e9
    row = [label, shape, SHORT.get(dtype, dtype), f"{seconds * 1e3:.3f}", f"{gbs:,.0f}"]
    return row + ([f"{100 * gbs * 1e9 / peak:.0f}%"] if peak else [])


def row_cases(args):
    """(op, rows, cols, dtype) for every row-kernel measurement asked for."""
    shapes = {op: (s[:1] if args.quick else s) for op, s in ROW_SHAPES.items()}
    return [(op, rows, cols, dtype) for op, op_shapes in shapes.items() for (rows, cols) in op_shapes
            for dtype in args.dtypes]


def measure_rows(args, table, peak, failures):
    clock = CupyClock()
    timed = lambda fn: median_seconds(fn, clock, args.warmup, args.repeats, args.cell_seconds)  # noqa: E731
    copy_bytes = 2**30
    seconds = failures.cell("copy", lambda: timed(copy_runner(copy_bytes)))
    if not isinstance(seconds, str):
        table.add(bandwidth_row("copy (reference)", f"{copy_bytes / 2**30:g} GiB", "float32", 2 * copy_bytes,
                                seconds, peak))
    for op, rows, cols, dtype in row_cases(args):
        label = f"{op} {rows}x{cols} {SHORT[dtype]}"
        fns = failures.cell(f"{label} setup", lambda: row_inputs(op, rows, cols, dtype, args.seed))
        if isinstance(fns, str):
            continue
        for passname, fn in zip(("forward", "backward"), fns):
            seconds = failures.cell(f"{label} {passname}", lambda fn=fn: timed(fn))
            if not isinstance(seconds, str):
                table.add(bandwidth_row(f"{op} {passname}", f"{rows}x{cols}", dtype,
                                        row_op_bytes(op, passname, rows, cols, dtype), seconds, peak))
        del fns
    for params in ADAM_PARAMS[:1] if args.quick else ADAM_PARAMS:
        seconds = failures.cell(f"adam {params}", lambda: timed(adam_runner(params, args.seed)))
        if not isinstance(seconds, str):
            table.add(bandwidth_row("adam update", f"{params / 2**20:.0f} Mi params", "float32",
                                    adam_bytes(params), seconds, peak))


# ----------------------------------------------------------------------------- reporting
class Table:
    """Prints its header at once and each row as it is added (a partial run still reports)."""

    def __init__(self, header, markdown, width=7, first_width=0):
        self.markdown = markdown
        self.widths = [max(width, len(h)) for h in header]
        self.widths[0] = max(self.widths[0], first_width)
        if markdown:
            print("| " + " | ".join(header) + " |")
            print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
        else:
            self._print(header)
            print("  ".join("-" * w for w in self.widths))
        sys.stdout.flush()

    def _print(self, cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, self.widths))))

    def add(self, row):
        if self.markdown:
            print("| " + " | ".join(row) + " |")
        else:
            self._print(row)
        sys.stdout.flush()


def device_description():
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    runtime, driver = cupy.cuda.runtime.runtimeGetVersion(), cupy.cuda.runtime.driverGetVersion()
    return (f"{name} (sm_{props['major']}{props['minor']}, {props['totalGlobalMem'] / 2**30:.0f} GiB), CUDA runtime "
            f"{runtime // 1000}.{runtime % 1000 // 10}, driver API {driver // 1000}.{driver % 1000 // 10}")


def peak_bandwidth():
    """Theoretical DRAM bandwidth in bytes/s from the device properties, or None where not reported."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    clock_khz, bus_bits = props.get("memoryClockRate"), props.get("memoryBusWidth")
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8  # double data rate


def torch_status():
    """(usable, description): PyTorch with CUDA present or not, and why."""
    try:
        import torch
    except ImportError:
        return False, "not installed"
    if not torch.cuda.is_available():
        return False, f"{torch.__version__} without CUDA"
    return True, f"{torch.__version__}"


def print_preamble(args, torch_text):
    import cupy

    print("Fused CUDA kernels: attention in TFLOP/s, row kernels in GB/s")
    print(f"command: {provenance.command_line()}")
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"device: {device_description()}")
    print(f"versions: python {platform.python_version()}, numpy {numpy.__version__}, cupy {cupy.__version__}, "
          f"torch {torch_text}")
    print(f"timing: CUDA events, median of up to {args.repeats} calls (at least {MIN_REPEATS}, fewer past "
          f"{args.cell_seconds:g} s per cell) after {args.warmup} warm-up call(s)")
    print()
    sys.stdout.flush()


def run_attention(args, torch_ok, failures):
    print(f"Attention, TFLOP/s (FlashAttention's count: 4·B·S²·H·D forward, x3.5 forward+backward, "
          f"/2 causal); B = {args.tokens} // S, H = {args.model_dim} // D; dropout 0, no padding")
    names = timed_columns(args)
    header = ["dtype", "causal", "S", "D", "BxH"]
    header += [f"fwd {n}" for n in names] + ["fwd kernel/best"] + [f"fwd+bwd {n}" for n in names]
    header += ["fwd+bwd kernel/best", "rel err"]
    table = Table(header, args.markdown, width=7, first_width=5)
    for case in attention_cases(args):
        table.add(measure_attention(case, args, torch_ok, failures))
    print()
    print("kernel: fp16/bf16 kernels.attention.attention_mma_forward/backward (tensor cores, q/k/v as (B, S, H, D) "
          "views), fp32 kernels.attention.attention_forward/backward (CUDA cores, (B·H, S, D)); bf16 as ml_dtypes "
          "bfloat16 arrays. "
          "cuda-core: the CUDA-core kernel in the 16-bit types. unfused: functional.scaled_dot_product_attention "
          "with TINYFORMER_KERNELS=0 (CuPy ops through the autograd engine; n/a for bf16, which CuPy lacks). "
          "flash, cudnn, efficient: torch.nn.functional.scaled_dot_product_attention with that backend forced "
          "(torch.nn.attention.sdpa_kernel); n/a where it refuses the case. kernel/best: the kernel's TFLOP/s as "
          "a share of the fastest of them.")
    print("rel err: max |O_kernel - O_ref| / max |O_ref|, against SDPA's own backend choice (torch) or, without "
          "PyTorch, the unfused path (ref); MISMATCH past "
          + ", ".join(f"{SHORT[d]} {t:.0e}" for d, t in CHECK_TOLERANCE.items()) + ".")
    print()


def run_rows(args, failures):
    peak = peak_bandwidth()
    print("Row kernels, GB/s: least bytes read + written per pass (each input read once, each output "
          "written once) / median time" + (f"; theoretical peak {peak / 1e9:,.0f} GB/s" if peak else ""))
    header = ["kernel", "shape", "dtype", "ms", "GB/s"] + (["of peak"] if peak else [])
    table = Table(header, args.markdown, width=7, first_width=len("cross_entropy backward"))
    measure_rows(args, table, peak, failures)
    print()
    print("layer_norm backward: input and parameter gradients (three kernels); cross_entropy: label "
          f"smoothing 0.1; dropout forward: p {DROPOUT_P}, mask drawn on the device (bytes: x, y, keep); adam "
          "update: float32, the gradient-norm pass and the fused update (two launches, the step's scalars on the "
          "device) over tensors of 1 Mi elements; copy: cupy.copyto (bytes read + "
          "written).")
    print()


# ----------------------------------------------------------------------------- main
def parse_ints(text):
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_dtypes(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    for n in names:
        if n not in DTYPES:
            raise argparse.ArgumentTypeError(f"unknown dtype {n!r}; known: {', '.join(DTYPES)}")
    return tuple(DTYPES[n] for n in names)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"fewer sizes: S {QUICK['seq_lens']}, non-causal "
                        "only, the smaller row shapes")
    parser.add_argument("--seq-lens", type=parse_ints, help=f"sequence lengths (default {FULL['seq_lens']})")
    parser.add_argument("--head-dims", type=parse_ints, help=f"head dimensions (default {FULL['head_dims']})")
    parser.add_argument("--dtypes", type=parse_dtypes, default=parse_dtypes("bf16,fp16,fp32"),
                        help="comma-separated, of bf16, fp16, fp32 (default all three)")
    parser.add_argument("--causal", choices=("no", "yes", "both"), help="default both (--quick: no)")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per attention call: B = tokens // S")
    parser.add_argument("--model-dim", type=int, default=2048, help="H·D: H = model_dim // D (default 2048)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls at most (default 10)")
    parser.add_argument("--cell-seconds", type=float, default=0.5,
                        help="stop timing a cell after this much GPU time, once it has 3 calls (default 0.5)")
    parser.add_argument("--unfused", action="store_true", help="also time the unfused CuPy path")
    parser.add_argument("--cuda-core", action="store_true", help="also time the CUDA-core kernel in fp16/bf16")
    parser.add_argument("--no-torch", dest="torch", action="store_false", help="skip PyTorch even if present")
    parser.add_argument("--skip-attention", action="store_true")
    parser.add_argument("--skip-rows", action="store_true", help="skip the row-kernel bandwidth table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    args.seq_lens = args.seq_lens or preset["seq_lens"]
    args.head_dims = args.head_dims or preset["head_dims"]
    args.causal = args.causal or preset["causal"]
    if args.tokens < 1 or args.model_dim < 1 or args.warmup < 0 or args.repeats < 1 or min(args.seq_lens) < 1:
        parser.error("--tokens, --model-dim, --repeats and the sequence lengths must be >= 1, --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    from tinyformer.engine import backend

    if not backend.is_gpu_available():
        print("bench_attention: status: skipped (no usable GPU: tinyformer.engine.backend.is_gpu_available() is false)")
        return 0
    torch_ok, torch_text = torch_status() if args.torch else (False, "not used (--no-torch)")
    print_preamble(args, torch_text)
    failures = Failures()
    if not args.skip_attention:
        run_attention(args, torch_ok, failures)
    if not args.skip_rows:
        run_rows(args, failures)
    for line in failures.notes:
        print(f"note: {line}")
    for line in failures.errors:
        print(f"error: {line}")
    print(f"bench_attention: status: {'errors (' + str(len(failures.errors)) + ')' if failures.errors else 'ok'}")
    return 1 if failures.errors else 0


if __name__ == "__main__":
    sys.exit(main())
