"""Validating and loading configs: :class:`ConfigKinds` (the kinds of config one layer accepts, discriminated
by ``kind``: validation with errors that name each bad field, YAML files with dotted overrides, the JSON
schema), the engine's own (:data:`ENGINE_KINDS`, :data:`ExperimentConfig`) and a config's engine fields as
data."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, Discriminator, Tag, TypeAdapter, ValidationError

from agilerl_core.config.common import _ExperimentBase
from agilerl_core.config.hyperparameters import normalise_algorithm
from agilerl_core.config.kinds import EXPERIMENT_KINDS, _kind_tag
from agilerl_core.config.messages import _format_validation_error
from agilerl_core.config.overrides import _set_dotted
from agilerl_core.errors import ConfigError
from agilerl_core.io.files import read_bytes
from agilerl_core.limits import current as limits_current


class ConfigKinds:
    """The kinds of experiment config one layer accepts (the engine's, or the pipeline's extensions of them),
    discriminated by `kind` (default gym): validation with errors that name each bad field, YAML loading with
    dotted overrides, and the JSON schema."""

    def __init__(self, kinds: dict[str, type[_ExperimentBase]]) -> None:
        self.kinds = dict(kinds)
        members = tuple(Annotated[cls, Tag(kind)] for kind, cls in self.kinds.items())
        self.annotation = Annotated[Union[members],  # noqa: UP007 (a tuple of members: only Union takes one)
                                    Discriminator(_kind_tag, custom_error_type="kind",
                                                  custom_error_message=f"kind: must be one of {', '.join(kinds)}")]
        self.adapter = TypeAdapter(self.annotation)

    def schema(self) -> dict[str, Any]:
        """JSON schema of every kind."""
        return self.adapter.json_schema()

    def validate(self, data: dict[str, Any], source: str = "config") -> Any:
        """A config from plain data, raising ConfigError that names each bad field."""
        if not isinstance(data, dict):
            raise ConfigError(f"invalid config ({source}): expected a mapping of fields, got {type(data).__name__}")
        try:
            return self.adapter.validate_python(data)
        except ValidationError as err:
            model = self.kinds.get(_kind_tag(data), self.kinds["gym"])
            algo = data.get("algorithm", getattr(model, "default_algorithm", None))
            algo = normalise_algorithm(algo) if isinstance(algo, str) else None
            raise ConfigError(_format_validation_error(err, source, model, algo)) from None

    def load(self, path: str | Path, overrides: dict[str, Any] | None = None) -> Any:
        """Load a YAML config file and apply dotted overrides (`hyperparameters.lr`: 3e-4)."""
        data = read_config_file(path)
        for key, value in (overrides or {}).items():
            _set_dotted(data, key, value)
        return self.validate(data, source=str(path))

    def resolve(self, config: Any, overrides: dict[str, Any] | None = None, leave_out: tuple[str, ...] = (),
                env_id: str | None = None) -> tuple[Any, dict[str, Any]]:
        """A config of these kinds from a YAML path, a mapping or a config object, with dotted `overrides`
        applied (then validated again), and the top-level sections of `leave_out` (sections another layer reads)
        it held, left out: ``(config, {section: its value})``. `env_id` (an env factory's label,
        given as ``env=``) replaces the config's env id and entry point."""
        if isinstance(config, str | Path):
            data, source = read_config_file(config), str(config)
        elif isinstance(config, BaseModel):
            kind = getattr(config, "kind", None)
            if kind not in self.kinds:
                raise ConfigError(f"config: a {type(config).__name__} is not an experiment config; pass a YAML path, "
                                  f"a dict or a config from validate_config")
            if not overrides and env_id is None and isinstance(config, self.kinds[kind]):
                return config, {}
            data, source = config.model_dump(include=set(self.kinds[kind].model_fields)), "config"  # secrets kept
        elif isinstance(config, dict):
            data, source = copy.deepcopy(config), "config"
        else:
            raise ConfigError(f"config: expected a YAML path, a dict or a config object, got {type(config).__name__}")
        left_out = {name: data.pop(name) for name in leave_out if data.get(name) is not None}
        for key, value in (overrides or {}).items():
            _set_dotted(data, key, value)
        if env_id is not None:
            if _kind_tag(data) == "llm":
                raise ConfigError("env: an LLM config takes no env (its tasks come from `dataset` and `rewards`)")
            data["env_id"] = env_id
            data.pop("env_entry_point", None)
        return self.validate(data, source), left_out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds; a ConfigError naming the file when it is missing or not one."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass the path of a YAML config "
                          f"such as deployments/configs/cartpole_dqn.yaml")
    raw = read_bytes(path, limits_current().json_bytes, "json_bytes", f"config file {str(path)!r}", ConfigError)
    try:
        data = yaml.safe_load(raw.decode("utf-8", errors="replace")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of fields at the top level")
    return data


ENGINE_KINDS = ConfigKinds(EXPERIMENT_KINDS)
ExperimentConfig = ENGINE_KINDS.annotation
"""One evolution run as the engine reads it, discriminated by `kind` (default gym)."""


def config_schema() -> dict[str, Any]:
    """JSON schema of every kind of engine config."""
    return ENGINE_KINDS.schema()


def engine_data(cfg: Any) -> dict[str, Any]:
    """A config's engine fields as JSON data: a pipeline config's own sections left out."""
    return cfg.model_dump(mode="json", include=set(EXPERIMENT_KINDS[cfg.kind].model_fields))


def validate_config(data: dict[str, Any], source: str = "config") -> ExperimentConfig:
    """Build an engine ExperimentConfig from plain data, raising ConfigError that names each bad field."""
    return ENGINE_KINDS.validate(data, source)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load a YAML engine config file and apply dotted overrides (`hyperparameters.lr`: 3e-4)."""
    return ENGINE_KINDS.load(path, overrides)
