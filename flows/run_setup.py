"""Preparing an evolution run, before any training (:func:`prepare_run`): the Evolution built (config, env,
dataset checked and pinned), the storage URI and its credentials and the tracking server checked, the run's
record written, and a run with committed generations loaded back (every checksum verified).

:func:`flows.api.run` (the CLI's ``run`` and ``resume``) prepares before it starts the flow and hands the prepared
run and its callbacks to the flow as its ``handover`` parameter (:class:`Handover`); a deployment's flow prepares
itself. :func:`finished_summary` tells a run that has nothing left to resume.
"""

from __future__ import annotations

import logging as std_logging
from dataclasses import dataclass
from typing import Any

from agilerl_core.api.callbacks import CallbackHooks
from agilerl_core.errors import ConfigError
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
    # the config as built: the content hashes of the data and base it read pinned, so the run's record, its MLflow
    # params and every worker name (and check) this content
    cfg = evo.arena.cfg
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


class Handover:
    """What :func:`flows.api.run` hands the flow it starts in this process, as the flow's ``handover`` parameter:
    the run it prepared (checked, built, resumed) and the run's callbacks. Prefect records it as a placeholder (it
    is not data); a flow run whose ``handover`` is anything else (a deployment's parameter) is refused."""

    __slots__ = ("hooks", "prepared")  # no __dict__: Prefect's parameter encoder stops at once, with "<Handover>"

    def __init__(self, prepared: PreparedRun, hooks: CallbackHooks | None = None) -> None:
        self.prepared, self.hooks = prepared, hooks

    def __reduce__(self) -> tuple:
        """It never leaves its process: a copy a task runner ships to a worker with the flow run's context (Dask
        pickles it) arrives as None; the flow itself reads the original."""
        return _nothing, ()


def _nothing() -> None:
    return None


def handed_over(handover: object, cfg: PipelineConfig, run_id: str | None) -> Handover | None:
    """The flow's `handover` checked: None, or the one prepared in this process for this config and run id."""
    if handover is None:
        return None
    if not isinstance(handover, Handover):
        raise ConfigError("handover: a flow run's run is prepared in the process that starts it (flows.run); leave "
                          "the handover parameter out of a deployment's parameters")
    prepared = handover.prepared
    if prepared.cfg != cfg or (run_id is not None and run_id != prepared.run_id):
        raise ConfigError(f"handover: prepared for run {prepared.run_id} with another config; pass the config and "
                          f"run id it was prepared with, or no handover")
    return handover


def finished_summary(prepared: PreparedRun) -> dict[str, Any] | None:
    """The stored summary of a run whose last committed generation ended it (None when it has more to do)."""
    store, evo = prepared.store, prepared.evo
    if prepared.latest is None or not evo.finished() or not store.storage.exists(store.key("summary.json")):
        return None
    from agilerl_core.io.records import read_record

    summary = read_record(store.storage.get_bytes(store.key("summary.json")), store.storage.url(store.key("summary.json")),
                          allow_nan=True)
    return summary if isinstance(summary, dict) and summary.get("generations") == len(evo.history) else None
