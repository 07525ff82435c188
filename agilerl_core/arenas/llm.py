"""The LLM arena: a population of LoRA adapters on one frozen base model, trained with GRPO (prompts with
verifiable rewards) or DPO (preference pairs), judged on held-out records.

Built from the config, it loads the base once (checked against ``model.sha256``), reads the prompt or
preference set (local or ``s3://``, checked against ``dataset.sha256``), tokenises it once (through the chat
template when the tokenizer has one), splits off the held-out records by the seed and builds the reward
functions: every bad input fails here, before anything trains. Members share the base and no experience.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import torch

from agilerl_core.arenas.base import checked_space, torch_device
from agilerl_core.arenas.experience import OwnExperience
from agilerl_core.arenas.llm_data_parallel import train_data_parallel
from agilerl_core.data.fetch import check_pin
from agilerl_core.data.prompts import TextRecords, load_text_records, split_indices
from agilerl_core.data.reasoning import generate
from agilerl_core.errors import CheckpointError, ConfigError, DatasetError
from agilerl_core.io.storage import s3_options
from agilerl_core.llm.adapter import LoraAdapter
from agilerl_core.llm.algorithm import LLMAlgorithm, RankBounds
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.rewards import Rewards
from agilerl_core.results import TrainResult


def load_llm_member(path: str, device: str = "cpu") -> tuple[LLMAlgorithm, dict[str, Any]]:
    """A saved LLM member (e.g. a run's elite) with its base model rebuilt from what the checkpoint records
    (path or config, tokens, LoRA targets) and checked against the recorded SHA-256: (member, env
    description). What the registered champion loads."""
    from agilerl_core.algorithms.registry import get_algorithm
    from agilerl_core.config import LLMModelConfig, LoraSettings
    from agilerl_core.io.checkpoint import load_member

    def rebuild(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> LLMAlgorithm:
        try:
            return _rebuild(tensors, meta)
        except ConfigError as err:  # the recorded base is data: files read, nothing imported or run
            raise CheckpointError(f"{path}/member.json: field agent.base does not name a loadable base ({err})") \
                from None

    def _rebuild(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> LLMAlgorithm:
        rec = meta["base"]
        fields = {k: rec.get(k) for k in ("path", "gguf_file", "config", "tokenizer_chars", "eos_token", "pad_token")}
        spec = LLMModelConfig(**{k: v for k, v in fields.items() if v is not None}, sha256=rec["sha256"],
                              init_seed=rec.get("init_seed", 0),
                              lora=LoraSettings(targets=rec.get("targets"), rank=1, min_rank=1))
        return get_algorithm(meta["algorithm"]).from_state(SharedBase.load(spec, device, "agent.base"), tensors, meta)

    member, env = load_member(path, rebuild=rebuild)
    return member.agent, env


class LLMArena(OwnExperience):
    """Members are LoRA adapters; training is the algorithm's phase on the train split, fitness its held-out
    score (GRPO: mean reward of greedy completions; DPO: preference accuracy)."""

    kind = "llm"
    evaluation_notes = ("samples", "eval_metrics")  # held-out completions (first few); games' win rate, guesses
    batch_scope = "training and evaluation: a group's rows through one forward of the base, one adapter per row"

    def __init__(self, cfg, algo_cls: type[LLMAlgorithm]) -> None:
        self.cfg = cfg
        self.algo_cls = algo_cls
        self.device = torch_device(cfg.device, cfg.tf32)
        torch.set_num_threads(cfg.torch_threads)
        self.space = checked_space(cfg, algo_cls)
        lora = cfg.model.lora
        self.arch_bounds = RankBounds(lora.min_rank, lora.max_rank)
        if cfg.dataset.source == "wordle":
            self._init_games(cfg)
        else:
            self._init_records(cfg, algo_cls)
        self.seed_adapter = self._seed_adapter(cfg)
        # the base and prompt set it read, named in the run's record (a game set pins itself through its words)
        dataset = getattr(self, "dataset", None)
        self.cfg = cfg.pinned(dataset=None if dataset is None else dataset.sha256, model=self.base.sha256)

    def _init_records(self, cfg, algo_cls: type[LLMAlgorithm]) -> None:
        self.dataset = self._load_records(cfg)
        self.rewards = Rewards(cfg.rewards, self.dataset.entries) if algo_cls.data_kind == "prompts" else None
        if self.rewards is not None and self.rewards.needs_answers and self.dataset.answers is None:
            raise DatasetError(f"dataset {cfg.dataset.label}: the exact_answer reward needs answers, but no record has "
                               f"an {cfg.dataset.answer_field!r} field; set dataset.answer_field, or use regex/python "
                               f"rewards")
        self.base = SharedBase.load(cfg.model, self.device)
        template = cfg.model.chat_template
        self.chat_template = template == "on" or (template == "auto" and bool(self.base.tokenizer.chat_template))
        if template == "on" and not self.base.tokenizer.chat_template:
            raise DatasetError("model.chat_template: on, but the tokenizer has no chat template; set auto or off")
        train_idx, held_idx = split_indices(len(self.dataset), cfg.dataset.held_out, cfg.seed)
        if cfg.eval_prompts is not None:
            held_idx = held_idx[: cfg.eval_prompts]
        self.train_data = algo_cls.prepare(self.base, self.dataset.subset(train_idx), self.chat_template)
        self.eval_data = algo_cls.prepare(self.base, self.dataset.subset(held_idx), self.chat_template)
        self._check_context(cfg)
        self.env_desc: dict[str, Any] = {"kind": "llm", "base": self.base.describe(),
                                         "chat_template": self.chat_template,
                                         "dataset": {"uri": self.dataset.uri, "sha256": self.dataset.sha256}}
        if cfg.dataset.source == "reasoning_gym":  # what was generated, beside its hash
            from importlib.metadata import version

            self.env_desc["dataset"].update(task=cfg.dataset.task, size=cfg.dataset.size, seed=cfg.dataset.seed,
                                            options=dict(cfg.dataset.options), reasoning_gym=version("reasoning_gym"))

    def _init_games(self, cfg) -> None:
        """Games of Wordle as the data: the training secrets to play (``group_size`` games each per learn step), the
        held-out ones (the first ``eval_prompts``) to judge greedy play on; the words and prompt pinned by hash."""
        from agilerl_core.language.wordle import word_list
        from agilerl_core.llm.games import INSTRUCTION, GameData

        ds, opts = cfg.dataset, cfg.dataset.options
        max_guesses = opts.get("max_guesses", 6)
        if isinstance(max_guesses, bool) or not isinstance(max_guesses, int) or not 1 <= max_guesses <= 20:
            raise ConfigError(f"dataset.options.max_guesses: {max_guesses!r} is not a whole number from 1 to 20")
        shaping = opts.get("shaping", 0.0)
        if isinstance(shaping, bool) or not isinstance(shaping, int | float) or not 0 <= shaping < 1:
            raise ConfigError(f"dataset.options.shaping: {shaping!r} is not a weight in [0, 1) (each guess earns "
                              f"shaping x its marks' score while training; below 1 a wrong guess still costs more "
                              f"than it earns)")
        try:
            words = word_list(opts.get("vocabulary"), ds.held_out)
        except ValueError as err:
            raise ConfigError(f"dataset.options.{err}") from None
        self.rewards = None  # a game scores itself
        self.base = SharedBase.load(cfg.model, self.device)
        template = cfg.model.chat_template
        self.chat_template = template == "on" or (template == "auto" and bool(self.base.tokenizer.chat_template))
        prompt = INSTRUCTION.format(n=max_guesses)
        ids = self.base.encode([prompt], self.chat_template)[0]

        def encode(text: str) -> list[int]:
            return self.base.encode([text], False)[0]

        held = words.held_out[: cfg.eval_prompts] if cfg.eval_prompts is not None else words.held_out
        self.train_data = GameData([ids] * len(words.train), [prompt] * len(words.train), list(words.train), words,
                                   max_guesses, encode, float(shaping))
        self.eval_data = GameData([ids] * len(held), [prompt] * len(held), list(held), words, max_guesses, encode)
        pinned = {"words": words.words, "held_out": words.held_out, "prompt": prompt, "max_guesses": max_guesses}
        recorded = None
        if self.algo_cls.data_kind == "games":  # offline: the recorded games are the training data
            recorded = self._recorded_games(cfg, words, max_guesses, ids)
            pinned["games"] = {"sha256": recorded["sha256"], "min_return": recorded["min_return"]}
        digest = hashlib.sha256(json_bytes(pinned)).hexdigest()
        check_pin(ds.label, digest, ds.sha256)
        longest = self.eval_data.longest_game(getattr(cfg.hyperparameters, "max_new_tokens", 0))
        if recorded is not None:
            longest = max(longest, self.train_data.longest())
        context = getattr(self.base.model.config, "max_position_embeddings", None)
        if context is not None and longest > context:
            raise DatasetError(f"dataset {ds.label}: a whole game can take {longest} tokens (the prompt, and "
                               f"{max_guesses} turns of hyperparameters.max_new_tokens and the feedback), more than "
                               f"the model's context of {context} positions; use fewer tokens or guesses")
        self.env_desc = {"kind": "llm", "base": self.base.describe(), "chat_template": self.chat_template,
                         "dataset": {"uri": ds.label, "sha256": digest, "game": "wordle", "words": words.source,
                                     "vocabulary": opts.get("vocabulary"), "held_out": ds.held_out,
                                     "max_guesses": max_guesses, "shaping": float(shaping)}}
        if recorded is not None:
            self.env_desc["dataset"]["games"] = recorded

    def _recorded_games(self, cfg, words, max_guesses: int, prompt_ids: list[int]) -> dict[str, Any]:
        """Offline algorithms: the recorded games (read or played by the seeded players, checked against this
        game; only those with at least ``dataset.games.min_return`` kept) as token sequences, which replace the
        training secrets as :attr:`train_data`; returns their description."""
        from agilerl_core.config import GameDatasetConfig
        from agilerl_core.language.games import games_for
        from agilerl_core.llm.ilql import GameTranscripts

        ds = cfg.dataset
        games_cfg = ds.games or GameDatasetConfig()
        records, sha, _ = games_for(games_cfg, words, ds.options.get("vocabulary"), ds.held_out, max_guesses,
                                    s3_options(cfg), getattr(cfg, "limits", None),
                                    {"vocabulary": "dataset.options.vocabulary", "held_out": "dataset.held_out",
                                     "max_guesses": "dataset.options.max_guesses"}, "dataset.games.")
        check_pin(f"dataset.games {games_cfg.label}", sha, games_cfg.sha256)
        floor = games_cfg.min_return
        kept = records if floor is None else [g for g in records if g.total_return >= floor]
        if not kept:
            raise DatasetError(f"dataset.games {games_cfg.label}: no game has a return of at least "
                               f"dataset.games.min_return {floor} (the best is "
                               f"{max(g.total_return for g in records)}); lower it")
        tok, eos = self.base.tokenizer, self.base.eos_id
        self.train_data = GameTranscripts.of_games(kept, prompt_ids, self.train_data,
                                                   lambda w: [*tok.encode(w, add_special_tokens=False), eos],
                                                   self.base.pad_id)
        return {"uri": games_cfg.label, "sha256": sha, "games": len(records), "min_return": floor,
                "learnt_from": len(kept)}

    def _check_context(self, cfg) -> None:
        """A DatasetError when the longest prompt plus ``max_new_tokens`` outruns the model's context (an index
        error deep in its position embeddings otherwise)."""
        context = getattr(self.base.model.config, "max_position_embeddings", None)
        new = getattr(cfg.hyperparameters, "max_new_tokens", 0)
        ids = [*getattr(self.train_data, "ids", []), *getattr(self.eval_data, "ids", [])]
        if context is not None and hasattr(self.train_data, "longest"):  # demonstrations: prompt and response
            longest = max(self.train_data.longest(), self.eval_data.longest())
            if longest > context:
                raise DatasetError(f"dataset {cfg.dataset.label}: its longest demonstration (prompt and response) is "
                                   f"{longest} tokens, more than the model's context of {context} positions; "
                                   f"shorten or drop it")
            ids = list(self.eval_data.prompt_ids)  # greedy answers are generated after these
        if context is None or not ids:
            return
        longest = max(len(x) for x in ids)
        if longest + new > context:
            raise DatasetError(f"dataset {cfg.dataset.label}: its longest prompt is {longest} tokens, and with "
                               f"hyperparameters.max_new_tokens {new} that outruns the model's context of {context} "
                               f"positions; use shorter prompts, fewer new tokens or a model with a longer context")

    def _load_records(self, cfg) -> TextRecords:
        ds = cfg.dataset
        fields = {"prompt": ds.prompt_field, "answer": ds.answer_field, "chosen": ds.chosen_field,
                  "rejected": ds.rejected_field, "response": ds.response_field}
        need = {"preferences": ("prompt", "chosen", "rejected"),
                "demonstrations": ("prompt", "response")}.get(self.algo_cls.data_kind, ("prompt",))
        if ds.source == "reasoning_gym":
            if self.algo_cls.data_kind != "prompts":
                raise ConfigError(f"dataset.source: reasoning_gym generates prompts with answers, not the preference "
                                  f"pairs {cfg.algorithm} learns from; use a file of pairs")
            records = generate(ds.task, ds.size, ds.seed, ds.options)
        else:
            records = load_text_records(ds.uri, fields, need, s3_options(cfg), ds.cache_dir)
        check_pin(ds.label, records.sha256, ds.sha256)
        return records

    def _seed_adapter(self, cfg) -> LoraAdapter | None:
        """The adapter of the member saved at ``model.init_adapter`` (None without one), read as data: its
        algorithm must be an LLM algorithm of the registry, its base this run's (by SHA-256), its adapter's
        modules the base's targets and its rank within ``model.lora``'s bounds; any other is a ConfigError
        naming the field, before anything trains."""
        path = cfg.model.init_adapter
        if path is None:
            return None
        from agilerl_core.algorithms.registry import algorithms_for_kind, get_algorithm
        from agilerl_core.io.checkpoint import load_member

        where = f"model.init_adapter {path!r}"

        def rebuild(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> LLMAlgorithm:
            name, base = meta.get("algorithm"), meta.get("base")
            if name not in algorithms_for_kind("llm"):
                raise ConfigError(f"{where}: not an LLM member (its algorithm is {name!r}); point it at a saved LLM "
                                  f"member's folder, e.g. an earlier run's elite")
            sha = base.get("sha256") if isinstance(base, dict) else None
            if sha != self.base.sha256:
                raise ConfigError(f"{where}: trained on another base model (weights SHA-256 {sha}, this run's is "
                                  f"{self.base.sha256}); every stage must adapt the same base")
            return get_algorithm(name).from_state(self.base, tensors, meta)

        try:
            member, _ = load_member(path, rebuild=rebuild)
        except CheckpointError as err:
            raise ConfigError(f"{where}: {err}") from None
        except FileNotFoundError:
            raise ConfigError(f"{where}: no saved member there (it needs member.json and its weights)") from None
        rank, lora = member.agent.adapter.rank, cfg.model.lora
        if not lora.min_rank <= rank <= lora.max_rank:
            raise ConfigError(f"{where}: its adapter has rank {rank}, outside model.lora's [min_rank, max_rank] = "
                              f"[{lora.min_rank}, {lora.max_rank}]; widen them")
        adapter = member.agent.adapter
        digest = hashlib.sha256()
        for name, t in sorted(adapter.tensors().items()):  # what it starts from, whatever the folder holds later
            digest.update(name.encode())
            digest.update(t.detach().float().cpu().contiguous().numpy().tobytes())
        self.env_desc["init_adapter"] = {"path": str(path), "algorithm": member.agent.algorithm_name, "rank": rank,
                                         "sha256": digest.hexdigest()}
        return adapter

    # ---- members ---------------------------------------------------------------------------------------------
    def build_members(self, seeds: list[int]) -> list[LLMAlgorithm]:
        """Fresh members (a new adapter each, seeded), or, with ``model.init_adapter``, each a copy of that
        adapter with fresh optimiser state and this run's hyperparameters."""
        hp = self.cfg.hyperparameters
        if self.seed_adapter is not None:
            return [self.algo_cls(self.base, self.seed_adapter.clone(), hp.model_copy()) for _ in seeds]
        lora = self.cfg.model.lora
        return [self.algo_cls.create(self.base, hp, lora.rank, lora.alpha, s) for s in seeds]

    def member_from_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> LLMAlgorithm:
        return self.algo_cls.from_state(self.base, tensors, meta)

    # ---- a generation --------------------------------------------------------------------------------------
    def train(self, member: LLMAlgorithm, slot: int, seed: int, steps: int) -> TrainResult:
        """`steps` training samples (GRPO completions, DPO pairs), rounded up to whole learn steps; across
        `model.data_parallel` processes when it is above 1."""
        if self.cfg.model.data_parallel > 1 and member.parallel is None:
            return train_data_parallel(self, member, slot, seed, steps, self.cfg.model.data_parallel)
        return self.train_group([member], [slot], [seed], steps)[0]

    # ---- population batching: a group's rows share the base's forwards (see LLMAlgorithm.batch_key) ---------
    def batch_key(self, member: LLMAlgorithm):
        return member.batch_key()

    def train_group(self, members: list[LLMAlgorithm], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        """The members' training phases together (``GRPO.train_group`` / ``DPO.train_group``: each learn
        step's rows of every member through one forward of the base). With ``model.data_parallel`` above 1
        each member trains alone across its processes instead."""
        if self.cfg.model.data_parallel > 1 and any(m.parallel is None for m in members):
            return [self.train(m, s, seed, steps) for m, s, seed in zip(members, slots, seeds, strict=True)]
        t0 = time.perf_counter()
        if self.algo_cls.data_kind == "prompts":
            phases = self.algo_cls.train_group(members, self.train_data, self.rewards, steps, seeds, self.cfg.kl_metric)
        else:
            phases = self.algo_cls.train_group(members, self.train_data, steps, seeds)
        wall = time.perf_counter() - t0  # the group's time, as every arena reports a group's members
        out = []
        for slot, metrics in zip(slots, phases, strict=True):
            means = metrics.means()
            score = means.get("reward", means.get("accuracy", float("nan")))
            out.append(TrainResult(slot, metrics.samples, metrics.steps, 0, score, means.get("loss", float("nan")),
                                   wall, means))
        return out

    def evaluate_group(self, members: list[LLMAlgorithm], seed: int, slots: list[int]) -> list[float]:
        """Every member's fitness, the group's forwards shared (``GRPO.evaluate_many``: generation;
        ``DPO.evaluate_many``: the pairs' log-probabilities)."""
        n = self.cfg.sample_completions
        if self.algo_cls.data_kind == "prompts":
            return self.algo_cls.evaluate_many(members, self.eval_data, self.rewards, n)
        return self.algo_cls.evaluate_many(members, self.eval_data, n)

    def evaluate(self, member: LLMAlgorithm, seed: int, slot: int | None = None) -> float:
        n = self.cfg.sample_completions
        if self.algo_cls.data_kind == "prompts":
            return member.evaluate(self.eval_data, self.rewards, n)
        return member.evaluate(self.eval_data, n)


def json_bytes(value: Any) -> bytes:
    """`value` as canonical JSON bytes (what a generated dataset's content hash is taken of)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
