"""One table of the sizes the project accepts from what it reads: configs, checkpoints, datasets, lineage
records, LLM bases. Every size a file (or a flow-run parameter) declares is checked here *before* anything is
allocated from it, so a small tampered input never causes a large allocation; the refusal names the file, the
field and the limit to raise.

The defaults fit every shipped config with room to spare. A user raises a limit in their own config's
``limits:`` section (``limits: {layer_width: 16384}``), or for a load with ``agilerl_core.load(path,
limits={...})``. A flow-run parameter cannot raise one beyond the deployment's own config (see
``tasks/trust.py``).

Code that runs on behalf of a config enters :func:`applied` with the config's limits; readers call
:func:`check` (or read :func:`current`), which sees the limits of the innermost :func:`applied` of the
calling context (a thread a task runner starts copies its context; a worker process applies the config it is
handed).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agilerl_core.errors import AgileRLError, ConfigError


class Limits(BaseModel):
    """The largest sizes accepted from configs, checkpoints, datasets and records (raise one in ``limits:``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)

    layer_width: int = Field(8192, ge=1, description="Units of one hidden layer, channels of one conv layer, "
                                                     "hidden size of a recurrent core.")
    layer_count: int = Field(64, ge=1, description="Hidden layers of one network (or conv layers of an encoder).")
    network_params: int = Field(100_000_000, ge=1, description="Parameters of one member's networks (all heads "
                                                               "together), counted before they are built.")
    space_elements: int = Field(4_194_304, ge=1, description="Elements of one observation or action space "
                                                             "(product of a Box's shape; sub-spaces summed).")
    discrete_n: int = Field(1_000_000, ge=1, description="Choices of one Discrete (or MultiDiscrete entry) space.")
    population_size: int = Field(65_536, ge=1, description="Members of a population (slots of a lineage record).")
    num_envs: int = Field(65_536, ge=1, description="Vectorised envs of one member.")
    buffer_size: int = Field(100_000_000, ge=1, description="Transitions a replay buffer holds (per member).")
    member_id: int = Field(2**53, ge=1, description="Largest member id (a counter: exact in JSON and float64).")
    dataset_bytes: int = Field(64 * 2**30, ge=1, description="Bytes one dataset array expands to when read.")
    dataset_expansion: int = Field(1_000, ge=1, description="How many times larger than its stored bytes an "
                                                           "HDF5 array may expand (compression, fill values).")
    dataset_records: int = Field(10_000_000, ge=1, description="Records of one prompt, preference or game set "
                                                              "(rows of a Parquet file, lines of a JSONL file).")
    record_bytes: int = Field(4 * 2**20, ge=1, description="Bytes of one record of a prompt, preference or game set "
                                                          "(one JSONL line, one Parquet row's text).")
    bandit_arms: int = Field(1_024, ge=1, description="Arms of a contextual bandit (distinct labels of its table, "
                                                     "choices of its env's actions): every arm is scored for every "
                                                     "context.")
    llm_params: int = Field(2_000_000_000, ge=1, description="Parameters of an LLM base read from files, "
                                                             "counted from its config before any tensor is built.")
    llm_config_params: int = Field(200_000_000, ge=1, description="Parameters of an LLM base built from a "
                                                                  "config (random weights: tests, benchmarks, "
                                                                  "from-scratch models).")
    llm_layers: int = Field(1_024, ge=1, description="Layers of an LLM base's config (num_hidden_layers, n_layer, "
                                                     "...) and experts of one MoE layer: checked before its "
                                                     "parameters are counted.")
    json_bytes: int = Field(256 * 2**20, ge=1, description="Bytes of one JSON record file (member, population, "
                                                           "manifest, lineage, lease, dataset attributes).")
    json_depth: int = Field(64, ge=1, description="Nesting depth of one JSON record.")
    json_digits: int = Field(400, ge=1, description="Digits of one number in a JSON record.")


DEFAULT = Limits()
_current: contextvars.ContextVar[Limits] = contextvars.ContextVar("agilerl_limits", default=DEFAULT)


def current() -> Limits:
    """The limits in force in this context (the defaults outside any :func:`applied`)."""
    return _current.get()


def as_limits(value: Limits | dict[str, Any] | None) -> Limits:
    """`value` as Limits (None: the ones in force); a ConfigError naming a bad field."""
    if value is None:
        return current()
    if isinstance(value, Limits):
        return value
    try:
        return Limits(**dict(value))
    except Exception as err:  # pydantic's ValidationError, or a non-mapping
        raise ConfigError(f"limits: {err}; every limit is a positive integer (see docs/security.md)") from None


@contextlib.contextmanager
def applied(value: Limits | dict[str, Any] | None) -> Iterator[Limits]:
    """Run the body under `value`'s limits (None: leave them as they are)."""
    limits = as_limits(value)
    token = _current.set(limits)
    try:
        yield limits
    finally:
        _current.reset(token)


def check(name: str, value: Any, where: str, error: type[AgileRLError] = ConfigError,
          limits: Limits | None = None) -> int:
    """`value` as a non-negative int no larger than limit `name`; otherwise `error` naming `where` (the file and
    field, e.g. ``runs/x/member.json: field agent.arch.hidden[0]``) and the limit to raise."""
    lim = limits or current()
    bound = getattr(lim, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and (not math.isfinite(value) or value != int(value))):
        raise error(f"{where}: {value!r} is not a whole number")
    value = int(value)
    if value < 0:
        raise error(f"{where}: {value} is negative")
    if value > bound:
        raise error(f"{where}: {value:,} is over the limit limits.{name} = {bound:,}; if this size is meant, raise "
                    f"limits.{name} in your own config (or agilerl_core.load(..., limits={{'{name}': ...}}))")
    return value


def fits(name: str, value: int, limits: Limits | None = None) -> bool:
    """Whether `value` is within limit `name` (no error)."""
    return 0 <= value <= getattr(limits or current(), name)
