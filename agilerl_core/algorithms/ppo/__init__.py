"""PPO: a member (:mod:`.agent`), its population-batched learning (:mod:`.group`) and the losses both use
(:mod:`.maths`)."""

from agilerl_core.algorithms.ppo.agent import PPO
from agilerl_core.algorithms.ppo.group import PPOGroup
from agilerl_core.algorithms.ppo.maths import minibatch_bounds, ppo_loss, value_loss

__all__ = ["PPO", "PPOGroup", "minibatch_bounds", "ppo_loss", "value_loss"]
