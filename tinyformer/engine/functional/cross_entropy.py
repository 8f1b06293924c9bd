"""Label-smoothed cross entropy fused with log-softmax (§5.4); kernels/cross_entropy.cu on the GPU."""

from .. import backend, kernels
from ..kernels import cross_entropy as cross_entropy_kernel
from ..tensor import Tensor
from ...common.validation import check_real, rectangular_array
from ._dispatch import KernelFunction

_xp = backend.get_array_module

_REDUCTIONS = ("mean", "sum", "none")


class CrossEntropy(KernelFunction):
    """Label-smoothed cross entropy fused with log-softmax, plus the plain NLL.

    With p = softmax(z) over V classes and target distribution
    q = (1 − ε)·onehot(t) + ε/V (Szegedy et al., 2016):
    loss = −Σᵥ qᵥ log pᵥ and nll = −log pₜ, so dz = (p − q)·dloss + (p − onehot)·dnll.
    Positions whose target is ``ignore_index`` count for nothing; "mean" divides by
    the number of the other positions.
    """

    materialize_grads = False
    float32_outputs = (0, 1)  # the loss and the NLL stay float32 for half logits

    def kernel_applies(self, logits, target, smoothing, ignore_index, reduction):
        return kernels.use_kernels(logits)

    def _rows(self, logits, target, smoothing, ignore_index, reduction):
        """Both paths' start: logits as (N, V) rows, targets flat."""
        self.smoothing, self.shape, self.reduction = smoothing, logits.shape, reduction
        return logits.reshape(-1, logits.shape[-1]), target.reshape(-1)

    def forward_reference(self, logits, target, smoothing, ignore_index, reduction):
        xp = _xp(logits)
        vocab = logits.shape[-1]
        flat, t = self._rows(logits, target, smoothing, ignore_index, reduction)
        keep = xp.ones(t.shape, dtype=bool) if ignore_index is None else t != ignore_index
        t_safe = xp.where(keep, t, 0)
        rows = xp.arange(len(t))
        # One (N, V) buffer holds z − max, then exp of it, then p; log p is never materialised:
        # log pₜ = shiftedₜ − log Z and Σᵥ log pᵥ = Σᵥ shiftedᵥ − V·log Z.
        p = xp.empty_like(flat)

        def softmax_rows(start, stop):  # rows [start, stop) of p; returns shiftedₜ, Σ shifted, Z
            z, out = flat[start:stop], p[start:stop]
            xp.subtract(z, z.max(axis=-1, keepdims=True), out=out)
            target_value = out[rows[: stop - start], t_safe[start:stop]]
            shifted_total = out.sum(axis=-1) if smoothing else None
            xp.exp(out, out=out)
            z_total = out.sum(axis=-1)
            out /= z_total[:, None]
            return target_value, shifted_total, z_total

        blocks = backend.map_row_blocks(softmax_rows, len(t), flat, row_size=vocab, cache_sized=True)
        shifted_target = xp.concatenate([b[0] for b in blocks])
        shifted_sum = xp.concatenate([b[1] for b in blocks]) if smoothing else None
        total = xp.concatenate([b[2] for b in blocks])
        log_z = xp.log(total)
        nll = log_z - shifted_target
        if smoothing:
            sum_logp = shifted_sum - vocab * log_z
            loss = (1.0 - smoothing) * nll - (smoothing / vocab) * sum_logp
        else:
            loss = nll
        self.p, self.t_safe, self.rows = p, t_safe, rows
        return self._reduce(loss, nll, keep, target.shape, logits.dtype)

    def backward_reference(self, g_loss, g_nll):
        xp = _xp(self.p)
        p = self.p
        vocab = p.shape[-1]
        zero = xp.zeros((), dtype=p.dtype)
        g_loss = zero if g_loss is None else g_loss
        g_nll = zero if g_nll is None else g_nll
        if self.reduction == "none":
            g_loss, g_nll = g_loss.reshape(-1, 1), g_nll.reshape(-1, 1)
        # both targets sum to one: the p part is shared. When the graph is released after this
        # backward, p is not needed again and becomes the gradient in place.
        grad = p if not self.retain_graph else p.copy()
        rows = (len(grad), 1)
        shared = xp.broadcast_to(g_loss + g_nll, rows)
        uniform = xp.broadcast_to((self.smoothing / vocab) * g_loss, rows)
        target_weight = xp.broadcast_to((1.0 - self.smoothing) * g_loss + g_nll, rows)[:, 0]

        def gradient_rows(start, stop):  # (p·(g_loss + g_nll) − q-part) · weight, rows [start, stop)
            block = grad[start:stop]
            block *= shared[start:stop]
            block[self.rows[: stop - start], self.t_safe[start:stop]] -= target_weight[start:stop]
            if self.smoothing:
                block -= uniform[start:stop]
            block *= self.weight[start:stop, None]

        backend.map_row_blocks(gradient_rows, len(grad), grad, row_size=vocab, cache_sized=True)
        return grad.reshape(self.shape), None

    def forward_kernel(self, logits, target, smoothing, ignore_index, reduction):
        """kernels/cross_entropy.cu in one launch: per-row loss and NLL ("none") or their sums over
        the kept rows ("sum", "mean": the count on the device), float32; the row's log-sum-exp kept."""
        flat, t = self._rows(logits, target, smoothing, ignore_index, reduction)
        self.flat, self.t, self.ignore_index, self.scale = flat, t, ignore_index, None
        if reduction == "none":
            loss, nll, self.lse = cross_entropy_kernel.cross_entropy_forward(flat, t, smoothing, ignore_index)
            return loss.reshape(target.shape), nll.reshape(target.shape)
        loss, nll, self.lse, self.scale = cross_entropy_kernel.cross_entropy_forward_reduced(
            flat, t, smoothing, ignore_index, reduction)
        return loss, nll

    def backward_kernel(self, g_loss, g_nll):
        """One launch: the upstream gradients as they come (None, device scalars, per-row arrays);
        the ignored rows and "mean"'s 1 / count applied by the kernel."""
        grad = cross_entropy_kernel.cross_entropy_backward(self.flat, self.t, self.lse, g_loss, g_nll,
                                                           self.smoothing, self.ignore_index, scale=self.scale)
        return grad.reshape(self.shape), None

    def _reduce(self, loss, nll, keep, target_shape, dtype):
        """Per-position loss and NLL weighted (ignored positions 0; 1/count for "mean"), then reduced."""
        weight = keep.astype(dtype)
        if self.reduction == "mean":  # the one reduction that needs the count on the host
            weight /= max(int(keep.sum()), 1)
        self.weight = weight
        loss, nll = (loss * weight).astype(dtype, copy=False), (nll * weight).astype(dtype, copy=False)
        if self.reduction == "none":
            return loss.reshape(target_shape), nll.reshape(target_shape)
        return loss.sum(), nll.sum()


