"""The one harness that checks each CUDA kernel against its NumPy reference.

A case draws float32 inputs, rounds them to the element type under test, runs the kernel of
``kernels.ops`` on the device (CuPy arrays: the compiled kernel; NumPy arrays: its very source
through the C++ emulation, float32 only) and returns a ``KernelRun``: one ``Comparison`` per
kernel result against the reference of ``functional`` (or ``optim.Adam``), computed in float64
from the same rounded values for a random upstream gradient. ``tinyformer gradcheck`` shows its
verdicts as the ``kernel_*`` rows (gradcheck_suite.KERNEL_CASES); tests/test_kernels_emulation.py
and tests/test_kernels_gpu.py call the same cases over more shapes and element types.

A comparison passes when |kernel − reference| <= atol + rtol·|reference| everywhere, with
(rtol, atol) by element type (``TOLERANCE``), gradients (longer sums) looser by ``GRAD_FACTOR``:
    float32   rtol 1e-5, atol 2e-6
    float16   rtol 2e-3, atol 2e-3   (output rounding 2^-11, accumulation in float32)
    bfloat16  rtol 2e-2, atol 2e-2   (output rounding 2^-8)
A comparison may raise its atol floor for a cancellation it names (a half type's floor still
applies when larger); some compare at fixed tolerances, dropout's keep mask exactly.

It sits above both ``kernels/`` and the references it checks (functional, optim), so that
``kernels/`` imports nothing of the ops that call it.
"""

import math
from typing import NamedTuple

import numpy

from ..engine import backend, functional as F
from ..engine.kernels import ops
from ..engine.kernels.philox import philox_uniform
from ..model.optim import Adam
from ..model.optim.adam import device_update_reference
from ..engine.tensor import Tensor, grad

TOLERANCE = {"float32": (1e-5, 2e-6), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2)}
GRAD_FACTOR = {"float32": 10.0, "float16": 2.0, "bfloat16": 2.0}


class Comparison(NamedTuple):
    """A kernel result (host float64) against its reference, with the tolerance it must meet."""

    label: str
    actual: numpy.ndarray
    expected: numpy.ndarray
    rtol: float
    atol: float

    def failure(self):
        """None when within tolerance, else one line naming the worst element."""
        if self.actual.shape != self.expected.shape:
            return f"{self.label}: shape {self.actual.shape}, reference {self.expected.shape}"
        error = numpy.abs(self.actual - self.expected)
        bad = ~(error <= self.atol + self.rtol * numpy.abs(self.expected))  # NaN counts as off
        if not bad.any():
            return None
        worst = numpy.argmax(numpy.where(bad, numpy.nan_to_num(error, nan=numpy.inf), -1.0))
        at = tuple(int(i) for i in numpy.unravel_index(int(worst), error.shape))
        return (f"{self.label}: {int(bad.sum())} of {error.size} values off (tolerance {self.atol:g} + "
                f"{self.rtol:g}·|reference|), worst at {at}: kernel {self.actual[at]:.7g}, "
                f"reference {self.expected[at]:.7g}")

    def errors(self):
        """(max |kernel − reference|, max of that over |reference| + atol); NaN when a value is NaN."""
        if self.actual.shape != self.expected.shape or not self.actual.size:
            return (math.nan, math.nan) if self.actual.shape != self.expected.shape else (0.0, 0.0)
        error = numpy.abs(self.actual - self.expected)
        scale = numpy.abs(self.expected) + self.atol
        with numpy.errstate(divide="ignore", invalid="ignore"):
            relative = numpy.where(scale > 0, error / scale, numpy.where(error > 0, numpy.inf, 0.0))
        return _max_or_nan(error), _max_or_nan(relative)


def _max_or_nan(values):
    return math.nan if numpy.isnan(values).any() else float(values.max())


def compared(label, actual, expected, rtol, atol):
    """A Comparison of a kernel array (NumPy or CuPy) at a fixed tolerance; both are copied (the
    reference of a later step may update its arrays in place)."""
    actual = backend.to_numpy(actual).astype(numpy.float64)
    return Comparison(label, actual, numpy.array(expected, dtype=numpy.float64), rtol, atol)


class KernelRun(NamedTuple):
    """A case's outcome: what it ran on (for the table), its comparisons, and kernel results
    (host arrays) that a test may look at further."""

    inputs: str
    comparisons: list
    results: dict

    @property
    def failures(self):
        return [f for f in (c.failure() for c in self.comparisons) if f]

    @property
    def passed(self):
        return not self.failures

    def max_errors(self):
        """(worst absolute, worst relative) error over the comparisons, NaN first."""
        pairs = [c.errors() for c in self.comparisons] or [(0.0, 0.0)]
        return tuple(max((p[i] for p in pairs), key=lambda e: math.inf if math.isnan(e) else e) for i in (0, 1))

    def check(self):
        """Raise AssertionError listing every comparison off its tolerance; return ``results``."""
        failures = self.failures
        if failures:
            raise AssertionError(f"{self.inputs}:\n" + "\n".join(failures))
        return self.results


