"""Preparing an evolution run, before any training (:func:`prepare_run`): the Evolution built (config, env,
dataset checked and pinned), the storage URI and its credentials and the tracking server checked, the run's
record written, and a run with committed generations loaded back (every checksum verified).

The CLI prepares before it starts the flow and leaves the prepared run in :data:`PREPARED_RUNS` (keyed by run
id), the Python API leaves the run's callbacks in :data:`RUN_HOOKS`; the flow (:func:`flows.evolution.run_evolution`)
takes them. :func:`finished_summary` tells a run that has nothing left to resume.
"""

from __future__ import annotations

import logging as std_logging
import threading
from dataclasses import dataclass
from typing import Any

from agilerl_core.api.callbacks import CallbackHooks
from agilerl_core.evolution import Evolution
from agilerl_core.experiment import build_evolution, new_run_id
from agilerl_core.hpo.found import config_data
from agilerl_core.io.lease import LeaseKeeper
from agilerl_core.io.run_store import RunStore, check_run_id
from agilerl_core.io.storage import storage_from_config
from flows.runners import check_runner
from tasks.config import PipelineConfig, grouping
from tasks.server_checks import check_tracking_server, tracking_uri
from tasks.tracker import SECRET_FIELDS


def stored_config(cfg: PipelineConfig) -> dict[str, Any]:
    """The config as persisted in run.json: JSON, secrets removed."""
    data = cfg.model_dump(mode="json")
    for dotted in SECRET_FIELDS:
        section, name = dotted.split(".")
        data[section].pop(name, None)
    return data


def rerun_data(cfg: PipelineConfig) -> dict[str, Any]:
    """The config as a user would write it (fields away from their defaults), secrets removed: what a run's
    ``found_config.yaml`` starts from."""
    data = config_data(cfg)
    for dotted in SECRET_FIELDS:
        section, name = dotted.split(".")
        data.get(section, {}).pop(name, None)
    return data


@dataclass
class PreparedRun:
    """A run ready to train: checked, built and (when it has committed generations) resumed."""

    cfg: PipelineConfig
    run_id: str
    evo: Evolution
    store: RunStore
    latest: int | None  # the last committed generation, None for a new run
    dropped: list[int]  # uncommitted generation folders a crash left behind (deleted)
    lease: LeaseKeeper  # this process is the run's one writer until the run ends
    committed: int | None = None  # the last generation committed (kept up to date by the flow)

    def __post_init__(self) -> None:
        if self.committed is None:
            self.committed = self.latest


def prepare_run(cfg: PipelineConfig, run_id: str | None) -> PreparedRun:
    """Every check and all setup that needs no training, in the order a user would fix them: the config,
    env and dataset (building the Evolution), the storage URI and its credentials, the tracking server; then
    the run's record, and the last committed generation loaded back when the run id has one."""
    run_id = check_run_id(run_id or new_run_id(cfg))
    check_runner(cfg.runner)
    evo = build_evolution(cfg, **grouping(cfg))
    dataset = getattr(evo.arena, "dataset", None)
    if dataset is not None and cfg.dataset.sha256 is None:
        # pin the data: the run's record, its MLflow params and every worker then name (and check) this content
        cfg = cfg.model_copy(update={"dataset": cfg.dataset.model_copy(update={"sha256": dataset.sha256})})
        evo.arena.cfg = cfg
    base = getattr(evo.arena, "base", None)
    if base is not None and cfg.model.sha256 is None:  # an LLM run: pin the base model the same way
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"sha256": base.sha256})})
        evo.arena.cfg = cfg
    storage = storage_from_config(cfg)
    storage.check()
    if cfg.tracking.enabled:
        check_tracking_server(tracking_uri(cfg))
    store = RunStore(storage, run_id)
    store.init_run(stored_config(cfg), evo.grouping())
    pinned = store.pinned_grouping()
    if pinned is not None and evo.pin_grouping(pinned):
        std_logging.getLogger("flows.evolution").warning(
            "run %s: grouping members as the run was started (%s), not as this runner would; groups decide results",
            run_id, pinned)
    lease = LeaseKeeper(store).start()  # before anything is deleted: a live writer's work is never discarded
    try:
        latest = store.latest_generation()
        dropped = store.discard_uncommitted()
        if latest is not None:
            evo.resume(store, latest)
    except BaseException:
        lease.stop()
        raise
    return PreparedRun(cfg, run_id, evo, store, latest, dropped, lease)


class PreparedRuns:
    """Runs the CLI prepared for the flow it starts next in this process, keyed by run id."""

    def __init__(self) -> None:
        self._runs: dict[str, PreparedRun] = {}
        self._lock = threading.Lock()

    def put(self, prepared: PreparedRun) -> None:
        with self._lock:
            self._runs[prepared.run_id] = prepared

    def take(self, cfg: PipelineConfig, run_id: str | None) -> PreparedRun | None:
        """The run prepared for `run_id` with exactly this config (removed from the cache), else None."""
        with self._lock:
            prepared = self._runs.pop(run_id, None) if run_id else None
        return prepared if prepared is not None and prepared.cfg == cfg else None


PREPARED_RUNS = PreparedRuns()


class RunHooks:
    """Callbacks given to :func:`flows.run` for the flow it starts next in this process, keyed by run id
    (functions cannot be flow-run parameters)."""

    def __init__(self) -> None:
        self._hooks: dict[str, CallbackHooks] = {}
        self._lock = threading.Lock()

    def put(self, run_id: str, hooks: CallbackHooks) -> None:
        with self._lock:
            self._hooks[run_id] = hooks

    def take(self, run_id: str) -> CallbackHooks | None:
        with self._lock:
            return self._hooks.pop(run_id, None)


RUN_HOOKS = RunHooks()


def finished_summary(prepared: PreparedRun) -> dict[str, Any] | None:
    """The stored summary of a run whose last committed generation ended it (None when it has more to do)."""
    store, evo = prepared.store, prepared.evo
    if prepared.latest is None or not evo.finished() or not store.storage.exists(store.key("summary.json")):
        return None
    from agilerl_core.io.records import read_record

    summary = read_record(store.storage.get_bytes(store.key("summary.json")), store.storage.url(store.key("summary.json")),
                          allow_nan=True)
    return summary if isinstance(summary, dict) and summary.get("generations") == len(evo.history) else None
