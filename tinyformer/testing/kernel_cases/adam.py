"""The cases of adam.cu: its fused step against ``optim.adam.fused_update`` and
``optim.Adam``'s eager loop, and its skip of a non-finite step."""

import math

import numpy

from ...engine import backend
from ...engine.kernels import adam as adam_kernel
from ...engine.tensor import Tensor
from ...model.optim import Adam
from ...model.optim.adam import fused_update
from .harness import KernelRun, compared, rand


ADAM = dict(lr=0.01, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
"""The hyper-parameters of the Adam cases."""


class _AdamOnDevice:
    """Float32 parameters, moments and (mixed precision) compute copies on ``dev`` with an
    ``adam_kernel.AdamPlan`` over them, beside the same values on the host updated by
    ``fused_update`` (the kernel's specification) with the step scalars of an
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
        self.plan = adam_kernel.AdamPlan(self.params, self.grads, self.m, self.v, chunk_size=chunk_size,
                                         copies=self.copies)
        self.result = backend.to_device(numpy.zeros(2, numpy.float32), dev.device)

    def step(self, grads, grad_scale=1.0, skip_nonfinite=True, loss=None):
        """One step of the kernel and of the reference from the same gradients (and ``loss``, a
        float or None)."""
        for target, g in zip(self.grads, grads):
            target[...] = self.dev.put(g)
        self.host_adam.write_step_scalars(grad_scale, skip_nonfinite)
        host_loss = None if loss is None else numpy.array([loss], numpy.float32)
        fused_update([p.data for p in self.host], grads, self.host_m, self.host_v, self.host_adam.hyper,
                                self.host_adam.result, ADAM["betas"], ADAM["eps"], ADAM["weight_decay"],
                                loss=host_loss)
        self.host_adam.finish_device_step()
        hyper = backend.to_device(self.host_adam.hyper, self.dev.device)
        device_loss = None if loss is None else backend.to_device(host_loss, self.dev.device)
        adam_kernel.grad_norm_adam_update(self.plan, hyper, self.result, *ADAM["betas"], ADAM["eps"],
                                          ADAM["weight_decay"], loss=device_loss)

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
    """adam.cu, the gradient-norm pass and the update (``adam_kernel.grad_norm_adam_update``), after every
    step against ``fused_update`` (``_AdamOnDevice.comparisons``) and against optim.Adam's
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
    [the norm: NaN, Inf or the finite one, 0], as ``fused_update``."""
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