class Device:
    """Moves arrays to ``device`` in the element type ``dtype`` and back as float32, and makes
    the comparisons with that element type's tolerance."""

    def __init__(self, device, dtype="float32"):
        if dtype not in TOLERANCE:
            raise ValueError(f"dtype must be one of {', '.join(TOLERANCE)}, got {dtype!r}")
        self.device, self.dtype = device, dtype

    def round(self, x):
        """x as the element type would hold it, in float32 (the reference's input)."""
        if self.dtype == "bfloat16":
            return ops.from_bfloat16(ops.to_bfloat16(x))
        return x.astype(self.dtype).astype(numpy.float32)

    def put(self, x):
        x = backend.to_device(numpy.ascontiguousarray(x, dtype=numpy.float32), self.device)
        return ops.to_bfloat16(x) if self.dtype == "bfloat16" else x.astype(self.dtype)

    def get(self, x):
        """An array of the element type as host float32."""
        x = ops.from_bfloat16(x) if self.dtype == "bfloat16" else x
        return backend.to_numpy(x).astype(numpy.float32)

    def output(self, label, actual, expected, atol=None, gradient=False):
        """A Comparison of an element-type kernel result; ``atol`` names a case's own floor
        (cancellation in float32 sums), the element type's floor applies when larger."""
        rtol, floor = TOLERANCE[self.dtype]
        factor = GRAD_FACTOR[self.dtype] if gradient else 1.0
        atol = floor if atol is None else max(atol, floor)
        return compared(label, self.get(actual), expected, rtol * factor, atol * factor)

    def gradient(self, label, actual, expected, atol=None):
        return self.output(label, actual, expected, atol, gradient=True)


def rand(rng, *shape, scale=1.0):
    """float32 N(0, scale²) values."""
    return (rng.standard_normal(shape) * scale).astype(numpy.float32)


def reference(fn, inputs, upstream):
    """Outputs and input gradients of ``fn`` on float64 tensors of ``inputs`` for the upstream
    gradients ``upstream`` (one per output)."""
    tensors = [Tensor(numpy.asarray(x, dtype=numpy.float64), requires_grad=True) for x in inputs]
    outputs = fn(*tensors)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    grads = grad(outputs, tensors, [numpy.asarray(u, dtype=numpy.float64) for u in upstream])
    return [o.data for o in outputs], grads


def _philox_keep(seed, offset, shape, p):
    """The kernels' dropout mask of an array of ``shape``: philox_uniform(seed, offset, e) >= p over
    its elements in C order (kernels/philox.cuh, kernels/philox.py)."""
    return (philox_uniform(seed, offset, numpy.arange(math.prod(shape))) >= numpy.float32(p)).reshape(shape)


def _shape(array):
    return str(tuple(array.shape)).replace(" ", "")


# ------------------------------------------------------------------------ softmax
def softmax(dev, rows, cols, log=False, seed=0):
    """softmax.cu against F.softmax (F.log_softmax). The backward kernel takes the forward's y;
    it is compared with the backward's formula on that y, and (float32) with F's gradient:
        softmax:      dx = y ∘ (dy − Σ dy ∘ y);   log-softmax:  dx = dy − exp(y) · Σ dy
    """
    rng = numpy.random.default_rng(seed)
    x, g = dev.round(rand(rng, rows, cols, scale=3.0)), dev.round(rand(rng, rows, cols))
    (expected,), (expected_grad,) = reference(F.log_softmax if log else F.softmax, [x], [g])
    y = ops.softmax_forward(dev.put(x), log=log)
    grad_x = ops.softmax_backward(y, dev.put(g), log=log)
    y64, g64 = dev.get(y).astype(numpy.float64), g.astype(numpy.float64)
    if log:
        from_y = g64 - numpy.exp(y64) * g64.sum(-1, keepdims=True)
    else:
        from_y = y64 * (g64 - (g64 * y64).sum(-1, keepdims=True))
    comparisons = [dev.output("output", y, expected), dev.gradient("grad x", grad_x, from_y)]
    if dev.dtype == "float32":  # y is F's to float32 rounding: the formula is F's gradient
        comparisons.append(dev.gradient("grad x against F's", grad_x, expected_grad))
    return KernelRun(f"x {_shape(x)}", comparisons, {"y": dev.get(y)})


