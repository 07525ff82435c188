"""Algorithms by config name, with their traits: hyperparameter model, the kinds of experiment they train in
and the arena that trains them there, on- or off-policy.

The table holds no algorithm class: an implementation is imported on first use (``get_algorithm``), so the
config (which builds its unions from this table) validates without importing torch or any algorithm.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from agilerl_core.algorithms.hyperparameters.bandit import (
    NeuralEpsilonGreedyHyperparameters,
    NeuralTSHyperparameters,
    NeuralUCBHyperparameters,
)
from agilerl_core.algorithms.hyperparameters.base import Hyperparameters
from agilerl_core.algorithms.hyperparameters.bc import BCHyperparameters
from agilerl_core.algorithms.hyperparameters.cql import CQLHyperparameters, CQNHyperparameters
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters, RainbowHyperparameters
from agilerl_core.algorithms.hyperparameters.ippo import IPPOHyperparameters, MAPPOHyperparameters
from agilerl_core.algorithms.hyperparameters.language import BCLMHyperparameters, ILQLHyperparameters
from agilerl_core.algorithms.hyperparameters.llm import (
    CISPOHyperparameters,
    DPOHyperparameters,
    GRPOHyperparameters,
    GSPOHyperparameters,
    LLMBCHyperparameters,
    LLMILQLHyperparameters,
    LLMPPOHyperparameters,
    REINFORCEHyperparameters,
    SFTHyperparameters,
)
from agilerl_core.algorithms.hyperparameters.maddpg import MADDPGHyperparameters, MATD3Hyperparameters
from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters
from agilerl_core.algorithms.hyperparameters.sac import SACHyperparameters
from agilerl_core.algorithms.hyperparameters.td3 import DDPGHyperparameters, TD3Hyperparameters


@dataclass(frozen=True)
class AlgorithmInfo:
    """One algorithm's traits."""

    name: str
    hp_model: type[Hyperparameters]
    implementation: str  # "module:Class", imported on first use
    arenas: dict[str, str]  # experiment kind -> the arena that trains it there; the first kind is its home
    on_policy: bool = False  # learns only from its own fresh rollouts (no replay, no fixed dataset)

    @property
    def home(self) -> str:
        """The kind of experiment the algorithm was made for."""
        return next(iter(self.arenas))

    @property
    def offline_only(self) -> bool:
        return tuple(self.arenas) == ("offline",)


