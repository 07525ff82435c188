"""What GRPO and DPO members share: a LoRA adapter on the population's shared base model, its Adam state,
its hyperparameters, and the Evolvable protocol (clone, state, hyperparameter and adapter-rank mutations).

A member holds no copy of the base: it borrows the arena's :class:`~agilerl_core.llm.base_model.SharedBase`
while it works. Its checkpoint is the adapter and Adam moments (safetensors) and JSON naming the base by its
SHA-256; :meth:`LLMAlgorithm.from_state` refuses a checkpoint made on another base (the checks are in
:mod:`agilerl_core.llm.checkpoint`). What learn steps are built from (micro-batch cuts, padded ids,
per-token GAE, phase metrics) is in :mod:`agilerl_core.llm.learning`.

Randomness comes from the seed each training phase is given (prompt order and sampling), so a member's state
is only its tensors and counters, and a resumed run repeats an uninterrupted one exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from agilerl_core.algorithms.hyperparameters.llm import LLMHyperparameters
from agilerl_core.errors import ConfigError
from agilerl_core.hpo.evolvable import MutationSettings
from agilerl_core.llm.adapter import LoraAdapter
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.checkpoint import MAX_SCALE, checked_moments, checked_state
from agilerl_core.llm.learning import PhaseMetrics
from agilerl_core.llm.sampling import RowBlock, pad_prompts, sample

LLM_MUTATIONS = frozenset({"none", "rl_hp", "adapter_rank", "adapter_crossover"})


@dataclass(frozen=True)
class RankBounds:
    """What adapter-rank mutations respect: the rank stays in [min_rank, max_rank]; a mutation doubles or
    halves it."""

    min_rank: int
    max_rank: int


class LLMAlgorithm:
    """A population member: one LoRA adapter trained on the shared base model."""

    hp_model: ClassVar[type[LLMHyperparameters]]
    algorithm_name: ClassVar[str]
    mutation_kinds: ClassVar[frozenset[str]] = LLM_MUTATIONS

    def __init__(self, base: SharedBase, adapter: LoraAdapter, hp: LLMHyperparameters,
                 head: dict[str, torch.Tensor] | None = None) -> None:
        self.base = base
        self.adapter = adapter
        self.hp = hp
        # trainable tensors beside the adapter (LLM-PPO's value head), saved, cloned and optimised with it
        self.head = {n: torch.nn.Parameter(t.detach().clone())
                     for n, t in sorted((head or self.new_head(base)).items())}
        self.optimizer = torch.optim.Adam(self.trainable(), lr=hp.lr, foreach=False)
        self.learn_steps = 0
        self.samples_seen = 0
        self.train_metrics: dict[str, float] = {}  # the last training phase's means (tracked per member)
        self.samples: list[dict[str, Any]] = []  # the last evaluation's sample completions (tracked)
        self.eval_metrics: dict[str, float] = {}  # the last evaluation's game statistics (games only)
        self.parallel = None  # a DataParallel share (agilerl_core.llm.data_parallel) while training across processes

    @classmethod
    def create(cls, base: SharedBase, hp: LLMHyperparameters, rank: int, alpha: float, seed: int) -> LLMAlgorithm:
        scale = alpha / rank
        if not (math.isfinite(scale) and 0 < scale <= MAX_SCALE):
            raise ConfigError(f"model.lora.alpha {alpha} / rank {rank} = {scale:g}: the LoRA scale must lie in (0, "
                              f"{MAX_SCALE:g}] (a member with a larger one is refused when its checkpoint is loaded)")
        gen = torch.Generator().manual_seed(seed)
        adapter = LoraAdapter.initial(base.shapes, rank, scale, gen, base.device)
        return cls(base, adapter, hp.model_copy())

    @property
    def device(self) -> str:
        return self.base.device

    @classmethod
    def new_head(cls, base: SharedBase) -> dict[str, torch.Tensor]:
        """A fresh member's tensors beside its adapter. Default: none."""
        return {}

    def trainable(self) -> list[torch.nn.Parameter]:
        """Every tensor the member's Adam steps: the adapter's, then its head's."""
        return [*self.adapter.parameters(), *self.head.values()]

    def trainable_names(self) -> list[str]:
        return [*self.adapter.param_names(), *(f"head.{n}" for n in self.head)]

    # ---- Evolvable ----------------------------------------------------------------------------------------
    def set_hyperparameter(self, name: str, value: Any) -> None:
        if isinstance(getattr(self.hp, name), int) and not isinstance(getattr(self.hp, name), bool):
            value = round(value)
        setattr(self.hp, name, value)
        if name == "lr":
            for group in self.optimizer.param_groups:
                group["lr"] = float(value)

    def mutate(self, kind: str, rng: np.random.Generator, settings: MutationSettings) -> str:
        if kind != "adapter_rank":
            raise ValueError(f"{self.algorithm_name} members support only {sorted(self.mutation_kinds)} mutations, "
                             f"not {kind!r}: the base model is frozen and shared")
        bounds: RankBounds = settings.arch_bounds
        old = self.adapter.rank
        grow = rng.random() < 0.5
        if (grow and old * 2 > bounds.max_rank) or (not grow and old // 2 < bounds.min_rank):
            grow = not grow
        new = min(old * 2, bounds.max_rank) if grow else max(old // 2, bounds.min_rank)
        if new == old:
            return "none(rank at its bounds)"
        self.set_rank(new, int(rng.integers(2**31)))
        return f"rank:{old}->{new}"

    def crossover(self, other: LLMAlgorithm, rng: np.random.Generator) -> str:
        """Become a child of this adapter and `other`'s (a second parent): each target module's (A, B) taken from
        one parent or the other (a fair coin per module; at least one from each when there are two or more
        modules). `other`'s adapter is first brought to this one's rank (grown keeping its function, or shrunk
        to its largest singular components), so every module's update ``B @ A`` is one parent's exactly. Adam
        moments stay with the modules this member kept and start at zero for those it took."""
        mine, theirs = self.adapter, other.adapter
        if theirs.scale != mine.scale:
            raise ValueError("crossover: the parents' adapters scale their updates differently")
        if theirs.rank > mine.rank:
            theirs = theirs.shrunk(mine.rank)
        elif theirs.rank < mine.rank:
            theirs = theirs.grown(mine.rank, torch.Generator().manual_seed(int(rng.integers(2**31))))
        names = mine.names
        take = [n for n in names if rng.random() < 0.5]
        if len(names) > 1 and len(take) in (0, len(names)):  # a child of both, not a copy of one
            flip = names[int(rng.integers(len(names)))]
            take = [n for n in take if n != flip] if take else [flip]
        step, moments = self._adam_state()
        self.adapter = LoraAdapter({n: (theirs if n in take else mine).a[n] for n in names},
                                   {n: (theirs if n in take else mine).b[n] for n in names}, mine.scale)
        self.optimizer = torch.optim.Adam(self.trainable(), lr=self.hp.lr, foreach=False)
        if step:
            for n in take:
                for part in ("lora_A", "lora_B"):
                    m, v = moments[f"{n}.{part}"]
                    moments[f"{n}.{part}"] = (torch.zeros_like(m), torch.zeros_like(v))
            self._load_adam(step, moments)
        return f"crossover:{len(take)}/{len(names)} modules"

    def set_rank(self, rank: int, seed: int) -> None:
        """Grow (function kept exactly, Adam moments kept for the old components) or shrink (largest singular
        components kept, Adam moments reset) the adapter's rank."""
        old_adapter, old_rank = self.adapter, self.adapter.rank
        step, moments = self._adam_state()
        if rank > old_rank:
            self.adapter = old_adapter.grown(rank, torch.Generator().manual_seed(seed))
        else:
            self.adapter = old_adapter.shrunk(rank)
        self.optimizer = torch.optim.Adam(self.trainable(), lr=self.hp.lr, foreach=False)
        if rank > old_rank and step > 0:
            grown = {}
            for name, (m, v) in moments.items():
                if name.startswith("head."):  # the head's shape does not depend on the rank
                    grown[name] = (m, v)
                    continue
                pad = [(0, 0), (0, rank - old_rank)] if name.endswith("lora_B") else [(0, rank - old_rank), (0, 0)]
                grown[name] = tuple(torch.nn.functional.pad(t, [x for p in reversed(pad) for x in p]) for t in (m, v))
            self._load_adam(step, grown)

    def describe(self) -> str:
        return f"LoRA r{self.adapter.rank} x{len(self.adapter.names)} modules on {self.base.model.config.model_type}"

    def param_count(self) -> int:
        return self.adapter.numel()

    def reseed(self, seed: int) -> None:
        """Nothing to do: an LLM member keeps no generator; every phase draws from the (run seed, generation,
        slot) seed it is given."""
        return None

    def clone(self) -> LLMAlgorithm:
        new = type(self)(self.base, self.adapter.clone(), self.hp.model_copy(), dict(self.head))
        step, moments = self._adam_state()
        if step:
            new._load_adam(step, {k: (m.clone(), v.clone()) for k, (m, v) in moments.items()})
        new.learn_steps, new.samples_seen = self.learn_steps, self.samples_seen
        new.train_metrics, new.samples = dict(self.train_metrics), list(self.samples)
        new.eval_metrics = dict(self.eval_metrics)
        return new

    # ---- as data --------------------------------------------------------------------------------------------
    def _adam_state(self) -> tuple[int, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        names = self.trainable_names()
        out, step = {}, 0
        for name, p in zip(names, self.trainable(), strict=True):
            st = self.optimizer.state.get(p)
            if st:
                step = int(st["step"])
                out[name] = (st["exp_avg"], st["exp_avg_sq"])
        return step, out

    def _load_adam(self, step: int, moments: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        for name, p in zip(self.trainable_names(), self.trainable(), strict=True):
            m, v = moments[name]
            self.optimizer.state[p] = {"step": torch.tensor(float(step)), "exp_avg": m.to(p.device).clone(),
                                       "exp_avg_sq": v.to(p.device).clone()}

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {f"adapter.{k}": v for k, v in self.adapter.tensors().items()}
        tensors.update({f"head.{k}": v.detach() for k, v in self.head.items()})
        step, moments = self._adam_state()
        for name, (m, v) in moments.items():
            tensors[f"adam.exp_avg.{name}"] = m
            tensors[f"adam.exp_avg_sq.{name}"] = v
        meta = {"algorithm": self.algorithm_name, "hp": self.hp.model_dump(), "rank": self.adapter.rank,
                "scale": self.adapter.scale, "adam_step": step, "learn_steps": self.learn_steps,
                "samples_seen": self.samples_seen, "train_metrics": self.train_metrics, "samples": self.samples,
                "eval_metrics": self.eval_metrics,
                "base": self.base.describe()}
        return tensors, meta

    @classmethod
    def from_state(cls, base: SharedBase, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> LLMAlgorithm:
        """A member from its checkpoint state, every field and tensor checked before anything is built from them
        (:func:`checked_state`): a CheckpointError names member.json's field or weights.safetensors' tensor."""
        state = checked_state(cls, base, tensors, meta)
        adapter = LoraAdapter({n: state.a[n].to(base.device) for n in state.a},
                              {n: state.b[n].to(base.device) for n in state.b}, state.scale)
        head = {k: t.to(base.device).float() for k, t in state.head.items()}
        member = cls(base, adapter, state.hp, head)
        if state.step:
            member._load_adam(state.step, checked_moments(member, tensors))
        member.learn_steps, member.samples_seen = state.learn_steps, state.samples_seen
        member.train_metrics, member.eval_metrics = state.train_metrics, state.eval_metrics
        member.samples = state.samples
        return member

    # ---- learning helpers -------------------------------------------------------------------------------------
    @staticmethod
    def run_group_phase(members: list[LLMAlgorithm], n: int, budget: int, seeds: list[int],
                        step: Callable[[list[int], list[list[int]]], list[tuple[int, dict[str, float]]]]
                        ) -> list[PhaseMetrics]:
        """Every member's training phase at once: member i takes learn steps on random batches of
        `batch_size` of the `n` records, drawn from its own seeded generator, until `budget` samples were
        used (the last step is whole). ``step(who, batches)`` runs one step of the members `who` (indices
        into `members`, those still short of the budget) on their batches, returning each one's (samples
        used, metrics). A member alone is a group of one."""
        rngs = [np.random.default_rng(s) for s in seeds]
        metrics = [PhaseMetrics() for _ in members]
        while who := [i for i, m in enumerate(metrics) if m.samples < budget]:
            batches = [rngs[i].choice(n, size=min(members[i].hp.batch_size, n), replace=False).tolist() for i in who]
            for i, (used, values) in zip(who, step(who, batches), strict=True):
                metrics[i].add(used, **values)
        for member, m in zip(members, metrics, strict=True):
            member.samples_seen += m.samples
            member.train_metrics = m.means()
        return metrics

    @classmethod
    def train_on_records(cls, members: list[LLMAlgorithm], data: Any, budget: int, seeds: list[int]
                         ) -> list[PhaseMetrics]:
        """An offline algorithm's training phases (DPO's pairs, recorded games): learn steps of the members still
        short of `budget` records taken together by ``cls.learn_group(members, data, batches)``, member i's
        batches from seeds[i] alone."""

        def step(who: list[int], batches: list[list[int]]) -> list[tuple[int, dict[str, float]]]:
            values = cls.learn_group([members[i] for i in who], data, batches)
            return [(len(b), v) for b, v in zip(batches, values, strict=True)]

        return LLMAlgorithm.run_group_phase(members, len(data), budget, seeds, step)

    # ---- population batching --------------------------------------------------------------------------------
    def batch_key(self) -> tuple | None:
        """Members with equal keys train and evaluate as one group (their rows through one forward of the
        base, each row through its own member's adapter)."""
        return (self.algorithm_name,)

    def batch_refusal(self) -> str:
        return f"{self.algorithm_name}: members with other generation settings train apart"

    @staticmethod
    def group_parts(members: list[LLMAlgorithm], parts: list) -> list:
        """The micro-batches of a group step whose backward this process runs: all of them, unless a member
        alone trains data-parallel (its share of them)."""
        if len(members) == 1 and members[0].parallel is not None:
            return members[0].parallel.mine(parts)
        if any(m.parallel is not None for m in members):
            raise ValueError("a data-parallel member trains alone (a group of one)")
        return parts

    def summed(self, *values: float) -> list[float]:
        """Per-micro-batch sums (loss, KL...) added up over the data-parallel processes (as they are alone)."""
        return list(values) if self.parallel is None else self.parallel.sum_floats(list(values))

    def take(self, other: LLMAlgorithm) -> None:
        """Become `other` (the same member trained elsewhere, on this base): adapter, optimiser and counters."""
        self.adapter, self.optimizer, self.hp, self.head = other.adapter, other.optimizer, other.hp, other.head
        self.learn_steps, self.samples_seen = other.learn_steps, other.samples_seen
        self.train_metrics, self.samples = dict(other.train_metrics), list(other.samples)
        self.eval_metrics = dict(other.eval_metrics)

    def _step(self) -> float:
        """Clip and apply the accumulated gradient (summed over data-parallel processes first); returns its
        norm before clipping."""
        params = self.trainable()
        if self.parallel is not None:
            self.parallel.sum_grads(params)
        if self.hp.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.hp.max_grad_norm))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.learn_steps += 1
        return norm

    def logit_adjust(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """How the member's acting policy changes the model's next-token logits, given them [B, V] and the last
        hidden states [B, H] (:attr:`~agilerl_core.llm.sampling.RowBlock.adjust`); None: it samples the model."""
        return None

    def prompt_batch(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_prompts(prompts, self.base.pad_id, self.device)

    @torch.no_grad()
    def generate(self, prompts: list[str], chat_template: bool, max_new_tokens: int | None = None,
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        """Completions of raw prompt texts (greedy by default): what the registered champion serves."""
        return self.generate_ids(self.base.encode(prompts, chat_template), max_new_tokens, temperature, seed)

    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[list[int]], max_new_tokens: int | None = None, temperature: float = 0.0,
                     seed: int = 0) -> list[str]:
        """Completions of tokenised prompts (greedy by default; ``max_new_tokens`` at most, else the member's)."""
        ids, mask = self.prompt_batch(prompt_ids)
        gen = torch.Generator().manual_seed(seed)
        with self.base.bound(self.adapter) as model:
            comp, cmask = sample(model, ids, mask, max_new_tokens or getattr(self.hp, "max_new_tokens", 32),
                                 temperature, self.base.eos_id, self.base.pad_id,
                                 blocks=[RowBlock(slice(0, ids.shape[0]), temperature, gen, self.logit_adjust())])
        return self.base.decode(comp, cmask)