# ------------------------------------------------------------------------ layer norm
def layer_norm(dev, rows, cols, seed=0, rows_per_chunk=16, x=None):
    """layer_norm.cu (forward, dx, the two-stage dw/db) against F.layer_norm, eps 1e-5.
    ``x`` (float32, rows × cols) replaces the drawn N(1.5, 4) input, e.g. by rows near the
    float32 maximum, whose statistics the kernel computes on a rescaled row."""
    rng = numpy.random.default_rng(seed)
    x = dev.round(rand(rng, rows, cols, scale=2.0) + 1.5) if x is None else dev.round(x)
    w, b, g = dev.round(rand(rng, cols)), dev.round(rand(rng, cols)), dev.round(rand(rng, rows, cols))
    (expected,), (gx, gw, gb) = reference(lambda x, w, b: F.layer_norm(x, w, b, 1e-5), [x, w, b], [g])
    y, mean, rstd = ops.layer_norm_forward(dev.put(x), dev.put(w), dev.put(b), 1e-5)
    kx, kw, kb = ops.layer_norm_backward(dev.put(x), dev.put(w), dev.put(g), mean, rstd,
                                         rows_per_chunk=rows_per_chunk)
    # r·(g − mean g − x̂·mean(g x̂)) cancels: a few ulp of r·|g|; dw and db sum over the rows
    sums = 1e-5 * max(1, rows / 16)
    return KernelRun(f"x {_shape(x)} w,b {_shape(w)}",
                     [dev.output("output", y, expected, atol=1e-5), dev.gradient("grad x", kx, gx, atol=1e-5),
                      dev.gradient("grad w", kw, gw, atol=sums), dev.gradient("grad b", kb, gb, atol=sums)],
                     {"y": dev.get(y), "grad x": dev.get(kx), "grad w": dev.get(kw), "grad b": dev.get(kb),
                      "mean": backend.to_numpy(mean), "rstd": backend.to_numpy(rstd)})


# ------------------------------------------------------------------------ cross entropy
def cross_entropy(dev, rows, vocab, smoothing, ignore_index, seed=0):
    """cross_entropy.cu against F.cross_entropy(reduction="none", return_nll=True): per-row loss,
    NLL and log-sum-exp (float32 whatever the element type) and d logits; the first two targets
    are 0 (ignored when ignore_index is 0)."""
    rng = numpy.random.default_rng(seed)
    logits = dev.round(rand(rng, rows, vocab, scale=4.0))
    target = rng.integers(0, vocab, rows)
    target[: min(2, rows)] = 0
    keep = numpy.ones(rows, bool) if ignore_index is None else target != ignore_index
    g_loss, g_nll = (rand(rng, rows) * keep for _ in range(2))
    (loss, nll), (expected_grad,) = reference(
        lambda z: F.cross_entropy(z, target, smoothing, ignore_index, reduction="none", return_nll=True),
        [logits], [g_loss, g_nll])
    device_target = backend.to_device(target, dev.device)
    k_loss, k_nll, lse = ops.cross_entropy_forward(dev.put(logits), device_target, smoothing, ignore_index)
    k_grad = ops.cross_entropy_backward(dev.put(logits), device_target, lse,
                                        *(backend.to_device(g, dev.device) for g in (g_loss, g_nll)),
                                        smoothing, ignore_index)
    z = logits.astype(numpy.float64)
    shift = z.max(axis=-1)
    expected_lse = shift + numpy.log(numpy.exp(z - shift[:, None]).sum(axis=-1))
    return KernelRun(f"logits {_shape(logits)}",
                     [compared("loss", k_loss, loss, 1e-5, 2e-5), compared("nll", k_nll, nll, 1e-5, 2e-5),
                      compared("lse", lse, expected_lse, 1e-5, 2e-5),
                      dev.gradient("grad logits", k_grad, expected_grad, atol=1e-5)], {})


