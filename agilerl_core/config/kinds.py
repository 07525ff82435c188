"""The engine's kinds of experiment config by the ``kind`` tag that tells them apart (default gym): the
table the loader (:mod:`agilerl_core.config.load`) builds its union from and error messages read the tags of."""

from __future__ import annotations

from typing import Any

from agilerl_core.config.bandit import BanditExperimentConfig
from agilerl_core.config.common import _ExperimentBase
from agilerl_core.config.envs import GymExperimentConfig, MultiAgentExperimentConfig, OfflineExperimentConfig
from agilerl_core.config.language import LanguageExperimentConfig
from agilerl_core.config.llm import LLMExperimentConfig


def _kind_tag(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("kind", "gym")
    return getattr(value, "kind", "gym")


EXPERIMENT_KINDS: dict[str, type[_ExperimentBase]] = {"gym": GymExperimentConfig,
                                                      "offline": OfflineExperimentConfig,
                                                      "multi_agent": MultiAgentExperimentConfig,
                                                      "llm": LLMExperimentConfig,
                                                      "language": LanguageExperimentConfig,
                                                      "bandit": BanditExperimentConfig}
