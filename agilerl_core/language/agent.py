"""A language agent trained from scratch on game transcripts: an evolvable character-level GPT and the
heads its algorithm adds (ILQL's Q and V). What the language algorithms share: the member as an
:class:`~agilerl_core.hpo.evolvable.Evolvable` (clone, mutate, save as tensors + JSON), and the population's
batched forward and training phase, written once for a group of members with one architecture (a member
alone is a group of one).

A group's step is one backward of the members' summed losses and one AdamW step each; every member keeps its own
optimiser, learning rate and minibatch draws, so its results do not depend on its group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from agilerl_core.algorithms.hyperparameters.language import LanguageHyperparameters
from agilerl_core.errors import CheckpointError
from agilerl_core.hpo.evolvable import MutationSettings
from agilerl_core.io.files import quote
from agilerl_core.language.tensors import LETTER_IDS, GameTensors
from agilerl_core.language.wordle import PAD
from agilerl_core.networks.gpt import EvolvableGPT, GPTBounds, GPTSpec, propose_gpt_mutation

LANGUAGE_MUTATIONS = frozenset({"none", "architecture", "parameters", "rl_hp"})


def head(width: int, out: int, generator: torch.Generator | None) -> nn.Sequential:
    """A two-layer MLP head on the GPT's hidden states (ILQL's Q and V heads)."""
    net = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, out))
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.02, generator=generator) if p.ndim > 1 else p.zero_()
    return net


class LanguageNet(nn.Module):
    """A member's trainable networks: the GPT (its language model) and the algorithm's heads."""

    def __init__(self, gpt: EvolvableGPT, heads: dict[str, nn.Module]) -> None:
        super().__init__()
        self.gpt = gpt
        self.heads = nn.ModuleDict(heads)

    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """``hidden`` [B, T, E]; ``lm``: the language model's letter logits [B, T, 26]; each head's output
        [B, T, out]."""
        h = self.gpt.hidden(idx)
        out = {"hidden": h, "lm": self.gpt.lm_head(h)[..., list(LETTER_IDS)]}
        out.update({name: net(h) for name, net in self.heads.items()})
        return out


def group_outputs(nets: Sequence[nn.Module], idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every member's outputs for its own rows `idx` [K, B, T], stacked as [K, B, T, ...]. One forward per member:
    on CPU this measured faster than one vmapped forward of the stacked parameters (4 members, 64 games of 73
    characters: 420 against 489 ms per training step; torch has no batching rule for CPU attention), and as fast
    as a hand-batched one (bmm) from 32 games up."""
    outs = [net(x) for net, x in zip(nets, idx, strict=True)]
    return {k: torch.stack([o[k] for o in outs]) for k in outs[0]}


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each member's mean of `values` [K, B, T] over its `mask`ed positions: [K]."""
    m = mask.to(values.dtype)
    return (values * m).sum((1, 2)) / m.sum((1, 2)).clamp(min=1.0)