# ------------------------------------------------------------------------ adam
ADAM = dict(lr=0.01, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
"""The hyper-parameters of the Adam cases."""


class _AdamOnDevice:
    """Float32 parameters, moments and (mixed precision) compute copies on ``dev`` with an
    ``ops.AdamPlan`` over them, beside the same values on the host updated by
    ``device_update_reference`` (the kernel's specification) with the step scalars of an
    ``optim.Adam`` (``write_step_scalars``, ``finish_device_step``)."""

    def __init__(self, dev, start, chunk_size, copy_dtype=None, max_grad_norm=None):
        self.dev, self.copy_dtype = dev, copy_dtype
        self.host = [Tensor(a.copy(), requires_grad=True) for a in start]
        self.host_m, self.host_v = ([numpy.zeros_like(a) for a in start] for _ in range(2))
        self.host_adam = Adam(self.host, max_grad_norm=max_grad_norm, **ADAM)
        self.params = [dev.put(a) for a in start]
        self.m, self.v = ([dev.put(numpy.zeros_like(a)) for a in start] for _ in range(2))
        self.copies = [None] * len(start)
        if copy_dtype is not None:  # every parameter but the last has a compute copy
            half = backend.bfloat16 if copy_dtype == "bfloat16" else numpy.dtype(copy_dtype)
            self.copies = [backend.to_device(a.astype(half), dev.device) for a in start[:-1]] + [None]
        self.grads = [dev.put(numpy.zeros_like(a)) for a in start]  # persistent, as a captured step keeps them
        self.plan = ops.AdamPlan(self.params, self.grads, self.m, self.v, chunk_size=chunk_size, copies=self.copies)
        self.result = backend.to_device(numpy.zeros(2, numpy.float32), dev.device)

    def step(self, grads, grad_scale=1.0, skip_nonfinite=True, loss=None):
        """One step of the kernel and of the reference from the same gradients (and ``loss``, a
        float or None)."""
        for target, g in zip(self.grads, grads):
            target[...] = self.dev.put(g)
        self.host_adam.write_step_scalars(grad_scale, skip_nonfinite)
        host_loss = None if loss is None else numpy.array([loss], numpy.float32)
        device_update_reference([p.data for p in self.host], grads, self.host_m, self.host_v, self.host_adam.hyper,
                                self.host_adam.result, ADAM["betas"], ADAM["eps"], ADAM["weight_decay"],
                                loss=host_loss)
        self.host_adam.finish_device_step()
        hyper = backend.to_device(self.host_adam.hyper, self.dev.device)
        device_loss = None if loss is None else backend.to_device(host_loss, self.dev.device)
        ops.grad_norm_adam_update(self.plan, hyper, self.result, *ADAM["betas"], ADAM["eps"], ADAM["weight_decay"],
                                  loss=device_loss)

    def state(self):
        """The kernel's parameters, moments and copies as host arrays (copies as float32)."""
        return {"params": [self.dev.get(a) for a in self.params], "m": [self.dev.get(a) for a in self.m],
                "v": [self.dev.get(a) for a in self.v],
                "copies": [None if c is None else backend.to_numpy(c).astype(numpy.float32) for c in self.copies]}

    def comparisons(self, label):
        """Kernel against reference: parameters and moments (float32, rounding once a step:
        rtol 1e-6, atol 1e-7), the norm (rtol 1e-6), whether applied (exactly), and each compute copy
        against the kernel's own parameter rounded to the half type (exactly)."""
        state = self.state()
        out = [compared(f"{name} {i}, {label}", got, want, 1e-6, 1e-7)
               for name, reference in (("param", [p.data for p in self.host]), ("m", self.host_m), ("v", self.host_v))
               for i, (got, want) in enumerate(zip(state["params"] if name == "param" else state[name], reference))]
        result, expected = backend.to_numpy(self.result), self.host_adam.result
        out += [compared(f"norm, {label}", result[:1], expected[:1], 1e-6, 0.0),
                compared(f"applied, {label}", result[1:], expected[1:], 0.0, 0.0)]
        for i, c in enumerate(state["copies"]):
            if c is not None:
                rounded = backend.cast(state["params"][i], self.copies[i].dtype).astype(numpy.float32)
                out.append(compared(f"compute copy {i} ({self.copy_dtype}), {label}", c, rounded, 0.0, 0.0))
        return out


def adam(dev, shapes, chunk_size, steps=3, seed=0, copy_dtype=None, grad_scale=None, max_grad_norm=None):
    """adam.cu, the gradient-norm pass and the update (``ops.grad_norm_adam_update``), after every
    step against ``device_update_reference`` (``_AdamOnDevice.comparisons``) and against optim.Adam's
    eager loop in float64 (lr 0.01, betas (0.9, 0.98), eps 1e-9, weight decay 0.01): parameters
    rtol 1e-6, atol 1e-7, the norm rtol 1e-6. Mixed precision: ``copy_dtype`` ("float16",
    "bfloat16") gives every parameter but the last a compute copy; ``grad_scale`` s: the gradients
    are s times larger and the kernel divides them by s; ``max_grad_norm``: clipping (the cases'
    gradients have a norm of about √(elements))."""
    rng = numpy.random.default_rng(seed)
    start = [rand(rng, *s) for s in shapes]
    run = _AdamOnDevice(dev, start, chunk_size, copy_dtype, max_grad_norm)
    expected = [Tensor(a.astype(numpy.float64), requires_grad=True) for a in start]
    eager = Adam(expected, max_grad_norm=max_grad_norm, **ADAM)
    comparisons = []
    for t in range(1, steps + 1):
        grads = [rand(rng, *s) * numpy.float32(grad_scale or 1.0) for s in shapes]
        for p, g in zip(expected, grads):
            p.grad = g.astype(numpy.float64)
        eager.step(grad_scale=grad_scale)
        run.step(grads, grad_scale or 1.0)
        comparisons += run.comparisons(f"step {t}")
        comparisons += [compared(f"param {i} against the eager step, step {t}", dev.get(p), r.data, 1e-6, 1e-7)
                        for i, (p, r) in enumerate(zip(run.params, expected))]
        comparisons.append(compared(f"norm against the eager step, step {t}", backend.to_numpy(run.result)[:1],
                                    [eager.last_grad_norm], 1e-6, 0.0))
    return KernelRun(f"{len(shapes)} params ({', '.join(str(math.prod(s)) for s in shapes)})", comparisons,
                     {"plan": run.plan, "result": backend.to_numpy(run.result)})


#: What ``adam_skip`` makes non-finite: a gradient element (NaN or +Inf) or the loss.
ADAM_POISONS = ("grad nan", "grad inf", "loss nan", "loss inf")


def adam_skip(dev, shapes, chunk_size, poison, copy_dtype=None, seed=0):
    """A step whose gradient or loss is not finite (``ADAM_POISONS``) after a normal one: the
    kernel writes nothing (parameters, moments and copies bit for bit as before), result =
    [the norm: NaN, Inf or the finite one, 0], as ``device_update_reference``."""
    if poison not in ADAM_POISONS:
        raise ValueError(f"poison must be one of {', '.join(ADAM_POISONS)}, got {poison!r}")
    rng = numpy.random.default_rng(seed)
    run = _AdamOnDevice(dev, [rand(rng, *s) for s in shapes], chunk_size, copy_dtype)
    run.step([rand(rng, *s) for s in shapes], loss=1.5)
    comparisons = run.comparisons("the step before")
    before = run.state()
    grads = [rand(rng, *s) for s in shapes]
    what, value = poison.split()
    if what == "grad":
        grads[-1].reshape(-1)[-1] = numpy.float32(value)
    run.step(grads, loss=float(value) if what == "loss" else 2.5)
    after = run.state()
    comparisons += [compared(f"{name} {i} unchanged", a, b, 0.0, 0.0)
                    for name in after for i, (a, b) in enumerate(zip(after[name], before[name])) if a is not None]
    result = backend.to_numpy(run.result)
    kind, is_kind = {"grad nan": ("NaN", numpy.isnan), "grad inf": ("+Inf", numpy.isposinf)}.get(
        poison, ("finite", numpy.isfinite))
    comparisons += [compared("skipped (applied = 0)", result[1:], [0.0], 0.0, 0.0),
                    compared(f"norm is {kind}", [float(is_kind(result[0]))], [1.0], 0.0, 0.0),
                    compared("the reference skipped too", run.host_adam.result[1:], [0.0], 0.0, 0.0)]
    if what == "loss":
        comparisons.append(compared("norm as the reference's", result[:1], run.host_adam.result[:1], 1e-6, 0.0))
    return KernelRun(f"{len(shapes)} params, {poison}", comparisons, {"result": result})


# ------------------------------------------------------------------------ dropout
def dropout(dev, shape, p, seed, offset=0, rng_seed=0):
    """dropout.cu against its Philox reference: keep_i = philox_uniform(seed, offset, i) >= p over
    the elements in C order, exactly; y = x ∘ keep / (1 − p) (float32: rtol 1e-6)."""
    rng = numpy.random.default_rng(rng_seed)
    x = dev.round(rand(rng, *shape))
    keep = _philox_keep(seed, offset, x.shape, p)
    expected = numpy.where(keep, x.astype(numpy.float64) / (1.0 - p), 0.0)
    y, kernel_keep = ops.dropout_forward(dev.put(x), p, seed, offset)
    if kernel_keep.dtype != numpy.bool_ or kernel_keep.shape != x.shape or y.shape != x.shape:
        raise AssertionError(f"dropout kernel: keep {kernel_keep.dtype} {kernel_keep.shape}, y {y.shape} "
                             f"for x {x.shape}")
    output = (compared("output", dev.get(y), expected, 1e-6, 0.0) if dev.dtype == "float32"
              else dev.output("output", y, expected))
    return KernelRun(f"x {_shape(x)}", [compared("keep", kernel_keep, keep, 0.0, 0.0), output],
                     {"keep": backend.to_numpy(kernel_keep)})


# ------------------------------------------------------------------------ bias + ReLU + dropout
def bias_relu_dropout(dev, rows, cols, p, seed=0, rng_seed=0):
    """bias_relu_dropout.cu against dropout(max(0, y + b)) in float64 with dropout.cu's Philox mask
    (keep = philox_uniform(seed, 0, e) >= p) and the mask [y + b > 0] ∧ keep compared exactly; the
    backward dz ∘ mask · scale."""
    rng = numpy.random.default_rng(rng_seed)
    y, b, g = dev.round(rand(rng, rows, cols)), dev.round(rand(rng, cols)), dev.round(rand(rng, rows, cols))
    keep = _philox_keep(seed, 0, y.shape, p)
    scale = float(dev.round(numpy.array([1.0 / (1.0 - p)], numpy.float32))[0])
    pre = dev.round(y + b)  # y + b as the element type holds it
    mask = (pre > 0) & keep
    expected = numpy.where(mask, pre.astype(numpy.float64) * (scale if p else 1.0), 0.0)
    z, kernel_mask = ops.bias_relu_dropout_forward(dev.put(y), dev.put(b), p, seed, scale=scale)
    grad = ops.bias_relu_dropout_backward(dev.put(g), kernel_mask, scale if p else 1.0)
    expected_grad = numpy.where(mask, g.astype(numpy.float64) * (scale if p else 1.0), 0.0)
    tight = dev.dtype == "float32"
    return KernelRun(f"y {_shape(y)} b {_shape(b)} p {p:g}",
                     [compared("mask", kernel_mask, mask, 0.0, 0.0),
                      compared("output", dev.get(z), expected, 1e-6, 0.0) if tight else dev.output("output", z, expected),
                      compared("grad y", dev.get(grad), expected_grad, 1e-6, 0.0) if tight
                      else dev.gradient("grad y", grad, expected_grad)],
                     {"mask": backend.to_numpy(kernel_mask)})


# ------------------------------------------------------------------------ residual + dropout + layer norm
def residual_layer_norm(dev, rows, cols, p, seed=0, rng_seed=0):
    """residual_layer_norm.cu against F.layer_norm(h) in float64 with h = x + y ∘ Z as the kernel
    holds it (each term and the sum rounded to the element type, as the unfused path stores them),
    Z = keep/(1 − p) with dropout.cu's Philox mask keep = philox_uniform(seed, 0, e) >= p (compared
    exactly); outputs and the gradients of x (= dh), y (= dh ∘ Z), w, b for a random upstream
    gradient, with layer norm's tolerances. (A reference on the unrounded sum is off by h's
    rounding: in bfloat16 dw = Σ_rows dy ∘ x̂ then differs by 0.1 over 300 rows.)"""
    rng = numpy.random.default_rng(rng_seed)
    x, y = dev.round(rand(rng, rows, cols, scale=2.0) + 1.5), dev.round(rand(rng, rows, cols))
    w, b, g = dev.round(rand(rng, cols)), dev.round(rand(rng, cols)), dev.round(rand(rng, rows, cols))
    keep = _philox_keep(seed, 0, x.shape, p)
    scale = float(dev.round(numpy.array([1.0 / (1.0 - p)], numpy.float32))[0])  # in the element type, as F passes it
    kept = keep * scale
    h = dev.round(dev.round(y * kept.astype(numpy.float32)) + x)
    (expected,), (gh, gw, gb) = reference(lambda h, w, b: F.layer_norm(h, w, b, 1e-5), [h, w, b], [g])
    gx, gy = gh, gh * kept
    out, kernel_h, kernel_keep, mean, rstd = ops.residual_layer_norm_forward(
        dev.put(x), dev.put(y), dev.put(w), dev.put(b), p, seed, scale=scale)
    kx, ky, kw, kb = ops.residual_layer_norm_backward(kernel_h, dev.put(w), dev.put(g), mean, rstd, kernel_keep, scale)
    sums = 1e-5 * max(1, rows / 16)
    return KernelRun(f"x,y {_shape(x)} w,b {_shape(w)} p {p:g}",
                     [compared("keep", kernel_keep, keep, 0.0, 0.0), dev.output("output", out, expected, atol=1e-5),
                      dev.gradient("grad x", kx, gx, atol=1e-5), dev.gradient("grad y", ky, gy, atol=1e-5),
                      dev.gradient("grad w", kw, gw, atol=sums), dev.gradient("grad b", kb, gb, atol=sums)],
                     {"keep": backend.to_numpy(kernel_keep)})


# ------------------------------------------------------------------------ embedding
def embedding(dev, positions, vocab, cols, seed=0):
    """embedding.cu against the scatter add of dy's rows into their ids' rows in float64 (ids drawn
    with repeats, so some rows sum many terms and some none); ``results["grad w"]`` for the
    determinism tests."""
    rng = numpy.random.default_rng(seed)
    ids = rng.integers(0, vocab, positions)
    g = dev.round(rand(rng, positions, cols))
    expected = numpy.zeros((vocab, cols))
    numpy.add.at(expected, ids, g.astype(numpy.float64))
    kernel = ops.embedding_backward(backend.to_device(ids, dev.device), dev.put(g), vocab)
    return KernelRun(f"ids ({positions},) of {vocab}, dy {_shape(g)}",
                     [dev.gradient("grad w", kernel, expected, atol=1e-5 * max(1, positions / vocab))],
                     {"grad w": dev.get(kernel)})


# ------------------------------------------------------------------------ attention
def _attention_reference(dev, batch, heads, len_q, len_k, dim, lengths, causal, dropout_p, seed, rng_seed):
    """Rounded (batch, heads, len, dim) q, k, v, an upstream gradient g, and F's float64 output and
    gradients with the padding mask of ``lengths`` and ``causal``. With dropout the reference is
    (P ∘ Z)·V, P the probabilities F returns, Z = keep/(1 − p) from the kernels' Philox stream:
    keep = philox_uniform(seed, 0, (bh·Lq + i)·Lk + j) >= p."""
    rng = numpy.random.default_rng(rng_seed)
    q, k, v = (dev.round(rand(rng, batch, heads, n, dim)) for n in (len_q, len_k, len_k))
    g = dev.round(rand(rng, batch, heads, len_q, dim))
    mask = None
    if lengths is not None:
        mask = (numpy.arange(len_k)[None, :] < numpy.asarray(lengths)[:, None])[:, None, None, :]
    if dropout_p:
        keep = _philox_keep(seed, 0, (batch, heads, len_q, len_k), dropout_p)
        kept = Tensor(keep / (1.0 - dropout_p))

        def fn(q, k, v):
            _, probabilities = F.scaled_dot_product_attention(q, k, v, mask, causal, return_weights=True)
            return (probabilities * kept) @ v
    else:
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, mask, causal)
    (expected,), grads = reference(fn, [q, k, v], [g])
    return (q, k, v, g), expected, grads