def _check_target(logits, target, ignore_index):
    target = target.data if isinstance(target, Tensor) else target
    if not hasattr(target, "dtype"):
        target = rectangular_array(target, "cross_entropy: target")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"cross_entropy: target shape {tuple(target.shape)} must equal the logits' shape "
            f"without its class axis, {tuple(logits.shape[:-1])} (logits {tuple(logits.shape)})"
        )
    if target.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must be integer class ids, got dtype {target.dtype}")
    vocab = logits.shape[-1]
    if backend.is_capturing():  # no read-back in a CUDA graph: the trainer checked the batch on the host
        return backend.like(target, logits.data)
    valid = target if ignore_index is None else target[target != ignore_index]
    if valid.size and (int(valid.min()) < 0 or int(valid.max()) >= vocab):
        raise IndexError(
            f"cross_entropy: target ids must lie in [0, {vocab}) (or equal ignore_index="
            f"{ignore_index}), got values from {int(valid.min())} to {int(valid.max())}"
        )
    return backend.like(target, logits.data)


def cross_entropy(logits, target, label_smoothing=0.0, ignore_index=None, reduction="mean",
                  return_nll=False):
    """Cross entropy of ``logits`` (..., V) against integer ``target`` (...), label smoothing as in §5.4.

    ``label_smoothing`` ε spreads ε over all V classes as PyTorch does; positions
    where ``target == ignore_index`` contribute nothing and are left out of the
    mean; ``reduction`` is "mean", "sum" or "none". With ``return_nll=True`` the
    plain negative log-likelihood (for perplexity) comes back too, as
    ``(loss, nll)``, from the same softmax.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    label_smoothing = check_real("cross_entropy: label_smoothing", label_smoothing, 0, 1)
    if logits.ndim < 1:
        raise ValueError("cross_entropy: logits need a class axis")
    if not backend.is_floating(logits.dtype):
        raise TypeError(f"cross_entropy: logits must be floating point, got dtype {logits.dtype}")
    if logits.shape[-1] == 0:
        raise ValueError(f"cross_entropy: logits of shape {tuple(logits.shape)} have no classes")
    target = _check_target(logits, target, ignore_index)
    # Half logits (autocast's) are read as they are, no float32 copy: both paths compute in float32
    # (KernelFunction), the loss and NLL come back float32 and the gradient in the logits' type.
    loss, nll = CrossEntropy.apply(logits, target, label_smoothing, ignore_index, reduction)
    return (loss, nll) if return_nll else loss


def nll_loss(logits, target, ignore_index=None, reduction="mean"):
    """Negative log-likelihood −log softmax(logits)[target] (cross entropy without smoothing)."""
    return cross_entropy(logits, target, 0.0, ignore_index, reduction)
