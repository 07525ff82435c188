"""Multi-turn games for LLM members (GRPO, REINFORCE, GSPO, CISPO, LLM-PPO): a LoRA-adapted language model plays whole games of
Wordle, one completion per turn, the env's feedback appended to its context after each guess.

A game's sequence is its instruction prompt followed by the turns: the member's completion (its own tokens, up
to ``max_new_tokens``), then the env's answer `` -> FEEDBACK\\n`` (the env's tokens). The policy's loss, ratio and
KL weigh only the member's own tokens; the env's tokens are context (attended to, never a target). A game's
return (-1 per wrong guess, 0 for the solving one) is its reward for GRPO and REINFORCE; LLM-PPO places each
turn's reward on the turn's last token and runs its token-level GAE over the member's tokens across turns, the
env's tokens skipped.

Shaping (``dataset.options.shaping``, a weight w in [0, 1)): while training, each guess also earns w times its
marks' score (greens + yellows / 2) / 5 (0 for an invalid guess), so games that never win still rank (a valid
word, letters in place); a wrong guess still costs more than its bonus can earn, so winning sooner stays best.
Fitness is always the plain return.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from agilerl_core.language.wordle import WordleGame, WordList, marks_score
from agilerl_core.llm.algorithm import LLMAlgorithm
from agilerl_core.llm.grpo import GroupRollout
from agilerl_core.llm.learning import chunks, row_pieces, token_gae
from agilerl_core.llm.sampling import RowBlock, pad_prompts, sample

INSTRUCTION = ("Let us play Wordle. Guess the secret five-letter English word in at most {n} guesses. Answer each "
               "turn with one lowercase five-letter word. After each guess you are told, letter by letter: G for the "
               "right letter in the right place, Y for a letter of the word in another place, - for a letter not in "
               "the word; !!!!! means the guess is not a word of the list.")
_GUESS = re.compile(r"\b[a-z]{5}\b")


def parse_guess(text: str) -> str:
    """The guess in a completion: its first five-letter word (the stripped text when there is none, which the
    game then penalises as invalid)."""
    m = _GUESS.search(text.lower())
    return m.group(0) if m else text.strip()[:20]


def env_text(feedback: str) -> str:
    """What the env appends after a guess."""
    return f" -> {feedback}\n"


@dataclass
class GameData:
    """Secrets to play, each with the instruction prompt's token ids, and the game's rules."""

    ids: list[list[int]]
    prompts: list[str]
    answers: list[str]  # the secrets
    words: WordList
    max_guesses: int
    encode: Callable[[str], list[int]]  # the env's text as token ids (no special tokens)
    shaping: float = 0.0  # training only: each guess also earns shaping * marks_score(its feedback)
    _env_ids: dict[str, list[int]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    def rollout(self, model, members: list, batches: list[list[int]], rewards, generators: list[torch.Generator]
                ) -> GameRollout:
        """One learn step's games (see :class:`GameRollout`); `rewards` is unused: a game scores itself."""
        return GameRollout(model, members, batches, self, rewards, generators)

    def score_many(self, members: Sequence, rewards, n_samples: int) -> list[float]:
        """Each member's fitness: its mean return over greedy games (:func:`evaluate_games`)."""
        return evaluate_games(members, self, n_samples)

    def env_ids(self, feedback: str) -> list[int]:
        """The token ids of the env's answer `feedback` (cached: there are few)."""
        if feedback not in self._env_ids:
            self._env_ids[feedback] = self.encode(env_text(feedback))
        return self._env_ids[feedback]

    def longest_game(self, max_new_tokens: int) -> int:
        """Tokens a whole game can take: the prompt, and every turn's completion and answer."""
        answer = max(len(env_text("G-Y!-")), *(len(self.env_ids(f)) for f in ("GGGGG", "!!!!!", "-----", "G-Y-G")))
        return max(len(x) for x in self.ids) + self.max_guesses * (max_new_tokens + answer + 2)