def _key_lengths_on(dev, lengths):
    return None if lengths is None else backend.to_device(numpy.asarray(lengths, numpy.int32), dev.device)


def attention(dev, batch, heads, len_q, len_k, dim, lengths=None, causal=False, dropout_p=0.0, seed=0,
              rng_seed=0):
    """attention.cu on (batch·heads, len, dim) arrays against F.scaled_dot_product_attention
    (``_attention_reference``)."""
    (q, k, v, g), expected, grads = _attention_reference(dev, batch, heads, len_q, len_k, dim, lengths, causal,
                                                         dropout_p, seed, rng_seed)

    def flat(a):
        return dev.put(a.reshape(batch * heads, a.shape[2], dim))

    args = dict(key_lengths=_key_lengths_on(dev, lengths), causal=causal, dropout_p=dropout_p, seed=seed)
    o, lse = ops.attention_forward(flat(q), flat(k), flat(v), heads, **args)
    kq, kk, kv = ops.attention_backward(flat(q), flat(k), flat(v), o, lse, flat(g), heads, **args)
    comparisons = [dev.output("output", o, expected.reshape(o.shape))]
    for label, got, want in (("grad q", kq, grads[0]), ("grad k", kk, grads[1]), ("grad v", kv, grads[2])):
        comparisons.append(dev.gradient(label, got, want.reshape(got.shape), atol=1e-5))
    return KernelRun(f"q {_shape(q)} k,v {_shape(k)}", comparisons, {"o": dev.get(o), "lse": backend.to_numpy(lse)})


