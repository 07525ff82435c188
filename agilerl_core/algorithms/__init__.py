"""RL algorithms on a small shared base."""

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.dqn import DQN, linear_epsilon
from agilerl_core.algorithms.optim import FlatAdam
from agilerl_core.algorithms.registry import get_algorithm

__all__ = ["DQN", "FlatAdam", "RLAlgorithm", "get_algorithm", "linear_epsilon"]
