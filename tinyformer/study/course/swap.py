"""The proof beyond the checker: the reader's backward inside a real model, which trains.

``swapped_in(number, module)`` is a with-block during which the tinyformer op of exercise
``number`` runs the reader's ``backward`` (from ``module``, their checked file) in place of its
own; on the way out, whatever ends the block (an error, Ctrl-C), every replaced method is put
back. The replacements are methods of the op classes (``forward_reference`` /
``backward_reference``, the NumPy path every CPU run takes), so every instance in the model uses them:

==============  =====================================================================================
2 softmax       ``ScaledDotProductAttention``: its backward as tinyformer writes it (dV = Pᵀ·dO,
                dP = dO·Vᵀ, dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k) with dS from the reader's softmax
                backward, handed the masked scores S (rebuilt from Q, K and the mask its forward
                kept) and dP. The model has no stand-alone softmax: attention's is the one that
                trains (F.softmax's own op, ``Softmax``, runs nowhere in a training step).
3 layer norm    ``LayerNorm``: forward_reference also keeps its input x, backward_reference calls
                the reader's. Every post-LN sublayer connection (``ResidualDropoutLayerNorm``)
                runs a LayerNorm inside, so every layer norm of the model uses it.
4 attention     ``ScaledDotProductAttention``: forward_reference also keeps the mask and the causal
                flag, backward_reference hands the reader (batch·heads, len, d_k) arrays and the
                mask broadcast to (batch·heads, len_q, len_k).
5 cross entropy ``CrossEntropy``: forward_reference keeps logits, targets and the settings;
                backward_reference calls the reader's mean-reduction backward and scales it to
                the reduction asked for (training sums over tokens: N times the mean's gradient).
6 multi-head    ``nn.MultiHeadAttention.forward``: a module is no single op, so its forward becomes
  attention     one autograd node, ``ReaderMultiHeadAttention`` (a ``Function`` whose forward is the
                exercise's given forward and whose backward is the reader's, its inputs the three
                input tensors and the eight parameters). Packed rows (the CPU trainer's layout)
                reach it unpacked to the padded layout and its output is packed again. Calls the
                node does not cover (a decoding cache, kept weights, attention dropout) run the
                module's own forward.
7, 8 the tiled  ``ScaledDotProductAttention``: the reader's tiled forward (its O; backward from its
  attention     lse) or tiled backward (from tinyformer's O and lse), ``flash_swap``; calls with a
                mask that is not trailing padding run tinyformer's own (``Swap.own``).
==============  =====================================================================================

``train(number, module, steps)`` then trains the ``tiny`` preset on the built-in synthetic task
(``tinyformer train``'s default data, built by ``train.build_parts`` and stepped by
``Trainer.train_step``, on one BLAS thread) with the reader's backward swapped in, and returns
the losses: a falling loss is the proof; for 7 and 8 also the greedy exact match of validation
sentences, against a run with tinyformer's own attention (``EXACT_MATCH_SLACK``).
"""

import contextlib
import dataclasses
import math
import tempfile

import numpy

from ...model import nn
from ...engine.functional import CrossEntropy, KeyLengthMask, LayerNorm, ScaledDotProductAttention, causal_mask
from ...engine.ops._helpers import sum_to_shape
from ...engine.tensor import Function, Tensor, is_grad_enabled
from .flash_swap import tiled_backward_replacements, tiled_forward_replacements

__all__ = ["NoModelOp", "Swap", "swapped_in", "train", "TrainingProof", "ReaderMultiHeadAttention",
           "EXACT_MATCH_SLACK", "EXACT_MATCH_STEPS"]

EXACT_MATCH_STEPS = 800
"""Exercises 7 and 8's training steps: where ``tiny``'s greedy exact match on the built-in task
has risen to 100% of 100 validation sentences (at 300 steps it is 11% to 17% run to run, at 500
92% to 99%: float64 tiles against float32 matrices drift apart within a run, and before the task
is learned the drift decides)."""
EXACT_MATCH_SLACK = 0.05
"""Exercises 7 and 8: the greedy exact match of a model trained with the reader's tiles must be
within 5 points of one trained with tinyformer's own attention (the same seed and steps)."""


class NoModelOp(ValueError):
    """The exercise has no op in the model to swap (exercise 1)."""


@dataclasses.dataclass
class Swap:
    """What a with-block of ``swapped_in`` did: ``calls`` counts the reader's backward's calls (7:
    its forward's), ``own`` the calls its op took itself (7 and 8: masks the tiles do not take)."""

    number: int
    calls: int = 0
    own: int = 0


