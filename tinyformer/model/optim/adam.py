"""Adam (Kingma & Ba, 2015) with the paper's settings β₁ = 0.9, β₂ = 0.98, ε = 10⁻⁹ (§5.3)."""

import math

import numpy

from ...engine import amp, backend, kernels
from ...engine.kernels import adam as adam_kernel
from ...engine.kernels.arguments import pointer
from ...engine.tensor import Tensor

__all__ = ["Adam", "clip_grad_norm", "fused_update"]


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


def _update_flat(theta, g, m, v, tmp, betas, bias2, eps, step_size):
    """One Adam update of the flat contiguous arrays θ, m, v in place from the gradient g (its
    multiplier and weight decay applied); ``tmp`` a scratch of θ's size. Large arrays in blocks
    on several threads. The eager loop and ``fused_update`` both run this."""
    beta1, beta2 = betas
    xp = backend.get_array_module(theta)

    def update(start, stop):  # elements [start, stop)
        m_, v_, t_, g_ = m[start:stop], v[start:stop], tmp[start:stop], g[start:stop]
        m_ *= beta1
        m_ += xp.multiply(g_, 1.0 - beta1, out=t_)
        v_ *= beta2
        xp.multiply(g_, g_, out=t_)
        t_ *= 1.0 - beta2
        v_ += t_
        xp.divide(v_, bias2, out=t_)  # t = √(v / (1 − β₂ᵗ)) + ε
        xp.sqrt(t_, out=t_)
        t_ += eps
        xp.divide(m_, t_, out=t_)  # t = step size · m / t
        t_ *= step_size
        theta[start:stop] -= t_

    backend.map_row_blocks(update, theta.size, theta, cache_sized=True)


def _effective_gradient(g, theta, multiplier, weight_decay):
    """g · multiplier + λθ, as the update uses it (g itself when neither applies)."""
    if multiplier != 1.0:
        g = g * g.dtype.type(multiplier)
    if weight_decay:
        g = g + weight_decay * theta
    return g


def _on_host(array):
    """A NumPy array as a plain ndarray (the reference runs on the host: its "device" buffers are
    host memory, whatever ndarray subclass holds them, and reading them is no read-back); a CuPy
    array read back (not capturable)."""
    return backend.to_numpy(array) if backend.is_cupy_array(array) else numpy.asarray(array)


def _plain(array):
    """A NumPy array as a plain ndarray (``_on_host``); a CuPy array as it is."""
    return array if backend.is_cupy_array(array) else numpy.asarray(array)


def fused_update(params, grads, m, v, hyper, result, betas, eps, weight_decay, loss=None, copies=None):
    """The fused device step (``kernels.adam.grad_norm_adam_update``: global norm, clipping, the
    non-finite skip and the update in one call, its scalars read from the buffer ``hyper``) as
    array operations: ``Adam.step_on_device``'s path where the kernel does not run (NumPy arrays;
    CuPy works too, reading the scalars back), and so the kernel's specification. ``hyper`` holds
    ``kernels.adam.ADAM_HYPER`` (step_size, bias2, loss scale s, max_grad_norm with ≤ 0 for none,
    skip_nonfinite); ``params``, ``m``, ``v`` (and the ``copies``, None or per parameter a half
    copy or None) are updated in place, ``result`` gets [norm, applied].

    norm = √(Σ g², accumulated in float64) / s, reported in float32; applied = not skip_nonfinite,
    or that norm and ``loss`` (a one-element array, or None) are finite. Not applied: nothing but
    ``result`` is written. Applied: g · clip(norm)/s + λθ into the update, clip as ``_clip_factor``.
    """
    step_size, bias2, scale, max_norm, skip = (float(x) for x in _on_host(hyper)[:5])
    total = 0.0
    for g in grads:
        flat = _plain(g).reshape(-1).astype(numpy.float64)
        total += float(flat @ flat)
    norm = math.sqrt(total) / scale
    with numpy.errstate(over="ignore"):
        reported = numpy.float32(norm)
    loss_value = None if loss is None else float(_on_host(loss).reshape(-1)[0])
    finite = bool(numpy.isfinite(reported)) and (loss_value is None or math.isfinite(loss_value))
    applied = not skip or finite
    result[0], result[1] = reported, float(applied)
    if not applied:
        return
    multiplier = float(numpy.float32(_clip_factor(norm, max_norm if max_norm > 0 else None) / scale))
    for i, (theta, g, m_i, v_i) in enumerate(zip(params, grads, m, v)):
        for name, a in (("params", theta), ("m", m_i), ("v", v_i)):
            if not a.flags.c_contiguous:
                raise ValueError(f"fused_update: {name}[{i}] must be C-contiguous (updated in place)")
        g = _effective_gradient(g, theta, multiplier, weight_decay)
        flat = [a.reshape(-1) for a in (theta, g, m_i, v_i)]
        _update_flat(*flat, backend.get_array_module(theta).empty_like(flat[0]), betas, bias2, eps, step_size)
        if copies is not None and copies[i] is not None:
            copies[i][...] = backend.cast(theta, copies[i].dtype)


