"""The multi-agent (PettingZoo) evolution flow: every member is a team acting in its own vectorised parallel
envs, sharing one replay buffer. The body is :func:`flows.evolution.run_evolution`."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.evolution import flow_run_name, run_evolution
from tasks.config import MultiAgentPipelineConfig


@flow(name="multi-agent-evolution", flow_run_name=flow_run_name, validate_parameters=True)
def multi_agent_evolution(config: MultiAgentPipelineConfig, run_id: str | None = None,
                          progress: bool = False, handover: Any = None) -> dict[str, Any]:
    """Evolve a population of teams in a PettingZoo parallel env until the target fitness or the budget.

    Running it again with the same `run_id` after a crash continues from the last committed generation
    and ends exactly as an uninterrupted run would.
    """
    return run_evolution(config, run_id, progress, handover)
