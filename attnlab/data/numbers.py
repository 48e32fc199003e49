"""The built-in synthetic translation task: English number words -> German number words.

    "forty-two"                         -> "zweiundvierzig"
    "three hundred one thousand twelve" -> "dreihunderteintausendzwölf"

German writes a number as one word with the units before the tens ("two-and-forty"), so the
decoder must look back and forth in the source: the reordering shows in cross-attention.
Numbers cover 0–999,999; a seeded split keeps held-out numbers out of training entirely.
"""

from __future__ import annotations

import random

from attnlab.errors import BadInput

EN_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
           "fourteen fifteen sixteen seventeen eighteen nineteen").split()
EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
DE_ONES = ("null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn "
           "vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn").split()
DE_TENS = "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()
MAX_NUMBER = 999_999


def english(n: int) -> str:
    """American style without "and": 305 -> "three hundred five"."""
    if not 0 <= n <= MAX_NUMBER:
        raise BadInput(f"number {n} outside 0..{MAX_NUMBER}")
    if n < 20:
        return EN_ONES[n]
    if n < 100:
        return EN_TENS[n // 10] + (f"-{EN_ONES[n % 10]}" if n % 10 else "")
    if n < 1000:
        rest = f" {english(n % 100)}" if n % 100 else ""
        return f"{EN_ONES[n // 100]} hundred{rest}"
    rest = f" {english(n % 1000)}" if n % 1000 else ""
    return f"{english(n // 1000)} thousand{rest}"


def _de_below_1000(n: int, final: bool) -> str:
    """German for 1..999; ``final``: "eins" at the very end, "ein" inside a compound."""
    out = ""
    if n >= 100:
        out = ("ein" if n // 100 == 1 else DE_ONES[n // 100]) + "hundert"
        n %= 100
    if n == 0:
        return out
    if n == 1:
        return out + ("eins" if final else "ein")
    if n < 20:
        return out + DE_ONES[n]
    units, tens = n % 10, DE_TENS[n // 10]
    if units == 0:
        return out + tens
    return out + ("ein" if units == 1 else DE_ONES[units]) + "und" + tens


def german(n: int) -> str:
    """One word, units before tens: 21 -> "einundzwanzig", 1001 -> "eintausendeins"."""
    if not 0 <= n <= MAX_NUMBER:
        raise BadInput(f"number {n} outside 0..{MAX_NUMBER}")
    if n == 0:
        return DE_ONES[0]
    thousands, rest = divmod(n, 1000)
    out = _de_below_1000(thousands, final=False) + "tausend" if thousands else ""
    return out + (_de_below_1000(rest, final=True) if rest else "")


def number_split(n_test: int, seed: int = 0) -> tuple[set[int], random.Random]:
    """Held-out numbers (``n_test`` of them) and a generator for the training stream."""
    rng = random.Random(seed)
    held_out = set(rng.sample(range(MAX_NUMBER + 1), n_test))
    return held_out, rng


def sample_number(rng: random.Random) -> int:
    """Mix scales so that small numbers (rare among 0..999,999) are seen too."""
    digits = rng.choice((1, 2, 3, 4, 5, 6, 6, 6))
    return rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits)


def numbers_corpus(n_train: int, n_test: int, seed: int = 0):
    """``(train_pairs, test_pairs)`` of (english, german); no test number occurs in train."""
    held_out, rng = number_split(n_test, seed)
    train = []
    while len(train) < n_train:
        n = sample_number(rng)
        if n not in held_out:
            train.append((english(n), german(n)))
    test = [(english(n), german(n)) for n in sorted(held_out)]
    return train, test
