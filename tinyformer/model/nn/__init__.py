"""Layers of the Transformer, built from ``tinyformer.engine.functional`` (no array code here)."""

from . import init
from .attention import MultiHeadAttention
from .layers import (
    Dropout,
    Embedding,
    LayerNorm,
    LearnedPositionalEmbedding,
    Linear,
    PositionalEncoding,
    PositionwiseFeedForward,
)
from .config import TransformerConfig
from . import limits, probe
from .module import Module, ModuleList, Parameter, StateDictError, inference
from .presets import PAPER_CHOICES, PRESETS
from .transformer import Decoder, DecoderLayer, DecoderState, Encoder, EncoderLayer, Transformer

__all__ = [
    "Module", "ModuleList", "Parameter", "StateDictError", "Linear", "Embedding", "LayerNorm",
    "Dropout", "PositionalEncoding", "LearnedPositionalEmbedding", "PositionwiseFeedForward",
    "MultiHeadAttention", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder", "Transformer", "DecoderState",
    "TransformerConfig", "PRESETS", "PAPER_CHOICES", "inference", "init", "limits", "probe",
]
