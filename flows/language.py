"""The language evolution flow: character-level GPT agents learning Wordle from games (behaviour cloning or
ILQL), judged by greedy play on held-out secrets. The body is :func:`flows.evolution.run_evolution` (same DAG,
runners, resume and tracking as every other kind); the arena is ``agilerl_core.arenas.language``."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.evolution import flow_run_name, run_evolution
from tasks.config import LanguagePipelineConfig


@flow(name="language-evolution", flow_run_name=flow_run_name, validate_parameters=True)
def language_evolution(config: LanguagePipelineConfig, run_id: str | None = None,
                       progress: bool = False, handover: Any = None) -> dict[str, Any]:
    """Evolve language agents (their architecture, learning rate and ILQL's expectile, beta, conservative weight
    and target rate) until the target fitness or the budget of gradient steps; the same `run_id` resumes a crashed
    run exactly."""
    return run_evolution(config, run_id, progress, handover)
