"""The body every evolution flow shares, whatever the kind of training (the flows themselves are one line
each: ``flows/online.py``, ``flows/offline.py``; the CLI and ``deployments/build.py`` pick one by ``kind``).

A run is first *prepared* (:func:`prepare_run`): the Evolution is built (config, env, dataset checked), the
storage URI and its credentials and the tracking server are checked, and a run with committed generations
is loaded back (every checksum verified). The CLI prepares before it starts the flow, so a bad input is one
clear paragraph and never a failed flow run; the flow then takes that prepared run from
:data:`PREPARED_RUNS` (keyed by run id) instead of building it again. A deployment's flow prepares itself.

Then one DAG of tasks per generation::

    select+mutate --+--> train(group 0) --> evaluate(group 0) --+--> fold --> commit --> log
    (from g-1)      +--> train(group 1) --> evaluate(group 1) --+
                    +--> ...                                     +

A group is one or more members that learn together (population-batched, see Evolution.groups); the task
runner (threads, Dask or Ray: flows/runners.py) places each group's task.
"""

from __future__ import annotations

import contextlib
import json
import logging as std_logging
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from tqdm import tqdm

from agilerl_core.api import CallbackHooks
from agilerl_core.champion import choose_champion, eval_rounds
from agilerl_core.errors import CheckpointError, TrackingError
from agilerl_core.evolution import Evolution
from agilerl_core.experiment import build_evolution, new_run_id
from agilerl_core.io.checkpoint import save_member
from agilerl_core.io.run_store import LeaseKeeper, RunStore, check_run_id
from agilerl_core.io.storage import storage_from_config
from agilerl_core.progress import reporting as progress_reporting
from agilerl_core.progress import show_generation
from flows.runners import check_deployment, check_runner, dask_cluster, placement, task_runner
from tasks.artifacts import RunView, generation_rows, lineage_markdown
from tasks.config import PipelineConfig, grouping
from tasks.generation import (
    WORKER_RUNS,
    GenerationJob,
    MemberState,
    by_slot,
    commit_generation_task,
    dispatch_group_task,
    evaluate_group_task,
    evaluate_shipped_group_task,
    fold_generation_task,
    group_label,
    select_and_mutate_task,
    train_group_task,
    train_shipped_group_task,
)
from tasks.reports import elite_path, member_rows, render_lineage
from tasks.tracking import (
    SECRET_FIELDS,
    Tracker,
    TrackingQueue,
    champion_io,
    check_tracking_server,
    log_run_end_task,
    run_description,
    tracking_uri,
)
from tasks.trust import check_flow_run_code

SUMMARY_ARTIFACT = "summary"  # the run's JSON summary: artifact key RUN-summary (what `trigger` reads)
ARTIFACTS_TIMEOUT_S = 60.0  # how long a run's end waits for the Prefect API to take its queued artifacts


def flow_run_name() -> str:
    """An evolution flow run's name: its run id, so the Runs list tells runs of one config apart. A run started
    without one (a deployment's) is named after its config until :func:`run_evolution` makes the id, then
    renamed to it."""
    from prefect.runtime import flow_run

    params = flow_run.parameters or {}
    if params.get("run_id"):
        return str(params["run_id"])
    config = params.get("config")
    name = config.get("name") if isinstance(config, dict) else getattr(config, "name", None)
    return str(name or "evolution")


def _name_flow_run(run_id: str, logger) -> None:
    """Rename this flow run to `run_id` (a convenience: a failure is a warning)."""
    try:
        from prefect.client.orchestration import get_client
        from prefect.runtime import flow_run

        if flow_run.id is None or flow_run.name == run_id:
            return
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=run_id)
    except Exception as err:
        logger.warning("run %s: could not rename the flow run after it: %s", run_id, err)


