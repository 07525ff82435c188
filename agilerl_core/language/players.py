"""The seeded players that collect Wordle data, as the ILQL paper (Snell et al., 2023, "Offline RL for Natural
Language Generation with Implicit Language Q Learning") built its synthetic Wordle games: a random player, a
solver that guesses a random word still consistent with the feedback, and a solver that guesses at random
with probability eps. A mix of them (``"random:0.2,solver:0.3,noisy_solver_0.5:0.5"``) gives games of every
quality, the data an offline learner has to improve on.

Game i of :func:`play_games` draws its player, its secret and every choice from a generator seeded by
(seed, i), so the same arguments give the same games and game i does not depend on how many are played.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from agilerl_core.language.wordle import (
    CODES,
    SOLVED,
    Turn,
    WordleGame,
    WordList,
    codes_of,
    feedback_codes,
    is_word,
    turn_text,
    word_list,
)

DEFAULT_MIX = "random:0.2,solver:0.3,noisy_solver_0.5:0.5"
PLAYER_NAMES = "random, solver, noisy_solver_EPS (EPS from 0 to 1, e.g. noisy_solver_0.5)"


class Player(Protocol):
    """Chooses the next guess from the turns so far."""

    name: str
    words: WordList

    def choose(self, game_turns: Sequence[Turn], rng: np.random.Generator) -> str:
        """The next guess."""
        ...

    def for_words(self, words: WordList) -> Player:
        """The same player choosing among `words`."""
        ...


class RandomPlayer:
    """Guesses a uniformly random valid word."""

    def __init__(self, words: WordList | None = None) -> None:
        self.words = words or word_list()
        self.name = "random"

    def for_words(self, words: WordList) -> RandomPlayer:
        """The same player choosing among `words`."""
        return self if words is self.words or words == self.words else RandomPlayer(words)

    def choose(self, game_turns: Sequence[Turn], rng: np.random.Generator) -> str:
        """A uniformly random valid word."""
        return self.words.words[int(rng.integers(len(self.words.words)))]


class SolverPlayer:
    """Guesses a uniformly random word among the valid words still consistent with every feedback so far."""

    def __init__(self, words: WordList | None = None) -> None:
        self.words = words or word_list()
        self.name = "solver"
        self._narrowed: tuple[tuple[tuple[str, str], ...], np.ndarray | None] = ((), None)

    def for_words(self, words: WordList) -> SolverPlayer:
        """The same player choosing among `words`."""
        return self if words is self.words or words == self.words else type(self)(words)

    def candidates(self, game_turns: Sequence[Turn]) -> np.ndarray:
        """Indices (into ``words.words``) of the words consistent with every turn: ``feedback(guess, word)``
        equals the turn's feedback. Invalid guesses (feedback ``!!!!!``) tell nothing and are skipped."""
        key = tuple((t.guess, t.feedback) for t in game_turns)
        known, index = self._narrowed
        if key[:len(known)] != known:  # another game: start again from every word
            known, index = (), None
        letters = self.words.letters
        for guess, marks in key[len(known):]:
            if not is_word(guess) or any(c not in CODES for c in marks):
                continue
            target = codes_of(marks)[:, None]
            subset = letters if index is None else letters[:, index]
            keep = np.flatnonzero((feedback_codes(guess, subset) == target).all(0))
            index = keep if index is None else index[keep]
        self._narrowed = (key, index)  # the next turn of the same game narrows this set further
        return np.arange(letters.shape[1]) if index is None else index

    def choose(self, game_turns: Sequence[Turn], rng: np.random.Generator) -> str:
        """A random consistent word (a random valid word if none is: a secret from outside the list)."""
        cands = self.candidates(game_turns)
        if len(cands) == 0:
            return self.words.words[int(rng.integers(len(self.words.words)))]
        return self.words.words[int(cands[rng.integers(len(cands))])]


class NoisySolver(SolverPlayer):
    """The solver, but with probability `eps` a uniformly random valid word instead."""

    def __init__(self, eps: float, words: WordList | None = None) -> None:
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps <= 1:
            raise ValueError(f"eps: {eps!r} is not a probability from 0 to 1")
        super().__init__(words)
        self.eps = float(eps)
        self.name = f"noisy_solver_{self.eps:g}"

    def for_words(self, words: WordList) -> NoisySolver:
        """The same player choosing among `words`."""
        return self if words is self.words or words == self.words else NoisySolver(self.eps, words)

    def choose(self, game_turns: Sequence[Turn], rng: np.random.Generator) -> str:
        """A random valid word with probability eps, else the solver's choice."""
        if rng.random() < self.eps:
            return self.words.words[int(rng.integers(len(self.words.words)))]
        return super().choose(game_turns, rng)


def make_player(name: str, words: WordList | None = None) -> Player:
    """The player called `name` (one of :data:`PLAYER_NAMES`)."""
    if name == "random":
        return RandomPlayer(words)
    if name == "solver":
        return SolverPlayer(words)
    if name.startswith("noisy_solver_"):
        try:
            return NoisySolver(float(name.removeprefix("noisy_solver_")), words)
        except ValueError:
            pass
    raise ValueError(f"player {name!r} is unknown; the players are {PLAYER_NAMES}")


