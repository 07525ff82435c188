"""MADDPG: Lowe et al., "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive Environments",
NeurIPS 2017; and MATD3 (Ackermann et al., "Reducing Overestimation Bias in Multi-Agent Domains Using
Double Centralized Critics", 2019) as MADDPG with TD3's three changes switched on.

Every agent has a deterministic actor on its own observation and a centralised critic Q_i(x, a_1..a_N)
on every agent's observation (x, concatenated) and action. With ``share_policy: group`` identical agents
(``agent_0``, ``agent_1``, ...) act through one actor of their group, whose gradient sums every agent's
term; each agent keeps its own critic (its own reward). Box actions are tanh-bounded in [-1, 1]
(scaled to the env's bounds by its ActionSpec); Discrete actions are one-hot in the critics, explored by
sampling the actor's softmax, and trained through a straight-through Gumbel-softmax sample. Every random
number comes from keyed streams whose key the team draws from its own generator (so runs repeat bit for bit,
alone or in a group).

* critic_i: y_i = r_i + gamma (1 - done_i) min_c Q'_c,i(x', mu'_1(o'_1), .., mu'_N(o'_N)), regressed
  on the rows where agent i acted (an agent dead for the rest of an episode contributes nothing);
* actor_i: maximise Q_1,i(x, a_1, .., mu_i(o_i), .., a_N), the other agents' actions from the batch;
* MATD3: two critics per agent (the minimum in the target), actors and targets every ``policy_freq``
  critic steps, clipped Gaussian noise on the target's Box actions.

All networks share one architecture template, so one architecture or activation mutation changes every
agent's actor and critics together (and keeps their trained weights). The same template lets the critics
live stacked in one buffer, so a learn step evaluates and steps all of them at once; each critic keeps its
own parameters, loss and Adam state.

This module holds a team: its networks, greedy acting and state. Exploring and learning are written once for a
population of teams in :mod:`agilerl_core.algorithms.maddpg.group`; a team alone is a group of one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.hyperparameters.maddpg import MADDPGHyperparameters, MATD3Hyperparameters
from agilerl_core.algorithms.maddpg.group import MADDPGGroup
from agilerl_core.algorithms.optim import FlatAdam, stack_parameters
from agilerl_core.buffers.replay import AgentTensors
from agilerl_core.envs.multi_agent import policy_units
from agilerl_core.envs.spaces import ActionSpec, MultiAgentSpec, Obs, ObsSpec
from agilerl_core.networks.evolvable import ArchSpec, EvolvableNetwork
from agilerl_core.networks.stacked import stackable


class MADDPG(RLAlgorithm):
    """MADDPG over any mix of Discrete and Box agents (see the module doc)."""

    name: ClassVar[str] = "maddpg"
    hp_model = MADDPGHyperparameters
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "box")
    group_class = MADDPGGroup

    def __init__(self, obs_spec: MultiAgentSpec, action: dict[str, ActionSpec] | None, arch: ArchSpec, hp,
                 seed: int, device: str | torch.device = "cpu") -> None:
        self.ma = obs_spec
        self.agents = obs_spec.agents
        # policy units: one actor per agent, or one per group of identical agents (share_policy: group)
        self.units = policy_units(obs_spec, getattr(hp, "share_policy", "agent"))
        self.unit_of = {a: u for u, agents in self.units.items() for a in agents}
        critics = ("critic_1", "critic_2") if hp.twin_q else ("critic_1",)
        self.critic_names = critics
        self.online_networks = (*(f"actor.{u}" for u in self.units),
                                *(f"{c}.{a}" for c in critics for a in self.agents))
        self.target_networks = {f"{n}.target": n for n in self.online_networks}
        self.noise_networks = tuple(f"actor.{u}" for u in self.units)
        super().__init__(obs_spec, action if action is not None else obs_spec.actions, arch, hp, seed, device)

    # ---- spaces and networks ----------------------------------------------------------------------------
    def init_actions(self, action: Any) -> None:
        actions = {a: action[a] if isinstance(action[a], ActionSpec) else ActionSpec.from_dict(action[a])
                   for a in self.agents}
        self.action_specs = actions
        self.action_dim = sum(s.dim for s in actions.values())
        self.action_spec = None  # one per agent: action_specs

    @property
    def env_spec(self) -> MultiAgentSpec:
        return self.ma

    def action_meta(self) -> Any:
        return {a: s.to_dict() for a, s in self.action_specs.items()}

    @classmethod
    def action_from_meta(cls, meta: dict[str, Any]) -> Any:
        return meta["action"]

    def network_obs_spec(self, name: str) -> ObsSpec:
        kind, _, who = name.partition(".")
        return self.ma.obs[self.units[who][0]] if kind == "actor" else self.ma.joint

    def network_arch(self, arch: ArchSpec, name: str) -> ArchSpec:
        kind, _, who = name.partition(".")
        if kind == "actor":
            agent = self.units[who][0]  # a unit's agents have identical spaces
            in_dim, out = self.ma.obs[agent].vector_dim, self.action_specs[agent].dim
        else:
            in_dim, out = self.ma.joint.vector_dim + self.action_dim, 1
        return replace(arch, mlp=replace(arch.mlp, in_dim=in_dim, out_dim=out))

    def lr_field_for(self, name: str) -> str:
        return "lr_actor" if name.startswith("actor.") else "lr_critic"

    # ---- acting (through its group: agilerl_core.algorithms.acting) ----------------------------------------
    def env_actions(self, actions: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Agent-scale actions -> what the env takes (a Box's bounds and shape)."""
        return {a: self.action_specs[a].to_env(x) for a, x in actions.items()}

    # ---- population-batched learning ----------------------------------------------------------------------
    def batch_key(self) -> tuple:
        """Teams with equal keys learn as one group: the same agents, architecture (hidden widths may differ)
        and critics; rates, gamma, tau, noise, temperature and policy_freq are per team."""
        return self._group_key(self.critic_names, self.hp.max_grad_norm, tuple(self.units.items()))

    def joint_action(self, actions: AgentTensors) -> torch.Tensor:
        """The critics' action input: every agent's action (Discrete ones one-hot), concatenated in agent order."""
        parts = []
        for a in self.agents:
            spec, x = self.action_specs[a], actions[a]
            parts.append(F.one_hot(x.long().reshape(-1), spec.dim).to(torch.float32) if spec.discrete and
                         x.dtype in (torch.int64, torch.int32) else x.reshape(x.shape[0], -1).to(torch.float32))
        return torch.cat(parts, dim=1)

    def q(self, critic: str, agent: str, obs: Obs, joint_action: torch.Tensor, target: bool = False) -> torch.Tensor:
        name = f"{critic}.{agent}" + (".target" if target else "")
        return self.networks[name](obs, joint_action).squeeze(1)

    # ---- optimisers: the critics stacked ------------------------------------------------------------------
    def install_optimizers(self, online: dict[str, EvolvableNetwork], targets: dict[str, EvolvableNetwork]) -> None:
        """Actors keep an Adam each; every critic (and every target critic) lives in one stacked buffer, so a
        learn step evaluates all of them in one batched pass and takes one Adam step."""
        critics = [n for n in self.online_networks if not n.startswith("actor.")]
        nets = [online[n] for n in critics]
        if not stackable(nets):
            raise ValueError(f"{self.name}'s networks must be plain MLPs (flat observations, no noisy layers)")
        super().install_optimizers({n: net for n, net in online.items() if n.startswith("actor.")},
                                   {n: net for n, net in targets.items() if n.startswith("actor.")})
        critic_adam = FlatAdam(nets, self.lr_for(critics[0]), stack=True)
        for i, n in enumerate(critics):
            self.optimizers[n] = critic_adam.view(i)
        self.critic_target_flat, _ = stack_parameters([targets[f"{n}.target"] for n in critics], with_grad=False)

    @property
    def critic_adam(self) -> FlatAdam:
        """The one Adam of every critic (their weights stacked, critic after critic)."""
        return next(o.adam for n, o in self.optimizers.items() if not n.startswith("actor."))

    def target_buffers(self) -> dict[str, torch.Tensor]:
        return {**self.target_flat, "critics.target": self.critic_target_flat}

    def weight_buffers(self) -> dict[str, torch.Tensor]:
        """The actors' and critics' weights, then the targets': each target critic its segment of the stacked
        target buffer (critic after critic, as the online critics lie in theirs)."""
        critics = [n for n in self.online_networks if not n.startswith("actor.")]
        size = self.critic_target_flat.numel() // len(critics)
        stacked = {f"{n}.target": self.critic_target_flat[i * size: (i + 1) * size] for i, n in enumerate(critics)}
        out = {n: self.optimizers[n].flat for n in self.online_networks}
        out.update({t: self.target_flat[t] if t in self.target_flat else stacked[t] for t in self.target_networks})
        return out

    def set_target_buffer(self, name: str, flat: torch.Tensor) -> None:
        if name == "critics.target":
            self.critic_target_flat = flat
        else:
            self.target_flat[name] = flat


class MATD3(MADDPG):
    """MATD3: MADDPG with twin critics, delayed actors and target smoothing (the hyperparameters' defaults)."""

    name: ClassVar[str] = "matd3"
    hp_model = MATD3Hyperparameters
