"""Who may make a flow run import code.

Config fields that name code (an env id's module, ``env_entry_point``, python rewards; see
:func:`agilerl_core.config.code_references`) are code by design: trusted when the config comes from the user's
own files (the CLI, a deployment's own config). A deployment's flow run, though, takes ``config`` as a
parameter from anyone who can reach the Prefect API, so such a run imports only the modules its deployment's
own config names, plus those in ``$AGILERL_TRUSTED_MODULES`` on the worker.
"""

from __future__ import annotations

import contextlib
from typing import Any

from agilerl_core.config import check_code_allowed, code_references, trusted_modules_from_env
from tasks.config import validate_config


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


def deployed_modules(parameters: dict[str, Any]) -> set[str]:
    """The modules a deployment's own default `config` parameter names (nothing when it has none)."""
    raw = parameters.get("config")
    if not isinstance(raw, dict):
        return set()
    with contextlib.suppress(Exception):  # an unusable default names nothing it could allow
        return set(code_references(validate_config(raw, "the deployment's config")).values())
    return set()


def check_flow_run_code(cfg) -> None:
    """Refuse, naming the field, a config that arrived as a deployment run's parameter and names a module
    outside the allowlist; a run started from the user's own files (no deployment) is not checked."""
    dep_id, parameters = _deployment()
    if dep_id is None or not code_references(cfg):
        return
    check_code_allowed(cfg, deployed_modules(parameters) | trusted_modules_from_env())


def check_stored_run_code(cfg) -> None:
    """For a train-group deployment run: the config it reads from the storage URI its parameters name may
    import only modules in ``$AGILERL_TRUSTED_MODULES`` on the worker."""
    dep_id, _ = _deployment()
    if dep_id is not None:
        check_code_allowed(cfg, trusted_modules_from_env(), "the stored run's config")
