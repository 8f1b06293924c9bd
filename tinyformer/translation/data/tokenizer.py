"""A joint sentencepiece tokenizer: one subword vocabulary for source and target (§5.1).

The paper encodes WMT with byte-pair encoding over a vocabulary shared by both
languages, which is what lets the source embedding, target embedding and output
projection be one matrix (§3.4). ``Tokenizer.train`` builds such a model with
sentencepiece, ``Tokenizer.load`` reads one back; the special tokens always have
the ids of ``special.py`` (pad 0, unk 1, bos 2, eos 3), so a model never needs
to ask its tokenizer where padding is.

Text is not normalised (sentencepiece's ``identity`` rule instead of its
default ``nmt_nfkc``): NFKC would turn a no-break space into a space, and a
translation scored against the raw reference should keep it; umlauts, ß and
typographic quotes pass unchanged either way. The one change a round trip
makes is to spaces: leading and trailing ones are dropped and runs of them
become one. Otherwise ``decode(encode(s)) == s`` for every sentence whose
characters occur in the training text; a character that does not is
``UNK_ID`` and decodes as " ⁇ ".
"""

import hashlib
import io
import os
import re
from pathlib import Path

import sentencepiece

from ...common.atomic import write_atomically
from ...common.files import read_bytes, readable_file
from .special import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from ...common.validation import check_int, is_integer

__all__ = ["Tokenizer", "file_sha256", "load_tokenizer", "tokenizer_sha256"]

MODEL_TYPES = ("bpe", "unigram", "char", "word")


