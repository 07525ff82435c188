"""The offline evolution flow: members learn from one fixed dataset instead of collecting experience.

Each generation has the online flow's DAG (select+mutate, train, evaluate, fold, commit, log) and the same
runners, resume and MLflow behaviour; only the arena differs (``agilerl_core.arenas.offline``): ``evo_steps``
gradient steps on batches of the dataset, evaluation online in the env. The dataset's content hash is
pinned in the run's record (a resume refuses other data) and logged to MLflow as the run's input.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.evolution import flow_run_name, run_evolution
from tasks.config import OfflinePipelineConfig


@flow(name="offline-evolution", flow_run_name=flow_run_name, validate_parameters=True)
def offline_evolution(config: OfflinePipelineConfig, run_id: str | None = None,
                      progress: bool = False, handover: Any = None) -> dict[str, Any]:
    """Evolve a population on a dataset (`config.dataset`) until the target fitness or the budget of
    gradient steps; the same `run_id` resumes a crashed run exactly."""
    return run_evolution(config, run_id, progress, handover)
