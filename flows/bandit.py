"""The contextual-bandit evolution flow: members pull arms for contexts (a classification table or a bandit env
of your own) and learn from the population's shared replay of pulls.

Each generation has the online flow's DAG (select+mutate, train, evaluate, fold, commit, log) and the same
runners, resume and MLflow behaviour; only the arena differs (``agilerl_core.arenas.bandit``): ``evo_steps``
pulls per member, fitness the mean reward of greedy pulls on held-out contexts, each member's regret logged.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.evolution import flow_run_name, run_evolution
from tasks.config import BanditPipelineConfig


@flow(name="bandit-evolution", flow_run_name=flow_run_name, validate_parameters=True)
def bandit_evolution(config: BanditPipelineConfig, run_id: str | None = None,
                     progress: bool = False, handover: Any = None) -> dict[str, Any]:
    """Evolve a population of contextual-bandit agents until the target fitness or the budget of pulls; the same
    `run_id` resumes a crashed run exactly."""
    return run_evolution(config, run_id, progress, handover)
