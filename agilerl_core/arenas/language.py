"""The language arena: character-level GPT members learn to play Wordle from a fixed set of games (behaviour
cloning or ILQL) and are judged by greedy play on held-out secrets.

Built from the config, it resolves the word list, reads the games (a JSONL file, local or ``s3://``, checked line
by line and against ``dataset.sha256``) or plays them with the seeded players, checks that they were played on
this game's words and never on a held-out secret, and encodes them once as tensors: every bad input fails here,
before anything trains. Budgets count gradient steps; members share no experience.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from agilerl_core import progress
from agilerl_core.arenas.base import checked_space, torch_device
from agilerl_core.arenas.experience import OwnExperience
from agilerl_core.data.fetch import check_pin
from agilerl_core.errors import ConfigError, DatasetError
from agilerl_core.io.storage import s3_options
from agilerl_core.language.agent import LanguageAgent, act_greedy, train_group
from agilerl_core.language.games import games_for
from agilerl_core.language.players import GameRecord
from agilerl_core.language.tensors import LETTER_IDS, TURN_CHARS, game_tensors, sequence_length
from agilerl_core.language.wordle import BOS, CHARS, LENGTH, MAX_GUESSES, WordleGame, WordList, encode, word_list
from agilerl_core.networks.gpt import GPTBounds, GPTSpec
from agilerl_core.results import TrainResult


class LanguageArena(OwnExperience):
    """Members are language agents (:class:`~agilerl_core.language.agent.LanguageAgent`); training is
    the algorithm's phase on minibatches of games, fitness the mean return of greedy games on held-out secrets."""

    kind = "language"
    evaluation_notes = ("samples", "eval_metrics")  # sample games; win rate and mean guesses
    batch_scope = "training and evaluation: one vmapped forward of a group's GPTs"

    def __init__(self, cfg, algo_cls: type[LanguageAgent]) -> None:
        self.cfg = cfg
        self.algo_cls = algo_cls
        self.device = torch_device(cfg.device, cfg.tf32)
        torch.set_num_threads(cfg.torch_threads)
        self.space = checked_space(cfg, algo_cls)
        m = cfg.model
        self.arch_bounds = GPTBounds(m.min_layers, m.max_layers, m.min_heads, m.max_heads, m.min_mlp_hidden,
                                     m.max_mlp_hidden, m.mlp_step)
        env = cfg.env
        try:
            self.words: WordList = word_list(env.vocabulary, env.held_out)
        except ValueError as err:
            raise ConfigError(f"env.{err}") from None
        self.spec = GPTSpec(len(CHARS), sequence_length(env.max_guesses), m.n_layer, m.n_embd, m.n_head, m.head_dim,
                            m.mlp_hidden)
        GPTSpec.from_dict(self.spec.to_dict(), "model", ConfigError)  # sizes against the limits, before building
        games, sha, description = self._games(cfg)
        check_pin(cfg.dataset.label, sha, cfg.dataset.sha256)
        self.data_description = description
        kept = games if cfg.dataset.min_return is None else [g for g in games if g.total_return >= cfg.dataset.min_return]
        if not kept:
            raise DatasetError(f"dataset {cfg.dataset.label}: no game has a return of at least dataset.min_return "
                               f"{cfg.dataset.min_return} (the best is {max(g.total_return for g in games)}); lower it")
        self.games = kept
        self.data = game_tensors(kept, self.spec.block_size)
        held = self.words.held_out
        if cfg.eval_games is not None and cfg.eval_games > len(held):
            raise ConfigError(f"eval_games: {cfg.eval_games}, but this game holds out {len(held)} secrets; set "
                              f"eval_games: {len(held)} or fewer (null: all), or raise env.vocabulary or env.held_out")
        self.eval_secrets = held if cfg.eval_games is None else held[: cfg.eval_games]
        self.env_desc: dict[str, Any] = {
            "kind": "language", "game": env.game, "vocabulary": env.vocabulary, "held_out": env.held_out,
            "max_guesses": env.max_guesses, "words": self.words.source, "chars": "".join(CHARS[3:]),
            "eval_secrets": len(self.eval_secrets),
            "dataset": {"uri": cfg.dataset.label, "sha256": sha, "games": len(games), "learnt_from": len(kept)}}

    def _games(self, cfg) -> tuple[list[GameRecord], str, dict[str, Any]]:
        """The games (read or played), their content hash and their description."""
        env = cfg.env
        return games_for(cfg.dataset, self.words, env.vocabulary, env.held_out, env.max_guesses, s3_options(cfg),
                         getattr(cfg, "limits", None))

    # ---- members ---------------------------------------------------------------------------------------------
    def build_members(self, seeds: list[int]) -> list[LanguageAgent]:
        return [self.algo_cls.create(self.spec, self.cfg.hyperparameters, s) for s in seeds]

    def member_from_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> LanguageAgent:
        agent = self.algo_cls.from_state(tensors, meta)
        if agent.spec.vocab_size != self.spec.vocab_size or agent.spec.block_size != self.spec.block_size:
            raise DatasetError(f"this member reads {agent.spec.vocab_size} characters over {agent.spec.block_size} "
                               f"positions; this game needs {self.spec.vocab_size} over {self.spec.block_size} "
                               f"(env.max_guesses differs)")
        return agent

    # ---- a generation --------------------------------------------------------------------------------------
    def batch_key(self, member: LanguageAgent):
        return member.batch_key()

    def train_group(self, members: list[LanguageAgent], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        """`steps` gradient steps of every member on minibatches of the games (one batched step each)."""
        t0 = time.perf_counter()
        phases = train_group(members, self.data, steps, seeds, on_step=lambda: progress.advance(len(members)))
        wall = time.perf_counter() - t0
        return [TrainResult(slot, steps, steps, 0, float("nan"), phase["loss"], wall, phase)
                for slot, phase in zip(slots, phases, strict=True)]

    def evaluate_group(self, members: list[LanguageAgent], seed: int, slots: list[int]) -> list[float]:
        """Every member's mean return over the held-out secrets, played greedily (the group's forwards shared)."""
        games = play_greedy(members, self.eval_secrets, self.words, self.cfg.env.max_guesses)
        fitness = []
        for member, played in zip(members, games, strict=True):
            returns = [g.total_return for g in played]
            member.eval_metrics = {"win_rate": sum(g.solved for g in played) / len(played),
                                   "mean_guesses": sum(len(g.guesses) for g in played) / len(played),
                                   "invalid_guesses": sum(f == "!" * LENGTH for g in played for f in g.feedbacks)
                                   / max(sum(len(g.guesses) for g in played), 1)}
            member.samples = [{"secret": g.secret, "game": g.transcript, "return": g.total_return}
                              for g in played[: self.cfg.sample_games]]
            fitness.append(sum(returns) / len(returns))
        return fitness

    def evaluate(self, member: LanguageAgent, seed: int, slot: int | None = None) -> float:
        return self.evaluate_group([member], seed, [0 if slot is None else slot])[0]


def load_language_member(path: str) -> tuple[LanguageAgent, dict[str, Any]]:
    """A saved language agent (e.g. a run's elite) and its env description: the algorithm is looked up by name
    in the fixed registry (a language algorithm, or the checkpoint is refused), the architecture checked against
    the limits before anything is built. What the registered champion loads."""
    from agilerl_core.algorithms.registry import ALGORITHMS, get_algorithm
    from agilerl_core.errors import CheckpointError
    from agilerl_core.io.checkpoint import load_member

    def rebuild(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> LanguageAgent:
        name = meta.get("algorithm")
        if not isinstance(name, str) or "language" not in getattr(ALGORITHMS.get(name), "arenas", {}):
            raise CheckpointError(f"{path}/member.json: field agent.algorithm {name!r} is not a language algorithm")
        return get_algorithm(name).from_state(tensors, meta)

    member, env = load_member(path, rebuild=rebuild)
    agent, guesses = member.agent, env.get("max_guesses")
    if agent.spec.vocab_size != len(CHARS) or isinstance(guesses, bool) or not isinstance(guesses, int) or \
            not 1 <= guesses <= MAX_GUESSES or agent.spec.block_size != sequence_length(guesses):
        raise CheckpointError(f"{path}/member.json: the member reads {agent.spec.vocab_size} characters over "
                              f"{agent.spec.block_size} positions, which is not a Wordle game of this version "
                              f"({len(CHARS)} characters; field env.max_guesses {guesses!r})")
    return agent, env


def next_guesses(member: LanguageAgent, transcripts: list[str]) -> list[str]:
    """The member's greedy next guess after each transcript (whole turns ``guess feedback\n``, possibly none);
    a ValueError names a transcript that is not whole turns of the game's characters or is too long."""
    rows = []
    for i, text in enumerate(transcripts):
        if not isinstance(text, str) or len(text) % TURN_CHARS:
            raise ValueError(f"transcripts[{i}]: not whole turns of {TURN_CHARS} characters ('crane -G-Y-\\n')")
        ids = [BOS, *encode(text)]
        if len(ids) + LENGTH > member.spec.block_size:
            raise ValueError(f"transcripts[{i}]: {len(text) // TURN_CHARS} turns leave no room for another guess "
                             f"in the model's {member.spec.block_size} positions")
        rows.append(ids)
    out = []
    letters = torch.tensor(LETTER_IDS)
    for length in sorted({len(r) for r in rows}):  # one batch per transcript length (no padding needed)
        which = [i for i, r in enumerate(rows) if len(r) == length]
        ids = torch.tensor([rows[i] for i in which]).unsqueeze(0)
        for _ in range(LENGTH):
            ids = torch.cat([ids, letters[act_greedy([member], ids)].unsqueeze(-1)], dim=-1)
        out += [(i, "".join(CHARS[c] for c in row[-LENGTH:])) for i, row in zip(which, ids[0].tolist(), strict=True)]
    return [w for _, w in sorted(out)]


def play_greedy(members: list[LanguageAgent], secrets: tuple[str, ...], words: WordList, max_guesses: int
                ) -> list[list[GameRecord]]:
    """Each member's greedy games against every secret: a guess is five letters, each the member's best
    (``policy_logits``) given the transcript so far; the env's feedback is appended after the fifth. Every game
    of a turn has the same length, so a group's games advance as one [K, G, T] batch."""
    k, n = len(members), len(secrets)
    games = [[WordleGame(s, words, max_guesses) for s in secrets] for _ in range(k)]
    ids = torch.full((k, n, 1), BOS, dtype=torch.long)
    letters = torch.tensor(LETTER_IDS)
    for _ in range(max_guesses):
        if all(g.done for row in games for g in row):
            break
        for _ in range(LENGTH):
            ids = torch.cat([ids, letters[act_greedy(members, ids)].unsqueeze(-1)], dim=-1)
        guesses = ids[:, :, -LENGTH:].tolist()
        tails = []
        for row, row_ids in zip(games, guesses, strict=True):
            for game, gid in zip(row, row_ids, strict=True):
                word = "".join(CHARS[i] for i in gid)
                marks = game.guess(word).feedback if not game.done else "-" * LENGTH  # a finished game idles
                tails.append(encode(f" {marks}\n"))
        ids = torch.cat([ids, torch.tensor(tails).view(k, n, TURN_CHARS - LENGTH)], dim=-1)
    return [[GameRecord(g.secret, tuple(t.guess for t in g.turns), tuple(t.feedback for t in g.turns),
                        tuple(t.reward for t in g.turns), m.algorithm_name) for g in row]
            for m, row in zip(members, games, strict=True)]
