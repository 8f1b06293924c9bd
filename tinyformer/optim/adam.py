"""Adam (Kingma & Ba, 2015) with the paper's settings β₁ = 0.9, β₂ = 0.98, ε = 10⁻⁹ (§5.3)."""

import math

import numpy

from .. import amp, backend, kernels
from ..kernels import ops as kernel_ops

__all__ = ["Adam", "clip_grad_norm"]


def clip_grad_norm(params, max_norm):
    """Scale every gradient by min(1, max_norm / ‖g‖) where ‖g‖ is the norm of all of them together.

    Returns the norm before clipping (``inf`` or ``nan`` if a gradient is not finite;
    gradients are then left as they are).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = math.sqrt(_total_squared_norm(grads))
    scale = _clip_factor(total, max_norm)
    if scale != 1.0:
        for g in grads:
            g *= g.dtype.type(scale)
    return total


def _clip_factor(norm, max_norm):
    """min(1, max_norm / ‖g‖) for a finite norm; 1 without max_norm or for a non-finite norm."""
    if max_norm is not None and math.isfinite(norm) and norm > max_norm:
        return max_norm / (norm + 1e-12)
    return 1.0


def _total_squared_norm(grads):
    """Σ over the gradients of Σ g² as a Python float: one BLAS dot product per gradient in its
    own precision (no float64 copy), redone in float64 for a gradient whose float32 sum
    overflows on finite values. On a GPU the dot products stay on the device and are read
    back once (one synchronisation per step, not one per parameter)."""
    xp = backend.get_array_module(grads[0])
    flats = [g.reshape(-1) for g in grads]
    squares = [xp.vdot(flat, flat) for flat in flats]
    if xp is not numpy:
        squares = xp.stack(squares).astype(numpy.float64).tolist()  # the one device -> host copy
    total = 0.0
    for flat, square in zip(flats, squares):
        square = float(square)
        if not math.isfinite(square) and bool(xp.isfinite(flat).all()):
            square = float((flat.astype(numpy.float64) ** 2).sum())
        total += square
    return total


class Adam:
    """m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  θ ← θ − lr · m̂ / (√v̂ + ε) with m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ).

    ``lr`` is a number or a schedule: a callable of the step number (1, 2, ...)
    such as ``NoamSchedule``. ``max_grad_norm`` clips the global gradient norm
    first; ``weight_decay`` adds λθ to the gradient (L2, as ``torch.optim.Adam``).
    Parameters without a gradient are skipped.

    Mixed precision (``tinyformer.amp``): the parameters and moments stay float32 (the master
    weights); a parameter's half-precision compute copy, once made, is refreshed by every step
    (inside the fused kernel on the GPU). ``step(grad_scale=s)`` takes gradients of a loss scaled
    by s (``GradScaler``) and divides them by s before clipping and the update.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0,
                 max_grad_norm=None):
        self.params = list(params)
        if not self.params:
            raise ValueError("Adam: params is empty")
        ids = [id(p) for p in self.params]
        if len(set(ids)) != len(ids):
            raise ValueError("Adam: a parameter appears more than once in params")
        if not callable(lr) and not lr > 0:
            raise ValueError(f"Adam: lr must be positive or a schedule, got {lr!r}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Adam: betas must lie in [0, 1), got {betas}")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"Adam: max_grad_norm must be positive, got {max_grad_norm!r}")
        self.lr, self.betas, self.eps = lr, tuple(betas), eps
        self.weight_decay, self.max_grad_norm = weight_decay, max_grad_norm
        self.step_count = 0
        self.m = [None] * len(self.params)
        self.v = [None] * len(self.params)
        self.last_grad_norm = None
        self._buffers = {}

    def current_lr(self, step=None):
        """The learning rate used at ``step`` (default: the next step)."""
        step = self.step_count + 1 if step is None else step
        return float(self.lr(step)) if callable(self.lr) else float(self.lr)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self, skip_nonfinite=False, grad_scale=None):
        """One update from the parameters' current ``.grad``; returns the gradient norm.

        With ``skip_nonfinite``, a gradient holding NaN or Inf (its norm is not finite) changes
        nothing: no update, no moment, no step counted. ``grad_scale``: the gradients are those of
        the loss times it; the norm returned and clipped is the unscaled one.
        """
        multiplier = 1.0
        if grad_scale is None:
            self.last_grad_norm = clip_grad_norm(self.params, self.max_grad_norm)
        else:
            self.last_grad_norm, multiplier = self._unscaled_norm(grad_scale)
        if skip_nonfinite and not math.isfinite(self.last_grad_norm):
            return self.last_grad_norm
        self.step_count += 1
        t = self.step_count
        lr = self.current_lr(t)
        beta1, beta2 = self.betas
        bias1, bias2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
        step_size = lr / bias1
        copies = amp.compute_copies(self.params)
        if self._fused_step(step_size, bias2, multiplier, copies):
            return self.last_grad_norm
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            if multiplier != 1.0:
                g = g * g.dtype.type(multiplier)
            if self.weight_decay:
                g = g + self.weight_decay * p.data
            xp = backend.get_array_module(p.data)
            self._init_moments(i)
            if not p.data.flags.c_contiguous:  # updated through a flat view below
                p.data = xp.ascontiguousarray(p.data)
            theta, g, m, v, tmp = (a.reshape(-1) for a in (p.data, g, self.m[i], self.v[i], self._scratch(p.data)))

            def update(start, stop):  # elements [start, stop); large parameters in blocks on several threads
                m_, v_, t_, g_ = m[start:stop], v[start:stop], tmp[start:stop], g[start:stop]
                m_ *= beta1
                m_ += xp.multiply(g_, 1.0 - beta1, out=t_)
                v_ *= beta2
                xp.multiply(g_, g_, out=t_)
                t_ *= 1.0 - beta2
                v_ += t_
                xp.divide(v_, bias2, out=t_)  # t = √(v / (1 − β₂ᵗ)) + ε
                xp.sqrt(t_, out=t_)
                t_ += self.eps
                xp.divide(m_, t_, out=t_)  # t = step size · m / t
                t_ *= step_size
                theta[start:stop] -= t_

            backend.map_row_blocks(update, theta.size, theta)
            if copies[i] is not None:
                amp.refresh_compute_copy(p, copies[i])
        return self.last_grad_norm

    def _unscaled_norm(self, grad_scale):
        """(‖g‖ / s, the factor that unscales and clips) for gradients of a loss scaled by s; the
        gradients are not touched (the update applies the factor)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = math.sqrt(_total_squared_norm(grads)) / grad_scale if grads else 0.0
        return norm, _clip_factor(norm, self.max_grad_norm) / grad_scale

    def _init_moments(self, i):
        """Zero moments for parameter ``i`` on its first update."""
        if self.m[i] is None:
            data = self.params[i].data
            xp = backend.get_array_module(data)
            self.m[i], self.v[i] = xp.zeros_like(data), xp.zeros_like(data)

    def _scratch(self, like):
        """A temporary of ``like``'s shape and dtype, carved from one buffer reused by every
        parameter and step (instead of a handful of new arrays per parameter per step)."""
        xp = backend.get_array_module(like)
        key = (like.dtype.str, xp.__name__)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.size < like.size:
            buffer = self._buffers[key] = xp.empty(max(p.data.size for p in self.params), dtype=like.dtype)
        return buffer[: like.size].reshape(like.shape)

    def _fused_step(self, step_size, bias2, multiplier=1.0, copies=None):
        """kernels/adam.cu: every parameter with a gradient in one launch, where ``kernels.use_kernels``
        says so for the parameters and gradients and they share one dtype; the compute copies
        (``copies``, one half dtype) are written in the same pass.

        Returns False, doing nothing, when the reference loop above must run instead.
        """
        active = [i for i, p in enumerate(self.params) if p.grad is not None]
        arrays = [a for i in active for a in (self.params[i].data, self.params[i].grad)]
        if not arrays or not kernels.use_kernels(*arrays) or len({a.dtype for a in arrays}) != 1:
            return False
        copies = [None] * len(self.params) if copies is None else copies
        active_copies = [copies[i] for i in active]
        if len({c.dtype for c in active_copies if c is not None}) > 1 or not all(
                c is None or (c.flags.c_contiguous and backend.is_cupy_array(c) == backend.is_cupy_array(arrays[0]))
                for c in active_copies):
            return False
        xp = backend.get_array_module(self.params[active[0]].data)
        for i in active:
            self._init_moments(i)
        # The pointer tables are rebuilt every step: gradients are new arrays each backward.
        plan = kernel_ops.AdamPlan([self.params[i].data for i in active],
                                   [xp.ascontiguousarray(self.params[i].grad) for i in active],
                                   [self.m[i] for i in active], [self.v[i] for i in active],
                                   copies=active_copies)
        beta1, beta2 = self.betas
        kernel_ops.adam_update(plan, step_size, beta1, beta2, bias2, self.eps, self.weight_decay,
                               grad_multiplier=multiplier)  # it writes the live compute copies in place
        return True

    def state_dict(self):
        """Step count, hyper-parameters and moments (NumPy copies; None for untouched parameters)."""
        return {
            "step_count": self.step_count,
            "betas": self.betas,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "max_grad_norm": self.max_grad_norm,
            "lr": None if callable(self.lr) else self.lr,
            "schedule": self.lr.state_dict() if hasattr(self.lr, "state_dict") else None,
            "m": [None if a is None else backend.to_numpy(a).copy() for a in self.m],
            "v": [None if a is None else backend.to_numpy(a).copy() for a in self.v],
        }

    def load_state_dict(self, state):
        """Restore from ``state_dict()``; checks the parameter count and every moment's shape first."""
        m, v = state["m"], state["v"]
        if len(m) != len(self.params) or len(v) != len(self.params):
            raise ValueError(
                f"Adam.load_state_dict: state has moments for {len(m)} parameters, "
                f"the optimizer holds {len(self.params)}"
            )
        for i, (p, mi) in enumerate(zip(self.params, m)):
            if mi is not None and tuple(mi.shape) != p.shape:
                raise ValueError(
                    f"Adam.load_state_dict: moment {i} has shape {tuple(mi.shape)}, "
                    f"parameter {i} has shape {p.shape}"
                )
        self.step_count = int(state["step_count"])
        self.betas, self.eps = tuple(state["betas"]), state["eps"]
        self.weight_decay, self.max_grad_norm = state["weight_decay"], state["max_grad_norm"]
        if state.get("lr") is not None:
            self.lr = state["lr"]
        elif state.get("schedule") is not None and hasattr(self.lr, "load_state_dict"):
            self.lr.load_state_dict(state["schedule"])

        def restore(a, p):
            return None if a is None else backend.like(a, p.data).astype(p.data.dtype, copy=True)

        self.m = [restore(a, p) for a, p in zip(m, self.params)]
        self.v = [restore(a, p) for a, p in zip(v, self.params)]
        return self
