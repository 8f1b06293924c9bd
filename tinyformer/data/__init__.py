"""Data: tokenizer, Multi30k and the built-in synthetic task, token-count batching."""

from .special import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS, UNK_ID

__all__ = ["PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "SPECIAL_IDS"]
