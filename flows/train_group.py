"""The per-group train deployment of ``runner.kind: deployments``: one run trains and evaluates one group of
a generation on whatever machine its work pool's worker runs (a GPU worker, a Kubernetes pod), members and
experience through the run's storage (:func:`tasks.generation.train_stored_group`).

Deploy it with the others: ``prefect deploy --prefect-file deployments/prefect.yaml -n train-group``.
"""

from __future__ import annotations

from prefect import flow

from tasks.generation import train_stored_group


@flow(name="train-group", log_prints=False)
def train_group(run_id: str, storage_uri: str, generation: int, steps: int, slots: list[int]) -> dict:
    """Train and evaluate the members `slots` of run `run_id`'s generation `generation` for `steps` each."""
    return train_stored_group(run_id, storage_uri, generation, steps, slots)