def file_sha256(path, chunk_size=1 << 20):
    """Hex SHA-256 of a file's bytes, read in chunks (a data file need not fit in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Sentences:
    """Feeds ``texts`` to sentencepiece, keeping the first bad item or exception of the iterable.

    sentencepiece turns any exception raised inside the iterator into a bare
    RuntimeError; this keeps the original so ``train`` can raise it instead.
    """

    def __init__(self, texts):
        self.texts = texts
        self.error = None

    def __iter__(self):
        try:
            for i, text in enumerate(self.texts):
                if not isinstance(text, str):
                    raise TypeError(f"Tokenizer.train: texts[{i}] is {type(text).__name__}, not str")
                yield text
        except Exception as e:
            self.error = e
            raise


def _check_encodable(text, name):
    """Raise a ValueError naming the first lone surrogate of ``text`` (sentencepiece takes UTF-8)."""
    for position, char in enumerate(text):
        if "\ud800" <= char <= "\udfff":
            raise ValueError(f"{name} holds a lone surrogate U+{ord(char):04X} at index {position}, which "
                             "is not Unicode text (decode bytes with errors='replace')")


class Tokenizer:
    """A sentencepiece model with the fixed special ids; ``Tokenizer(path)`` is ``Tokenizer.load(path)``.

    ``sha256`` is the digest of the model file: checkpoints record it, so a
    model paired with another tokenizer (same size, different pieces) is refused
    instead of translating nonsense.
    """

    def __init__(self, path):
        path = Path(path)
        data = read_bytes(path, "tokenizer model")  # unreadable, missing or a folder: said so, not "corrupt"
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(data)
        except (RuntimeError, OSError):
            raise ValueError(f"tokenizer model {str(path)!r} is not a sentencepiece model "
                             f"(corrupt, truncated or another format)") from None
        ids = {"pad": processor.pad_id(), "unk": processor.unk_id(),
               "bos": processor.bos_id(), "eos": processor.eos_id()}
        expected = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
        if ids != expected:
            raise ValueError(f"tokenizer model {str(path)!r} has special ids {ids}; tinyformer "
                             f"needs {expected} (train it with Tokenizer.train)")
        self._processor = processor
        self._path = path
        self._sha256 = hashlib.sha256(data).hexdigest()

    @classmethod
    def load(cls, path):
        """Load ``<name>.model``; a missing file is FileNotFoundError, a corrupt one ValueError."""
        return cls(path)

    @classmethod
    def train(cls, texts, directory, vocab_size=8000, model_type="bpe", character_coverage=1.0,
              name="spm", verbose=False):
        """Train on an iterable of sentences, write ``<directory>/<name>.model`` and ``.vocab``, load it.

        Deterministic: the same texts give a byte-identical model, hence the same
        ``sha256``. Every sentence is used (no sampling), training runs on one
        thread (the thread count is stored in the model), and the model comes
        back as bytes rather than through sentencepiece's ``model_prefix``, which
        it would record in the file along with its directory. ``vocab_size`` is
        an upper bound (``hard_vocab_limit=False``): a corpus too small for it
        gives a smaller vocabulary instead of an error. Both files are written
        atomically, replacing earlier ones.
        """
        if isinstance(texts, (str, bytes)):
            raise TypeError("Tokenizer.train: texts must be an iterable of sentences, not one string")
        vocab_size = check_int("Tokenizer.train: vocab_size (four special tokens and one more)", vocab_size, 5)
        if model_type not in MODEL_TYPES:
            raise ValueError(f"Tokenizer.train: model_type must be one of {MODEL_TYPES}, "
                             f"got {model_type!r}")
        if not 0.0 < character_coverage <= 1.0:
            raise ValueError(f"Tokenizer.train: character_coverage must lie in (0, 1], "
                             f"got {character_coverage!r}")
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name \
                or os.sep in name or (os.altsep and os.altsep in name):
            raise ValueError(f"Tokenizer.train: name must be a plain file name, got {name!r}")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)

        sentences = _Sentences(texts)
        model = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=model,
                vocab_size=vocab_size, model_type=model_type,
                character_coverage=character_coverage, hard_vocab_limit=False,
                normalization_rule_name="identity",
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                input_sentence_size=0, shuffle_input_sentence=False, num_threads=1,
                minloglevel=0 if verbose else 2)
        except (RuntimeError, ValueError) as e:
            if sentences.error is not None:
                raise sentences.error from None
            message = str(e)
            if "sentences_.empty()" in message:
                raise ValueError("Tokenizer.train: texts holds no non-empty sentence") from None
            needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
            if needed:
                raise ValueError(f"Tokenizer.train: vocab_size={vocab_size} is too small: the "
                                 f"characters of texts and the 4 special tokens need "
                                 f"{needed.group(1)} ids; raise vocab_size or lower "
                                 f"character_coverage") from None
            raise ValueError(f"Tokenizer.train: sentencepiece failed: {message}") from None

        data = model.getvalue()
        path = directory / f"{name}.model"
        processor = sentencepiece.SentencePieceProcessor(model_proto=data)
        vocab = "".join(f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n"
                        for i in range(processor.get_piece_size()))
        write_atomically(directory / f"{name}.vocab", vocab.encode("utf-8"))
        write_atomically(path, data)
        return cls(path)

    # The special ids, the same for every tokenizer of this kind (a MarianTokenizer has its own).
    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    # ------------------------------------------------------------------ properties
    @property
    def path(self):
        """The ``.model`` file this tokenizer was loaded from."""
        return self._path

    @property
    def sha256(self):
        """Hex SHA-256 of the model file's bytes, as loaded."""
        return self._sha256

    @property
    def vocab_size(self):
        """Number of ids, special tokens included: ids are 0 .. vocab_size - 1."""
        return self._processor.get_piece_size()

    def __len__(self):
        return self.vocab_size

    def __repr__(self):
        return (f"Tokenizer(path={str(self._path)!r}, vocab_size={self.vocab_size}, "
                f"sha256={self._sha256[:12]!r}...)")

    # ------------------------------------------------------------------ encoding
    def encode(self, text):
        """Subword ids of one sentence, without BOS or EOS (the batching code adds those).

        Any str of valid Unicode encodes (a character outside the vocabulary is
        ``UNK_ID``); one holding a lone surrogate (not Unicode, e.g. from
        ``errors="surrogateescape"``) is a ValueError naming its position.
        """
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode: text must be str, got {type(text).__name__}")
        try:
            return self._processor.encode(text)
        except (RuntimeError, TypeError):  # sentencepiece's words for text it cannot take as UTF-8
            _check_encodable(text, "Tokenizer.encode: text")
            raise

    def encode_batch(self, texts):
        """``encode`` for each sentence of a list."""
        if isinstance(texts, (str, bytes)):
            raise TypeError("Tokenizer.encode_batch: texts must be a list of sentences, not one string")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"Tokenizer.encode_batch: texts[{i}] must be str, "
                                f"got {type(text).__name__}")
        try:
            return self._processor.encode(texts) if texts else []
        except (RuntimeError, TypeError):
            for i, text in enumerate(texts):
                _check_encodable(text, f"Tokenizer.encode_batch: texts[{i}]")
            raise

    def encode_target(self, text):
        """``encode``: the one joint model splits both languages (a MarianTokenizer's differ)."""
        return self.encode(text)

    def encode_target_batch(self, texts):
        """``encode_batch``: the one joint model splits both languages."""
        return self.encode_batch(texts)

    def _clean(self, ids, where):
        """Ids up to the first EOS, without PAD and BOS, each checked to be an integer in range."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"{where}: ids must be a sequence of integers, got {type(ids).__name__}")
        out = []
        size = self.vocab_size
        for i in ids:
            if not is_integer(i):
                raise TypeError(f"{where}: ids must be integers, got {i!r} ({type(i).__name__})")
            i = int(i)
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            if not 0 <= i < size:
                raise IndexError(f"{where}: id {i} is outside the vocabulary [0, {size})")
            out.append(i)
        return out

    def decode(self, ids):
        """Text of a sequence of ids (list or 1-D array): stops at the first EOS, skips PAD and BOS."""
        return self._processor.decode(self._clean(ids, "Tokenizer.decode"))

    def decode_batch(self, batch):
        """``decode`` for each row of a list of sequences or a 2-D array."""
        return [self._processor.decode(self._clean(ids, "Tokenizer.decode_batch")) for ids in batch]

    def id_to_piece(self, i):
        """The subword of an id ("<pad>", "<unk>", "<s>", "</s>" for the special ones)."""
        size = self.vocab_size
        if not is_integer(i) or not 0 <= i < size:
            raise IndexError(f"Tokenizer.id_to_piece: id {i!r} is outside the vocabulary [0, {size})")
        return self._processor.id_to_piece(int(i))

    def piece_to_id(self, piece):
        """The id of a subword; a piece not in the vocabulary is ``UNK_ID``."""
        return self._processor.piece_to_id(piece)


def load_tokenizer(path):
    """The tokenizer stored at ``path``: a folder holding ``source.spm``, ``target.spm`` and ``vocab.json``
    is a ``MarianTokenizer``, anything else a joint sentencepiece ``Tokenizer``."""
    if Path(path).is_dir():
        from .marian_tokenizer import MarianTokenizer

        return MarianTokenizer(path)
    return Tokenizer(path)


def tokenizer_sha256(path):
    """The ``sha256`` that ``load_tokenizer(path)`` would have, without loading it (None where there is
    nothing at ``path``): a Marian folder's digest over its three files, or the model file's own."""
    path = Path(path)
    if path.is_dir():
        from .marian_tokenizer import MARIAN_FILES, marian_sha256

        return marian_sha256(path) if all((path / name).is_file() for name in MARIAN_FILES) else None
    return file_sha256(readable_file(path, "tokenizer")) if path.is_file() else None  # unreadable: said so