_MISSING = object()


@contextlib.contextmanager
def swapped_in(number, module):
    """A block during which exercise ``number``'s op in tinyformer runs ``module.backward``; yields a
    ``Swap``. The op's own methods are back when the block ends, however it ends."""
    swap = Swap(number)
    if number not in _REPLACEMENTS:
        raise NoModelOp(f"exercise {number} has no op in the model: there is nothing to swap")
    replacements = _REPLACEMENTS[number](module, swap)
    saved = [(owner, name, owner.__dict__.get(name, _MISSING)) for owner, name, _ in replacements]
    try:
        for owner, name, method in replacements:
            setattr(owner, name, method)
        yield swap
    finally:
        for owner, name, original in reversed(saved):
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def _keep(mask, causal, len_q, len_k):
    """The boolean keep-mask attention's forward applied (None: every key), as its forward builds it."""
    mask = mask.mask if isinstance(mask, KeyLengthMask) else mask
    if causal:
        future = causal_mask(len_q, len_k)
        mask = future if mask is None else mask & future
    return mask


def _no_extras(op, g_weights, what):
    if g_weights is not None or op.keep is not None:
        raise RuntimeError(f"{what} covers attention without dropout and without returned weights; this model "
                           "uses them (attention_dropout or keep_attention)")


# ---------------------------------------------------------------------------- 2: softmax, inside attention
def _softmax_replacements(module, swap):
    own_forward = ScaledDotProductAttention.forward_reference

    def forward_reference(self, q, k, v, mask, causal, dropout_p, generator, return_weights):
        self.study_keep = _keep(mask, causal, q.shape[-2], k.shape[-2])
        return own_forward(self, q, k, v, mask, causal, dropout_p, generator, return_weights)

    def backward_reference(self, g_out, g_weights=None):
        """ScaledDotProductAttention's backward with dS from the reader's softmax backward."""
        _no_extras(self, g_weights, "exercise 2's swap")
        q, k, v, p = self.q, self.k, self.v, self.p
        scores = q @ k.swapaxes(-1, -2) * self.scale
        if self.study_keep is not None:
            scores = numpy.where(self.study_keep, scores, -numpy.inf)
        seen = numpy.isfinite(scores).any(axis=-1, keepdims=True)  # a row with no key has P = 0 and no gradient
        scores = numpy.where(seen, scores, 0.0)
        dp = g_out @ v.swapaxes(-1, -2)
        n = scores.shape[-1]
        ds = numpy.asarray(module.backward(scores.reshape(-1, n), dp.reshape(-1, n))).reshape(dp.shape)
        swap.calls += 1
        ds = numpy.where(seen, ds, 0.0).astype(p.dtype, copy=False) * p.dtype.type(self.scale)
        return (sum_to_shape(ds @ k, q.shape), sum_to_shape(ds.swapaxes(-1, -2) @ q, k.shape),
                sum_to_shape(p.swapaxes(-1, -2) @ g_out, v.shape), None)

    return [(ScaledDotProductAttention, "forward_reference", forward_reference),
            (ScaledDotProductAttention, "backward_reference", backward_reference)]


# ---------------------------------------------------------------------------- 3: layer norm
def _layer_norm_replacements(module, swap):
    own_forward = LayerNorm.forward_reference

    def forward_reference(self, x, weight, bias, eps):
        if eps != module.EPS:
            raise ValueError(f"exercise 3's backward uses ε = {module.EPS}; this model's LayerNorm has ε = {eps}")
        self.study_x, self.study_bias = x, bias
        return own_forward(self, x, weight, bias, eps)

    def backward_reference(self, g):
        n = g.shape[-1]
        dx, dgain, dbias = module.backward(self.study_x.reshape(-1, n), self.weight, self.study_bias, g.reshape(-1, n))
        swap.calls += 1
        return numpy.asarray(dx).reshape(g.shape), numpy.asarray(dgain), numpy.asarray(dbias), None

    return [(LayerNorm, "forward_reference", forward_reference), (LayerNorm, "backward_reference", backward_reference)]


