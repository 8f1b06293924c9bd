"""Data: tokenizer, Multi30k and the built-in synthetic task, token-count batching."""

from .multi30k import ChecksumError, find_file, load_multi30k, read_lines
from .special import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS, UNK_ID
from .tokenizer import Tokenizer, file_sha256

__all__ = ["PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "SPECIAL_IDS", "Tokenizer", "file_sha256",
           "load_multi30k", "find_file", "read_lines", "ChecksumError"]
