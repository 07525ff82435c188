"""The online (Gymnasium) evolution flow: members collect their own experience in the env (off-policy ones
share it through one replay buffer). The body is :func:`flows.evolution.run_evolution`."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.evolution import flow_run_name, run_evolution
from tasks.config import GymPipelineConfig


@flow(name="online-evolution", flow_run_name=flow_run_name, validate_parameters=True)
def online_evolution(config: GymPipelineConfig, run_id: str | None = None,
                     progress: bool = False, handover: Any = None) -> dict[str, Any]:
    """Evolve a population on a Gymnasium env until the target fitness or the env-step budget.

    Running it again with the same `run_id` after a crash continues from the last committed generation
    and ends exactly as an uninterrupted run would.
    """
    return run_evolution(config, run_id, progress, handover)
