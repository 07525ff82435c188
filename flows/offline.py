"""The offline evolution flow: members learn from one fixed dataset instead of collecting experience.

Each generation has the online flow's DAG (select+mutate, train, evaluate, commit, log) and the same
runners, resume and MLflow behaviour; only the train step differs: ``evo_steps`` gradient steps on
batches of the dataset (:func:`agilerl_core.training.generation.train_member_offline`). Members are
evaluated online in the env. The dataset is resolved once per process (an ``s3://`` one downloaded into
the local cache and verified), its content hash is pinned in the run's record (a resume refuses other
data) and logged to MLflow as the run's input, with its size and return statistics as params.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from agilerl_core.config import ExperimentConfig
from agilerl_core.errors import ConfigError
from flows.online import run_evolution


@flow(name="offline-evolution", flow_run_name="{config.name}", validate_parameters=True)
def offline_evolution(config: ExperimentConfig, run_id: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Evolve a population on a dataset (`config.dataset`) until the target fitness or the budget of
    gradient steps; the same `run_id` resumes a crashed run exactly."""
    if config.dataset is None:
        raise ConfigError(f"dataset: {config.name} has no dataset section; the offline flow learns from one "
                          f"(dataset.uri), or use the online-evolution flow")
    return run_evolution(config, run_id, progress)


def evolution_flow(cfg: ExperimentConfig):
    """The flow that runs `cfg`: offline when it names a dataset, else online."""
    if cfg.dataset is not None:
        return offline_evolution
    from flows.online import online_evolution

    return online_evolution
