"""The LLM evolution flow: a population of LoRA adapters on one shared base model, trained with GRPO or DPO
and judged on held-out prompts. The body is :func:`flows.evolution.run_evolution` (same DAG, runners, resume
and tracking as every other kind); the arena is ``agilerl_core.arenas.llm``."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.evolution import flow_run_name, run_evolution
from tasks.config import LLMPipelineConfig


@flow(name="llm-evolution", flow_run_name=flow_run_name, validate_parameters=True)
def llm_evolution(config: LLMPipelineConfig, run_id: str | None = None,
                  progress: bool = False, handover: Any = None) -> dict[str, Any]:
    """Evolve LoRA adapters (their learning rate, beta, group size, temperature and rank) until the target
    fitness or the budget of training samples; the same `run_id` resumes a crashed run exactly."""
    return run_evolution(config, run_id, progress, handover)
