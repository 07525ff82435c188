"""``--set KEY=VALUE`` overrides: values read as YAML scalars, applied to a config's data by dotted key
(``hyperparameters.lr=3e-4``)."""

from __future__ import annotations

import contextlib
from typing import Any

import yaml

from agilerl_core.errors import ConfigError


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section, cannot set a field inside it")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Parse CLI `key=value` pairs; values are read as YAML scalars (`lr=3e-4`, `double=false`)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set hyperparameters.lr=3e-4")
        key, raw = pair.split("=", 1)
        if not key:
            raise ConfigError(f"--set {pair!r}: empty key")
        value = yaml.safe_load(raw) if raw != "" else ""
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        out[key.strip()] = value
    return out