def parse_mix(spec: str, words: WordList | None = None) -> list[tuple[Player, float]]:
    """Players and their normalised weights from ``"NAME:WEIGHT,NAME:WEIGHT,..."``."""
    mix: list[tuple[Player, float]] = []
    for piece in str(spec).split(","):
        name, sep, weight_text = piece.strip().rpartition(":")
        hint = f"; write NAME:WEIGHT pieces separated by commas; the players are {PLAYER_NAMES}"
        if not sep or not name:
            raise ValueError(f"mix {spec!r}: piece {piece!r} is not NAME:WEIGHT{hint}")
        try:
            player = make_player(name.strip(), words)
        except ValueError:
            raise ValueError(f"mix {spec!r}: piece {piece!r} names an unknown player{hint}") from None
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"mix {spec!r}: piece {piece!r} has weight {weight_text!r}, not a positive number{hint}")
        if any(p.name == player.name for p, _ in mix):
            raise ValueError(f"mix {spec!r}: piece {piece!r} names {player.name} a second time{hint}")
        mix.append((player, weight))
    total = sum(w for _, w in mix)
    return [(p, w / total) for p, w in mix]


@dataclass(frozen=True)
class GameRecord:
    """One finished game: what was guessed, what it was told, what it earned, and who played."""

    secret: str
    guesses: tuple[str, ...]
    feedbacks: tuple[str, ...]
    rewards: tuple[float, ...]
    player: str

    @property
    def total_return(self) -> float:
        """The sum of the rewards: -(wrong guesses)."""
        return float(sum(self.rewards))

    @property
    def solved(self) -> bool:
        """Whether the last guess was the secret."""
        return bool(self.feedbacks) and self.feedbacks[-1] == SOLVED

    @property
    def transcript(self) -> str:
        """The game as text, one line per turn."""
        return "".join(turn_text(g, f) for g, f in zip(self.guesses, self.feedbacks, strict=True))


def play_games(mix: Sequence[tuple[Player, float]], secrets: Sequence[str], words: WordList, n_games: int, seed: int,
               max_guesses: int = 6, progress: bool = False) -> list[GameRecord]:
    """Play `n_games` games, game i with a player of `mix` and a secret of `secrets` drawn by a generator seeded
    by (seed, i)."""
    if not mix:
        raise ValueError("mix: no players; give at least one (see parse_mix)")
    if not secrets:
        raise ValueError("secrets: empty; give at least one secret word")
    if isinstance(n_games, bool) or not isinstance(n_games, int) or n_games < 0:
        raise ValueError(f"n_games: {n_games!r} is not a whole number of games (0 or more)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: {seed!r} is not a non-negative whole number")
    bad = next((s for s in secrets if s not in words.valid), None)
    if bad is not None:
        raise ValueError(f"secrets: {bad!r} is not in the word list")
    players = [p.for_words(words) for p, _ in mix]
    weights = np.array([w for _, w in mix], np.float64)
    if not np.isfinite(weights).all() or (weights <= 0).any():
        raise ValueError(f"mix: weights {weights.tolist()} are not all positive")
    weights /= weights.sum()
    records = []
    for i in tqdm(range(n_games), unit="game", desc="wordle", file=sys.stderr, disable=not progress):
        rng = np.random.default_rng(np.random.SeedSequence([seed, i]))
        player = players[int(rng.choice(len(players), p=weights))]
        game = WordleGame(secrets[int(rng.integers(len(secrets)))], words, max_guesses)
        turns: list[Turn] = []
        while not game.done:
            turns.append(game.guess(player.choose(turns, rng)))
        records.append(GameRecord(game.secret, tuple(t.guess for t in turns), tuple(t.feedback for t in turns),
                                  tuple(t.reward for t in turns), player.name))
    return records


def _stats(returns: list[float], solved: list[bool], guesses: list[int]) -> dict[str, Any]:
    n = len(returns)
    if n == 0:
        return {"games": 0, "mean_return": None, "win_rate": None, "mean_guesses": None}
    return {"games": n, "mean_return": float(np.mean(returns)), "win_rate": float(np.mean(solved)),
            "mean_guesses": float(np.mean(guesses))}


def mix_report(records: Sequence[GameRecord]) -> dict[str, Any]:
    """Games, mean return, win rate and mean guesses: overall and per player (one pass over the games, so a file
    of many distinct players costs no more than one of few)."""
    per: dict[str, tuple[list[float], list[bool], list[int]]] = {}
    everyone: tuple[list[float], list[bool], list[int]] = ([], [], [])
    for r in records:
        values = (r.total_return, r.solved, len(r.guesses))
        for bucket in (everyone, per.setdefault(r.player, ([], [], []))):
            for column, v in zip(bucket, values, strict=True):
                column.append(v)
    return {"overall": _stats(*everyone), "players": {n: _stats(*per[n]) for n in sorted(per)}}