#: How the tensor-core case lays out q, k, v (batch, heads, len, d) in memory: "heads" contiguous as
#: (batch, heads, len, d); "projection" as views of (batch, len, heads, d) arrays (a head split by
#: reshape and transpose); "fused" as views of one (batch, len, 3, heads, d) array (a fused QKV
#: projection: rows 3·heads·d apart) — the last two read in place. Only "fused" needs len_q == len_k.
MMA_LAYOUTS = ("heads", "projection", "fused")


def _in_layout(dev, arrays, layout):
    if layout == "heads":
        return [dev.put(a) for a in arrays]
    if layout == "projection":
        return [dev.put(a.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for a in arrays]
    fused = dev.put(numpy.stack([a.transpose(0, 2, 1, 3) for a in arrays], axis=2))
    return [fused[:, :, n].transpose(0, 2, 1, 3) for n in range(len(arrays))]


def attention_mma(dev, batch, heads, len_q, len_k, dim, lengths=None, causal=False, dropout_p=0.0, seed=0,
                  rng_seed=0, layout="projection"):
    """attention_mma.cu (tensor cores; float16 or bfloat16) on q, k, v laid out as ``layout``
    (``MMA_LAYOUTS``) against F.scaled_dot_product_attention (``_attention_reference``). The
    products take P and dS rounded to the element type (as FlashAttention-2 does), so outputs and
    gradients meet the element type's tolerance on their values, gradients by GRAD_FACTOR."""
    if layout not in MMA_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(MMA_LAYOUTS)}, got {layout!r}")
    (q, k, v, g), expected, grads = _attention_reference(dev, batch, heads, len_q, len_k, dim, lengths, causal,
                                                         dropout_p, seed, rng_seed)
    qd, kd, vd = _in_layout(dev, [q, k, v], layout) if layout != "fused" or len_q == len_k else (
        _in_layout(dev, [q], "projection") + _in_layout(dev, [k, v], "fused"))
    (gd,) = _in_layout(dev, [g], "projection")
    args = dict(key_lengths=_key_lengths_on(dev, lengths), causal=causal, dropout_p=dropout_p, seed=seed)
    o, lse = ops.attention_mma_forward(qd, kd, vd, **args)
    kq, kk, kv = ops.attention_mma_backward(qd, kd, vd, o, lse, gd, **args)
    comparisons = [dev.output("output", o, expected)]
    for label, got, want in (("grad q", kq, grads[0]), ("grad k", kk, grads[1]), ("grad v", kv, grads[2])):
        comparisons.append(dev.gradient(label, got, want))
    return KernelRun(f"q {_shape(q)} k,v {_shape(k)} {layout}", comparisons,
                     {"o": dev.get(o), "lse": backend.to_numpy(lse), "grads": [dev.get(a) for a in (kq, kk, kv)]})


