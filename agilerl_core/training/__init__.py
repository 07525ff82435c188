"""The generation step and the in-process training loops."""

from agilerl_core.training.experiment import Experiment, GenerationStats, RunResult, train_local
from agilerl_core.training.generation import TrainResult, derive_seed, evaluate_member, train_member

__all__ = [
           "Experiment",
           "GenerationStats",
           "RunResult",
           "TrainResult",
           "derive_seed",
           "evaluate_member",
           "train_local",
           "train_member",
]
