"""A float64 NumPy copy of a Transformer that keeps what the explain page shows, and the passes
over one sentence pair that read it.

The copy's attention modules record through the model's probe API (``nn.probe.AttentionProbe``,
each module's ``probe``, switched on): P is a graph tensor (the hook point: ``retain_grad`` gives
dL/dP), and so are Q, K, V and the heads' output O = Dropout(P)·V before W_O, to which the probe's
``offset`` adds: moving O by ε·V_j is moving P_ij by ε, which is how the gradient check
differentiates the loss along P and S entries. Its embeddings keep their
outputs (the looked-up rows), for the saliency of each token. The user's model is not touched.
"""

import numpy

from ...engine import functional as F
from ...model.nn import Embedding, MultiHeadAttention, Transformer
from ...engine.tensor import Tensor, no_grad

__all__ = ["KINDS", "ProbedEmbedding", "probed_copy", "attention_modules", "run_pass",
           "sentence_loss"]

KINDS = {
    "enc": "encoder self-attention",
    "dec": "decoder self-attention (causal)",
    "cross": "decoder-encoder attention",
}
"""The three uses of attention (§3.2.3), by the short names the page's URL uses."""


class ProbedEmbedding(Embedding):
    """Embedding that appends each output (the looked-up rows) to ``outputs`` while it is a list.
    With its weight frozen (not requiring grad) each output is a leaf that requires grad, so that
    gradients still flow to the rows, and from them nowhere."""

    outputs = None

    def forward(self, ids):
        out = super().forward(ids)
        if not self.weight.requires_grad:
            out = Tensor(out.data, requires_grad=True)
        if self.outputs is not None:
            self.outputs.append(out)
        return out


def probed_copy(model):
    """A float64 copy of the Transformer ``model`` on NumPy, in eval mode, its attention and
    embedding modules probed (each attention's ``probe`` recording, ``ProbedEmbedding``)."""
    copy = Transformer(model.config.replace(seed=0))
    copy.load_state_dict(model.state_dict())
    copy.double().eval()
    for module in copy.modules():
        if type(module) is MultiHeadAttention:
            module.probe.keep = True
        elif type(module) is Embedding:
            module.__class__ = ProbedEmbedding
    return copy


def attention_modules(copy):
    """{kind: [the MultiHeadAttention of layer 1, 2, ...]} for the kinds of ``KINDS``."""
    return {"enc": [layer.self_attn for layer in copy.encoder.layers],
            "dec": [layer.self_attn for layer in copy.decoder.layers],
            "cross": [layer.cross_attn for layer in copy.decoder.layers]}


def _embedding_outputs(copy):
    """(source rows, target rows) that the last forward looked up (one table or two)."""
    if copy.src_embed is copy.tgt_embed:
        return tuple(copy.src_embed.outputs)
    return copy.src_embed.outputs[0], copy.tgt_embed.outputs[0]


def _logits(copy, src, tgt_in):
    for table in {id(copy.src_embed): copy.src_embed, id(copy.tgt_embed): copy.tgt_embed}.values():
        table.outputs = []
    return copy(src, tgt_in)


def sentence_loss(copy, src, tgt_in, tgt_out):
    """L = Σₜ −log p(yₜ | y₍<t₎, x) of every batch row, a float, with nothing recorded."""
    with no_grad():
        return float(F.cross_entropy(_logits(copy, src, tgt_in), tgt_out, reduction="sum").data)


def run_pass(copy, src, tgt_in, tgt_out, positions=None, probs_grad_hook=None, parameter_grads=True):
    """One forward and backward pass of ``copy`` over a batch of sentence pairs.

    The loss is the NLL summed over every target position of every row, or, with ``positions``
    (one per row), over position ``positions[r]`` of row r only: a batch of copies of one pair
    with one position each gives each position's gradients in one pass. ``probs_grad_hook``
    is registered on every P before ``retain_grad`` (so what is read is what the backward used).
    ``parameter_grads=False`` freezes the parameters for the pass: the backward skips their
    gradients (a third of its work, and the whole vocabulary projection's) and leaves ``.grad`` alone.

    Returns a dict of float64 arrays: ``nll`` (batch, len_tgt), per kind of ``KINDS`` ``{kind: {name:
    (layers, batch, heads, ...)}}`` with P, dP (at the hook point), O and dO (the heads' output),
    Q, K, V and their gradients dQ, dK, dV; and the looked-up embedding rows with their
    gradients: ``source``, ``d_source`` (batch, len_src, d_model), ``target``, ``d_target``.
    """
    frozen = [] if parameter_grads else [p for p in copy.parameters() if p.requires_grad]
    for parameter in frozen:
        parameter.requires_grad = False
    try:
        return _run_pass(copy, src, tgt_in, tgt_out, positions, probs_grad_hook, parameter_grads)
    finally:
        for parameter in frozen:
            parameter.requires_grad = True


def _run_pass(copy, src, tgt_in, tgt_out, positions, probs_grad_hook, parameter_grads):
    if parameter_grads:
        copy.zero_grad()
    logits = _logits(copy, src, tgt_in)
    nll = F.cross_entropy(logits, tgt_out, reduction="none")
    if positions is None:
        loss = nll.sum()
    else:
        loss = nll[numpy.arange(len(positions)), numpy.asarray(positions)].sum()
    watched = {}
    for kind, modules in attention_modules(copy).items():
        watched[kind] = []
        for module in modules:
            probs, (q, k, v) = module.probe.probs, module.probe.inputs
            if probs_grad_hook is not None:
                probs.register_hook(probs_grad_hook)
            tensors = {"P": probs, "Q": q, "K": k, "V": v, "O": module.probe.heads_output}
            for tensor in tensors.values():
                tensor.retain_grad()
            watched[kind].append(tensors)
    embedded = dict(zip(("source", "target"), _embedding_outputs(copy)))
    for tensor in embedded.values():
        tensor.retain_grad()
    loss.backward()
    result = {"nll": numpy.array(nll.data), "loss": float(loss.data)}
    for kind, layers in watched.items():
        result[kind] = {}
        for name in ("P", "Q", "K", "V", "O"):
            result[kind][name] = numpy.stack([layer[name].data for layer in layers])
            result[kind]["d" + name] = numpy.stack([layer[name].grad for layer in layers])
    for name, tensor in embedded.items():
        result[name], result["d_" + name] = numpy.array(tensor.data), numpy.array(tensor.grad)
    return result