def letter_cross_entropy(lm: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the letter logits `lm` [..., 26] against the written letters `action` [...]."""
    return -torch.log_softmax(lm, dim=-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)


class LanguageAgent:
    """A population member: a character-level GPT with its algorithm's heads, trained from game tensors."""

    algorithm_name: ClassVar[str]
    hp_model: ClassVar[type[LanguageHyperparameters]]
    mutation_kinds: ClassVar[frozenset[str]] = LANGUAGE_MUTATIONS
    head_shapes: ClassVar[dict[str, int]] = {}  # the heads' output widths (from the hyperparameters, see heads_of)
    target_heads: ClassVar[tuple[str, ...]] = ()  # heads with a slowly tracking target copy

    def __init__(self, net: LanguageNet, hp: LanguageHyperparameters, targets: nn.ModuleDict | None = None) -> None:
        self.net = net
        self.hp = hp
        self.targets = targets if targets is not None else self._new_targets()
        for p in self.targets.parameters():
            p.requires_grad_(False)
        self.optimizer = self._new_optimizer()
        self.learn_steps = 0
        self.games_seen = 0
        self.train_metrics: dict[str, float] = {}
        self.samples: list[dict[str, Any]] = []  # the last evaluation's sample games
        self.eval_metrics: dict[str, float] = {}  # the last evaluation's win rate, mean guesses...

    # ---- construction -----------------------------------------------------------------------------------------
    @classmethod
    def heads_of(cls, hp: LanguageHyperparameters) -> dict[str, int]:
        """The heads a member with `hp` carries, by name: their output widths."""
        return dict(cls.head_shapes)

    @classmethod
    def create(cls, spec: GPTSpec, hp: LanguageHyperparameters, seed: int) -> LanguageAgent:
        gen = torch.Generator().manual_seed(seed)
        gpt = EvolvableGPT(spec, gen)
        heads = {name: head(spec.n_embd, out, gen) for name, out in cls.heads_of(hp).items()}
        return cls(LanguageNet(gpt, heads), hp.model_copy())

    def _new_targets(self) -> nn.ModuleDict:
        return nn.ModuleDict({n: _copy(self.net.heads[n]) for n in self.target_heads if n in self.net.heads})

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.net.parameters(), lr=self.hp.lr, weight_decay=self.hp.weight_decay,
                                 foreach=False)

    @property
    def spec(self) -> GPTSpec:
        return self.net.gpt.spec

    # ---- Evolvable ----------------------------------------------------------------------------------------
    def set_hyperparameter(self, name: str, value: Any) -> None:
        if isinstance(getattr(self.hp, name), int) and not isinstance(getattr(self.hp, name), bool):
            value = round(value)
        setattr(self.hp, name, value)
        for group in self.optimizer.param_groups:
            group["lr"], group["weight_decay"] = float(self.hp.lr), float(self.hp.weight_decay)

    def mutate(self, kind: str, rng: np.random.Generator, settings: MutationSettings) -> str:
        if kind == "architecture":
            bounds: GPTBounds = settings.arch_bounds
            proposal = propose_gpt_mutation(self.spec, bounds, rng)
            if proposal is None:
                return "none(architecture at its bounds)"
            spec, what = proposal
            self._rebuild(spec, int(rng.integers(2**31)))
            return f"architecture:{what}"
        if kind == "parameters":
            gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
            with torch.no_grad():
                for p in self.net.gpt.parameters():
                    if p.ndim > 1:
                        p.add_(torch.randn(p.shape, generator=gen) * (p.std() * settings.parameter_strength))
            return "parameters"
        raise ValueError(f"{self.algorithm_name} members mutate their architecture, parameters or hyperparameters, "
                         f"not {kind!r}")

    def _rebuild(self, spec: GPTSpec, seed: int) -> None:
        """The GPT rebuilt as `spec` (growth keeps its function); Adam's moments are kept for every tensor whose
        shape did not change and start fresh for the others."""
        old = {n: p for n, p in self.net.named_parameters()}
        state = {n: self.optimizer.state.get(p) for n, p in old.items()}
        self.net.gpt = self.net.gpt.rebuilt(spec, torch.Generator().manual_seed(seed))
        self.optimizer = self._new_optimizer()
        for n, p in self.net.named_parameters():
            st = state.get(n)
            if st and st["exp_avg"].shape == p.shape:
                self.optimizer.state[p] = {k: v.clone() for k, v in st.items()}

    def describe(self) -> str:
        return f"{self.spec.describe()}" + (f" + heads {','.join(self.net.heads)}" if len(self.net.heads) else "")

    def param_count(self) -> int:
        return sum(p.numel() for p in self.net.parameters())

    def reseed(self, seed: int) -> None:
        """Nothing to do: a member keeps no generator; every phase draws from the seed it is given."""
        return None

    def clone(self) -> LanguageAgent:
        tensors, meta = self.state()
        return type(self).from_state({k: v.clone() for k, v in tensors.items()}, meta)

    # ---- as data --------------------------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Weights, target heads and AdamW's per-tensor state (moments and step; a tensor grown or rebuilt by a
        mutation and not stepped since has none) as tensors; the rest as JSON."""
        tensors = {f"net.{n}": p.detach().clone() for n, p in self.net.named_parameters()}
        tensors.update({f"target.{n}": p.detach().clone() for n, p in self.targets.named_parameters()})
        for n, p in self.net.named_parameters():
            st = self.optimizer.state.get(p)
            if st:
                tensors[f"adam.exp_avg.{n}"] = st["exp_avg"].clone()
                tensors[f"adam.exp_avg_sq.{n}"] = st["exp_avg_sq"].clone()
                tensors[f"adam.step.{n}"] = torch.as_tensor(st["step"], dtype=torch.float32).clone().reshape(())
        meta = {"algorithm": self.algorithm_name, "hp": self.hp.model_dump(), "arch": self.spec.to_dict(),
                "learn_steps": self.learn_steps, "games_seen": self.games_seen,
                "train_metrics": self.train_metrics, "samples": self.samples, "eval_metrics": self.eval_metrics}
        return tensors, meta

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> LanguageAgent:
        """A member from its checkpoint's data: the architecture and heads are counted against the limits before
        anything is built, then every tensor must fit exactly, be finite, and AdamW's state be a valid one."""
        from agilerl_core.limits import check

        spec = GPTSpec.from_dict(meta.get("arch"), "member.json: agent.arch", CheckpointError)
        try:
            hp = cls.hp_model(**meta["hp"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"member.json: field agent.hp does not hold {cls.algorithm_name}'s "
                                  f"hyperparameters ({str(err)[:200]})") from None
        for key, value in hp.model_dump().items():
            if isinstance(value, float) and not math.isfinite(value):
                raise CheckpointError(f"member.json: field agent.hp.{key} is {value}, not a finite number")
        counts = {k: meta.get(k, 0) for k in ("learn_steps", "games_seen")}
        for key, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**53:
                raise CheckpointError(f"member.json: field agent.{key} is {quote(value)}, not a whole number in "
                                      f"[0, 2**53]")
        notes = {k: meta.get(k, {}) for k in ("train_metrics", "eval_metrics")}
        for key, value in notes.items():
            if not isinstance(value, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                      for v in value.values()):
                raise CheckpointError(f"member.json: field agent.{key} is {quote(value)}, not an object of numbers")
        samples = meta.get("samples", [])
        if not isinstance(samples, list):
            raise CheckpointError(f"member.json: field agent.samples is {quote(samples)}, not a list")
        heads = cls.heads_of(hp)
        e = spec.n_embd
        per_head = {n: e * 2 * e + 2 * e + 2 * e * o + o for n, o in heads.items()}
        total = spec.param_count() + sum(per_head.values()) + sum(per_head[n] for n in cls.target_heads if n in heads)
        check("network_params", total, f"member.json: field agent (the GPT and its {len(heads)} heads)",
              CheckpointError)
        agent = cls(LanguageNet(EvolvableGPT(spec), {n: head(e, o, None) for n, o in heads.items()}), hp)
        want = {f"net.{n}": p for n, p in agent.net.named_parameters()}
        want.update({f"target.{n}": p for n, p in agent.targets.named_parameters()})
        stepped = {k.removeprefix("adam.step.") for k in tensors if k.startswith("adam.step.")}
        params = dict(agent.net.named_parameters())
        adam = {f"adam.{k}.{n}" for n in stepped for k in ("exp_avg", "exp_avg_sq", "step")}
        if set(tensors) != set(want) | adam or not stepped <= set(params):
            extra = sorted(set(tensors) - set(want) - adam)[:3] + sorted(stepped - set(params))[:3]
            missing = sorted((set(want) | adam) - set(tensors))[:3]
            raise CheckpointError(f"{cls.algorithm_name} member tensors do not fit its recorded architecture "
                                  f"{spec.describe()} (unexpected {extra}, missing {missing})")
        with torch.no_grad():
            for name, p in want.items():
                _fill(p, tensors[name], name)
        for n in sorted(stepped):
            p = params[n]
            m, v, t = (tensors[f"adam.{k}.{n}"] for k in ("exp_avg", "exp_avg_sq", "step"))
            _fill(torch.empty_like(p), m, f"adam.exp_avg.{n}")
            _fill(torch.empty_like(p), v, f"adam.exp_avg_sq.{n}")
            _fill(torch.empty(()), t, f"adam.step.{n}")
            if bool((v < 0).any()):
                raise CheckpointError(f"member tensor adam.exp_avg_sq.{n}: holds negative second moments")
            if not (float(t) >= 1 and float(t) == int(t)):
                raise CheckpointError(f"member tensor adam.step.{n}: {float(t)} is not a whole number of steps >= 1")
            agent.optimizer.state[p] = {"step": t.clone().float(), "exp_avg": m.clone().float(),
                                        "exp_avg_sq": v.clone().float()}
        agent.learn_steps, agent.games_seen = counts["learn_steps"], counts["games_seen"]
        agent.train_metrics = {k: float(v) for k, v in notes["train_metrics"].items()}
        agent.samples = list(samples)
        agent.eval_metrics = {k: float(v) for k, v in notes["eval_metrics"].items()}
        return agent

    # ---- population batching ----------------------------------------------------------------------------------
    def batch_key(self) -> tuple:
        """Members with one architecture, head set and batch size train and play as one group."""
        return (self.algorithm_name, self.spec, tuple(self.net.heads), self.hp.batch_size)

    def batch_refusal(self) -> str:
        return f"{self.algorithm_name}: members with other architectures or batch sizes train apart"

    # ---- acting and targets (an algorithm also defines ``losses(out, target, batch, hps) -> (loss [K],
    # {metric: [K]})``: each member's loss on its batch of tensors [K, B, T]) ---------------------------------------
    @classmethod
    def policy_logits(cls, out: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                      hps: Sequence[LanguageHyperparameters]) -> torch.Tensor:
        """Each member's letter logits [K, G, 26] when acting, from the outputs at the games' last positions."""
        return out["lm"]

    def update_targets(self) -> None:
        """Soft-update the target heads towards the online ones (by the member's ``tau``)."""
        tau = float(getattr(self.hp, "tau", 1.0))
        with torch.no_grad():
            for name, tnet in self.targets.items():
                for pt, p in zip(tnet.parameters(), self.net.heads[name].parameters(), strict=True):
                    pt.lerp_(p, tau)


def _copy(net: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(net)


def _fill(dst: torch.Tensor, src: object, name: str) -> None:
    if not isinstance(src, torch.Tensor) or tuple(src.shape) != tuple(dst.shape) or not src.is_floating_point():
        shape = tuple(src.shape) if isinstance(src, torch.Tensor) else type(src).__name__
        raise CheckpointError(f"member tensor {name}: shape {shape}, expected float {tuple(dst.shape)}")
    if not bool(torch.isfinite(src).all()):
        raise CheckpointError(f"member tensor {name}: holds NaN or inf")
    dst.copy_(src)


def target_call(members: Sequence[LanguageAgent], hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every member's target heads on its own hidden states [K, B, T, E] (no gradient): {name: [K, B, T, out]}."""
    with torch.no_grad():
        return {name: torch.stack([m.targets[name](h) for m, h in zip(members, hidden, strict=True)])
                for name in members[0].targets}


def train_group(members: Sequence[LanguageAgent], data: GameTensors, steps: int, seeds: Sequence[int],
                on_step: Callable[[], None] | None = None) -> list[dict[str, float]]:
    """`steps` gradient steps of every member of a group (one architecture and batch size) on minibatches of
    the games `data`, each member's drawn by its own generator seeded from `seeds` and cut to its own longest game
    (so its result does not depend on its group): one backward of the summed losses per step, then each member's
    clipped AdamW step and target update. Returns each member's means of its loss and metrics over the phase."""
    cls, k, n = type(members[0]), len(members), data.ids.shape[0]
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    batch_size = members[0].hp.batch_size
    hps = [m.hp for m in members]
    sums: dict[str, torch.Tensor] = {}
    for _ in range(steps):
        losses, metrics = [], []
        for m, gen, hp in zip(members, gens, hps, strict=True):
            rows = data.rows(torch.randint(n, (batch_size,), generator=gen))
            t = int((rows.ids != PAD).sum(-1).max())  # its longest game drawn: the rest is padding
            batch = GameTensors(*(x[None, :, :t] for x in rows))  # a member axis of one
            out = {name: v.unsqueeze(0) for name, v in m.net(batch.ids[0]).items()}
            target = target_call([m], out["hidden"].detach())
            loss, values = cls.losses(out, target, batch, [hp])
            losses.append(loss)
            metrics.append(values)
        loss = torch.cat(losses)
        metrics = {name: torch.cat([v[name] for v in metrics]) for name in metrics[0]}
        for m in members:
            m.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        for m, hp in zip(members, hps, strict=True):
            if hp.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(m.net.parameters(), hp.max_grad_norm)
            m.optimizer.step()
            m.update_targets()
            m.learn_steps += 1
            m.games_seen += batch_size
        for name, value in {"loss": loss, **metrics}.items():
            sums[name] = sums.get(name, torch.zeros(k)) + value.detach()
        if on_step is not None:
            on_step()
    means = {name: (v / max(steps, 1)).tolist() for name, v in sums.items()}
    phases = [{name: float(v[i]) for name, v in means.items()} for i in range(k)]
    for m, phase in zip(members, phases, strict=True):
        m.train_metrics = phase
    return phases


@torch.no_grad()
def act_greedy(members: Sequence[LanguageAgent], ids: torch.Tensor) -> torch.Tensor:
    """Each member's greedy letter (index into LETTER_IDS) for each of its sequences `ids` [K, G, T]: [K, G]."""
    out = group_outputs([m.net for m in members], ids)
    last = {name: v[:, :, -1:] for name, v in out.items()}
    target = target_call(members, last["hidden"])
    logits = type(members[0]).policy_logits(last, target, [m.hp for m in members])
    return logits[:, :, -1].argmax(-1)
