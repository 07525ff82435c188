"""Games as the tensors a character-level language agent learns from.

A game's sequence is ``<bos>`` followed by its transcript's characters: every turn is ``guess feedback\\n``
(12 characters), so turn j's guess letters sit at sequence positions 12j+1 .. 12j+5. The model's hidden state at
position t predicts the character at t+1, so the *state* of the action "write the letter at p" is position
p-1. Per state position the tensors hold: whether the next character is an action (one of the guess's
letters: the env's feedback is context, never a target), that character, the reward the action earns (the
turn's reward on the guess's last letter, 0 on the others), the position of the next action's state (the
next letter, or the next guess's first letter once the env has answered) and whether the game ends after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from agilerl_core.language.wordle import BOS, CHARS, LENGTH, PAD, encode

TURN_CHARS = LENGTH + 1 + LENGTH + 1  # "guess feedback\n"
TENSOR_BYTES = 8 + 1 + 8 + 4 + 8 + 1  # per position: ids, act, action, reward, next_state, done
LETTER_IDS = tuple(CHARS.index(c) for c in "abcdefghijklmnopqrstuvwxyz")  # the actions, in order


def sequence_length(max_guesses: int) -> int:
    """Positions a whole game of `max_guesses` turns takes (the model's context must hold them)."""
    return 1 + TURN_CHARS * max_guesses


class GameTensors(NamedTuple):
    """N games, right-padded to T positions (all [N, T])."""

    ids: torch.Tensor  # long: <bos> + the transcript's characters, then <pad>
    act: torch.Tensor  # bool: the character at t+1 is an action (a guess letter)
    action: torch.Tensor  # long: that letter's index in LETTER_IDS (0 where act is False)
    reward: torch.Tensor  # float: the reward of the action taken from state t
    next_state: torch.Tensor  # long: the next action's state position (t itself where the game ends)
    done: torch.Tensor  # bool: the game ends after the action taken from state t

    def rows(self, index: torch.Tensor) -> GameTensors:
        """The games at `index` (any leading shape: [K, B] for K members' batches)."""
        return GameTensors(*(t[index] for t in self))


def game_tensors(games: Sequence, length: int) -> GameTensors:
    """The tensors of `games` (records with ``guesses`` and ``rewards``, e.g. :class:`GameRecord`), every
    sequence padded to `length` positions (ValueError naming the game when one does not fit)."""
    n = len(games)
    from agilerl_core.errors import DatasetError
    from agilerl_core.limits import check

    check("dataset_bytes", n * length * TENSOR_BYTES, f"the tensors of {n:,} games of {length} positions",
          DatasetError)
    ids = torch.full((n, length), PAD, dtype=torch.long)
    act = torch.zeros((n, length), dtype=torch.bool)
    action = torch.zeros((n, length), dtype=torch.long)
    reward = torch.zeros((n, length), dtype=torch.float32)
    next_state = torch.arange(length).repeat(n, 1)
    done = torch.zeros((n, length), dtype=torch.bool)
    for i, game in enumerate(games):
        seq = [BOS, *encode(game_text(game))]
        if len(seq) > length:
            raise ValueError(f"game {i}: its {len(game.guesses)} turns take {len(seq)} positions, more than the "
                             f"model's {length}")
        ids[i, : len(seq)] = torch.tensor(seq)
        turns = len(game.guesses)
        for j, r in enumerate(game.rewards):
            start = TURN_CHARS * j  # the state before the guess's first letter
            for k in range(LENGTH):
                t = start + k
                act[i, t] = True
                action[i, t] = seq[t + 1] - LETTER_IDS[0]
                if k < LENGTH - 1:
                    next_state[i, t] = t + 1
                elif j + 1 < turns:
                    next_state[i, t] = start + TURN_CHARS
                    reward[i, t] = float(r)
                else:
                    reward[i, t] = float(r)
                    done[i, t] = True
    if bool((action[act] < 0).any()) or bool((action[act] >= len(LETTER_IDS)).any()):
        raise ValueError("a guess holds a character that is not a letter a-z")
    return GameTensors(ids, act, action, reward, next_state, done)


def game_text(game) -> str:
    """A game's transcript text (``guess feedback\\n`` per turn)."""
    return "".join(f"{g} {f}\n" for g, f in zip(game.guesses, game.feedbacks, strict=True))