@dataclass
class PlayedGames:
    """A batch of played games: each row's continuation after its prompt (the member's and the env's tokens, in
    order), which tokens are the member's, where each turn ended, and the games."""

    tokens: list[list[int]]
    own: list[list[bool]]
    turn_ends: list[list[tuple[int, float]]]  # per row: (index in its continuation of the turn's last token, reward)
    games: list[WordleGame]


def play(model, base, prompts: list[list[int]], secrets: list[str], data: GameData, max_new_tokens: int,
         member_rows: list[tuple], batch_size: int) -> PlayedGames:
    """Play one game per row: `member_rows` gives, per member in order, (its number of rows, temperature,
    generator) or (..., its logit adjustment: :attr:`~agilerl_core.llm.sampling.RowBlock.adjust`); the rows are
    consecutive per member. Every turn, each member's live rows are sampled in chunks of
    `batch_size`, the j-th chunk of every member in one batch (each row through its member's adapter, each
    member drawing from its own generator as if it played alone)."""
    n = len(prompts)
    games = [WordleGame(s, data.words, data.max_guesses) for s in secrets]
    tokens: list[list[int]] = [[] for _ in range(n)]
    own: list[list[bool]] = [[] for _ in range(n)]
    ends: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    starts = np.cumsum([0] + [row[0] for row in member_rows])
    for _ in range(data.max_guesses):
        live = [[r for r in range(starts[m], starts[m + 1]) if not games[r].done] for m in range(len(member_rows))]
        if not any(live):
            break
        cuts = [[rows[s] for s in chunks(len(rows), batch_size)] for rows in live]
        for j in range(max(len(c) for c in cuts)):
            who = [m for m in range(len(member_rows)) if j < len(cuts[m])]
            order = [r for m in who for r in cuts[m][j]]
            ids, mask = pad_prompts([prompts[r] + tokens[r] for r in order], base.pad_id, base.device)
            blocks, start = [], 0
            for m in who:
                count = len(cuts[m][j])
                blocks.append(RowBlock(slice(start, start + count), *member_rows[m][1:]))
                start += count
            comp, cmask = sample(model, ids, mask, max_new_tokens, 0.0, base.eos_id, base.pad_id,
                                 rows=[(m, len(cuts[m][j])) for m in who], blocks=blocks)
            texts = base.decode(comp, cmask)
            for row, c, cm, text in zip(order, comp.tolist(), cmask.tolist(), texts, strict=True):
                mine = [t for t, keep in zip(c, cm, strict=True) if keep]
                turn = games[row].guess(parse_guess(text))
                tokens[row] += mine
                own[row] += [True] * len(mine)
                ends[row].append((len(tokens[row]) - 1, turn.reward + data.shaping * marks_score(turn.feedback)))
                answer = data.env_ids(turn.feedback)
                tokens[row] += answer
                own[row] += [False] * len(answer)
    return PlayedGames(tokens, own, ends, games)


