"""The continuous-action off-policy family (DDPG, TD3, SAC; CQL builds on SAC): members (:mod:`.agent`), their
population-batched learning (:mod:`.group`) and the maths both use (:mod:`.maths`)."""

from agilerl_core.algorithms.actor_critic.agent import DDPG, SAC, TD3, ContinuousActorCritic
from agilerl_core.algorithms.actor_critic.group import ActorCriticGroup, SACGroup, TD3Group
from agilerl_core.algorithms.actor_critic.maths import alpha_loss, squashed_log_prob

__all__ = ["DDPG", "SAC", "TD3", "ActorCriticGroup", "ContinuousActorCritic",
           "SACGroup", "TD3Group", "alpha_loss", "squashed_log_prob"]
