"""The built-in task: deterministic, disjoint splits, correct German."""

import pytest

from tinyformer.translation.data import synthetic
from tinyformer.translation.data.synthetic import number_to_german, synthetic_pairs, translate_sentence


@pytest.mark.parametrize("n, words", [
    (1, "eins"), (7, "sieben"), (11, "elf"), (17, "siebzehn"), (21, "einundzwanzig"),
    (30, "dreißig"), (47, "siebenundvierzig"), (100, "einhundert"), (101, "einhunderteins"),
    (116, "einhundertsechzehn"), (347, "dreihundertsiebenundvierzig"), (999, "neunhundertneunundneunzig"),
])
def test_numbers_in_german_put_units_before_tens(n, words):
    assert number_to_german(n) == words


def test_number_range_is_checked():
    with pytest.raises(ValueError, match="1..999"):
        number_to_german(0)


def test_agreement_and_verb_second():
    assert translate_sentence(None, "I", "see", 1, "small", "dog") == "Ich sehe einen kleinen Hund"
    assert translate_sentence(None, "you", "see", 1, "small", "cat") == "Du siehst eine kleine Katze"
    assert translate_sentence(None, "we", "buy", 1, "old", "house") == "Wir kaufen ein altes Haus"
    assert translate_sentence("today", "we", "buy", 3, "big", "trees") == "Heute kaufen wir drei große Bäume"


def test_splits_are_deterministic_disjoint_and_sized():
    sizes = {"train": 300, "val": 40, "test": 40}
    train = synthetic_pairs("train", seed=3, sizes=sizes)
    assert train == synthetic_pairs("train", seed=3, sizes=sizes)
    assert train != synthetic_pairs("train", seed=4, sizes=sizes)
    val, test = synthetic_pairs("val", 3, sizes), synthetic_pairs("test", 3, sizes)
    assert [len(x[0]) for x in (train, val, test)] == [300, 40, 40]
    assert not set(train[0]) & set(test[0]) and not set(val[0]) & set(test[0])
    assert all(len(e.split()) >= 5 for e in train[0])


def test_unknown_split():
    with pytest.raises(ValueError, match="split"):
        synthetic_pairs("dev")


def _draw_with_choice(rng):
    """The parts of a sentence as the task first drew them, with ``Generator.choice``: the data of
    every seed (and so every trained model and recorded figure) must stay what it was."""
    adverb = rng.choice([None] + list(synthetic._ADVERBS)) if rng.random() < 0.5 else None
    subject, verb = str(rng.choice(list(synthetic._SUBJECTS))), str(rng.choice(list(synthetic._VERBS)))
    number = 1 if rng.random() < 1 / 4 else int(rng.integers(2, 1000))
    adjective = str(rng.choice(list(synthetic._ADJECTIVES)))
    noun = str(rng.choice([k[0] for k in synthetic._NOUNS]))
    return (None if adverb is None else str(adverb)), subject, verb, number, adjective, noun


@pytest.mark.parametrize("seed", [0, 5])
def test_the_splits_are_those_generator_choice_draws(monkeypatch, seed):
    sizes = {"train": 3000, "val": 200, "test": 200}
    fast = [synthetic_pairs(split, seed, sizes) for split in ("train", "val", "test")]
    synthetic._splits.cache_clear()  # drawn once per process: draw again, with choice
    monkeypatch.setattr(synthetic, "_draw", _draw_with_choice)
    try:
        assert fast == [synthetic_pairs(split, seed, sizes) for split in ("train", "val", "test")]
    finally:
        synthetic._splits.cache_clear()


def test_a_split_is_drawn_once_per_process_and_handed_out_as_new_lists():
    english, german = synthetic_pairs("val", 11, {"val": 30, "test": 10, "train": 50})
    english.append("changed")
    again = synthetic_pairs("val", 11, {"val": 30, "test": 10, "train": 50})
    assert len(again[0]) == 30 and again[0] is not english and "changed" not in again[0]
    assert synthetic._splits.cache_info().hits >= 1