class GameRollout(GroupRollout):
    """One learn step's games for a group of members, each on its own batch of secrets (``group_size`` games per
    secret): what :class:`~agilerl_core.llm.grpo.GroupRollout` holds for single completions, with the
    continuations (member's and env's tokens, attended) as completions, the member's tokens as the loss mask
    (:attr:`fmask`) and the games' returns (shaped, when :attr:`GameData.shaping` says so) as rewards."""

    def __init__(self, model, members: list, batches: list[list[int]], data: GameData, rewards,
                 generators: list[torch.Generator]) -> None:
        first = members[0]
        base = first.base
        hps = [m.hp for m in members]
        if any(m.base is not base or h.max_new_tokens != hps[0].max_new_tokens for m, h in zip(members, hps, strict=True)):
            raise ValueError("learn_group: members must share the base and max_new_tokens")
        self.model, self.members, self.base, self.hps = model, members, base, hps
        rows = [[p for p in idx for _ in range(h.group_size)] for idx, h in zip(batches, hps, strict=True)]
        flat = [p for r in rows for p in r]
        played = play(model, base, [data.ids[p] for p in flat], [data.answers[p] for p in flat], data,
                      hps[0].max_new_tokens, [(len(r), h.temperature, g) for r, h, g in zip(rows, hps, generators,
                                                                                           strict=True)],
                      hps[0].generation_batch_size)
        width = max(len(data.ids[p]) for p in flat)
        self.prompts = [pad_prompts([data.ids[p] for p in r], base.pad_id, base.device, width) for r in rows]
        self.comps, self.fmask, self.rewards, self.turn_ends, self.games = [], [], [], [], []
        start = 0
        for r in rows:
            span = range(start, start + len(r))
            start += len(r)
            width = max(len(played.tokens[x]) for x in span)
            ids = torch.full((len(r), width), base.pad_id, dtype=torch.long)
            attn = torch.zeros((len(r), width), dtype=torch.long)
            own = torch.zeros((len(r), width))
            for n, x in enumerate(span):
                length = len(played.tokens[x])
                ids[n, :length] = torch.tensor(played.tokens[x])
                attn[n, :length] = 1
                own[n, :length] = torch.tensor(played.own[x], dtype=torch.float32)
            self.comps.append((ids.to(base.device), attn.to(base.device)))
            self.fmask.append(own.to(base.device))
            self.rewards.append(np.array([sum(r for _, r in played.turn_ends[x]) for x in span], dtype=np.float64))
            self.turn_ends.append([played.turn_ends[x] for x in span])
            self.games.append([played.games[x] for x in span])
        self.ntok = [f.sum().clamp(min=1) for f in self.fmask]
        self.parts = LLMAlgorithm.group_parts(members, row_pieces([len(x) for x in rows], hps[0].micro_batch_size))

    def place_rewards(self, i: int, token_rewards: torch.Tensor) -> torch.Tensor:
        """Each turn's reward added on the turn's last token of member i's rows."""
        for row, ends in enumerate(self.turn_ends[i]):
            for pos, reward in ends:
                token_rewards[row, pos] += reward
        return token_rewards

    def gae(self, i: int, token_rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-level GAE over member i's own tokens across turns (the env's tokens skipped)."""
        return compacted_gae(token_rewards, values, self.fmask[i], gamma, lam)


def compacted_gae(token_rewards: torch.Tensor, values: torch.Tensor, own: torch.Tensor, gamma: float, lam: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~agilerl_core.llm.learning.token_gae` over the tokens `own` marks [n, T] (the member's), in
    order, as if the others were not there; zeros elsewhere."""
    order = torch.sort((~own.bool()).long(), dim=1, stable=True).indices  # own tokens first, in order
    mask = own.gather(1, order)
    adv, ret = token_gae(token_rewards.gather(1, order) * mask, values.gather(1, order) * mask, mask, gamma, lam)
    return (torch.zeros_like(adv).scatter(1, order, adv * mask), torch.zeros_like(ret).scatter(1, order, ret * mask))


@torch.no_grad()
def evaluate_games(members: Sequence, data: GameData, n_samples: int = 0) -> list[float]:
    """Each member's mean return over greedy games against every secret of `data` (the group's rows in shared
    batches); keeps each member's first `n_samples` games as its :attr:`samples` and their win rate and mean
    guesses as its :attr:`eval_metrics`."""
    first = members[0]
    base, hp = first.base, first.hp
    n = len(data)
    with base.bound_many([m.adapter for m in members]) as model:
        played = play(model, base, [data.ids[p] for _ in members for p in range(n)], list(data.answers) * len(members),
                      data, hp.max_new_tokens, [(n, 0.0, None, m.logit_adjust()) for m in members],
                      hp.generation_batch_size)
    out = []
    for i, m in enumerate(members):
        games = played.games[i * n:(i + 1) * n]
        m.samples = [{"prompt": g.secret, "completion": g.transcript, "answer": g.secret, "reward": g.total_return}
                     for g in games[:n_samples]]
        m.eval_metrics = {"win_rate": float(np.mean([g.solved for g in games])),
                          "mean_guesses": float(np.mean([len(g.turns) for g in games]))}
        out.append(float(np.mean([g.total_return for g in games])))
    return out
