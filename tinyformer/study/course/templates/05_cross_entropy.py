"""Exercise 5 of `tinyformer study`: label-smoothed cross entropy over padded targets.

The forward pass is given below (tinyformer's ``F.cross_entropy(logits, target, smoothing,
ignore_index=pad_id)`` computes the same); you write ``backward``. At every position, with V
classes and p = softmax(logits) over them:

    q     = (1 − ε)·onehot(t) + ε/V        the smoothed target (§5.4): ε spread over all V
                                           classes, the target and the pad id included
    ℓ     = −Σᵥ qᵥ log pᵥ                  the position's loss
    loss  = (1/N) Σ ℓ over the N positions whose target is not pad_id

Positions whose target is pad_id (padding) count for nothing: not in the sum, not in N. When
every target is padding, N = 0 and the loss is 0.

backward receives d_loss = ∂L/∂loss (a random number in the checker) and returns dlogits.

* Start with one position and no smoothing: ∂ℓ/∂zᵥ for the logits z of that position. Then
  smoothing: q is a fixed distribution (it sums to 1), so the same steps work for any q.
* Then the mean: which positions receive a gradient, and divided by what?
* Padding positions must get exactly zero: no share of the one-hot and none of the ε/V either.

Shapes: logits (batch, len, V) floats; target (batch, len) integer class ids in [0, V);
smoothing ε in [0, 1]; pad_id a class id; dlogits has the logits' shape.

Check your backward with ``tinyformer study check 05_cross_entropy.py``.
"""

import numpy

EXERCISE = 5  # which exercise this file holds; `tinyformer study check` reads it


def log_softmax(z):
    """log p along the last axis, without forming p (no log 0)."""
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - numpy.log(numpy.exp(shifted).sum(axis=-1, keepdims=True))


def smoothed_target(target, vocab, smoothing):
    """q = (1 − ε)·onehot(target) + ε/V, (..., V)."""
    q = numpy.full(target.shape + (vocab,), smoothing / vocab)
    numpy.put_along_axis(q, target[..., None], 1.0 - smoothing + smoothing / vocab, axis=-1)
    return q


def forward(logits, target, smoothing, pad_id):
    """The mean over non-pad positions of −Σᵥ qᵥ log softmax(logits)ᵥ, a number."""
    per_position = -(smoothed_target(target, logits.shape[-1], smoothing) * log_softmax(logits)).sum(axis=-1)
    kept = target != pad_id
    return (per_position * kept).sum() / max(int(kept.sum()), 1)


def backward(logits, target, smoothing, pad_id, d_loss):
    """dlogits = ∂L/∂logits, of the logits' shape, given the number d_loss = ∂L/∂loss."""
    raise NotImplementedError("write backward")
