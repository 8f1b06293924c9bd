"""tinyformer's Transformer built in PyTorch (``nn.Transformer``), and weights copied both ways.

Shared by the benchmarks that run PyTorch beside tinyformer (``bench_step.py``, ``bench_decode.py``,
``bench_quality.py``); PyTorch comes from the ``bench`` extra and is imported only when called.

``build_torch_model(config)`` reads tinyformer's ``model.config`` (or its ``TransformerConfig.to_dict()``):
post-LN, one shared vocabulary tied to the output projection, embeddings x sqrt(d_model) (unless
``scale_embedding`` is false) plus tinyformer's sinusoids, dropout on the embedding sums and on every
sub-layer output (``dropout``), the config's depths and activation (relu, gelu, silu). Its state dict
is the layout ``tinyformer.translation.interop.torch_transformer`` documents (``tinyformer import
torch`` reads it, ``tinyformer export --format torch`` writes it); what that layout cannot hold (two
vocabularies, learned positions, a logits bias) is refused. PyTorch's own extras are taken from the
same config, so each can be switched alone:

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
tiny)`` the other way (Q, K and V cut from in_proj_weight), both through the library's mapping
(``to_torch_state``, ``from_torch_state``); both are exact (float32 to float32).
"""

import math
import warnings

from tinyformer.translation.data.special import PAD_ID as PAD  # the masks below use the config's pad_id, else this


def stock_extras(p):
    """The Transformer arguments that make tinyformer's model stock ``nn.Transformer(dropout=p)``."""
    return {"attention_dropout": p, "activation_dropout": p, "final_norm": True, "init": "torch"}


def has_final_norm(config):
    """Whether a model of ``config`` (a dict) ends each stack in a LayerNorm (``TransformerConfig.has_final_norm``)."""
    final = config.get("final_norm")
    return bool(config.get("norm_first", False)) if final is None else bool(final)


def build_torch_model(config, device="cpu"):
    """The post-LN Transformer of ``config`` (tinyformer's ``model.config``, or its ``to_dict()``) in PyTorch;
    see the module's text.

    Its weights are drawn from PyTorch's default generator as ``config["init"]`` says; a caller
    that wants tinyformer's weights copies them in with ``copy_weights``.
    """
    import torch
    from torch import nn
    from torch.nn import functional as TF

    from tinyformer.engine import functional as F
    from tinyformer.translation.interop.torch_transformer import torch_config

    config = config.to_dict() if hasattr(config, "to_dict") else config
    if config.get("norm_first"):
        raise ValueError("build_torch_model builds post-LN models (norm_first=False)")
    torch_config(config, "build_torch_model")  # a model the layout holds
    d_model, heads, layers = config["d_model"], config["heads"], config["num_layers"]
    encoder_layers, decoder_layers = config.get("encoder_layers") or layers, config.get("decoder_layers") or layers
    activation = {"relu": "relu", "gelu": "gelu", "silu": TF.silu}[config.get("activation", "relu")]
    scale = math.sqrt(d_model) if config.get("scale_embedding", True) else 1.0
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
                    d_model, heads, encoder_layers, decoder_layers, config["d_ff"], config["dropout"],
                    activation=activation, batch_first=True, norm_first=False, layer_norm_eps=config["eps"])
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
            x = self.embed(ids) * scale + self.pe[:ids.shape[1]]
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
    parameter of the two models, as ``interop.torch_transformer.torch_names`` pairs them; a model without
    final LayerNorms has no pairs for them."""
    from tinyformer.translation.interop.torch_transformer import torch_names

    names = torch_names(tiny.config)
    ours, theirs = dict(tiny.named_parameters()), dict(model.named_parameters())
    if set(theirs) != set(names):
        odd = sorted(set(theirs) ^ set(names))[0]
        raise RuntimeError(f"weight copy: the PyTorch model {'lacks' if odd in names else 'has another'} parameter "
                           f"{odd} (tinyformer's model_config and the PyTorch model differ, e.g. in final_norm)")
    return [([ours[name] for name in parts], theirs[torch_name]) for torch_name, parts in names.items()]


def copy_weights(tiny, model):
    """tinyformer's weights into the PyTorch model, so both start from the same point (the library's
    ``to_torch_state``, loaded strictly: every tensor of the model, each of its shape)."""
    import torch

    from tinyformer.translation.interop.torch_transformer import to_torch_state

    tensors = to_torch_state(tiny.state_dict(), tiny.config)
    model.load_state_dict({name: torch.from_numpy(value) for name, value in tensors.items()}, strict=True)


def copy_weights_back(model, tiny):
    """The PyTorch model's weights into tinyformer's (of the same config), in place (the library's
    ``from_torch_state``): e.g. to decode a model PyTorch trained with tinyformer's own beam search."""
    from tinyformer.translation.interop.torch_transformer import from_torch_state

    tiny.load_state_dict(from_torch_state(model.state_dict(), tiny.config, "the PyTorch model"))