def stored_config(cfg: PipelineConfig) -> dict[str, Any]:
    """The config as persisted in run.json: JSON, secrets removed."""
    data = cfg.model_dump(mode="json")
    for dotted in SECRET_FIELDS:
        section, name = dotted.split(".")
        data[section].pop(name, None)
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
        std_logging.getLogger(__name__).warning(
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


def run_generation(job: GenerationJob, evo: Evolution, store: RunStore, runner, tracking: TrackingQueue | None,
                   hooks: CallbackHooks | None = None) -> dict[str, Any]:
    """One generation's DAG in the flow run (select+mutate from the previous one first).

    The tasks are submitted to `runner`, a started task runner of the configured kind, so that one flow
    serves every runner; a generation is not a subflow of its own (a subflow costs ~0.4 s of API calls
    and heartbeat teardown per generation, measured; its task names carry the generation instead)."""
    if evo.history:
        select_and_mutate_task(job, evo)
    evo.begin_generation()
    groups = evo.groups()
    inline = job.mode == "threads" and job.config.runner.max_threads == 1
    members = evo.population.members  # a process runner ships each group's member states; threads, the live ones
    shipped = [[MemberState(*members[s].agent.state(), members[s].member_id) for s in g] for g in groups] \
        if job.mode == "process" else None
    if inline:  # one group at a time in this thread (no hand-off to a pool thread), evaluated right after
        trained_lists, evaluated_lists = [], []
        for g in groups:
            label = group_label(g)
            trained_lists.append(train_group_task(job, g, label, evo))
            evaluated_lists.append(evaluate_group_task(job, g, label, evo))
    elif job.config.runner.kind == "deployments":  # each group a run of the train deployment, through storage
        futures = [runner.submit(dispatch_group_task, {"job": job, "slots": g, "label": group_label(g),
                                                       "members": m}) for g, m in zip(groups, shipped, strict=True)]
        pairs = [f.result() for f in futures]
        trained_lists, evaluated_lists = [p[0] for p in pairs], [p[1] for p in pairs]
    else:
        with placement(job.config.runner):
            if job.mode == "threads":  # the live members: evaluated once their training future is done
                trained = [runner.submit(train_group_task, {"job": job, "slots": g, "label": group_label(g),
                                                            "evolution": evo}) for g in groups]
                evaluated = [runner.submit(evaluate_group_task, {"job": job, "slots": g, "label": group_label(g),
                                                                 "evolution": evo}, wait_for=[t])
                             for g, t in zip(groups, trained, strict=True)]
            else:  # the members travel as data; the trained states as the training future's result
                trained = [runner.submit(train_shipped_group_task, {"job": job, "slots": g, "label": group_label(g),
                                                                    "members": m})
                           for g, m in zip(groups, shipped, strict=True)]
                evaluated = [runner.submit(evaluate_shipped_group_task, {"job": job, "slots": g,
                                                                         "label": group_label(g), "trained": t})
                             for g, t in zip(groups, trained, strict=True)]
        trained_lists = [f.result() for f in trained]
        evaluated_lists = [f.result() for f in evaluated]
    outputs, evaluations = by_slot(groups, trained_lists, evaluated_lists)
    placements = [{"group": group_label(g), **outs[0].placement} for g, outs in zip(groups, trained_lists, strict=True)]
    shards = fold_generation_task(job, evo, store, outputs, evaluations)
    for out in outputs if hooks else ():  # the trained members, folded into this process's population
        hooks.member_trained(evo.population.members, out.result)
    commit_generation_task(job, evo, store, shards)
    last = evo.history[-1]
    stats = {**asdict(last), "placements": placements}
    if tracking is not None:  # logged by the queue's thread: training never waits on the tracking server
        tracking.put(stats, member_rows(evo.population, last.train_returns, sorted(evo.arena.space), last.train_metrics))
    return stats


def run_evolution(cfg: PipelineConfig, run_id: str | None, progress: bool) -> dict[str, Any]:
    """The body of every evolution flow (called inside a flow run): the prepared run (or prepare it now),
    one DAG per generation, the elite, tracking."""
    logger = get_run_logger()
    check_flow_run_code(cfg)  # a deployment's parameters may not name code its own config does not
    prepared = PREPARED_RUNS.take(cfg, run_id) or prepare_run(cfg, run_id)
    cfg, run_id, evo, store = prepared.cfg, prepared.run_id, prepared.evo, prepared.store
    _name_flow_run(run_id, logger)
    if prepared.dropped:
        logger.info("run %s: discarded uncommitted generation(s) %s left by a crash", run_id, prepared.dropped)
    finished = _finished_summary(prepared)
    if finished is not None:  # nothing to resume: never repeat the ending (a second model version, the alias)
        try:
            if finished.get("tracking_pending") and cfg.tracking.enabled:
                return _deliver_pending(prepared, finished, logger)
        finally:
            prepared.lease.stop()
        logger.info("run %s finished already (generation %s, best fitness %s); nothing to resume", run_id,
                    finished.get("generations", 0) - 1, finished.get("best_fitness"))
        return {**finished, "already_finished": True}
    hooks = RUN_HOOKS.take(run_id)
    if hooks is not None:
        hooks.env = evo.arena.env_desc
    tracker = Tracker(cfg, run_id, store.storage.uri) if cfg.tracking.enabled else None
    flow_run_url = _flow_run("ui_url")
    view = RunView(cfg, run_id, logger)
    if tracker is not None:
        _describe(tracker, run_description(cfg, run_id, store.uri, flow_run_url=flow_run_url), logger)
    view.start(store.uri, tracker.where if tracker else None, tracker.run_url if tracker else None, prepared.latest,
               evo.global_steps)
    dataset = getattr(evo.arena, "dataset", None)
    if tracker is not None and dataset is not None:
        tracker.log_dataset(dataset.describe())
    space_names = sorted(evo.arena.space)
    mode = "threads" if cfg.runner.kind == "threads" else "process"
    tracking = TrackingQueue(tracker, logger, spill=lambda st, m: _spill(store, st, m),
                             unspill=lambda g: store.storage.delete([_spill_key(store, g)])) if tracker else None
    pending: list[int] = []  # generations the tracking server had not taken when the run ended
    end_pending = False  # the run's ending (lineage, champion) not in MLflow: `resume` delivers it
    t0 = time.perf_counter()
    steps0 = evo.global_steps
    gen_wall0 = sum(h.wall_s for h in evo.history)  # the committed generations' wall time before this attempt
    placements: list[dict] = []  # where the last generation's groups trained (process runners: host, GPUs)
    status = "FAILED"
    try:
        if tracker is not None and evo.history:  # generations committed before a crash but never logged
            _log_unlogged(tracker, store, evo, space_names, logger)
        check_deployment(cfg.runner)
        with dask_cluster(cfg.runner) as address, task_runner(cfg, address) as runner:
            bar = tqdm(total=cfg.max_env_steps, initial=evo.global_steps, unit="step", file=sys.stderr,
                       disable=not progress, dynamic_ncols=True, desc=f"evolution {run_id}")
            # members training in this process (threads) move the bar as they step; worker processes do not
            with progress_reporting(bar.update) if progress else contextlib.nullcontext():
                while not evo.finished():
                    prepared.lease.check()  # taken over by another writer (after a long stall): stop, commit nothing
                    g = evo.population.generation + (1 if evo.history else 0)
                    job = GenerationJob(run_id, cfg, store.storage.uri, g, evo.generation_steps(), mode)
                    stats = run_generation(job, evo, store, runner, tracking, hooks)
                    prepared.committed = stats["generation"]
                    placements = stats["placements"]
                    view.generation(stats, generation_rows(evo.population, stats, space_names))
                    show_generation(bar, stats["global_steps"], stats["generation"], evo.finished(),
                                    evo.best_fitness(), stats["best_fitness"], stats["mean_fitness"])
                    if hooks and hooks.generation(evo.history[-1], evo.population.members):
                        logger.info("run %s: stopped after generation %d by callback %s", run_id, stats["generation"],
                                    hooks.stopped_by)
                        break
            bar.close()
        if tracking is not None:
            pending = tracking.close(cfg.tracking.flush_timeout)
        choice = choose_champion(evo, store, eval_rounds(cfg))
        logger.info("run %s: champion candidates on fresh seeds: %s; registering the %s", run_id, ", ".join(
            f"{c.role.replace('_', ' ')} (member {c.member_id}, generation {c.generation}) {c.fresh_fitness:.2f} "
            f"(scored {c.fitness:.2f} in its generation)" for c in choice.candidates),
            choice.chosen.role.replace("_", " "))
        elite_uri = store.save_elite(choice.member, evo.arena.env_desc)
        wall = time.perf_counter() - t0
        summary = {**evo.result(wall, evo.global_steps - steps0, elite_uri).summary(), "run_id": run_id,
                   **_whole_run(evo, wall, evo.global_steps - steps0, prepared.latest, gen_wall0),
                   "champion": choice.summary(),
                   "storage_uri": store.uri, "mlflow_run_id": tracker.parent_id if tracker else None,
                   "mlflow_run_url": tracker.run_url if tracker else None, "prefect_flow_run_id": _flow_run("id"),
                   "group_placements": placements, **({"stopped_by": hooks.stopped_by} if hooks else {})}
        lineage = [e.to_dict() for e in evo.population.lineage]
        with tempfile.TemporaryDirectory(prefix="agilerl-end-") as tmp:
            tracked = False
            if tracker is not None and not pending:  # the pictures are rendered into tmp beside the champion's logging
                elite_dir = save_member(Path(tmp) / "member", choice.member, evo.arena.env_desc)
                tracked = _track_end(tracker, evo, lineage, space_names, elite_dir, summary, tmp, logger)
            if tracker is not None and not tracked:
                end_pending = True
                summary["tracking_pending"] = {"generations": pending, "end": True}
                logger.warning(_pending_message(tracker, run_id, store.storage.uri, pending))
            tree = Path(tmp) / "family_tree.png"
            if not tree.exists():
                tree, _ = render_lineage(lineage, space_names, tmp, cfg.name)
            lineage_md = lineage_markdown(tree, elite_path(lineage), lineage)
        if tracker is not None and tracked:
            _describe(tracker, run_description(cfg, run_id, store.uri, summary, flow_run_url), logger)
        view.end(summary, tracker.model_url(summary.get("registered_model"), summary.get("version"))
                 if tracker else None, lineage_md)
        store.storage.put_bytes(store.key("summary.json"), json.dumps(summary, indent=1).encode())
        view.close(ARTIFACTS_TIMEOUT_S)  # the summary artifact is among them: `agilerl-flow trigger` reads it
        status = "FINISHED"
        return summary
    finally:
        view.close(0, quiet=True)  # a failed run: what the API has not taken yet is dropped
        prepared.lease.stop()
        WORKER_RUNS.drop(run_id)
        if tracking is not None:
            pending = pending or tracking.close(0)  # a failed run: resume logs its committed generations
        if tracker is not None and not pending and not end_pending:
            with contextlib.suppress(Exception):
                tracker.end(status)


def _track_end(tracker: Tracker, evo: Evolution, lineage: list[dict], space_names: list[str], elite_dir: Path,
               summary: dict[str, Any], tmp: str, logger) -> bool:
    """The run's ending in MLflow: lineage table and pictures, the champion logged, registered and (by policy)
    promoted; `summary` updated. False when the tracking server failed (the summary then marks it pending)."""
    signature, example = champion_io(evo.arena)
    try:
        summary.update(log_run_end_task(tracker, lineage, space_names, str(elite_dir), summary, tmp, signature,
                                        example))
    except Exception as err:
        logger.warning("run %s: logging the run's end to %s failed: %s", tracker.run_id, tracker.uri, err)
        return False
    return True


def _pending_message(tracker: Tracker, run_id: str, storage_uri: str, pending: list[int]) -> str:
    gens = f"generation(s) {', '.join(map(str, pending))}, " if pending else ""
    return (f"run {run_id} finished, but the tracking server {tracker.uri} did not take everything: {gens}the "
            f"lineage and the champion model are not logged yet (nothing is lost: they are in storage). Once the "
            f"server is back, `agilerl-flow resume {run_id} --storage {storage_uri}` delivers them, each exactly once")


def _spill_key(store: RunStore, generation: int) -> str:
    return store.key("tracking", f"generation-{generation:06d}.json")


def _spill(store: RunStore, stats: dict[str, Any], members: list[dict[str, Any]]) -> None:
    """Keep a generation's tracking rows in storage while the tracking server cannot take them: what `resume`
    logs (a pruned generation's members are gone from its checkpoints, their rows are not)."""
    data = json.dumps({"stats": {k: v for k, v in stats.items() if k != "placements"}, "members": members})
    store.storage.put_bytes(_spill_key(store, int(stats["generation"])), data.encode())


def _log_unlogged(tracker: Tracker, store: RunStore, evo: Evolution, space_names: list[str], logger) -> list[int]:
    """Log the committed generations MLflow does not have completely (a crash, or a tracking server that was
    down), each run's metrics exactly once: from the rows the run kept in storage for it, else rebuilt from
    the committed generation; returns them."""
    logged = tracker.logged_generations()
    missing = [h for h in evo.history if h.generation not in logged]
    for h in missing:
        logger.info("run %s: logging generation %d, committed while it could not be logged", tracker.run_id,
                    h.generation)
        key = _spill_key(store, h.generation)
        if store.storage.exists(key):
            from agilerl_core.io.records import field, read_record

            url = store.storage.url(key)
            kept = read_record(store.storage.get_bytes(key), url, allow_nan=True)  # the one parser for stored records
            tracker.log_generation(field(kept, "stats", dict, url), field(kept, "members", list, url), only_missing=True)
        else:
            _log_from_store(tracker, store, h.generation, asdict(h), evo, space_names)
    spilled = store.storage.list(store.key("tracking") + "/")
    if spilled:
        store.storage.delete(spilled)
    return [h.generation for h in missing]


def _deliver_pending(prepared: PreparedRun, summary: dict[str, Any], logger) -> dict[str, Any]:
    """A finished run whose tracking server was down at its end: log its missing generations and its ending
    (lineage, the champion from ``<run>/elite/``) now, exactly once, and store the completed summary."""
    cfg, run_id, evo, store = prepared.cfg, prepared.run_id, prepared.evo, prepared.store
    tracker = Tracker(cfg, run_id, store.storage.uri)
    space_names = sorted(evo.arena.space)
    delivered = _log_unlogged(tracker, store, evo, space_names, logger)
    summary = {k: v for k, v in summary.items() if k != "tracking_pending"}
    summary.update(mlflow_run_id=tracker.parent_id, mlflow_run_url=tracker.run_url)
    lineage = [e.to_dict() for e in evo.population.lineage]
    with tempfile.TemporaryDirectory(prefix="agilerl-end-") as tmp:
        elite_dir = store.storage.download_dir(store.key("elite"), Path(tmp) / "member")
        registered = tracker.registered_version()
        if registered is not None:  # the registration landed before the server went away: not a second version
            summary.update(model_uri=f"models:/{registered.name}/{registered.version}",
                           registered_model=registered.name, version=str(registered.version),
                           **tracker.promote(registered.name, str(registered.version),
                                             (summary.get("champion") or {}).get("fitness")))
            tracker.log_lineage(lineage, space_names, tmp)
        elif not _track_end(tracker, evo, lineage, space_names, elite_dir, summary, tmp, logger):
            raise TrackingError(f"run {run_id}: the tracking server {tracker.uri} failed while the run's end was "
                                f"delivered; run `agilerl-flow resume {run_id} --storage {store.storage.uri}` again")
    _describe(tracker, run_description(cfg, run_id, store.uri, summary, _flow_run("ui_url")), logger)
    tracker.end("FINISHED")
    store.storage.put_bytes(store.key("summary.json"), json.dumps(summary, indent=1).encode())
    logger.info("run %s finished already; delivered to %s what its tracking server missed: generation(s) %s, the "
                "lineage and the champion (%s)", run_id, tracker.where, delivered or "none", summary.get("promotion"))
    return {**summary, "already_finished": True, "tracking_delivered": delivered}


def _whole_run(evo: Evolution, wall: float, steps: int, resumed_after: int | None, gen_wall0: float) -> dict:
    """The summary's timing over the whole run: a resumed run's wall_s adds the committed generations of its
    earlier attempts to this attempt's wall time (work a crash discarded is not counted); this attempt alone is
    attempt_wall_s / attempt_steps."""
    if resumed_after is None:
        return {"attempt_wall_s": round(wall, 3), "attempt_steps": steps}
    return {"wall_s": round(gen_wall0 + wall, 3), "attempt_wall_s": round(wall, 3), "attempt_steps": steps,
            "resumed_after_generation": resumed_after}


def _finished_summary(prepared: PreparedRun) -> dict[str, Any] | None:
    """The stored summary of a run whose last committed generation ended it (None when it has more to do)."""
    store, evo = prepared.store, prepared.evo
    if prepared.latest is None or not evo.finished() or not store.storage.exists(store.key("summary.json")):
        return None
    from agilerl_core.io.records import read_record

    summary = read_record(store.storage.get_bytes(store.key("summary.json")), store.storage.url(store.key("summary.json")),
                          allow_nan=True)
    return summary if isinstance(summary, dict) and summary.get("generations") == len(evo.history) else None


def _flow_run(field: str) -> str | None:
    """This flow run's `id` or `ui_url` (its page in the Prefect UI); None when Prefect cannot say."""
    with contextlib.suppress(Exception):
        from prefect.runtime import flow_run

        return getattr(flow_run, field)
    return None


def _describe(tracker: Tracker, text: str, logger) -> None:
    """The MLflow parent run's description (a convenience: a failure is a warning, not a failed run)."""
    try:
        tracker.describe(text)
    except Exception as err:
        logger.warning("run %s: could not set the MLflow run's description: %s", tracker.run_id, err)


def _log_from_store(tracker: Tracker, store: RunStore, generation: int, stats: dict, evo: Evolution,
                    space_names: list[str]) -> None:
    """Log a committed generation read back from storage (its members as they were then)."""
    try:
        pop = evo.population if generation == evo.population.generation else \
            store.load_generation(generation, rebuild=evo.arena.member_from_state)[0]
    except CheckpointError:  # pruned by retention: its members are gone, the population metrics remain
        tracker.log_generation(stats, [], only_missing=True)
        return
    tracker.log_generation(stats, member_rows(pop, stats["train_returns"], space_names, stats.get("train_metrics")),
                           only_missing=True)
