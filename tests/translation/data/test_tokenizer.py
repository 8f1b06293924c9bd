"""The joint sentencepiece tokenizer: round trips, fixed special ids, deterministic training, errors."""

import io
import random

import numpy as np
import pytest
import sentencepiece
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyformer.translation.data.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tinyformer.translation.data.tokenizer import Tokenizer, file_sha256

# Two sentences of Multi30k's test set; they are held out, built from words the corpus has.
HELD_OUT = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Zwei Männer stehen am Herd und bereiten Essen zu.",
    "Eine Frau mit einem blauen Hut steht am Herd.",
    "Ein Mann mit der Nummer\xa06 steht am Herd.",              # a no-break space, kept
    "Two young men are standing near a stove, cooking food.",
]

_DE_SUBJECTS = ["Ein Mann", "Eine Frau", "Zwei Männer", "Drei Kinder", "Ein kleines Mädchen",
                "Ein Hund", "Eine Gruppe von Menschen", "Ein älterer Herr"]
_DE_WITH = ["", " mit einem orangefarbenen Hut,", " mit einem blauen Hemd", " in Schwarz",
            " mit einer Mütze", " „Bürger“",
            " mit der Nummer\xa06"]
_DE_VERBS = ["steht am Herd", "stehen am Herd und bereiten Essen zu", "der etwas anstarrt",
             "läuft über grünes Gras", "sitzt auf einer Bank", "spielt Fußball",
             "klettert in ein Spielhaus aus Holz", "bereiten Essen zu", "schauen etwas an"]
_EN_SUBJECTS = ["A man", "A woman", "Two young men", "Three children", "A little girl", "A dog",
                "A group of people", "An older gentleman"]
_EN_WITH = ["", " in an orange hat,", " in a blue shirt", " wearing black", " with a cap",
            " (smiling)"]
_EN_VERBS = ["is standing near a stove", "are cooking food", "staring at something",
             "runs across green grass", "sits on a bench", "plays soccer", "climbs into a playhouse",
             "are standing outside", "is looking at something"]


