"""The continuous-action off-policy family (DDPG, TD3, SAC; CQL builds on SAC): members (:mod:`.agent`), their
population-batched learning (:mod:`.group`), the maths both use (:mod:`.maths`) and exploration noise
(:mod:`.noise`)."""

from agilerl_core.algorithms.actor_critic.agent import DDPG, SAC, TD3, ContinuousActorCritic
from agilerl_core.algorithms.actor_critic.group import ActorCriticGroup, SACGroup, TD3Group
from agilerl_core.algorithms.actor_critic.maths import alpha_loss, squashed_log_prob
from agilerl_core.algorithms.actor_critic.noise import GaussianNoise, OUNoise

__all__ = ["DDPG", "SAC", "TD3", "ActorCriticGroup", "ContinuousActorCritic", "GaussianNoise", "OUNoise",
           "SACGroup", "TD3Group", "alpha_loss", "squashed_log_prob"]