# ---------------------------------------------------------------------------- 4: attention
def _attention_replacements(module, swap):
    own_forward = ScaledDotProductAttention.forward_reference

    def forward_reference(self, q, k, v, mask, causal, dropout_p, generator, return_weights):
        self.study_mask, self.study_causal = (mask.mask if isinstance(mask, KeyLengthMask) else mask), causal
        return own_forward(self, q, k, v, mask, causal, dropout_p, generator, return_weights)

    def backward_reference(self, g_out, g_weights=None):
        """The reader's attention backward on the heads flattened into the batch axis."""
        _no_extras(self, g_weights, "exercise 4's swap")
        q, k, v = self.q, self.k, self.v
        lead = numpy.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        len_q, len_k = q.shape[-2], k.shape[-2]

        def flat(a, rows, cols):
            return numpy.ascontiguousarray(numpy.broadcast_to(a, lead + (rows, cols))).reshape(-1, rows, cols)

        mask = self.study_mask
        if mask is not None:
            mask = flat(mask, len_q, len_k)
        dq, dk, dv = module.backward(flat(q, len_q, q.shape[-1]), flat(k, len_k, k.shape[-1]),
                                     flat(v, len_k, v.shape[-1]), mask, self.study_causal,
                                     flat(g_out, len_q, g_out.shape[-1]))
        swap.calls += 1
        return tuple(sum_to_shape(numpy.asarray(d).reshape(lead + a.shape[-2:]), a.shape)
                     for d, a in ((dq, q), (dk, k), (dv, v))) + (None,)

    return [(ScaledDotProductAttention, "forward_reference", forward_reference),
            (ScaledDotProductAttention, "backward_reference", backward_reference)]


# ---------------------------------------------------------------------------- 5: cross entropy
def _cross_entropy_replacements(module, swap):
    own_forward = CrossEntropy.forward_reference

    def forward_reference(self, logits, target, smoothing, ignore_index, reduction):
        self.study_inputs = (logits, target, smoothing, -1 if ignore_index is None else ignore_index)
        return own_forward(self, logits, target, smoothing, ignore_index, reduction)

    def backward_reference(self, g_loss, g_nll):
        """The reader's gradient of the mean loss, times N for the sum (the loss, and the NLL: the
        loss without smoothing)."""
        if self.reduction == "none":
            raise RuntimeError("exercise 5's swap covers the mean and sum reductions, not reduction='none'")
        logits, target, smoothing, pad_id = self.study_inputs
        scale = max(int((target != pad_id).sum()), 1) if self.reduction == "sum" else 1
        grad = numpy.zeros(logits.shape, dtype=logits.dtype)
        for upstream, eps in ((g_loss, smoothing), (g_nll, 0.0)):
            if upstream is not None:
                grad += scale * numpy.asarray(module.backward(logits, target, eps, pad_id, float(upstream)))
                swap.calls += 1
        return grad, None

    return [(CrossEntropy, "forward_reference", forward_reference),
            (CrossEntropy, "backward_reference", backward_reference)]


# ---------------------------------------------------------------------------- 6: multi-head attention
_INPUTS = ("query", "key", "value")
_PARAMETERS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")


class ReaderMultiHeadAttention(Function):
    """nn.MultiHeadAttention as one node: forward is the exercise's forward (the reader's file,
    checked to compute tinyformer's), backward the reader's; inputs query, key, value and the
    eight parameters, in that order (self-attention passes one tensor three times, and the engine
    adds its three gradients)."""

    def forward(self, query, key, value, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, heads, mask, causal, module, swap):
        self.arrays = (query, key, value)
        self.params = dict(zip(_PARAMETERS, (w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o)))
        self.heads, self.mask, self.causal, self.module, self.swap = heads, mask, causal, module, swap
        return numpy.asarray(module.forward(query, key, value, self.params, heads, mask, causal)).astype(query.dtype,
                                                                                                         copy=False)

    def backward(self, g):
        grads = self.module.backward(*self.arrays, self.params, self.heads, self.mask, self.causal, g)
        self.swap.calls += 1
        return tuple(numpy.asarray(grads[name]) for name in _INPUTS + _PARAMETERS)


