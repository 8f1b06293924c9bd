"""tinyformer's Transformer built in PyTorch (``nn.Transformer``), and weights copied both ways.

Shared by the benchmarks that run PyTorch beside tinyformer (``bench_step.py``, ``bench_decode.py``,
``bench_quality.py``); PyTorch comes from the ``bench`` extra and is imported only when called.

``build_torch_model(config)`` reads tinyformer's ``model.config`` (a ``TransformerConfig.to_dict()``):
post-LN, one shared vocabulary tied to the output projection, embeddings x sqrt(d_model) plus
tinyformer's sinusoids, dropout on the embedding sums and on every sub-layer output (``dropout``).
PyTorch's own extras are taken from the same config, so each can be switched alone:

* ``attention_dropout``: dropout on the attention probabilities (stock nn.Transformer: its ``dropout``);
* ``activation_dropout``: dropout after the feed-forward ReLU (stock: its ``dropout``);
* ``final_norm``: the final LayerNorm of the encoder and of the decoder, which nn.Transformer has
  even when post-LN (stock: True); None or False removes them, as tinyformer's post-LN default;
* ``init``: "torch" keeps nn.Transformer's own initialisation (stock: Xavier-uniform on every matrix,
  the packed in_proj_weight as one (3 d_model, d_model) matrix; feed-forward biases nn.Linear's
  U(+-1/sqrt(fan_in)); attention biases zero); "xavier" redraws Q, K and V Xavier-uniform each on its
  own (d_model, d_model) shape and zeroes every bias, as tinyformer's default. Either way drawn from
  PyTorch's generator (``torch.manual_seed``); the embedding is N(0, d_model^-0.5) as tinyformer's.

``STOCK_EXTRAS`` are the values of stock ``nn.Transformer`` (with dropout p).
``copy_weights(tiny, model)`` puts tinyformer's parameters into such a model, ``copy_weights_back(model,
tiny)`` the other way (Q, K and V cut from in_proj_weight); both are exact (float32 to float32).
"""

import math
import warnings

import numpy

PAD = 0  # tinyformer's padding id (tinyformer.translation.data.special.PAD_ID); the masks below use the config's pad_id


def stock_extras(p):
    """The Transformer arguments that make tinyformer's model stock ``nn.Transformer(dropout=p)``."""
    return {"attention_dropout": p, "activation_dropout": p, "final_norm": True, "init": "torch"}


def has_final_norm(config):
    """Whether a model of ``config`` (a dict) ends each stack in a LayerNorm (``TransformerConfig.has_final_norm``)."""
    final = config.get("final_norm")
    return bool(config.get("norm_first", False)) if final is None else bool(final)