def _corpus(n=400, seed=0):
    """German and English captions from templates, like Multi30k's; HELD_OUT excluded."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        de = f"{rng.choice(_DE_SUBJECTS)}{rng.choice(_DE_WITH)} {rng.choice(_DE_VERBS)}."
        en = f"{rng.choice(_EN_SUBJECTS)}{rng.choice(_EN_WITH)} {rng.choice(_EN_VERBS)}!"
        sentences += [de, en]
    return [s for s in sentences if s not in HELD_OUT]


CORPUS = _corpus()
ALPHABET = sorted(set("".join(CORPUS)) - {" "})


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.train(CORPUS, tmp_path_factory.mktemp("spm"), vocab_size=300)


def test_train_writes_model_and_vocab(tmp_path):
    tok = Tokenizer.train(CORPUS, tmp_path / "new" / "dir", vocab_size=200, name="joint")
    assert tok.path == tmp_path / "new" / "dir" / "joint.model"
    assert sorted(p.name for p in tok.path.parent.iterdir()) == ["joint.model", "joint.vocab"]
    vocab = (tmp_path / "new" / "dir" / "joint.vocab").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == tok.vocab_size == len(tok) == 200
    assert [line.split("\t")[0] for line in vocab[:4]] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert [line.split("\t")[0] for line in vocab] == [tok.id_to_piece(i) for i in range(200)]


def test_special_ids_are_fixed(tok):
    assert [tok.id_to_piece(i) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)] == [
        "<pad>", "<unk>", "<s>", "</s>"]
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert [tok.piece_to_id(p) for p in ("<pad>", "<unk>", "<s>", "</s>")] == [0, 1, 2, 3]
    ids = tok.encode(HELD_OUT[0])
    assert ids and all(i > EOS_ID for i in ids)          # no BOS/EOS added, nothing unknown


def test_round_trip_of_held_out_sentences(tok):
    for sentence in HELD_OUT:
        assert tok.decode(tok.encode(sentence)) == sentence
    assert tok.decode_batch(tok.encode_batch(HELD_OUT)) == HELD_OUT
    assert tok.encode_batch(HELD_OUT) == [tok.encode(s) for s in HELD_OUT]
    assert tok.encode_batch([]) == [] and tok.encode("") == [] and tok.decode([]) == ""


def test_round_trip_collapses_spaces_only(tok):
    """Spaces at the ends go, runs of spaces become one; no other character changes."""
    assert tok.decode(tok.encode("  Zwei  Männer   stehen am Herd. ")) == "Zwei Männer stehen am Herd."
    assert tok.decode(tok.encode("„Bürger“ (smiling)")) == "„Bürger“ (smiling)"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=12), min_size=1, max_size=8))
def test_round_trip_of_any_text_in_the_training_alphabet(tok, words):
    sentence = " ".join(words)
    assert tok.decode(tok.encode(sentence)) == sentence


def test_unknown_characters_map_to_unk(tok):
    ids = tok.encode("Ein Mann € steht.")
    assert UNK_ID in ids
    assert "€" not in tok.decode(ids)


def test_decode_drops_specials_and_stops_at_the_first_eos(tok):
    ids = tok.encode(HELD_OUT[1])
    other = tok.encode(HELD_OUT[0])
    assert tok.decode([BOS_ID] + ids + [EOS_ID] + other + [PAD_ID] * 3) == HELD_OUT[1]
    assert tok.decode(ids + [PAD_ID, PAD_ID]) == HELD_OUT[1]
    assert tok.decode([EOS_ID] + ids) == ""
    batch = np.full((2, max(len(ids), len(other)) + 3), PAD_ID, dtype=np.int64)  # a model's output
    batch[0, 0], batch[0, 1:len(ids) + 1], batch[0, len(ids) + 1] = BOS_ID, ids, EOS_ID
    batch[1, 0], batch[1, 1:len(other) + 1] = BOS_ID, other
    assert tok.decode_batch(batch) == [HELD_OUT[1], HELD_OUT[0]]


def test_decode_refuses_ids_outside_the_vocabulary(tok):
    with pytest.raises(IndexError, match="300"):
        tok.decode([5, tok.vocab_size])
    with pytest.raises(IndexError, match="-1"):
        tok.decode([-1])
    with pytest.raises(IndexError, match="id_to_piece"):
        tok.id_to_piece(tok.vocab_size)
    with pytest.raises(TypeError, match="text must be str"):
        tok.encode(b"bytes")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        tok.encode_batch(["ok", 3])


def test_training_is_deterministic(tmp_path):
    a = Tokenizer.train(CORPUS, tmp_path / "a", vocab_size=250)
    b = Tokenizer.train(iter(CORPUS), tmp_path / "b", vocab_size=250)   # a one-shot iterator too
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.sha256 == b.sha256 == file_sha256(a.path)
    c = Tokenizer.train(CORPUS[:-50], tmp_path / "c", vocab_size=250)
    assert c.sha256 != a.sha256
    # Nothing about the machine ends up in the model: not the directory it was trained in.
    assert str(tmp_path).encode() not in a.path.read_bytes()


def test_retraining_replaces_the_model_atomically(tmp_path):
    first = Tokenizer.train(CORPUS, tmp_path, vocab_size=250)
    second = Tokenizer.train(CORPUS[:100], tmp_path, vocab_size=250)
    assert first.path == second.path and first.sha256 != second.sha256
    assert Tokenizer.load(first.path).sha256 == second.sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model", "spm.vocab"]   # no temp files


def test_vocab_size_is_an_upper_bound(tmp_path):
    assert Tokenizer.train(CORPUS, tmp_path / "a", vocab_size=123).vocab_size == 123
    # hard_vocab_limit=False: a corpus too small for the request gives fewer pieces, no error.
    small = Tokenizer.train(CORPUS[:4], tmp_path / "b", vocab_size=5000)
    assert 4 < small.vocab_size < 5000
    assert all(small.decode(small.encode(s)) == s for s in CORPUS[:4])
    with pytest.raises(ValueError, match="vocab_size=10 is too small"):
        Tokenizer.train(CORPUS, tmp_path / "c", vocab_size=10)


def test_bad_training_arguments(tmp_path):
    with pytest.raises(ValueError, match="no non-empty sentence"):
        Tokenizer.train(["", ""], tmp_path, vocab_size=50)
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        Tokenizer.train(["a b", 7], tmp_path, vocab_size=50)
    with pytest.raises(TypeError, match="not one string"):
        Tokenizer.train("a sentence", tmp_path, vocab_size=50)
    with pytest.raises(ValueError, match="model_type"):
        Tokenizer.train(CORPUS, tmp_path, model_type="bytes")
    with pytest.raises(ValueError, match="name"):
        Tokenizer.train(CORPUS, tmp_path, name="sub/spm")

    def failing():
        yield "Ein Mann."
        raise OSError("corpus file vanished")

    with pytest.raises(OSError, match="corpus file vanished"):      # not sentencepiece's wrapper
        Tokenizer.train(failing(), tmp_path, vocab_size=50)
    assert list(tmp_path.iterdir()) == []


def test_load_round_trips_and_reports_bad_files(tok, tmp_path):
    again = Tokenizer.load(tok.path)
    assert again.sha256 == tok.sha256 and again.vocab_size == tok.vocab_size
    assert again.encode(HELD_OUT[0]) == tok.encode(HELD_OUT[0])

    missing = tmp_path / "missing.model"
    with pytest.raises(FileNotFoundError, match="missing.model"):
        Tokenizer.load(missing)
    for name, data in [("empty.model", b""), ("garbage.model", b"\x08\x96\x01 not a model" * 5),
                       ("truncated.model", tok.path.read_bytes()[:1000])]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=name):
            Tokenizer.load(tmp_path / name)


def test_load_refuses_other_special_ids(tmp_path):
    """A stock sentencepiece model (unk 0, bos 1, eos 2, no pad) would shift every special id."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model,
                                             vocab_size=100, minloglevel=2)
    (tmp_path / "stock.model").write_bytes(model.getvalue())
    with pytest.raises(ValueError, match="stock.model.*special ids"):
        Tokenizer.load(tmp_path / "stock.model")