# ------------------------------------------------------------------------ the tensor-core instructions
def _bits(dev, rng, *shape):
    """Random 16-bit patterns as an array of the element type (float16 or bfloat16) on the device:
    ldmatrix moves bits, whatever they mean."""
    bits = rng.integers(0, 1 << 16, shape, dtype=numpy.uint16)
    return backend.to_device(bits.view(backend.bfloat16 if dev.dtype == "bfloat16" else numpy.float16), dev.device)


def _storage_bits(array):
    return backend.to_numpy(array).view(numpy.uint16)


def ldmatrix_layout(matrices, count, trans):
    """The registers (32 lanes × 4, unused 0) that ldmatrix.x{count}[.trans] gives for 8×8 16-bit
    ``matrices`` stacked as (8·count, 8) rows, by the PTX ISA's layout: register i of lane l holds
    row l/4, elements 2(l%4) and 2(l%4)+1 of matrix i (transposed: column l/4, rows 2(l%4), 2(l%4)+1)."""
    regs = numpy.zeros((32, 4), dtype=numpy.uint64)
    m = matrices.astype(numpy.uint64)
    for lane in range(32):
        for i in range(count):
            if trans:
                lo, hi = m[8 * i + 2 * (lane % 4), lane // 4], m[8 * i + 2 * (lane % 4) + 1, lane // 4]
            else:
                lo, hi = m[8 * i + lane // 4, 2 * (lane % 4)], m[8 * i + lane // 4, 2 * (lane % 4) + 1]
            regs[lane, i] = lo | (hi << numpy.uint64(16))
    return regs


def mma_instructions(dev, seed=0):
    """mma_probe.cu (the helpers of kernels/mma.cuh) against the PTX ISA's fragment layouts, for a
    float16 or bfloat16 ``dev``: the six ldmatrix variants bit for bit; mma.m16n8k16 with fragments
    packed by the documented layout and with fragments from ldmatrix, against a·b + c in float64
    (products exact, float32 sums: rtol 1e-5); cp.async's two groups and zero fill; and the
    round-to-nearest-even conversions float -> T -> float bit for bit against NumPy's."""
    from ..engine.kernels import launch  # the probes have no op of their own in kernels.ops

    if dev.dtype not in ("float16", "bfloat16"):
        raise ValueError(f"the tensor-core probes take float16 or bfloat16, got {dev.dtype}")
    rng = numpy.random.default_rng(seed)

    def on_device(array):
        return backend.to_device(numpy.ascontiguousarray(array), dev.device)

    kind = dev.dtype
    comparisons = []

    matrices = _bits(dev, rng, 32, 8)
    registers = on_device(numpy.zeros(6 * 32 * 4, dtype=numpy.uint32))
    launch.launch("ldmatrix_probe", kind, (1,), (32,), (matrices, registers))
    got = backend.to_numpy(registers).reshape(6, 32, 4)
    for variant, (count, trans) in enumerate([(1, False), (2, False), (4, False), (1, True), (2, True), (4, True)]):
        expected = ldmatrix_layout(_storage_bits(matrices), count, trans)
        comparisons.append(compared(f"ldmatrix.x{count}{'.trans' if trans else ''}", got[variant], expected, 0.0, 0.0))

    a, b = dev.round(rand(rng, 16, 16)), dev.round(rand(rng, 16, 8))
    c = rand(rng, 16, 8)
    expected = a.astype(numpy.float64) @ b.astype(numpy.float64) + c
    for via in (0, 1):
        d = on_device(numpy.zeros((16, 8), dtype=numpy.float32))
        launch.launch("mma_probe", kind, (1,), (32,), (dev.put(a), dev.put(b), on_device(c), d, numpy.int32(via)))
        comparisons.append(compared(f"mma.m16n8k16 {'via ldmatrix' if via else 'by layout'}", d, expected, 1e-5, 1e-5))

    chunk = 8  # 16-bit elements per 16-byte chunk
    source = _bits(dev, rng, 64 * chunk)
    out = on_device(numpy.zeros_like(backend.to_numpy(source)))
    valid = 29
    launch.launch("cp_async_probe", kind, (1,), (32,), (source, out, numpy.int32(valid), numpy.int32(0)))
    expected_bits = _storage_bits(source).reshape(2, 32, chunk).copy()
    expected_bits[:, valid:] = 0
    comparisons.append(compared("cp.async groups", _storage_bits(out), expected_bits.reshape(-1), 0.0, 0.0))

    tiny, big = (6e-8, 65504.0) if dev.dtype == "float16" else (9.2e-41, 3.3e38)
    x = numpy.concatenate([rand(rng, 200, scale=3.0), numpy.array(
        [0.0, -0.0, tiny, -tiny, tiny * 1.5, big, big * 1.0001, -big * 1.001, numpy.inf, -numpy.inf, 1 + 2 ** -11,
         1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 2 ** -15, 2 ** -24 * 2.5], numpy.float32)])
    y = on_device(numpy.zeros(x.size, dtype=backend.bfloat16 if dev.dtype == "bfloat16" else numpy.float16))
    back = on_device(numpy.zeros(x.size, dtype=numpy.float32))
    launch.launch("convert_probe", kind, (1,), (32,), (on_device(x), y, back, numpy.int32(x.size)))
    with numpy.errstate(over="ignore"):  # the values beyond T's range round to inf on purpose
        rounded = (ops.to_bfloat16(x) if dev.dtype == "bfloat16" else x.astype(numpy.float16)).view(numpy.uint16)
        widened = dev.round(x)
    comparisons.append(compared("float -> T (nearest even)", _storage_bits(y), rounded, 0.0, 0.0))
    comparisons.append(compared("T -> float (bits)", backend.to_numpy(back).view(numpy.uint32), widened.view(numpy.uint32),
                                0.0, 0.0))
    return KernelRun(f"{dev.dtype} probes", comparisons, {})