class Adam:
    """m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  θ ← θ − lr · m̂ / (√v̂ + ε) with m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ).

    ``lr`` is a number or a schedule: a callable of the step number (1, 2, ...)
    such as ``NoamSchedule``. ``max_grad_norm`` clips the global gradient norm
    first; ``weight_decay`` adds λθ to the gradient (L2, as ``torch.optim.Adam``).
    Parameters without a gradient are skipped.

    Mixed precision (``tinyformer.engine.amp``): the parameters and moments stay float32 (the master
    weights); a parameter's half-precision compute copy, once made, is refreshed by every step
    (inside the fused kernel on the GPU). ``step(grad_scale=s)`` takes gradients of a loss scaled
    by s (``GradScaler``) and divides them by s before clipping and the update.

    On the GPU (``kernels.use_kernels``) a step runs on the device (kernels/adam.cu): the norm,
    clipping, the non-finite skip and the update, with no value read back but the result. The
    same calls make a step a CUDA graph can capture: ``write_step_scalars`` (the step's learning
    rate and loss scale into the device buffer ``hyper``, before the replay), ``prepare_device_step``
    (moments and the kernel's pointer tables, outside the capture), ``step_on_device`` (captured)
    and ``finish_device_step`` (reads ``result``: the norm and whether the update was applied).
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
        self.hyper = self.result = None  # the device step's scalars (kernels.adam.ADAM_HYPER) and [norm, applied]
        self._device_plan = None  # (key of the arrays' addresses, adam_kernel.AdamPlan)

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
        if self._kernel_applies(self._active(), amp.compute_copies(self.params)):
            self.write_step_scalars(1.0 if grad_scale is None else grad_scale, skip_nonfinite=skip_nonfinite)
            self.prepare_device_step()
            self.step_on_device()
            norm, _ = self.finish_device_step()
            self._device_plan = None  # it holds this step's gradients; the next backward makes new ones
            return norm
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
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = _effective_gradient(p.grad, p.data, multiplier, self.weight_decay)
            xp = backend.get_array_module(p.data)
            self._init_moments(i)
            if not p.data.flags.c_contiguous:  # updated through a flat view below
                p.data = xp.ascontiguousarray(p.data)
            flat = (a.reshape(-1) for a in (p.data, g, self.m[i], self.v[i], self._scratch(p.data)))
            _update_flat(*flat, self.betas, bias2, self.eps, step_size)
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

    # ---------------------------------------------------------------- the step on the device
    def write_step_scalars(self, grad_scale=1.0, skip_nonfinite=True):
        """Write the next step's scalars (``kernels.adam.ADAM_HYPER``: lr(t)/(1 − β₁ᵗ), 1 − β₂ᵗ for
        t = step_count + 1, the loss scale, max_grad_norm or 0, the skip flag) into the persistent
        buffer ``hyper`` on the parameters' device, allocated on the first call with ``result``.
        The one host-to-device copy of a step: outside any capture, before the step or replay."""
        if backend.is_capturing():
            raise RuntimeError("Adam.write_step_scalars copies to the device: call it before a captured step "
                               "is replayed, not inside the capture")
        t = self.step_count + 1
        beta1, beta2 = self.betas
        values = numpy.array([self.current_lr(t) / (1.0 - beta1 ** t), 1.0 - beta2 ** t, grad_scale,
                              self.max_grad_norm or 0.0, 1.0 if skip_nonfinite else 0.0], dtype=numpy.float32)
        like = self.params[0].data
        if self.hyper is None or backend.device_of(self.hyper) != backend.device_of(like):
            self.hyper = backend.like(values, like)
            self.result = backend.like(numpy.zeros(2, dtype=numpy.float32), like)
        else:
            backend.copy_into(self.hyper, values)

    def prepare_device_step(self):
        """Outside any capture: zero moments where missing, contiguous parameters and gradients,
        and, where the kernel runs, its pointer tables (``adam_kernel.AdamPlan``) for the current
        arrays, cached while their addresses stay the same (persistent gradient buffers keep them).
        Returns True when it built new tables: a graph captured with the old ones is stale."""
        active = self._active()
        self._ready_arrays(active)
        copies = amp.compute_copies(self.params)
        if not self._kernel_applies(active, copies):
            self._device_plan = None
            return False
        key = self._plan_key(active, copies)
        if self._device_plan is not None and self._device_plan[0] == key:
            return False
        plan = adam_kernel.AdamPlan([self.params[i].data for i in active], [self.params[i].grad for i in active],
                                    [self.m[i] for i in active], [self.v[i] for i in active],
                                    copies=[copies[i] for i in active])
        self._device_plan = (key, plan)
        return True

    def step_on_device(self, loss=None):
        """The step from the current ``.grad`` with the scalars of ``write_step_scalars``: the
        global norm, clipping, the skip of a non-finite norm or ``loss`` (a float32 one-element
        device array or Tensor, or None) and the update, on the device: kernels/adam.cu where
        ``kernels.use_kernels`` holds for the parameters and gradients (no host read, capturable),
        else ``fused_update``. Writes ``result``; ``finish_device_step`` reads it."""
        if self.hyper is None:
            raise RuntimeError("Adam.step_on_device: no step scalars on the device; call write_step_scalars() first")
        loss = loss.data if isinstance(loss, Tensor) else loss
        active = self._active()
        copies = amp.compute_copies(self.params)
        if not self._kernel_applies(active, copies):
            self._ready_arrays(active)
            fused_update([self.params[i].data for i in active], [self.params[i].grad for i in active],
                                    [self.m[i] for i in active], [self.v[i] for i in active], self.hyper, self.result,
                                    self.betas, self.eps, self.weight_decay, loss=loss,
                                    copies=[copies[i] for i in active])
            return
        if self._device_plan is None or self._device_plan[0] != self._plan_key(active, copies):
            if backend.is_capturing():
                raise RuntimeError("Adam.step_on_device: the kernel's pointer tables are missing or do not match the "
                                   "parameters, gradients and moments; call prepare_device_step() before the capture "
                                   "and keep the gradients in place (zero them, do not replace them)")
            self.prepare_device_step()
        beta1, beta2 = self.betas
        adam_kernel.grad_norm_adam_update(self._device_plan[1], self.hyper, self.result, beta1, beta2, self.eps,
                                          self.weight_decay, loss=loss)

    def finish_device_step(self):
        """Read ``result`` (the step's one synchronisation): sets ``last_grad_norm`` and counts the
        step if its update was applied. Returns (norm, applied)."""
        if self.result is None:
            raise RuntimeError("Adam.finish_device_step: no step ran on the device")
        norm, applied = (float(x) for x in backend.to_numpy(self.result))
        self.last_grad_norm, applied = norm, applied != 0.0
        if applied:
            self.step_count += 1
        return norm, applied

    def _active(self):
        """Indices of the parameters with a gradient."""
        return [i for i, p in enumerate(self.params) if p.grad is not None]

    def _ready_arrays(self, active):
        for i in active:
            self._init_moments(i)
            p = self.params[i]
            xp = backend.get_array_module(p.data)
            if not p.data.flags.c_contiguous:  # updated in place through its pointer or a flat view
                p.data = xp.ascontiguousarray(p.data)
            if not p.grad.flags.c_contiguous:
                p.grad = xp.ascontiguousarray(p.grad)

    def _kernel_applies(self, active, copies):
        """Whether kernels/adam.cu runs: ``kernels.use_kernels`` says so for the parameters and
        gradients, they share one dtype, and the compute copies (``copies``) one half dtype and
        the parameters' device."""
        arrays = [a for i in active for a in (self.params[i].data, self.params[i].grad)]
        if not arrays or not kernels.use_kernels(*arrays) or len({a.dtype for a in arrays}) != 1:
            return False
        present = [copies[i] for i in active if copies[i] is not None]
        return len({c.dtype for c in present}) <= 1 and all(
            c.flags.c_contiguous and backend.is_cupy_array(c) == backend.is_cupy_array(arrays[0]) for c in present)

    def _plan_key(self, active, copies):
        """What a plan's pointer tables depend on: the addresses, sizes and dtypes of the arrays."""
        def address(a):
            return (0, "") if a is None else (pointer(a), a.dtype.str)

        return tuple((self.params[i].data.size, *address(self.params[i].data), *address(self.params[i].grad),
                      *address(self.m[i]), *address(self.v[i]), *address(copies[i])) for i in active)

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
