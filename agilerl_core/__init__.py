"""agilerl_core: the evolutionary RL engine (pure PyTorch + Gymnasium, no orchestration imports).

The public API (imported on first use, so ``import agilerl_core`` stays cheap)::

    import agilerl_core as ac

    result = ac.evolve("deployments/configs/cartpole_dqn.yaml", env=MyEnv)   # or a dict, or a config
    result.elite.predict(obs)
    policy = ac.load("runs/cartpole-dqn-latest/best")                      # local or s3://

- :func:`evolve`, :class:`EvolveResult`, :class:`Callback`: run a population in this process.
- :func:`load`, :class:`Policy`: any saved member, ready to ``predict`` (RL) or ``generate`` (LLM).
- :func:`validate_config`, :func:`load_config`: the engine's config, checked field by field.
- :class:`ConfigError`, :class:`CheckpointError`: what bad input raises; :class:`BudgetWarning`: what :func:`evolve`
  warns when the step budget pays for fewer than three generations.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "evolve": "agilerl_core.api", "load": "agilerl_core.api", "Policy": "agilerl_core.api",
    "EvolveResult": "agilerl_core.api", "Callback": "agilerl_core.api",
    "GenerationStats": "agilerl_core.results", "TrainResult": "agilerl_core.results",
    "validate_config": "agilerl_core.config", "load_config": "agilerl_core.config",
    "ConfigError": "agilerl_core.errors", "CheckpointError": "agilerl_core.errors",
    "BudgetWarning": "agilerl_core.errors",
}
__all__ = [
    "BudgetWarning",
    "Callback",
    "CheckpointError",
    "ConfigError",
    "EvolveResult",
    "GenerationStats",
    "Policy",
    "TrainResult",
    "__version__",
    "evolve",
    "load",
    "load_config",
    "validate_config",
]

if TYPE_CHECKING:
    from agilerl_core.api import Callback, EvolveResult, Policy, evolve, load
    from agilerl_core.config import load_config, validate_config
    from agilerl_core.errors import BudgetWarning, CheckpointError, ConfigError
    from agilerl_core.results import GenerationStats, TrainResult


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agilerl_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
