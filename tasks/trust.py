"""Who may make a flow run import code, or point its data and the worker's credentials elsewhere.

Config fields that name code (an env id's module, ``env_entry_point``, wrappers, python rewards; see
:func:`agilerl_core.config.code_references`, parsed the way Gymnasium and the importers read them) are code by
design: trusted when the config comes from the user's own files (the CLI, a deployment's own config). A
deployment's flow run, though, takes ``config`` as a parameter from anyone who can reach the Prefect API, so
such a run (:func:`check_flow_run_parameters`):

- imports only the modules its deployment's own config names, plus those in ``$AGILERL_TRUSTED_MODULES``;
- sends its work and data only where its deployment's own config does: ``runner.address`` (a Dask or Ray
  cluster: the members and data travel there pickled) must equal the deployment's value or be listed in
  ``$AGILERL_TRUSTED_ADDRESSES``; ``tracking.uri``, ``storage.uri`` and ``storage.endpoint_url`` (the worker's
  MLflow and S3 credentials go with every request) must equal the deployment's value or be listed in
  ``$AGILERL_TRUSTED_URIS``;
- writes and reads only where its deployment's own config does: every field of the config marked as a location
  (:class:`agilerl_core.config.common.Location`: ``output_dir``, ``dataset.uri``, ``dataset.cache_dir``,
  ``dataset.games.uri``, ``dataset.games.cache_dir``, ``model.path``, ``model.gguf_file``, ``model.init_adapter``,
  a bandit's ``data.source`` and ``data.cache_dir``, found by walking the config, nested sections and lists
  included) likewise (``$AGILERL_TRUSTED_URIS``). A value with a prefix its marker lists names no place and is
  allowed: a bandit's ``sklearn:NAME`` (a table bundled with scikit-learn, never downloaded) and a base model's
  ``package:NAME`` (an installed package's directory: the operator installed it on the worker, it is found
  without importing it, one top-level name, and read as data: hashed, no ``.py`` file in it run, so a parameter
  picks among what the worker holds already, nothing it could write or point elsewhere);
- registers its champion only as the deployment's own model (``tracking.model_name``, else ``name``), and runs
  under the deployment's own ``name`` (the run's MLflow experiment and the ``OUTPUT_DIR/NAME-latest`` pointer
  are named by it: another name would log into another deployment's experiment and move its pointer);
- raises no entry of ``limits`` above the deployment's own config (its defaults when it sets none).

Each variable is read on the worker, comma-separated; an entry ending in ``/`` also allows every value below
it (``s3://runs/`` allows ``s3://runs/team-a``; a value with a ``..`` part never matches a prefix).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from pydantic import BaseModel

from agilerl_core.config import check_code_allowed, code_references, trusted_modules_from_env
from agilerl_core.config.common import Location
from agilerl_core.errors import ConfigError
from agilerl_core.limits import Limits
from tasks.config import validate_config

TRUSTED_ADDRESSES_ENV = "AGILERL_TRUSTED_ADDRESSES"  # cluster addresses a flow-run parameter may name
TRUSTED_URIS_ENV = "AGILERL_TRUSTED_URIS"  # tracking / storage URIs and S3 endpoints a flow-run parameter may name

# The pipeline's own sections (tasks.config: runner, tracking) that name a place: (field, the allowlist's
# variable, what goes there). Every such field of the engine's config is marked with Location instead and found
# by walking the config (:func:`location_fields`), checked against $AGILERL_TRUSTED_URIS.
PIPELINE_TARGETS = (
    ("runner.address", TRUSTED_ADDRESSES_ENV, "the run's members and data are sent to that cluster (pickled)"),
    ("tracking.uri", TRUSTED_URIS_ENV, "the worker's tracking credentials, metrics and models go there"),
)


def _deployment() -> tuple[str | None, dict[str, Any]]:
    """(this flow run's deployment id or None, that deployment's own default parameters)."""
    from prefect.runtime import deployment

    dep_id = None
    with contextlib.suppress(Exception):
        dep_id = deployment.id
    if not dep_id:
        return None, {}
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(dep_id), dict(client.read_deployment(dep_id).parameters or {})


def deployed_config(parameters: dict[str, Any]):
    """A deployment's own default `config` parameter, validated (None: it has none, or an unusable one)."""
    raw = parameters.get("config")
    if not isinstance(raw, dict):
        return None
    with contextlib.suppress(Exception):  # an unusable default allows nothing
        return validate_config(raw, "the deployment's config")
    return None


def deployed_modules(parameters: dict[str, Any]) -> set[str]:
    """The modules a deployment's own default `config` parameter names (nothing when it has none)."""
    deployed = deployed_config(parameters)
    if deployed is None:
        return set()
    with contextlib.suppress(Exception):
        return set(code_references(deployed).values())
    return set()


def trusted_values_from_env(name: str) -> set[str]:
    """The values the comma-separated environment variable `name` allows."""
    return {v.strip() for v in os.environ.get(name, "").split(",") if v.strip()}


