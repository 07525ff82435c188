"""Which algorithms each kind of experiment trains and the ``hyperparameters`` section each kind takes: one
union of the algorithms' hyperparameter models per kind, discriminated by the algorithm (the registry's
table, so a new algorithm needs no edit here); algorithm names as the registry spells them; and partial
``hp_space`` overrides completed from the algorithm's declared space."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Tag, ValidationError

from agilerl_core.algorithms.hyperparameters.base import HP_TAG
from agilerl_core.algorithms.registry import ALGORITHMS, algorithms_for_kind
from agilerl_core.hpo.space import HyperparameterSpec


def _schema_any_hyperparameters(schema: dict[str, Any]) -> None:
    """JSON Schema `oneOf` demands exactly one match, but a DQN section also matches Rainbow's (same
    fields, other defaults), so servers validating parameters (Prefect) would refuse it: use anyOf.
    Which model applies is decided by `algorithm` when the config is validated."""
    hp = schema.get("properties", {}).get("hyperparameters", {})
    if "oneOf" in hp:
        hp["anyOf"] = hp.pop("oneOf")
        hp.pop("discriminator", None)


def _hp_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get(HP_TAG)
    return getattr(value, "algorithm_name", None)


def _hyperparameter_union(kind: str) -> Any:
    """The hyperparameter models of every algorithm that trains in experiments of `kind`, as one union
    discriminated by the algorithm (the registry's table, so a new algorithm needs no edit here)."""
    members = tuple(Annotated[ALGORITHMS[n].hp_model, Tag(n)] for n in algorithms_for_kind(kind))
    return Annotated[Union[members], Discriminator(_hp_tag)]  # noqa: UP007 (a runtime-built union)


GYM_ALGORITHMS = algorithms_for_kind("gym")
OFFLINE_ALGORITHMS = algorithms_for_kind("offline")
MULTI_AGENT_ALGORITHMS = algorithms_for_kind("multi_agent")
GymHyperparameters = _hyperparameter_union("gym")
OfflineHyperparameters = _hyperparameter_union("offline")
MultiAgentHyperparameters = _hyperparameter_union("multi_agent")
LLM_ALGORITHMS = algorithms_for_kind("llm")
OFFLINE_GAME_ALGORITHMS = frozenset({"llm_bc", "llm_ilql"})  # LLM algorithms that learn from recorded games
LLMHyperparameterModels = _hyperparameter_union("llm")
LANGUAGE_ALGORITHMS = algorithms_for_kind("language")
LanguageHyperparameterModels = _hyperparameter_union("language")


def normalise_algorithm(name: str) -> str:
    """An algorithm name as the registry spells it: case and surrounding spaces dropped (``PPO`` -> ``ppo``,
    ``Rainbow`` -> ``rainbow``), so a config may spell it as papers and Stable-Baselines3 do."""
    return name.strip().lower()


def _complete_space(algo: str, overrides: dict[str, Any]) -> dict[str, Any]:
    model = ALGORITHMS[algo].hp_model
    known = model.preset_space("wide")  # a partial override completes from the widest declaration
    numeric = {n for n, f in model.model_fields.items() if f.annotation in (int, float)} - model.fixed_fields
    out = {}
    for name, spec in overrides.items():
        if name not in numeric:
            raise ValueError(f"hp_space.{name}: not a mutable hyperparameter of {algo}; mutable ones are "
                             f"{sorted(numeric)}")
        if isinstance(spec, dict):
            base = known[name].model_dump() if name in known else {}
            if "kind" not in spec and "kind" not in base:
                base["kind"] = "int" if model.model_fields[name].annotation is int else "float"
            try:
                spec = HyperparameterSpec(**{**base, **spec})
            except ValidationError as err:
                e = err.errors()[0]
                where = ".".join(str(x) for x in e["loc"])
                msg = e["msg"].removeprefix("Value error, ")
                raise ValueError(f"hp_space.{name}{'.' + where if where else ''}: {msg}") from None
        out[name] = spec
    return out
