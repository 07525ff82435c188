"""The engine's experiment config: one pydantic model per kind of experiment, loaded from YAML, validated
before any work starts. Every field carries a one-line description; errors name the field (dotted path) and
the allowed values.

The engine reads only what trains and evaluates a population (and where its checkpoints live). The pipeline
extends each kind with its own sections (runner, tracking, schedule: :mod:`tasks.config`) through
:class:`ConfigKinds`; the engine never reads them.

Where things are, bottom first (each module imports only those above it in this list):

- :mod:`~agilerl_core.config.hyperparameters`: the algorithms of each kind, its ``hyperparameters`` union and
  the completion of ``hp_space`` overrides;
- :mod:`~agilerl_core.config.common`: what every kind shares (mutation, tournament, selection, storage, champion,
  the run name) and ``_ExperimentBase``;
- :mod:`~agilerl_core.config.network`: the RL members' networks (MLP, CNN, Dict encoders, RNN core);
- :mod:`~agilerl_core.config.envs`: the gym, offline and multi_agent kinds (env, wrappers, backend, dataset);
- :mod:`~agilerl_core.config.language`: the language kind (Wordle, the GPT, the games learnt from);
- :mod:`~agilerl_core.config.llm`: the llm kind (base model, LoRA, prompts, rewards, adapter mutations);
- :mod:`~agilerl_core.config.kinds`: the table of the engine's kinds by their ``kind`` tag;
- :mod:`~agilerl_core.config.messages`: the text of a refusal, with Stable-Baselines3's names translated;
- :mod:`~agilerl_core.config.overrides`: ``--set KEY=VALUE`` parsing and dotted keys;
- :mod:`~agilerl_core.config.load`: :class:`ConfigKinds`, :func:`validate_config`, :func:`load_config`,
  :func:`config_schema`, :func:`engine_data`.

The fields that name code and the allowlist a flow-run parameter is checked against live in
:mod:`agilerl_core.code_refs` (re-exported here).
"""

from __future__ import annotations

from agilerl_core.code_refs import (
    TRUSTED_MODULES_ENV,
    check_code_allowed,
    code_references,
    module_allowed,
    trusted_modules_from_env,
)
from agilerl_core.config.bandit import BANDIT_ALGORITHMS, BanditDataConfig, BanditExperimentConfig
from agilerl_core.config.common import (
    RUN_NAME_MAX,
    ChampionConfig,
    MutationConfig,
    SelectionConfig,
    StorageConfig,
    TournamentConfig,
    check_run_name,
)
from agilerl_core.config.envs import (
    DatasetConfig,
    FitnessConfig,
    GymExperimentConfig,
    MultiAgentExperimentConfig,
    OfflineExperimentConfig,
    WrapperConfig,
)
from agilerl_core.config.hyperparameters import (
    GYM_ALGORITHMS,
    LANGUAGE_ALGORITHMS,
    LLM_ALGORITHMS,
    MULTI_AGENT_ALGORITHMS,
    OFFLINE_ALGORITHMS,
    OFFLINE_GAME_ALGORITHMS,
    GymHyperparameters,
    LanguageHyperparameterModels,
    LLMHyperparameterModels,
    MultiAgentHyperparameters,
    OfflineHyperparameters,
    normalise_algorithm,
)
from agilerl_core.config.kinds import EXPERIMENT_KINDS
from agilerl_core.config.language import GameDatasetConfig, GPTConfig, LanguageExperimentConfig, WordleConfig
from agilerl_core.config.llm import (
    LLMExperimentConfig,
    LLMModelConfig,
    LLMMutationConfig,
    LoraSettings,
    PromptDatasetConfig,
    RewardConfig,
)
from agilerl_core.config.load import (
    ENGINE_KINDS,
    ConfigKinds,
    ExperimentConfig,
    config_schema,
    engine_data,
    load_config,
    read_config_file,
    validate_config,
)
from agilerl_core.config.messages import SB3_ALGORITHMS, SB3_FIELDS
from agilerl_core.config.network import ACTIVATIONS, CNNConfig, NetworkConfig, RNNConfig, VectorEncoderConfig
from agilerl_core.config.overrides import parse_overrides

__all__ = [
    "ACTIVATIONS",
    "BANDIT_ALGORITHMS",
    "ENGINE_KINDS",
    "EXPERIMENT_KINDS",
    "GYM_ALGORITHMS",
    "LANGUAGE_ALGORITHMS",
    "LLM_ALGORITHMS",
    "MULTI_AGENT_ALGORITHMS",
    "OFFLINE_ALGORITHMS",
    "OFFLINE_GAME_ALGORITHMS",
    "RUN_NAME_MAX",
    "SB3_ALGORITHMS",
    "SB3_FIELDS",
    "TRUSTED_MODULES_ENV",
    "BanditDataConfig",
    "BanditExperimentConfig",
    "CNNConfig",
    "ChampionConfig",
    "ConfigKinds",
    "DatasetConfig",
    "ExperimentConfig",
    "FitnessConfig",
    "GPTConfig",
    "GameDatasetConfig",
    "GymExperimentConfig",
    "GymHyperparameters",
    "LLMExperimentConfig",
    "LLMHyperparameterModels",
    "LLMModelConfig",
    "LLMMutationConfig",
    "LanguageExperimentConfig",
    "LanguageHyperparameterModels",
    "LoraSettings",
    "MultiAgentExperimentConfig",
    "MultiAgentHyperparameters",
    "MutationConfig",
    "NetworkConfig",
    "OfflineExperimentConfig",
    "OfflineHyperparameters",
    "PromptDatasetConfig",
    "RNNConfig",
    "RewardConfig",
    "SelectionConfig",
    "StorageConfig",
    "TournamentConfig",
    "VectorEncoderConfig",
    "WordleConfig",
    "WrapperConfig",
    "check_code_allowed",
    "check_run_name",
    "code_references",
    "config_schema",
    "engine_data",
    "load_config",
    "module_allowed",
    "normalise_algorithm",
    "parse_overrides",
    "read_config_file",
    "trusted_modules_from_env",
    "validate_config",
]