def _multi_head_replacements(module, swap):
    own_forward = nn.MultiHeadAttention.forward

    def forward(self, query, key=None, value=None, mask=None, causal=False, cache=None, static_kv=False,
                need_weights=False, query_rows=None, key_rows=None):
        if (cache is not None or need_weights or self.keep_attention or (self.training and self.dropout)
                or not is_grad_enabled()):
            return own_forward(self, query, key, value, mask, causal, cache, static_kv, need_weights,
                               query_rows, key_rows)
        key, value, key_rows = self.key_value_defaults(query, key, value, query_rows, key_rows)
        # Packed rows (the CPU trainer's layout): the node sees the padded layout, whose padding the mask hides.
        if query_rows is not None:
            query = query_rows.unpack(query)
        if key_rows is not None:
            key, value = key_rows.unpack(key), key_rows.unpack(value)
        mask = mask.mask if isinstance(mask, KeyLengthMask) else (mask.data if isinstance(mask, Tensor) else mask)
        params = [p for layer in (self.w_q, self.w_k, self.w_v, self.w_o) for p in (layer.weight, layer.bias)]
        out = ReaderMultiHeadAttention.apply(query, key, value, *params, heads=self.heads, mask=mask, causal=causal,
                                             module=module, swap=swap)
        return out if query_rows is None else query_rows.pack(out)

    return [(nn.MultiHeadAttention, "forward", forward)]


_REPLACEMENTS = {2: _softmax_replacements, 3: _layer_norm_replacements, 4: _attention_replacements,
                 5: _cross_entropy_replacements, 6: _multi_head_replacements, 7: tiled_forward_replacements,
                 8: tiled_backward_replacements}


# ---------------------------------------------------------------------------- the training run
@dataclasses.dataclass
class TrainingProof:
    """The losses (per target token) of a run with the reader's backward swapped in."""

    losses: list
    calls: int
    exact_match: float = None  # greedy, of ``sentences`` validation sentences, when asked
    sentences: int = 0

    @property
    def first(self):
        return self.losses[0]

    @property
    def last(self):
        return self.losses[-1]

    @property
    def falling(self):
        """The loss of the last tenth of the steps, on average, is below the first step's."""
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail) < self.first


def train(number, module, steps=300, max_tokens=1024, echo=print, lines=6, sentences=0):
    """Train ``tiny`` on the built-in synthetic task for ``steps`` steps with exercise ``number``'s
    op running the reader's backward (``module`` None: tinyformer's own, the baseline); ``echo`` gets
    ``lines`` lines of step and loss; with ``sentences``, the greedy exact-match rate of that many
    validation sentences after training, the reader's code still in place (7: it decodes). The Noam
    warm-up is the first fifth of the steps (the synthetic recipe's 200 of 1000), and at least 40
    (a shorter one peaks at a learning rate too high for ``tiny``); batches of ``max_tokens``
    padded tokens (half the recipe's 2048: a few hundred steps take well under a minute)."""
    from ...translation.train import Trainer, TrainConfig, blas_threads, build_parts

    shown = {1, steps} | {round(steps * i / (lines - 1)) for i in range(1, lines - 1)}
    with tempfile.TemporaryDirectory(prefix="tinyformer-study-") as folder:
        config = TrainConfig(data="synthetic", preset="tiny", save_dir=folder, max_steps=steps, max_tokens=max_tokens,
                             warmup_steps=max(40, steps // 5), threads=1, device="cpu", precision="fp32",
                             cuda_graphs="off").resolved()
        parts = build_parts(config, echo=_silent)
        trainer = Trainer(config, parts=parts, echo=_silent, progress=False)
        losses, epoch, batches, at = [], 0, None, 0
        swapping = swapped_in(number, module) if module is not None else contextlib.nullcontext(Swap(number))
        with blas_threads(1), swapping as swap:
            for step in range(1, steps + 1):
                if batches is None or at == len(batches):
                    batches, at = parts.train_data.batches(config.max_tokens, seed=config.seed, epoch=epoch), 0
                    epoch += 1
                loss = trainer.train_step(batches[at:at + 1]).loss
                at += 1
                if not math.isfinite(loss):
                    raise FloatingPointError(f"the loss is {loss} at step {step}: your backward sends "
                                             "gradients that are not finite")
                losses.append(loss)
                if step in shown:
                    echo(f"  step {step:>{len(str(steps))}}: loss {loss:.3f}")
            exact = _exact_match(trainer, parts, sentences) if sentences else None
    return TrainingProof(losses, swap.calls, exact, sentences)


def _exact_match(trainer, parts, sentences):
    """Greedy exact match of the first ``sentences`` validation sentences (the trainer's validation)."""
    from ...translation.train.evaluation import translation_scores

    trainer.model.eval()
    sources, references = (side[:sentences] for side in parts.val_text)
    _, _, exact = translation_scores(trainer.model, parts.tokenizer, sources, references, beam_size=1)
    trainer.model.train()
    return exact


def _silent(*args, **kwargs):
    """An echo that says nothing (the parts' and trainer's messages are not the proof's)."""
