"""The model's whole shape as one small frozen dataclass (§3, Table 3): what a Transformer is built from.

The one place each field and its default is declared: ``Transformer(config)`` builds the model it
describes and keeps it as ``model.config``. Every value is checked once, here, and kept as a plain
Python value, so ``to_dict()`` is what a checkpoint's ``model_config`` holds and ``from_dict``
reads it back (also the model_config of a checkpoint written before label smoothing left the
model, or before ``final_norm`` and ``init``, which take their defaults; checkpoints themselves are
brought to today's fields by ``tinyformer.translation.train.migration``).
"""

import dataclasses

import numpy

from ...common.validation import check_int, check_probability, check_real, is_integer
from .init import INIT_SCHEMES
from .layers import ACTIVATIONS, POSITIONAL_KINDS

__all__ = ["TransformerConfig", "LABEL_SMOOTHING_MOVED"]

LABEL_SMOOTHING_MOVED = ("label smoothing is a property of the loss, not of the model: pass it to "
                         "F.cross_entropy(..., label_smoothing=) or set TrainConfig.label_smoothing")
_LEGACY_KEYS = ("label_smoothing",)  # in the model_config of checkpoints written before it moved to the loss


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """The shape of an ``nn.Transformer`` (``Transformer(config)``); ``None`` vocabularies are left to be set
    (as presets do)."""

    src_vocab_size: int = None  # source token ids; the one shared vocabulary unless tgt_vocab_size is set (§3.4)
    tgt_vocab_size: int = None  # a separate target vocabulary, whose embedding is then the output projection
    d_model: int = 512  # width of the embeddings and of every sub-layer's output (§3.1)
    d_ff: int = 2048  # inner width of the position-wise feed-forward network (§3.3)
    heads: int = 8  # h parallel attention heads of d_k = d_v = d_model / h each (§3.2.2)
    num_layers: int = 6  # N identical layers in the encoder and in the decoder (§3.1)
    dropout: float = 0.1  # P_drop on each sub-layer's output and on the embedding sums (§5.4)
    attention_dropout: float = 0.0  # dropout on the attention probabilities (not in the paper)
    activation_dropout: float = 0.0  # dropout after the feed-forward ReLU (not in the paper)
    max_len: int = 1024  # positions the positional encoding covers (§3.5); longer inputs are refused
    pad_id: int = 0  # the padding token, hidden from attention by the masks built when none is given
    norm_first: bool = False  # pre-LN, x + Dropout(f(LayerNorm(x))), instead of the paper's post-LN
    eps: float = 1e-5  # LayerNorm's variance epsilon
    seed: int = None  # a generator of its own for the initial weights; None: the default generator
    # "sinusoid" (§3.5), "learned" (one vector per position, Table 3 (E)) or "sinusoid_split" (Marian's layout)
    positional: str = "sinusoid"
    # A LayerNorm after the last layer of the encoder and of the decoder. None: only when pre-LN (whose
    # residual stream is unnormalised); True also when post-LN, as PyTorch's nn.Transformer (not in the paper).
    final_norm: bool = None
    # The initial weights of the stacks: "xavier" (each projection Xavier-uniform on its own shape, biases
    # zero) or "torch" (nn.Transformer's: Q, K, V Xavier-uniform as one packed 3d x d matrix, FFN biases
    # U(+-1/sqrt(fan_in))); see nn.init.INIT_SCHEMES. Embeddings and LayerNorms are the same in both.
    init: str = "xavier"
    # The feed-forward network's activation: "relu" (§3.3), "silu" (x σ(x), Marian's "swish") or "gelu"
    # (x Φ(x), the exact GELU).
    activation: str = "relu"
    # The encoder's and the decoder's depths where they differ from num_layers (None: num_layers each),
    # as Marian's encoder_layers and decoder_layers.
    encoder_layers: int = None
    decoder_layers: int = None
    # Embeddings multiplied by sqrt(d_model) before the positions are added (§3.4); False: as they are.
    scale_embedding: bool = True
    # A learned bias added to the logits (Marian's final_logits_bias), zeros at first; none in the paper.
    logits_bias: bool = False

    def __post_init__(self):
        def keep(name, value):
            object.__setattr__(self, name, value)

        for name in ("src_vocab_size", "tgt_vocab_size", "seed"):
            value = getattr(self, name)
            if value is not None:
                keep(name, check_int(f"Transformer: {name}", value, 0 if name == "seed" else 1))
        for name in ("d_model", "d_ff", "heads", "num_layers", "max_len"):
            keep(name, check_int(f"Transformer: {name}", getattr(self, name), 1))
        for name in ("encoder_layers", "decoder_layers"):
            if getattr(self, name) is not None:
                keep(name, check_int(f"Transformer: {name}", getattr(self, name), 1))
        if self.d_model % self.heads:
            raise ValueError(f"Transformer: d_model={self.d_model} is not divisible by heads={self.heads}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            keep(name, check_probability(f"Transformer: {name}", getattr(self, name)))
        keep("eps", check_real("Transformer: eps", self.eps, 0))
        for name in ("norm_first", "scale_embedding", "logits_bias"):
            if not isinstance(getattr(self, name), (bool, numpy.bool_)):
                raise ValueError(f"Transformer: {name} must be True or False, got {getattr(self, name)!r}")
            keep(name, bool(getattr(self, name)))
        if self.final_norm is not None:
            if not isinstance(self.final_norm, (bool, numpy.bool_)):
                raise ValueError(f"Transformer: final_norm must be None, True or False, got {self.final_norm!r}")
            keep("final_norm", bool(self.final_norm))
        if self.init not in INIT_SCHEMES:
            raise ValueError(f"Transformer: init must be one of {', '.join(repr(k) for k in INIT_SCHEMES)}, "
                             f"got {self.init!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Transformer: activation must be one of {', '.join(repr(a) for a in ACTIVATIONS)}, "
                             f"got {self.activation!r}")
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(f"Transformer: positional must be one of "
                             f"{', '.join(repr(k) for k in POSITIONAL_KINDS)}, got {self.positional!r}")
        vocabularies = [v for v in (self.src_vocab_size, self.tgt_vocab_size) if v is not None]
        if vocabularies and not (is_integer(self.pad_id) and 0 <= self.pad_id < min(vocabularies)):
            raise ValueError(f"Transformer: pad_id must be an id of the vocabulary, 0 <= pad_id < "
                             f"{min(vocabularies)}, got {self.pad_id!r}")
        keep("pad_id", check_int("Transformer: pad_id", self.pad_id, 0))

    @property
    def depths(self):
        """(the encoder's layers, the decoder's layers)."""
        return (self.num_layers if self.encoder_layers is None else self.encoder_layers,
                self.num_layers if self.decoder_layers is None else self.decoder_layers)

    @property
    def has_final_norm(self):
        """Whether each stack ends in a LayerNorm: ``final_norm``, or pre-LN where it is None."""
        return self.norm_first if self.final_norm is None else self.final_norm

    @classmethod
    def field_names(cls):
        """The allowed arguments, in order."""
        return [field.name for field in dataclasses.fields(cls)]

    @classmethod
    def check_names(cls, names, context="Transformer"):
        """A one-line TypeError for the first name that is not a field (label smoothing: where it went)."""
        allowed = cls.field_names()
        for name in names:
            if name in _LEGACY_KEYS:
                raise TypeError(f"{context}: {name!r} is not an argument: {LABEL_SMOOTHING_MOVED}")
            if name not in allowed:
                raise TypeError(f"{context}: unknown argument {name!r}; allowed: {', '.join(allowed)}")

    def replace(self, **changes):
        """A copy with ``changes`` applied (and checked); an unknown name is a TypeError listing the allowed ones."""
        self.check_names(changes, "TransformerConfig.replace")
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        """The fields as a plain dict: what a checkpoint stores as ``model_config`` (``from_dict`` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        """The config a ``to_dict()`` (or an older checkpoint's ``model_config``) describes."""
        if not isinstance(values, dict):
            raise TypeError(f"TransformerConfig.from_dict: expected a dict of model settings, "
                            f"got {type(values).__name__}")
        values = {k: v for k, v in values.items() if k not in _LEGACY_KEYS}
        cls.check_names(values, "TransformerConfig.from_dict")
        return cls(**values)
