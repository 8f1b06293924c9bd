"""Several linear projections of one input — the queries', keys' and values' (§3.2.2) — as one
product where their weights lie back to back in one buffer (``backend.back_to_back``)."""

from .. import amp, backend, kernels
from ..kernels.cublas import column_sums, matmul
from ..tensor import Function
from .linear import _add_bias, _check_linear

_xp = backend.get_array_module


def _side_by_side(blocks):
    """The 2-D ``blocks`` (rows, nᵢ) as one (rows, Σ nᵢ) array: a view where they already lie so
    (attention's backward writes dQ, dK and dV side by side when Q, K and V came so), else one copy
    kernel on a GPU, counted (``backend.note_launch``) where the memory is not CuPy's, as a capture
    on other memory counts the array operations CuPy would launch."""
    joined = backend.side_by_side(blocks)
    if joined is not None:
        return joined
    if backend.is_counting_launches() and not backend.is_cupy_array(blocks[0]):
        backend.note_launch("array op: concatenate", bytes=2 * sum(b.nbytes for b in blocks))
    return backend.captured_memory(_xp(blocks[0]).concatenate(blocks, axis=1))


class LinearParts(Function):
    """(y₁, …, yₙ) = (x W₁ᵀ + b₁, …, x Wₙᵀ + bₙ), the projections of one input x, each Wᵢ (outᵢ, in).

    On the GPU (``kernels.on_gpu``), where the Wᵢ lie back to back in one buffer (a module packs them
    so: ``nn.MultiHeadAttention``), the forward is one product, y = x [W₁; …; Wₙ]ᵀ + [b₁; …; bₙ],
    whose column blocks are the yᵢ (views, no copy). Backward, with G = [g₁ … gₙ] the outputs' gradients side by side (one copy):
    dx = G [W₁; …; Wₙ], d[W₁; …; Wₙ] = Gᵀ x and d[b₁; …; bₙ] = 1ᵀ G, one product each, the last two
    straight into the parameters' gradients where those lie back to back too (the CUDA-graph step's
    flat gradient buffer). Otherwise one product per part, dx accumulated in one array (no add).
    """

    accepts_grad_targets = fresh_input_grads = True

    def forward(self, x, *params, parts):
        weights, biases = params[:parts], params[parts:]
        for w, b in zip(weights, biases or (None,) * parts):
            _check_linear(x, w, b)
        self.x, self.weights, self.parts = x, weights, parts
        # one product on the GPU, where a step is made of launches; on the CPU one per part is as fast
        # and needs no copy of the gradients side by side (the same values up to rounding either way)
        self.joined = backend.back_to_back(weights) if kernels.on_gpu(x) else None
        x2 = x.reshape(-1, x.shape[-1])
        if self.joined is None:
            outs = [matmul(x2, w.T) for w in weights]
            for y, b in zip(outs, biases):
                _add_bias(y, b)
        else:
            y = matmul(x2, self.joined.T)
            joined_bias = backend.back_to_back(biases) if biases else None
            outs = [y[:, start:start + w.shape[0]] for start, w in zip(self._starts(), weights)]
            if joined_bias is not None:
                _add_bias(y, joined_bias)
            else:
                for block, b in zip(outs, biases):
                    _xp(y).add(block, b, out=block)
        return tuple(out.reshape(x.shape[:-1] + (out.shape[1],)) for out in outs)

    def _starts(self):
        starts, start = [], 0
        for w in self.weights:
            starts.append(start)
            start += w.shape[0]
        return starts

    def backward(self, *grads):
        n, needs = self.parts, self.needs_input_grad
        targets = tuple(self.grad_targets) or (None,) * len(needs)
        target_x, target_w, target_b = targets[0], targets[1:1 + n], targets[1 + n:]
        x2 = self.x.reshape(-1, self.x.shape[-1])
        g2 = [g.reshape(-1, g.shape[-1]) for g in grads]
        together = self.joined is not None and (needs[0] or all(needs[1:]))
        side_by_side = _side_by_side(g2) if together else None
        grad_x = None
        if needs[0]:
            products = [(side_by_side, self.joined)] if together else list(zip(g2, self.weights))
            dx, accumulate = (None, False) if target_x is None else target_x.output()
            dx = None if dx is None else dx.reshape(x2.shape)
            for g, w in products:
                if dx is None:
                    dx = matmul(g, w)
                else:
                    matmul(g, w, out=dx, accumulate=accumulate)
                accumulate = True
            grad_x = None if target_x is not None else dx.reshape(self.x.shape)
        grad_w = self._parameter_grads(needs[1:1 + n], target_w, side_by_side, g2,
                                       lambda g, **out: matmul(g.T, x2, **out))
        grad_b = self._parameter_grads(needs[1 + n:], target_b, side_by_side, g2,
                                       lambda g, **out: column_sums(g, **out))
        return (grad_x, *grad_w, *grad_b)

    @staticmethod
    def _parameter_grads(needs, targets, side_by_side, g2, product):
        """The parts' gradients by ``product``: one call into their targets when those lie back to
        back (and the outputs' gradients are side by side), else one per part (into its target, or
        returned)."""
        if not needs:
            return ()
        if side_by_side is not None and all(needs) and all(t is not None for t in targets):
            joined = backend.back_to_back([t.array() for t in targets])
            if joined is not None:
                product(side_by_side, out=joined, accumulate=True)
                return (None,) * len(needs)
        grads = []
        for need, target, g in zip(needs, targets, g2):
            if not need:
                grads.append(None)
            elif target is None:
                grads.append(product(g))
            else:
                out, accumulate = target.output()
                product(g, out=out, accumulate=accumulate)
                grads.append(None)
        return tuple(grads)


def linear_parts(x, weights, biases=None):
    """(x W₁ᵀ + b₁, …, x Wₙᵀ + bₙ) for the ``weights`` (outᵢ, in) and ``biases`` (or None): one
    product where the weights lie back to back in one buffer (see ``LinearParts``); in the half type
    under ``amp.autocast``, as ``linear``."""
    weights = list(weights)
    biases = [] if biases is None else list(biases)
    if biases and len(biases) != len(weights):
        raise ValueError(f"linear_parts: {len(weights)} weights need {len(weights)} biases, got {len(biases)}")
    if biases and any(b is None for b in biases):
        raise ValueError("linear_parts: give every part a bias or none")
    x, *params = amp.half_args(x, *weights, *biases)
    return LinearParts.apply(x, *params, parts=len(weights))
