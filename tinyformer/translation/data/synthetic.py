"""The built-in translation task: a small rule-based English → German, generated from a seed.

It needs what real translation needs, not copying:

* **numbers** written in digits become German words with the units before the
  tens ("47" → "siebenundvierzig", "347" → "dreihundertsiebenundvierzig");
* **agreement**: the article and adjective ending depend on the noun's gender,
  which comes *after* them ("1 small dog" → "einen kleinen Hund", "1 small cat"
  → "eine kleine Katze"), the noun takes its plural form after numbers above one,
  and the verb agrees with the subject ("you see" → "du siehst");
* **reordering**: a leading adverb puts the verb before the subject (German V2:
  "today we buy ..." → "heute kaufen wir ...").

Sentences look like ``[adverb] subject verb number adjective noun``; train, val
and test splits are disjoint and depend only on the seed, so nothing is downloaded.
"""

import functools

import numpy

from ...common.validation import check_int

__all__ = ["SPLIT_SIZES", "number_to_german", "synthetic_pairs", "translate_sentence"]

SPLIT_SIZES = {"train": 20000, "val": 500, "test": 500}

_UNITS = ["", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]
_TEENS = ["zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn",
          "achtzehn", "neunzehn"]
_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig",
         "neunzig"]

# English subject: (German subject, person index into the conjugations)
_SUBJECTS = {"I": ("ich", 0), "you": ("du", 1), "we": ("wir", 2)}
_VERBS = {"see": ("sehe", "siehst", "sehen"), "buy": ("kaufe", "kaufst", "kaufen"),
          "have": ("habe", "hast", "haben"), "want": ("will", "willst", "wollen")}
_ADVERBS = {"today": "heute", "tomorrow": "morgen", "often": "oft", "now": "jetzt"}
# English singular, plural: (German singular, plural, gender)
_NOUNS = {("dog", "dogs"): ("Hund", "Hunde", "m"), ("cat", "cats"): ("Katze", "Katzen", "f"),
          ("house", "houses"): ("Haus", "Häuser", "n"), ("car", "cars"): ("Auto", "Autos", "n"),
          ("bird", "birds"): ("Vogel", "Vögel", "m"), ("flower", "flowers"): ("Blume", "Blumen", "f"),
          ("book", "books"): ("Buch", "Bücher", "n"), ("tree", "trees"): ("Baum", "Bäume", "m")}
_ADJECTIVES = {"small": "klein", "big": "groß", "red": "rot", "old": "alt", "new": "neu"}
# accusative after the indefinite article "ein-" (singular), strong endings without one (plural)
_ARTICLE = {"m": "einen", "f": "eine", "n": "ein"}
_SINGULAR_ENDING = {"m": "en", "f": "e", "n": "es"}
_PLURAL_ENDING = "e"


def number_to_german(n):
    """1 ≤ n ≤ 999 in German words, as one word: 347 → "dreihundertsiebenundvierzig"."""
    n = check_int("number_to_german: n (1..999)", n, 1, 999)
    hundreds, rest = divmod(n, 100)
    words = ("ein" if hundreds == 1 else _UNITS[hundreds]) + "hundert" if hundreds else ""
    if rest == 0:
        return words
    if rest == 1:
        return words + "eins"
    if rest < 10:
        return words + _UNITS[rest]
    if rest < 20:
        return words + _TEENS[rest - 10]
    tens, units = divmod(rest, 10)
    if units == 0:
        return words + _TENS[tens]
    unit = "ein" if units == 1 else _UNITS[units]
    return words + unit + "und" + _TENS[tens]


def translate_sentence(adverb, subject, verb, number, adjective, noun):
    """The German sentence for one choice of each part (English words as keys)."""
    german_subject, person = _SUBJECTS[subject]
    german_verb = _VERBS[verb][person]
    singular, plural, gender = next(v for k, v in _NOUNS.items() if noun in k)
    stem = _ADJECTIVES[adjective]
    if number == 1:
        obj = f"{_ARTICLE[gender]} {stem}{_SINGULAR_ENDING[gender]} {singular}"
    else:
        obj = f"{number_to_german(number)} {stem}{_PLURAL_ENDING} {plural}"
    if adverb:
        sentence = f"{_ADVERBS[adverb]} {german_verb} {german_subject} {obj}"
    else:
        sentence = f"{german_subject} {german_verb} {obj}"
    return sentence[0].upper() + sentence[1:]


def _english_sentence(adverb, subject, verb, number, adjective, noun):
    singular, plural = next(k for k in _NOUNS if noun in k)
    words = [adverb] if adverb else []
    words += [subject, verb, str(number), adjective, singular if number == 1 else plural]
    sentence = " ".join(words)
    return sentence[0].upper() + sentence[1:]


_ADVERB_CHOICES = [None] + list(_ADVERBS)
_SUBJECT_CHOICES, _VERB_CHOICES = list(_SUBJECTS), list(_VERBS)
_ADJECTIVE_CHOICES, _NOUN_CHOICES = list(_ADJECTIVES), [k[0] for k in _NOUNS]


def _pick(rng, options):
    """``rng.choice(options)``: the same draw from the generator (an index below ``len(options)``),
    without turning the list into an array each time (five times faster over a split)."""
    return options[int(rng.integers(0, len(options)))]


def _draw(rng):
    adverb = _pick(rng, _ADVERB_CHOICES) if rng.random() < 0.5 else None
    subject = _pick(rng, _SUBJECT_CHOICES)
    verb = _pick(rng, _VERB_CHOICES)
    # one in four objects is singular (agreement with "ein-"); the rest spread over 2..999
    number = 1 if rng.random() < 1 / 4 else int(rng.integers(2, 1000))
    return adverb, subject, verb, number, _pick(rng, _ADJECTIVE_CHOICES), _pick(rng, _NOUN_CHOICES)


def synthetic_pairs(split, seed=0, sizes=None):
    """(english_lines, german_lines) of ``split`` ("train", "val" or "test").

    All splits are drawn from one generator seeded with ``seed`` (test first, then
    val, then train), and no English sentence appears in two splits.
    """
    sizes = dict(SPLIT_SIZES, **(sizes or {}))
    if split not in sizes:
        raise ValueError(f"synthetic_pairs: split must be one of {tuple(sizes)}, got {split!r}")
    english, german = _splits(seed, tuple(sizes.items()))[split]
    return list(english), list(german)


@functools.lru_cache(maxsize=4)
def _splits(seed, sizes):
    """{split: (english, german)} of every split, drawn once per process for a seed and sizes (a
    run asks for its training and validation splits, which share the generator)."""
    sizes = dict(sizes)
    rng = numpy.random.default_rng(seed)
    seen, splits = set(), {}
    for name in ("test", "val", "train"):
        english, german = [], []
        while len(english) < sizes[name]:
            parts = _draw(rng)
            sentence = _english_sentence(*parts)
            if sentence in seen:
                continue
            seen.add(sentence)
            english.append(sentence)
            german.append(translate_sentence(*parts))
        splits[name] = tuple(english), tuple(german)
    return splits
