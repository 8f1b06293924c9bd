"""A Marian tokenizer: two sentencepiece models over one shared vocabulary, as the ``opus-mt-*`` models have.

A Marian model (Helsinki-NLP's ``opus-mt-*``, Hugging Face's ``MarianMTModel``) splits the source
text with one sentencepiece model (``source.spm``) and the target text with another
(``target.spm``); the pieces of both are looked up in one ``vocab.json`` ({piece: id}), whose ids
are the model's. A piece missing from it is ``<unk>``. The special tokens are the vocabulary's
``</s>`` (EOS, often 0), ``<unk>`` and ``<pad>`` (often the last id); there is no BOS: the decoder
starts from the padding id, so ``bos_id`` here is ``pad_id``.

Encoding and decoding follow transformers' ``MarianTokenizer``: a leading language code such as
``>>fra<<`` is one token; decoding stops at the first EOS, leaves out the special tokens and joins
the pieces as sentencepiece does (through the source model when the vocabulary is shared, as
transformers does), "▁" becoming a space. Text is not normalised.

``MarianTokenizer(folder)`` reads a folder holding the three files (an imported run's ``tokenizer/``
or a Hugging Face model folder); ``sha256`` covers all three, so a checkpoint records which.
"""

import hashlib
import json
from pathlib import Path

import sentencepiece

from ...common.files import read_bytes
from ...common.validation import is_integer

__all__ = ["MarianTokenizer", "MARIAN_FILES", "TokenizerFilesError", "marian_sha256"]

MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
_SPECIAL = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}
_MAX_MISSING = 0.05  # the share of a sentencepiece model's pieces vocab.json may lack before they disagree


def marian_sha256(folder):
    """Hex SHA-256 over the SHA-256 of a Marian tokenizer folder's ``source.spm``, ``target.spm`` and
    ``vocab.json``, in that order: ``MarianTokenizer.sha256``, without loading the models."""
    digest = hashlib.sha256()
    for name in MARIAN_FILES:
        digest.update(hashlib.sha256(read_bytes(Path(folder) / name, error=TokenizerFilesError)).digest())
    return digest.hexdigest()


class TokenizerFilesError(ValueError):
    """A Marian tokenizer's files are missing, unreadable or disagree with each other."""


def _load_spm(path):
    data = read_bytes(path, error=TokenizerFilesError)  # unreadable is not corrupt
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(data)
    except (RuntimeError, OSError):
        raise TokenizerFilesError(f"{path} is not a sentencepiece model (corrupt, truncated or another "
                                  "format)") from None
    return processor


def _load_vocabulary(path):
    text = read_bytes(path, error=TokenizerFilesError)
    try:
        vocab = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenizerFilesError(f"{path} is not a JSON vocabulary ({error})") from None
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerFilesError(f"{path} must hold a JSON object {{piece: id}}, got "
                                  f"{type(vocab).__name__ if not isinstance(vocab, dict) else 'an empty one'}")
    for piece, index in vocab.items():
        if not is_integer(index) or isinstance(index, bool) or index < 0:
            raise TokenizerFilesError(f"{path}: the id of piece {piece!r} must be an integer >= 0, got {index!r}")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        duplicate = next((a for a, b in zip(ids, ids[1:]) if a == b), None)
        problem = (f"id {duplicate} is given to two pieces" if duplicate is not None
                   else f"its ids are not 0 .. {len(ids) - 1} (the largest is {ids[-1]})")
        raise TokenizerFilesError(f"{path}: {problem}")
    for name, piece in _SPECIAL.items():
        if piece not in vocab:
            raise TokenizerFilesError(f"{path} has no {piece!r} ({name}) piece")
    return vocab