def value_allowed(value: str, allowed: set[str]) -> bool:
    """Whether `value` is in `allowed`, or below an entry ending in ``/`` (never with a ``..`` part)."""
    if value in allowed:
        return True
    if ".." in value.replace("\\", "/").split("/"):
        return False
    return any(entry.endswith("/") and value.startswith(entry) for entry in allowed)


def _field(cfg, dotted: str) -> Any:
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part, None)
    return value


FieldPath = tuple[str | int, ...]  # a field's place in a config: attribute names, list indices


def dotted_path(path: FieldPath) -> str:
    """`path` as messages name a field: ``dataset.games.uri``, ``rewards[0].function``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def location_fields(model: BaseModel, path: FieldPath = ()):
    """(path, value, marker, the field's default) of every field marked with :class:`Location` in config `model`
    and in every section under it (a nested model, a list or dict of models), in field order; the default is
    None for a required field."""
    for name, info in type(model).model_fields.items():
        value, here = getattr(model, name, None), (*path, name)
        marker = next((m for m in info.metadata if isinstance(m, Location)), None)
        if marker is not None:
            yield here, value, marker, None if info.is_required() else info.get_default(call_default_factory=True)
        else:
            yield from _sections(value, here)


def _sections(value: Any, path: FieldPath):
    if isinstance(value, BaseModel):
        yield from location_fields(value, path)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _sections(item, (*path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _sections(item, (*path, str(key)))


def _at(cfg: Any, path: FieldPath) -> Any:
    """The value at `path` in `cfg` (None where that section is absent)."""
    value = cfg
    for part in path:
        if isinstance(part, int):
            value = value[part] if isinstance(value, (list, tuple)) and part < len(value) else None
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            value = getattr(value, part, None)
    return value


def _default(cfg, dotted: str) -> Any:
    """The config model's default for `dotted` (what a deployment without a config of its own would use)."""
    head, _, rest = dotted.partition(".")
    info = type(cfg).model_fields.get(head)
    if info is None or info.is_required():
        return None
    value = info.get_default(call_default_factory=True)
    return _field(value, rest) if rest else value


def targets(cfg, deployed):
    """(field, value in `cfg`, the deployment's value, allowlist variable, what goes there, prefixes naming no
    place) of every place `cfg` names: :data:`PIPELINE_TARGETS`, then every field marked with :class:`Location`.
    The deployment's value is `deployed`'s (its validated config), or, when it has none, the config model's
    default."""
    for field, env, why in PIPELINE_TARGETS:
        theirs = _field(deployed, field) if deployed is not None else _default(cfg, field)
        yield field, _field(cfg, field), theirs, env, why, ()
    for path, value, marker, default in location_fields(cfg):
        theirs = _at(deployed, path) if deployed is not None else default
        yield dotted_path(path), value, theirs, TRUSTED_URIS_ENV, marker.why, marker.no_place


def check_targets(cfg, deployed, source: str = "the flow run's config") -> None:
    """A ConfigError naming the first place `cfg` names (:func:`targets`: a cluster, a tracking server, and every
    field marked as a location) whose value is neither `deployed`'s (the deployment's validated config; None: it
    has none, so its defaults) nor in the worker's allowlist, nor one its marker says names no place."""
    for field, value, theirs, env, why, no_place in targets(cfg, deployed):
        if value is None or value == theirs:
            continue
        if value_allowed(str(value), trusted_values_from_env(env)) or str(value).startswith(no_place):
            continue
        shown = str(value) if len(str(value)) <= 200 else str(value)[:200] + "..."
        raise ConfigError(
            f"{field}: {source} sets {shown!r}, which is not allowed in a parameter: {why}, and a flow run's "
            f"parameters come from anyone who can reach the Prefect API, so only the deployment's own value or one "
            f"listed in ${env} on the worker is accepted. Set it in the deployment's config, or add it to {env} "
            f"(comma-separated; an entry ending in / allows what is below it) in the worker's environment")


def check_limits(cfg, deployed, source: str = "the flow run's config") -> None:
    """A ConfigError naming the first entry of `cfg`'s ``limits`` above the deployment's own (its defaults when
    it has no config): a parameter may lower a limit, never raise one."""
    mine = getattr(cfg, "limits", None)
    if mine is None:
        return
    theirs = getattr(deployed, "limits", None) or Limits()
    for name in type(mine).model_fields:
        value, cap = getattr(mine, name), getattr(theirs, name)
        if value > cap:
            raise ConfigError(
                f"limits.{name}: {source} raises it to {value}, above the deployment's {cap}: a flow run's "
                f"parameters come from anyone who can reach the Prefect API, so they may lower a limit but not "
                f"raise one. Raise it in the deployment's own config (limits.{name}) and deploy again")


def registered_model(cfg) -> str | None:
    """The registered model a run of `cfg` would register its champion as (None: it registers none)."""
    tracking = getattr(cfg, "tracking", None)
    if tracking is None or not tracking.enabled or not tracking.register_model:
        return None
    return tracking.model_name or cfg.name


def check_registered_model(cfg, deployed, source: str = "the flow run's config") -> None:
    """A ConfigError when `cfg` would register its champion under another model than the deployment's own config
    (a parameter could otherwise move any model's ``champion`` alias, e.g. with ``champion.promote: always``)."""
    mine = registered_model(cfg)
    if mine is None or (deployed is not None and mine == registered_model(deployed)):
        return
    theirs = None if deployed is None else registered_model(deployed)
    other = "" if theirs is None else f", not the deployment's own {theirs!r}"
    raise ConfigError(
        f"tracking.model_name: {source} would register its champion as model {mine[:200]!r}{other} (set through "
        f"tracking.model_name or name): a flow run's parameters come from anyone who can reach the Prefect API, so "
        f"they may not move another model's champion alias. Deploy a config that registers that model, or set "
        f"tracking.register_model: false in the parameter")


def check_name(cfg, deployed, source: str = "the flow run's config") -> None:
    """A ConfigError when `cfg`'s ``name`` is not the deployment's own config's (its default ``name`` when it
    has none): the run's MLflow experiment and the ``OUTPUT_DIR/NAME-latest`` pointer are named by it, so a
    parameter naming another deployment's config would log into that experiment and point its ``-latest`` at
    this run."""
    theirs = deployed.name if deployed is not None else type(cfg).model_fields["name"].default
    if cfg.name == theirs:
        return
    raise ConfigError(
        f"name: {source} sets {cfg.name[:200]!r}, not the deployment's own {theirs!r}: the run logs into the MLflow "
        f"experiment of that name and moves OUTPUT_DIR/NAME-latest to itself (another deployment's, when the name is "
        f"theirs), and a flow run's parameters come from anyone who can reach the Prefect API. Keep the deployment's "
        f"name in the parameter, or deploy a config of that name")


def check_flow_run_parameters(cfg, parameters: dict[str, Any]) -> None:
    """Refuse, naming the field and the fix, a config that arrived as a parameter of a run of the deployment
    whose own default parameters are `parameters`, when it names code outside the allowlist
    (``$AGILERL_TRUSTED_MODULES``), a cluster, tracking or storage target or any other location outside the
    deployment's own and the operator's allowlists, a limit above the deployment's, another registered model
    or another name than the deployment's."""
    if code_references(cfg):  # a reference the importer would read otherwise is refused here too
        check_code_allowed(cfg, deployed_modules(parameters) | trusted_modules_from_env())
    deployed = deployed_config(parameters)
    check_targets(cfg, deployed)
    check_limits(cfg, deployed)
    check_registered_model(cfg, deployed)
    check_name(cfg, deployed)


def check_flow_run_code(cfg) -> None:
    """:func:`check_flow_run_parameters` for the config of this flow run when it is a deployment's run; a run
    started from the user's own files (no deployment) is not checked."""
    dep_id, parameters = _deployment()
    if dep_id is None:
        return
    check_flow_run_parameters(cfg, parameters)


def storage_parameter_allowed(storage_uri: str, parameters: dict[str, Any]) -> None:
    """A ConfigError unless a train-group run's `storage_uri` parameter is storage the worker trusts: its
    deployment's own default, the worker's ``$AGILERL_STORAGE_URI`` (or below it), or an entry of
    ``$AGILERL_TRUSTED_URIS``. The run's config and members are read from there (a trusted store holds what a
    checked flow run wrote) and its results written back with the worker's credentials."""
    own = os.environ.get("AGILERL_STORAGE_URI")
    allowed = trusted_values_from_env(TRUSTED_URIS_ENV) | ({own, own.rstrip("/") + "/"} if own else set())
    if storage_uri == parameters.get("storage_uri") or value_allowed(storage_uri, allowed):
        return
    shown = storage_uri if len(storage_uri) <= 200 else storage_uri[:200] + "..."
    raise ConfigError(
        f"storage_uri: the train-group run's parameter names {shown!r}, which is not storage this worker trusts: the "
        f"run's config and members are read from there and its results written back with the worker's credentials, "
        f"and a flow run's parameters come from anyone who can reach the Prefect API. Point the run at the worker's "
        f"$AGILERL_STORAGE_URI (or below it), or add it to {TRUSTED_URIS_ENV} in the worker's environment")


def check_stored_run_storage(storage_uri: str) -> None:
    """:func:`storage_parameter_allowed` for this flow run when it is a deployment's run (nothing otherwise)."""
    dep_id, parameters = _deployment()
    if dep_id is not None:
        storage_parameter_allowed(storage_uri, parameters)


def check_stored_run_code(cfg) -> None:
    """For a train-group deployment run: the config it reads from the storage URI its parameters name may
    import only modules in ``$AGILERL_TRUSTED_MODULES`` on the worker."""
    dep_id, _ = _deployment()
    if dep_id is not None:
        check_code_allowed(cfg, trusted_modules_from_env(), "the stored run's config")
