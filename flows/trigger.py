"""Trigger a Prefect deployment from CI and read back the run's summary."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from agilerl_core.config import parse_overrides
from agilerl_core.config.overrides import _set_dotted
from agilerl_core.errors import AgileRLError, ConfigError
from tasks.config import validate_config


class TriggerError(AgileRLError):
    """The deployment could not be run, or its run did not complete; `summary` (when the run started) is what
    the CLI still prints as its JSON summary: deployment, flow run id and name, final state."""

    def __init__(self, message: str, summary: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.summary = summary


def trigger_deployment(name: str, params: list[str], wait: bool = True, timeout: float | None = None) -> dict[str, Any]:
    """Run deployment `name` (FLOW/DEPLOYMENT) with dotted parameter overrides (``config.seed=3``); with
    `wait`, block until it ends and return its summary (the flow's summary artifact)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    if not os.environ.get("PREFECT_API_URL"):
        raise ConfigError("trigger needs a Prefect server: set PREFECT_API_URL (e.g. `agilerl-flow stack up` then "
                          "`source .stack/env.sh`)")
    if "/" not in name:
        raise ConfigError(f"deployment {name!r}: use FLOW/DEPLOYMENT, e.g. online-evolution/cartpole-dqn")
    try:
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name(name)
    except ObjectNotFound:
        raise ConfigError(f"deployment {name!r} not found on {os.environ['PREFECT_API_URL']}; create it with "
                          f"`prefect deploy --all --prefect-file deployments/prefect.yaml`") from None
    parameters = copy.deepcopy(deployment.parameters or {})
    for key, value in parse_overrides(params).items():
        _set_dotted(parameters, key, value)
    if "config" in parameters:  # fail here, not in a worker, on a bad override
        validate_config(parameters["config"], source=f"deployment {name} with --param overrides")
    flow_run = run_deployment(name, parameters=parameters, timeout=timeout if wait else 0, poll_interval=1)
    out: dict[str, Any] = {"deployment": name, "flow_run_id": str(flow_run.id), "flow_run_name": flow_run.name,
                           "state": flow_run.state.type.value if flow_run.state else None}
    if not wait:
        return out
    state = flow_run.state
    if state is None or not state.is_final():
        raise TriggerError(f"flow run {flow_run.name} ({flow_run.id}) did not finish within {timeout}s "
                           f"(state {state.type.value if state else 'unknown'})", {**out, "passed": False})
    if not state.is_completed():
        raise TriggerError(f"flow run {flow_run.name} ({flow_run.id}) ended {state.type.value}: {state.message}",
                           {**out, "passed": False, "message": state.message})
    out.update(_summary(flow_run.id))
    return out


def _summary(flow_run_id) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId

    from flows.evolution import SUMMARY_ARTIFACT

    with get_client(sync_client=True) as client:
        # the summary is created inside the flow run itself
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
            any_=[flow_run_id])), flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    for art in arts:
        if art.key and art.key.endswith(f"-{SUMMARY_ARTIFACT}"):
            data = json.loads(art.data) if isinstance(art.data, str) else art.data
            return dict(data[0])
    raise TriggerError(f"flow run {flow_run_id} completed but left no summary artifact (key RUN_ID-{SUMMARY_ARTIFACT})")
