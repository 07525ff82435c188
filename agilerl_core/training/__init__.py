"""The generation step and the in-process training loops."""

from agilerl_core.training.generation import TrainResult, derive_seed, evaluate_member, train_member
from agilerl_core.training.off_policy import Experiment, GenerationStats, RunResult, train_off_policy

__all__ = ["Experiment", "GenerationStats", "RunResult", "TrainResult", "derive_seed", "evaluate_member",
           "train_member", "train_off_policy"]