def build_torch_model(config, device="cpu"):
    """The post-LN Transformer of ``config`` (tinyformer's ``model.config``) in PyTorch; see the module's text.

    Its weights are drawn from PyTorch's default generator as ``config["init"]`` says; a caller
    that wants tinyformer's weights copies them in with ``copy_weights``.
    """
    import torch
    from torch import nn
    from torch.nn import functional as TF

    from tinyformer.engine import functional as F

    if config.get("norm_first"):
        raise ValueError("build_torch_model builds post-LN models (norm_first=False)")
    d_model, heads, layers = config["d_model"], config["heads"], config["num_layers"]
    pad_id = config.get("pad_id", PAD)
    scheme = config.get("init", "xavier")
    if scheme not in ("xavier", "torch"):
        raise ValueError(f"build_torch_model: unknown init {scheme!r}")

    class TorchTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(config["src_vocab_size"], d_model)
            nn.init.normal_(self.embed.weight, std=d_model ** -0.5)
            self.register_buffer("pe", torch.from_numpy(F.sinusoid_table(config["max_len"], d_model)))
            self.embed_dropout = nn.Dropout(config["dropout"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.transformer = nn.Transformer(
                    d_model, heads, layers, layers, config["d_ff"], config["dropout"],
                    batch_first=True, norm_first=False, layer_norm_eps=config["eps"])
            self.stock_extra = sum(p.numel() for p in self.transformer.encoder.norm.parameters()) + sum(
                p.numel() for p in self.transformer.decoder.norm.parameters())
            if not has_final_norm(config):
                self.transformer.encoder.norm = None
                self.transformer.decoder.norm = None
            for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
                layer.dropout = nn.Dropout(config.get("activation_dropout", 0.0))
                for attn in (getattr(layer, "self_attn", None), getattr(layer, "multihead_attn", None)):
                    if attn is not None:
                        attn.dropout = config.get("attention_dropout", 0.0)
            if scheme == "xavier":
                _xavier_init(self.transformer)

        def _embed(self, ids):
            x = self.embed(ids) * math.sqrt(d_model) + self.pe[:ids.shape[1]]
            return self.embed_dropout(x)

        def forward(self, src, tgt_in):
            src_pad = src == pad_id  # True = ignore (PyTorch's convention)
            length = tgt_in.shape[1]
            future = torch.triu(torch.ones(length, length, dtype=torch.bool, device=src.device), 1)
            h = self.transformer(self._embed(src), self._embed(tgt_in), tgt_mask=future,
                                 src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad,
                                 tgt_is_causal=True)
            return TF.linear(h, self.embed.weight)

    return TorchTransformer().to(device)


def _xavier_init(transformer):
    """tinyformer's "xavier" scheme on a PyTorch nn.Transformer: Q, K and V Xavier-uniform each on its
    own (d, d) rows of in_proj_weight, every bias zero (the other matrices are Xavier-uniform already)."""
    import torch
    from torch import nn

    with torch.no_grad():
        for module in transformer.modules():
            if isinstance(module, nn.MultiheadAttention):
                d = module.embed_dim
                for i in range(3):
                    nn.init.xavier_uniform_(module.in_proj_weight[i * d:(i + 1) * d])
                module.in_proj_bias.zero_()
                module.out_proj.bias.zero_()
        for layer in [*transformer.encoder.layers, *transformer.decoder.layers]:
            layer.linear1.bias.zero_()
            layer.linear2.bias.zero_()


def weight_pairs(tiny, model):
    """(tinyformer parameters, the PyTorch parameter that holds them, concatenated on axis 0) for every
    parameter of the two models; a model without final LayerNorms has no pairs for them."""
    pairs = [([tiny.src_embed.weight], model.embed.weight)]

    def attention(ours, theirs):
        pairs.append(([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight], theirs.in_proj_weight))
        pairs.append(([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias], theirs.in_proj_bias))
        pairs.append(([ours.w_o.weight], theirs.out_proj.weight))
        pairs.append(([ours.w_o.bias], theirs.out_proj.bias))

    def norm(ours, theirs):
        pairs.append(([ours.weight], theirs.weight))
        pairs.append(([ours.bias], theirs.bias))

    def feed_forward(ours, theirs):
        for name in ("linear1", "linear2"):
            for part in ("weight", "bias"):
                pairs.append(([getattr(getattr(ours, name), part)], getattr(getattr(theirs, name), part)))

    for ours, theirs in zip(tiny.encoder.layers, model.transformer.encoder.layers, strict=True):
        attention(ours.self_attn, theirs.self_attn)
        feed_forward(ours.feed_forward, theirs)
        norm(ours.attn_block.norm, theirs.norm1)
        norm(ours.ff_block.norm, theirs.norm2)
    for ours, theirs in zip(tiny.decoder.layers, model.transformer.decoder.layers, strict=True):
        attention(ours.self_attn, theirs.self_attn)
        attention(ours.cross_attn, theirs.multihead_attn)
        feed_forward(ours.feed_forward, theirs)
        norm(ours.self_block.norm, theirs.norm1)
        norm(ours.cross_block.norm, theirs.norm2)
        norm(ours.ff_block.norm, theirs.norm3)
    for ours, theirs in ((tiny.encoder, model.transformer.encoder), (tiny.decoder, model.transformer.decoder)):
        if (ours.final_norm is None) != (theirs.norm is None):
            raise RuntimeError("weight copy: one model has final LayerNorms and the other not "
                               f"(tinyformer {ours.final_norm is not None}, PyTorch {theirs.norm is not None})")
        if ours.final_norm is not None:
            norm(ours.final_norm, theirs.norm)
    if not tiny.shared_vocab:
        raise RuntimeError("weight copy: the PyTorch model ties one shared vocabulary")
    return pairs


def copy_weights(tiny, model):
    """tinyformer's weights into the PyTorch model, so both start from the same point."""
    import torch

    from tinyformer.engine import backend

    with torch.no_grad():
        for sources, target in weight_pairs(tiny, model):
            arrays = [backend.to_numpy(s.data) for s in sources]
            value = torch.from_numpy(numpy.concatenate(arrays) if len(arrays) > 1 else arrays[0].copy())
            if tuple(value.shape) != tuple(target.shape):
                raise RuntimeError(f"weight copy: shape {tuple(value.shape)} into {tuple(target.shape)}")
            target.copy_(value)


def copy_weights_back(model, tiny):
    """The PyTorch model's weights into tinyformer's (of the same config), in place: e.g. to decode
    a model PyTorch trained with tinyformer's own beam search."""
    from tinyformer.engine import backend

    for targets, source in weight_pairs(tiny, model):
        value = source.detach().cpu().numpy()
        rows = [t.data.shape[0] for t in targets]
        if sum(rows) != value.shape[0] or any(t.data.shape[1:] != value.shape[1:] for t in targets):
            raise RuntimeError(f"weight copy: shape {tuple(value.shape)} into {[tuple(t.data.shape) for t in targets]}")
        for target, part in zip(targets, numpy.split(value, numpy.cumsum(rows)[:-1])):
            target.data[...] = backend.like(part.astype(target.data.dtype), target.data)
