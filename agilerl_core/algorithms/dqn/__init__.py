"""The DQN family (DQN, Rainbow; CQN builds on it): a member (:mod:`.agent`), its population-batched
learning (:mod:`.group`) and the maths both use (:mod:`.maths`)."""

from agilerl_core.algorithms.dqn.agent import DQN, Rainbow
from agilerl_core.algorithms.dqn.group import DQNGroup
from agilerl_core.algorithms.dqn.maths import categorical_projection, linear_epsilon, mask_invalid

__all__ = ["DQN", "DQNGroup", "Rainbow", "categorical_projection", "linear_epsilon", "mask_invalid"]