_OFF_POLICY = {"gym": "gym_off_policy", "offline": "offline"}
_OFFLINE_FIRST = {"offline": "offline", "gym": "gym_off_policy"}
ALGORITHMS: dict[str, AlgorithmInfo] = {a.name: a for a in (
    AlgorithmInfo("dqn", DQNHyperparameters, "agilerl_core.algorithms.dqn:DQN", _OFF_POLICY),
    AlgorithmInfo("rainbow", RainbowHyperparameters, "agilerl_core.algorithms.dqn:Rainbow", _OFF_POLICY),
    AlgorithmInfo("ddpg", DDPGHyperparameters, "agilerl_core.algorithms.actor_critic:DDPG", _OFF_POLICY),
    AlgorithmInfo("td3", TD3Hyperparameters, "agilerl_core.algorithms.actor_critic:TD3", _OFF_POLICY),
    AlgorithmInfo("sac", SACHyperparameters, "agilerl_core.algorithms.actor_critic:SAC", _OFF_POLICY),
    AlgorithmInfo("ppo", PPOHyperparameters, "agilerl_core.algorithms.ppo:PPO", {"gym": "gym_on_policy"},
                  on_policy=True),
    AlgorithmInfo("cqn", CQNHyperparameters, "agilerl_core.algorithms.cql:CQN", _OFFLINE_FIRST),
    AlgorithmInfo("cql", CQLHyperparameters, "agilerl_core.algorithms.cql:CQL", _OFFLINE_FIRST),
    AlgorithmInfo("bc", BCHyperparameters, "agilerl_core.algorithms.bc:BC", {"offline": "offline"}),
    AlgorithmInfo("maddpg", MADDPGHyperparameters, "agilerl_core.algorithms.maddpg:MADDPG",
                  {"multi_agent": "multi_agent_off_policy"}),
    AlgorithmInfo("matd3", MATD3Hyperparameters, "agilerl_core.algorithms.maddpg:MATD3",
                  {"multi_agent": "multi_agent_off_policy"}),
    AlgorithmInfo("ippo", IPPOHyperparameters, "agilerl_core.algorithms.ippo:IPPO",
                  {"multi_agent": "multi_agent_on_policy"}, on_policy=True),
    AlgorithmInfo("mappo", MAPPOHyperparameters, "agilerl_core.algorithms.ippo:MAPPO",
                  {"multi_agent": "multi_agent_on_policy"}, on_policy=True),
    AlgorithmInfo("grpo", GRPOHyperparameters, "agilerl_core.llm.grpo:GRPO", {"llm": "llm"}, on_policy=True),
    AlgorithmInfo("reinforce", REINFORCEHyperparameters, "agilerl_core.llm.reinforce:REINFORCE", {"llm": "llm"},
                  on_policy=True),
    AlgorithmInfo("llm_ppo", LLMPPOHyperparameters, "agilerl_core.llm.ppo:LLMPPO", {"llm": "llm"},
                  on_policy=True),
    AlgorithmInfo("dpo", DPOHyperparameters, "agilerl_core.llm.dpo:DPO", {"llm": "llm"}),
    AlgorithmInfo("sft", SFTHyperparameters, "agilerl_core.llm.sft:SFT", {"llm": "llm"}),
    AlgorithmInfo("llm_bc", LLMBCHyperparameters, "agilerl_core.llm.ilql:LLMBC", {"llm": "llm"}),
    AlgorithmInfo("llm_ilql", LLMILQLHyperparameters, "agilerl_core.llm.ilql:LLMILQL", {"llm": "llm"}),
    AlgorithmInfo("gspo", GSPOHyperparameters, "agilerl_core.llm.gspo:GSPO", {"llm": "llm"}, on_policy=True),
    AlgorithmInfo("cispo", CISPOHyperparameters, "agilerl_core.llm.cispo:CISPO", {"llm": "llm"},
                  on_policy=True),
    AlgorithmInfo("bc_lm", BCLMHyperparameters, "agilerl_core.language.bc_lm:BCLM", {"language": "language"}),
    AlgorithmInfo("ilql", ILQLHyperparameters, "agilerl_core.language.ilql:ILQL", {"language": "language"}),
    AlgorithmInfo("neural_ucb", NeuralUCBHyperparameters, "agilerl_core.algorithms.neural_bandit:NeuralUCB",
                  {"bandit": "bandit"}),
    AlgorithmInfo("neural_ts", NeuralTSHyperparameters, "agilerl_core.algorithms.neural_bandit:NeuralTS",
                  {"bandit": "bandit"}),
    AlgorithmInfo("neural_eps_greedy", NeuralEpsilonGreedyHyperparameters,
                  "agilerl_core.algorithms.neural_bandit:NeuralEpsilonGreedy", {"bandit": "bandit"}),
)}


def algorithms_for_kind(kind: str) -> tuple[str, ...]:
    """Names of the algorithms that train in experiments of `kind` (config order)."""
    return tuple(n for n, a in ALGORITHMS.items() if kind in a.arenas)


def algorithm_info(name: str) -> AlgorithmInfo:
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; available: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


def get_algorithm(name: str) -> type:
    """The algorithm's class (imports its module)."""
    module, _, cls = algorithm_info(name).implementation.partition(":")
    return getattr(importlib.import_module(module), cls)


def algorithms_for(action_kind: str, kind: str) -> list[str]:
    """Names of the algorithms made for experiments of `kind` (or able to learn there, offline) that act in
    spaces of `action_kind` ("discrete" or "box"): what an error suggests instead of a misfit."""
    names = [n for n, a in ALGORITHMS.items() if a.home == kind or (kind == "offline" and kind in a.arenas)]
    return sorted(n for n in names if action_kind in get_algorithm(n).action_kinds)