class MarianTokenizer:
    """Source and target sentencepiece models over one ``vocab.json`` (see the module's docstring)."""

    def __init__(self, folder):
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"Marian tokenizer folder {str(folder)!r} does not exist"
                                    if not folder.exists() else
                                    f"Marian tokenizer {str(folder)!r} is not a folder")
        missing = [name for name in MARIAN_FILES if not (folder / name).exists()]
        if missing:
            raise TokenizerFilesError(f"{folder} lacks {', '.join(missing)} (a Marian tokenizer needs "
                                      f"{', '.join(MARIAN_FILES)})")
        self._folder = folder
        self._source = _load_spm(folder / "source.spm")
        self._target = _load_spm(folder / "target.spm")
        self._vocab = _load_vocabulary(folder / "vocab.json")
        self._pieces = {index: piece for piece, index in self._vocab.items()}
        for name, processor in (("source.spm", self._source), ("target.spm", self._target)):
            pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
                      if not (processor.is_control(i) or processor.is_unknown(i))]
            absent = [p for p in pieces if p not in self._vocab]
            if len(absent) > _MAX_MISSING * max(len(pieces), 1):
                raise TokenizerFilesError(
                    f"{folder}: vocab.json and {name} disagree: {len(absent):,} of {name}'s {len(pieces):,} pieces "
                    f"are not in the vocabulary (e.g. {', '.join(repr(p) for p in absent[:3])})")
        self.eos_id, self.unk_id, self.pad_id = (self._vocab[_SPECIAL[k]] for k in ("eos", "unk", "pad"))
        self.bos_id = self.pad_id  # the decoder starts from the padding id
        self._special = {self.eos_id, self.unk_id, self.pad_id}
        self._sha256 = marian_sha256(folder)

    @classmethod
    def load(cls, folder):
        return cls(folder)

    @property
    def path(self):
        """The folder holding ``source.spm``, ``target.spm`` and ``vocab.json``."""
        return self._folder

    @property
    def sha256(self):
        """Hex SHA-256 over the SHA-256 of ``source.spm``, ``target.spm`` and ``vocab.json``, in that order."""
        return self._sha256

    @property
    def vocab_size(self):
        return len(self._vocab)

    def __len__(self):
        return self.vocab_size

    def __repr__(self):
        return (f"MarianTokenizer(path={str(self._folder)!r}, vocab_size={self.vocab_size}, "
                f"sha256={self._sha256[:12]!r}...)")

    # ------------------------------------------------------------------ encoding
    def _encode(self, processor, text, where):
        if not isinstance(text, str):
            raise TypeError(f"{where}: text must be str, got {type(text).__name__}")
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:  # a target-language code, e.g. >>fra<<
            code, text = [text[:end + 2]], text[end + 2:]
        try:
            pieces = processor.encode(text, out_type=str)
        except (RuntimeError, TypeError):
            raise ValueError(f"{where}: text is not Unicode text sentencepiece can take") from None
        return [self._vocab.get(piece, self.unk_id) for piece in code + pieces]

    def encode(self, text):
        """Ids of one source sentence, without EOS (the batching code adds it)."""
        return self._encode(self._source, text, "MarianTokenizer.encode")

    def encode_target(self, text):
        """Ids of one target sentence (``target.spm``), without EOS."""
        return self._encode(self._target, text, "MarianTokenizer.encode_target")

    def encode_batch(self, texts):
        return [self.encode(text) for text in _sentences(texts, "MarianTokenizer.encode_batch")]

    def encode_target_batch(self, texts):
        return [self.encode_target(text) for text in _sentences(texts, "MarianTokenizer.encode_target_batch")]

    # ------------------------------------------------------------------ decoding
    def _pieces_of(self, ids, where):
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"{where}: ids must be a sequence of integers, got {type(ids).__name__}")
        pieces = []
        for i in ids:
            if not is_integer(i):
                raise TypeError(f"{where}: ids must be integers, got {i!r} ({type(i).__name__})")
            i = int(i)
            if i == self.eos_id:
                break
            if i not in self._pieces:
                raise IndexError(f"{where}: id {i} is outside the vocabulary [0, {self.vocab_size})")
            if i not in self._special:
                pieces.append(self._pieces[i])
        return pieces

    def _text(self, pieces):
        return self._source.decode_pieces(pieces).replace("\u2581", " ").strip()

    def decode(self, ids):
        """Text of target ids: up to the first EOS, special tokens left out."""
        return self._text(self._pieces_of(ids, "MarianTokenizer.decode"))

    def decode_batch(self, batch):
        return [self._text(self._pieces_of(ids, "MarianTokenizer.decode_batch")) for ids in batch]

    def id_to_piece(self, i):
        if not is_integer(i) or int(i) not in self._pieces:
            raise IndexError(f"MarianTokenizer.id_to_piece: id {i!r} is outside the vocabulary [0, {self.vocab_size})")
        return self._pieces[int(i)]

    def piece_to_id(self, piece):
        return self._vocab.get(piece, self.unk_id)


def _sentences(texts, where):
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{where}: texts must be a list of sentences, not one string")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{where}: texts[{i}] must be str, got {type(text).__name__}")
    return texts
