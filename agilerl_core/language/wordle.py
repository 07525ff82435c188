"""Wordle as a text game: guess a five-letter secret word in at most six guesses, told after each guess which
letters are right (``G``: right letter, right place; ``Y``: in the word elsewhere; ``-``: absent).

Word list: the five-letter words (9,979) of ``web2`` (Webster's Second International Dictionary, 1934, in the
public domain) as shipped by the ``english-words`` package (MIT licence), lower-case, letters only. The
train / held-out split of the secrets is a fixed rule, independent of any seed: a word is held out when its
SHA-256 (as an integer) modulo 1000 is below ``held_out * 1000``, so the split of a word never depends on the
vocabulary size either. ``vocabulary: N`` makes a smaller game: its secrets (and the words the players pick
from) are the first N words in SHA-256 order, while every word of the list stays a valid guess (as Wordle
allows more guesses than it has answers).

The observation is the transcript: one line per finished turn, ``guess + " " + feedback + "\\n"`` (e.g.
``"crane -G-Y-\\n"``), always twelve characters of :data:`CHARS`. A guess that is not a valid word is, by default
(``invalid="penalise"``), a turn like any other: it costs a guess (reward -1) and its feedback is ``"!!!!!"``;
a guess that is not even five letters a-z is shown as ``"!!!!!"`` too. With ``invalid="refuse"`` it raises
:class:`InvalidGuess` and the game is unchanged.

Reward: -1 for every guess that is not the secret, 0 for the solving guess, so a game solved on guess k
returns -(k-1) and an unsolved one returns -max_guesses.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

SOURCE = "english-words 2.0.2: web2 (Webster's Second International, public domain), five-letter words"
LENGTH = 5
MAX_GUESSES = 20  # hard cap on a game's length (games and datasets declaring more are refused)
SOLVED = "G" * LENGTH
INVALID = "!" * LENGTH  # the feedback of an invalid guess (and how a malformed guess is shown)
CODES = "-YG"  # feedback characters by code: 0 absent, 1 elsewhere, 2 right place
_WORD = re.compile(r"[a-z]{5}")


class InvalidGuess(ValueError):
    """A guess that is not a valid word, in a game that refuses them (``invalid="refuse"``)."""


def is_word(text: object) -> bool:
    """Whether `text` is five lower-case letters a-z."""
    return isinstance(text, str) and _WORD.fullmatch(text) is not None


def _check_word(text: object, name: str) -> str:
    if not is_word(text):
        raise ValueError(f"{name}: {text!r} is not five lower-case letters a-z")
    return text  # type: ignore[return-value]


def _digest(word: str) -> int:
    return int.from_bytes(hashlib.sha256(word.encode()).digest(), "big")


@functools.cache
def _all_words() -> tuple[str, ...]:
    """Every five-letter word of the source list, in the fixed order of their SHA-256 (loaded once)."""
    from english_words import get_english_words_set

    words = {w for w in get_english_words_set(["web2"], lower=True, alpha=True) if is_word(w)}
    return tuple(sorted(words, key=lambda w: (_digest(w), w)))


@dataclass(frozen=True)
class WordList:
    """The valid guesses and the secrets of a game, split into train and held-out secrets."""

    words: tuple[str, ...]  # the game's words (its secrets, and the words the players pick from), sorted
    train: tuple[str, ...]  # secrets to collect data and train on
    held_out: tuple[str, ...]  # secrets to evaluate on, never trained on
    source: str  # where the words come from
    allowed: tuple[str, ...] = ()  # every valid guess (the whole list, as Wordle allows more guesses than answers)

    @functools.cached_property
    def valid(self) -> frozenset[str]:
        """The valid guesses as a set: every word of the list (the game's words when `allowed` is empty)."""
        return frozenset(self.allowed or self.words)

    @functools.cached_property
    def letters(self) -> np.ndarray:
        """The valid guesses as letter codes (0 for a), [5, N] uint8."""
        return letters_of(self.words)


@functools.cache
def word_list(vocabulary: int | None = None, held_out: float = 0.2) -> WordList:
    """The game's words (the first `vocabulary` words in SHA-256 order; None: all) and its secrets' split; every word
    of the list stays a valid guess."""
    everything = _all_words()
    if vocabulary is not None and (isinstance(vocabulary, bool) or not isinstance(vocabulary, int)
                                   or not 2 <= vocabulary <= len(everything)):
        raise ValueError(f"vocabulary: {vocabulary!r} is not a whole number from 2 to {len(everything)} (the size of "
                         f"the word list), or None for all")
    if isinstance(held_out, bool) or not isinstance(held_out, (int, float)) or not 0 < held_out < 1:
        raise ValueError(f"held_out: {held_out!r} is not a fraction strictly between 0 and 1")
    kept = everything[:vocabulary] if vocabulary is not None else everything
    out = [w for w in kept if _digest(w) % 1000 < held_out * 1000]
    out_set = set(out)
    train = [w for w in kept if w not in out_set]
    if not out or not train:
        raise ValueError(f"held_out: {held_out} splits {len(kept)} words into {len(train)} train and {len(out)} "
                         f"held-out secrets; both need at least one (change held_out or vocabulary)")
    return WordList(tuple(sorted(kept)), tuple(sorted(train)), tuple(sorted(out)), SOURCE, tuple(sorted(everything)))


def marks_score(marks: str) -> float:
    """How close a guess came, from its feedback alone: (greens + yellows / 2) / 5, in [0, 1]; 0 for an invalid
    guess (its feedback is :data:`INVALID`). The shaped reward's per-guess term (``dataset.options.shaping``)."""
    return (marks.count("G") + 0.5 * marks.count("Y")) / LENGTH


def feedback(guess: str, secret: str) -> str:
    """Wordle's feedback on `guess` for `secret`: greens first, then yellows use up the remaining letters
    left to right (so a letter is marked at most as often as it occurs in the secret)."""
    _check_word(guess, "guess")
    _check_word(secret, "secret")
    marks = ["-"] * LENGTH
    left: Counter[str] = Counter()
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = "G"
        else:
            left[s] += 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and left[g] > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


def letters_of(words: Sequence[str]) -> np.ndarray:
    """Five-letter words as letter codes (0 for a), position first: [5, N] uint8 (each row contiguous)."""
    raw = np.frombuffer("".join(words).encode("ascii"), np.uint8).reshape(len(words), LENGTH)
    return np.ascontiguousarray((raw - ord("a")).T)


def feedback_codes(guess: str, secrets: np.ndarray) -> np.ndarray:
    """The feedback on `guess` for every secret of `secrets` ([5, M] letter codes, as :func:`letters_of`) as
    codes of :data:`CODES`, [5, M] int8: the rule of :func:`feedback`, vectorised over the secrets."""
    g = letters_of([_check_word(guess, "guess")])[:, 0]
    green = secrets == g[:, None]  # [5, M]
    codes = green.astype(np.int8) * 2
    for i in range(LENGTH):
        same = np.flatnonzero(g == g[i])  # positions of the guess holding this letter (i among them)
        avail = (secrets[0] == g[i]).astype(np.int8)  # occurrences in the secret not matched by a green
        for k in range(1, LENGTH):
            avail += secrets[k] == g[i]
        for k in same:
            avail -= green[k]
        # the r-th non-green occurrence of a letter in the guess (r from 0, left to right) is yellow when the
        # secret has more than r unmatched occurrences of it
        rank = np.zeros_like(avail)
        for k in same[same < i]:
            rank += ~green[k]
        codes[i] = np.where(green[i], 2, avail > rank)
    return codes


def codes_of(marks: str) -> np.ndarray:
    """A feedback string as codes of :data:`CODES`, [5] int8."""
    if len(marks) != LENGTH or any(c not in CODES for c in marks):
        raise ValueError(f"feedback: {marks!r} is not five of {CODES!r}")
    return np.array([CODES.index(c) for c in marks], np.int8)


def turn_text(guess: str, marks: str) -> str:
    """One finished turn as transcript text (a malformed guess shown as ``!!!!!``)."""
    return f"{guess if is_word(guess) else INVALID} {marks}\n"


# ---- characters, for from-scratch models ------------------------------------------------------------------
SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS: tuple[str, ...] = (*SPECIALS, *"abcdefghijklmnopqrstuvwxyz", " ", "G", "Y", "-", "!", "\n")
PAD, BOS, EOS = 0, 1, 2
_IDS = {c: i for i, c in enumerate(CHARS) if i >= len(SPECIALS)}


def encode(text: str) -> list[int]:
    """The ids of `text`'s characters (no specials added)."""
    try:
        return [_IDS[c] for c in text]
    except KeyError as err:
        raise ValueError(f"encode: character {err.args[0]!r} is not in the Wordle vocabulary CHARS") from None


def decode(ids: Iterable[int]) -> str:
    """The text of `ids`; the specials (pad, bos, eos) are dropped."""
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(CHARS):
            raise ValueError(f"decode: id {i!r} is not an id of CHARS (0 to {len(CHARS) - 1})")
        if i >= len(SPECIALS):
            out.append(CHARS[i])
    return "".join(out)


# ---- the game ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Turn:
    """One finished guess."""

    guess: str
    feedback: str
    reward: float
    done: bool
    solved: bool


class WordleGame:
    """One game of Wordle against `secret` (see the module docstring for rewards and invalid guesses)."""

    def __init__(self, secret: str, words: WordList | frozenset[str], max_guesses: int = 6,
                 invalid: Literal["penalise", "refuse"] = "penalise") -> None:
        self.valid = words.valid if isinstance(words, WordList) else frozenset(words)
        _check_word(secret, "secret")
        if secret not in self.valid:
            raise ValueError(f"secret: {secret!r} is not in the word list")
        if isinstance(max_guesses, bool) or not isinstance(max_guesses, int) or not 1 <= max_guesses <= MAX_GUESSES:
            raise ValueError(f"max_guesses: {max_guesses!r} is not a whole number from 1 to {MAX_GUESSES}")
        if invalid not in ("penalise", "refuse"):
            raise ValueError(f"invalid: {invalid!r} is not 'penalise' or 'refuse'")
        self.secret, self.max_guesses, self.invalid = secret, max_guesses, invalid
        self._turns: list[Turn] = []

    @property
    def turns(self) -> tuple[Turn, ...]:
        """The finished turns."""
        return tuple(self._turns)

    @property
    def solved(self) -> bool:
        """Whether the secret was guessed."""
        return bool(self._turns) and self._turns[-1].solved

    @property
    def done(self) -> bool:
        """Whether the game is over (solved, or out of guesses)."""
        return self.solved or len(self._turns) >= self.max_guesses

    @property
    def transcript(self) -> str:
        """The text so far: one line per finished turn."""
        return "".join(turn_text(t.guess, t.feedback) for t in self._turns)

    @property
    def total_return(self) -> float:
        """The sum of the rewards so far."""
        return float(sum(t.reward for t in self._turns))

    def guess(self, word: str) -> Turn:
        """Play `word`; an invalid word is penalised or refused (InvalidGuess) as the game was told."""
        if self.done:
            raise ValueError(f"the game is over ({'solved' if self.solved else 'out of guesses'}); start a new one")
        if isinstance(word, str) and word in self.valid:
            marks = feedback(word, self.secret)
        elif self.invalid == "refuse":
            raise InvalidGuess(f"guess: {word!r} is not in the word list")
        else:
            marks = INVALID
        solved = marks == SOLVED
        turn = Turn(word, marks, 0.0 if solved else -1.0, solved or len(self._turns) + 1 >= self.max_guesses, solved)
        self._turns.append(turn)
        return turn
