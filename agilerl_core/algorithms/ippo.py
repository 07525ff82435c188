"""IPPO: de Witt et al., "Is Independent Learning All You Need in the StarCraft Multi-Agent Challenge?",
arXiv:2011.09533 (2020): every policy unit learns with PPO (:mod:`agilerl_core.algorithms.ppo`, the same
loss functions, GAE and minibatching) from its agents' own observations, actions and rewards.

A *unit* is one agent (``share_policy: agent``) or one group of agents with identical spaces, which then
share an actor and a critic trained on all of the group's experience (``share_policy: group``;
``speaker_0``, ``speaker_1`` -> ``speaker``). A member is the team of its units: one architecture,
activation or hyperparameter mutation changes every unit alike, parameter noise reaches each. With one
agent an IPPO member is exactly a PPO agent (same seed, same draws, same result).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces

from agilerl_core.algorithms.hyperparameters.ippo import IPPOHyperparameters, MAPPOHyperparameters
from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters
from agilerl_core.algorithms.ppo import PPO, PPOGroup
from agilerl_core.envs.multi_agent import policy_units
from agilerl_core.envs.spaces import ActionSpec, MultiAgentSpec, Obs, ObsSpec
from agilerl_core.hpo.evolvable import RL_MUTATION_KINDS, MutationSettings
from agilerl_core.networks.evolvable import ArchSpec


class IPPOGroup:
    """IPPO teams learning as one population-batched group: each policy unit is stacked over the teams as a
    :class:`~agilerl_core.algorithms.ppo.PPOGroup` (the unit's learners of every team: one forward to act, one
    update per minibatch round), so K teams of U units cost U batched calls instead of K * U. Each team's
    learners keep their own hyperparameters, generators and rollouts (a team's rows where an agent was out of
    its episode are left out, as when it learns alone).

    A unit's rows of the group are member-major, then the unit's agents one after another over each team's
    N envs ([K, U * N, ...], :meth:`rows`): each team's columns are what it stacks alone (:meth:`IPPO.stack`)."""

    def __init__(self, teams: list) -> None:
        self.agents = list(teams)
        self.k = len(self.agents)
        first = self.agents[0]
        self.ma, self.device = first.ma, first.device
        self.unit_agents = first.units
        self.units = {u: PPOGroup([t.learners[u] for t in self.agents]) for u in first.learners}

    def rows(self, unit: str, per_agent: dict[str, Any]) -> Any:
        """Unit `unit`'s rows of every team, [K, U * N, ...], from every agent's member-major rows ([K * N, ...]
        tensors or host arrays)."""
        parts = [per_agent[a] for a in self.unit_agents[unit]]
        if isinstance(parts[0], torch.Tensor):
            parts = [p.view(self.k, -1, *p.shape[1:]) for p in parts]
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        parts = [p.reshape(self.k, -1, *p.shape[1:]) for p in parts]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def per_agent(self, unit: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`rows`: unit rows [K, U * N, ...] as each agent's member-major rows [K * N, ...]."""
        agents = self.unit_agents[unit]
        parts = x.view(self.k, len(agents), -1, *x.shape[2:]).unbind(1)
        return {a: p.reshape(-1, *x.shape[2:]) for a, p in zip(agents, parts, strict=True)}

    def critic_input(self, unit: str, obs: Obs) -> Obs | None:
        """A centralised critic's input for unit `unit` from every team's observations ([K * U * N, ...], rows as
        :meth:`rows` orders them); None: the unit's critics read its agents' own observations."""
        central = self.agents[0].critic_input(unit, obs)  # agent-major over all K * N rows
        if central is None:
            return None
        agents = len(self.unit_agents[unit])
        return {key: v.view(agents, self.k, -1, v.shape[-1]).transpose(0, 1).reshape(-1, v.shape[-1])
                for key, v in central.items()}

    @torch.no_grad()
    def greedy(self, obs: Obs, masks: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """Every agent's greedy actions [K * N(, dim)] (agent scale) for member-major observations, one forward per
        policy unit (`masks`: [K * N, A] per agent, or None)."""
        out = {}
        for u, unit in self.units.items():
            x = self.rows(u, obs)
            first = self.unit_agents[u][0]
            mask = None if masks.get(first) is None else self.rows(u, masks).flatten(0, 1)
            out.update(self.per_agent(u, unit.greedy({"obs": x.flatten(0, 1)}, mask)))
        return out

    def write_back(self) -> None:
        """Every unit's weights and optimiser state back into each team's learners (end of the phase)."""
        for unit in self.units.values():
            unit.write_back()


def _ppo_hp(hp: IPPOHyperparameters) -> PPOHyperparameters:
    return PPOHyperparameters(**{k: v for k, v in hp.model_dump().items() if k in PPOHyperparameters.model_fields})


class IPPO:
    """A team of PPO learners, one per policy unit (see the module doc). Implements the Evolvable protocol."""

    name: ClassVar[str] = "ippo"
    hp_model = IPPOHyperparameters
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "box")
    uses_replay: ClassVar[bool] = False
    mutation_kinds: ClassVar[frozenset[str]] = RL_MUTATION_KINDS

    def __init__(self, obs_spec: MultiAgentSpec, action: dict[str, Any] | None, arch: ArchSpec, hp, seed: int,
                 device: str | torch.device = "cpu") -> None:
        self.ma = obs_spec
        self.agents = obs_spec.agents
        self.device = torch.device(device)
        self._hp = self.hp_model.model_validate(hp.model_dump())
        self.units = policy_units(obs_spec, self._hp.share_policy)
        self.unit_of = {a: u for u, agents in self.units.items() for a in agents}
        self.arch = replace(arch, mlp=replace(arch.mlp, in_dim=0, out_dim=0))  # the shared template
        ppo_hp = _ppo_hp(self._hp)
        self.learners: dict[str, PPO] = {}
        for i, (u, agents) in enumerate(self.units.items()):
            unit_seed = seed if i == 0 else int(np.random.SeedSequence([seed, i]).generate_state(1)[0] & 0x7FFFFFFF)
            first = agents[0]
            self.learners[u] = PPO(obs_spec.obs[first], obs_spec.actions[first], self._unit_arch(u), ppo_hp,
                                   unit_seed, device, **self.learner_kwargs(u))
        self.action_specs = obs_spec.actions
        self.env_steps = 0
        self.learn_steps = 0

    def learner_kwargs(self, unit: str) -> dict[str, Any]:
        """What unit `unit`'s PPO learner is built with beyond the common arguments (IPPO: nothing)."""
        return {}

    def critic_input(self, unit: str, obs: Obs) -> Obs | None:
        """A centralised critic's input for unit `unit` from every agent's observations (IPPO: None, its
        critics read their agents' own)."""
        return None

    def value_input(self, unit: str, obs: Obs) -> Obs:
        """What unit `unit`'s critic reads, from every agent's observations."""
        central = self.critic_input(unit, obs)
        return {"obs": self.stack(unit, obs)} if central is None else central

    def _unit_arch(self, unit: str, template: ArchSpec | None = None) -> ArchSpec:
        t = template or self.arch
        first = self.units[unit][0]
        return replace(t, mlp=replace(t.mlp, in_dim=self.ma.obs[first].vector_dim, out_dim=self.ma.actions[first].dim))

    @property
    def env_spec(self) -> MultiAgentSpec:
        """The team's spaces, recorded as data in its checkpoints."""
        return self.ma

    # ---- the Evolvable protocol -------------------------------------------------------------------------
    @property
    def hp(self) -> IPPOHyperparameters:
        return self._hp

    def set_hyperparameter(self, name: str, value: Any) -> None:
        if self.hp_model.model_fields[name].annotation is int:
            value = round(value)
        self._hp = self.hp_model.model_validate({**self._hp.model_dump(), name: value})
        if name in PPOHyperparameters.model_fields:
            for learner in self.learners.values():
                learner.set_hyperparameter(name, value)

    def mutate(self, kind: str, rng: np.random.Generator, settings: MutationSettings) -> str:
        """Architecture and activation: drawn once (by the first unit) and applied to every unit, keeping
        its weights; parameter noise: each unit in turn."""
        first, *rest = self.learners.values()
        desc = first.mutate(kind, rng, settings)
        if kind == "parameters":
            for learner in rest:
                learner.mutate(kind, rng, settings)
        elif kind in ("architecture", "activation"):
            self.arch = replace(first.arch, mlp=replace(first.arch.mlp, in_dim=0, out_dim=0))
            for u, learner in list(self.learners.items())[1:]:
                learner.apply_architecture(self._unit_arch(u))
        return desc

    def describe(self) -> str:
        n = len(self.learners)
        return next(iter(self.learners.values())).describe() + (f" x{n} policies" if n > 1 else "")

    def param_count(self) -> int:
        return sum(learner.param_count() for learner in self.learners.values())

    def reseed(self, seed: int) -> None:
        """Each policy unit's learner gets generators of its own from `seed` (the first takes `seed` itself, so a
        one-agent team draws as a PPO member would)."""
        for i, learner in enumerate(self.learners.values()):
            learner.reseed(int(seed) if i == 0 else
                           int(np.random.SeedSequence([int(seed), i]).generate_state(1)[0]) & 0x7FFFFFFF)

    def clone(self) -> IPPO:
        tensors, meta = self.state()
        return type(self).from_state(self.ma, tensors, meta, self.device)

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors: dict[str, torch.Tensor] = {}
        units = {}
        for u, learner in self.learners.items():
            t, m = learner.state()
            tensors.update({f"unit/{u}/{k}": v for k, v in t.items()})
            units[u] = m
        meta = {"algorithm": self.name, "hp": self._hp.model_dump(), "arch": self.arch.to_dict(), "units": units,
                "env_steps": self.env_steps, "learn_steps": self.learn_steps,
                "action": {a: s.to_dict() for a, s in self.action_specs.items()}}
        return tensors, meta

    @classmethod
    def from_state(cls, obs_spec: MultiAgentSpec, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                   device: str | torch.device = "cpu") -> IPPO:
        if meta.get("algorithm") != cls.name:
            raise ValueError(f"state is for algorithm {meta.get('algorithm')!r}, not {cls.name!r}")
        team = cls(obs_spec, None, ArchSpec.from_dict(meta["arch"]), cls.hp_model.model_validate(meta["hp"]), 0, device)
        if set(meta["units"]) != set(team.learners):
            raise ValueError(f"state has policy units {sorted(meta['units'])}, the env gives {sorted(team.learners)}")
        for u in team.learners:
            prefix = f"unit/{u}/"
            team.learners[u] = PPO.from_state(obs_spec.obs[team.units[u][0]],
                                              {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)},
                                              meta["units"][u], device, **team.learner_kwargs(u))
        team.env_steps, team.learn_steps = int(meta["env_steps"]), int(meta["learn_steps"])
        return team

    # ---- population-batched learning ----------------------------------------------------------------------
    def batch_key(self) -> tuple:
        """Teams with equal keys learn as one group: the same units, each unit's learners of one key."""
        return (self.name, tuple(self.units.items()), *(learner.batch_key() for learner in self.learners.values()))

    @staticmethod
    def group(teams: list[IPPO]) -> IPPOGroup:
        return IPPOGroup(teams)

    # ---- acting -----------------------------------------------------------------------------------------
    def stack(self, unit: str, per_agent: dict[str, Any]) -> Any:
        """The unit's agents' rows stacked agent after agent ([k * N, ...])."""
        parts = [per_agent[a] for a in self.units[unit]]
        if isinstance(parts[0], torch.Tensor):
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def env_actions(self, actions: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {a: self.action_specs[a].to_env(x) for a, x in actions.items()}

    def action_spec_of(self, unit: str) -> ActionSpec:
        return self.action_specs[self.units[unit][0]]


class MAPPO(IPPO):
    """MAPPO: Yu et al., "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games", NeurIPS 2022
    (arXiv:2103.01955). IPPO's units, actors and PPO updates, with each unit's critic centralised: V reads the
    team's joint observation (every agent's observation vector, in env order), so the value of a state is
    learned from what the whole team sees while each actor still acts on its own observations. A unit shared
    by k > 1 agents (``share_policy: group``) appends the agent's one-hot index within the unit, so its one
    critic tells its agents apart (the paper's agent-specific global state)."""

    name: ClassVar[str] = "mappo"
    hp_model = MAPPOHyperparameters

    def _critic_spec(self, unit: str) -> ObsSpec:
        k = len(self.units[unit])
        width = self.ma.vector_dim + (k if k > 1 else 0)
        return ObsSpec(spaces.Box(-np.inf, np.inf, (width,), np.float32))

    def learner_kwargs(self, unit: str) -> dict[str, Any]:
        return {"critic_obs_spec": self._critic_spec(unit)}

    def critic_input(self, unit: str, obs: Obs) -> Obs:
        joint = torch.cat([self.ma.obs[a].preprocess({"obs": obs[a]})[0].reshape(obs[a].shape[0], -1).float()
                           for a in self.agents], dim=1)
        agents = self.units[unit]
        if len(agents) == 1:
            return {"obs": joint}
        n, k = joint.shape[0], len(agents)
        ids = torch.eye(k, device=joint.device).repeat_interleave(n, dim=0)  # agent after agent, as stack() orders rows
        return {"obs": torch.cat([joint.repeat(k, 1), ids], dim=1)}
