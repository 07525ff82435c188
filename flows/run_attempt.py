"""One attempt at a prepared run (:class:`RunAttempt`), around the generations :func:`flows.evolution.run_evolution`
runs: what watches it (the MLflow tracker and its queue, the run's view in the Prefect UI, the user's callbacks),
the champion chosen on fresh seeds, the elite and the JSON summary, the run's end in MLflow, and the teardown.

A run whose tracking server was down at its end is finished but not fully tracked: resuming it delivers what
the server missed, exactly once (:func:`end_finished_run`).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agilerl_core.api.callbacks import CallbackHooks
from agilerl_core.champion import choose_champion, eval_rounds, input_fitness
from agilerl_core.errors import CheckpointError, TrackingError
from agilerl_core.evolution import Evolution
from agilerl_core.experiment import point_latest
from agilerl_core.hpo.found import found_hyperparameters, rerun_yaml
from agilerl_core.io.checkpoint import save_member
from agilerl_core.io.run_store import RunStore
from agilerl_core.io.storage import LocalStorage
from agilerl_core.progress import show_generation
from flows.run_setup import PreparedRun, rerun_data
from tasks.artifacts import RunView, generation_rows, lineage_markdown
from tasks.delivery import TrackingQueue
from tasks.generation import WORKER_RUNS
from tasks.registry import champion_io
from tasks.reports import elite_path, member_rows, render_lineage
from tasks.tracker import Tracker, log_run_end_task, run_description

ARTIFACTS_TIMEOUT_S = 60.0  # how long a run's end waits for the Prefect API to take its queued artifacts


class RunAttempt:
    """This process's attempt at a prepared run: started before its first generation (the tracker, the view,
    the callbacks), told of each committed generation, finished (the champion, the summary, the run's end) and
    closed, finished or failed."""

    def __init__(self, prepared: PreparedRun, hooks: CallbackHooks | None, logger) -> None:
        cfg, run_id, evo, store = prepared.cfg, prepared.run_id, prepared.evo, prepared.store
        self.prepared, self.hooks, self.logger = prepared, hooks, logger
        if hooks is not None:
            hooks.env = evo.arena.env_desc
        tracker = Tracker(cfg, run_id, store.storage.uri) if cfg.tracking.enabled else None
        self.tracker = tracker
        self.flow_run_url = _flow_run("ui_url")
        self.view = RunView(cfg, run_id, logger)
        if tracker is not None:
            _describe(tracker, run_description(cfg, run_id, store.uri, flow_run_url=self.flow_run_url), logger)
        self.view.start(store.uri, tracker.where if tracker else None, tracker.run_url if tracker else None,
                        prepared.latest, evo.global_steps)
        dataset = getattr(evo.arena, "dataset", None)
        if tracker is not None and dataset is not None:
            tracker.log_dataset(dataset.describe())
        self.space_names = sorted(evo.arena.space)
        self.tracking = TrackingQueue(tracker, logger, spill=lambda st, m: _spill(store, st, m),
                                      unspill=lambda g: store.storage.delete([_spill_key(store, g)])) if tracker else None
        self.pending: list[int] = []  # generations the tracking server had not taken when the run ended
        self.end_pending = False  # the run's ending (lineage, champion) not in MLflow: `resume` delivers it
        self.t0 = time.perf_counter()
        self.steps0 = evo.global_steps
        self.gen_wall0 = sum(h.wall_s for h in evo.history)  # the committed generations' wall time before this attempt
        self.placements: list[dict] = []  # where the last generation's groups trained (process runners: host, GPUs)

    def log_unlogged_generations(self) -> None:
        """Generations committed before a crash (or while the tracking server was down) but never logged."""
        if self.tracker is not None and self.prepared.evo.history:
            _log_unlogged(self.tracker, self.prepared.store, self.prepared.evo, self.space_names, self.logger)

    def report_generation(self, stats: dict[str, Any], bar) -> bool:
        """A committed generation shown in the Prefect UI and on the progress bar; True when a callback stops
        the run there."""
        evo, hooks = self.prepared.evo, self.hooks
        self.placements = stats["placements"]
        self.view.generation(stats, generation_rows(evo.population, stats, self.space_names))
        show_generation(bar, stats["global_steps"], stats["generation"],
                        evo.best_fitness(), stats["best_fitness"], stats["mean_fitness"])
        if hooks and hooks.generation(evo.history[-1], evo.population.members):
            self.logger.info("run %s: stopped after generation %d by callback %s", self.prepared.run_id,
                             stats["generation"], hooks.stopped_by)
            return True
        return False

    def finish(self) -> dict[str, Any]:
        """The run's end once its generations are done: the champion chosen on fresh seeds and saved as the
        elite, the JSON summary (stored, and the Prefect summary artifact), the lineage and the champion in
        MLflow (marked pending when the tracking server does not take them)."""
        prepared, tracker, logger = self.prepared, self.tracker, self.logger
        cfg, run_id, evo, store = prepared.cfg, prepared.run_id, prepared.evo, prepared.store
        hooks, space_names = self.hooks, self.space_names
        if self.tracking is not None:
            self.pending = self.tracking.close(cfg.tracking.flush_timeout)
        choice = choose_champion(evo, store, eval_rounds(cfg))
        if cfg.champion.promote == "if_beats_input":  # the gate: scored beside the candidates, on their seeds
            choice.input_fitness = input_fitness(evo, eval_rounds(cfg))
            logger.info("run %s: what it started from scores %.2f on the same fresh seeds", run_id,
                        choice.input_fitness)
        logger.info("run %s: champion candidates on fresh seeds: %s; registering the %s", run_id, ", ".join(
            f"{c.role.replace('_', ' ')} (member {c.member_id}, generation {c.generation}) {c.fresh_fitness:.2f} "
            f"(scored {c.fitness:.2f} in its generation)" for c in choice.candidates),
            choice.chosen.role.replace("_", " "))
        elite_uri = store.save_elite(choice.member, evo.arena.env_desc)
        wall = time.perf_counter() - self.t0
        summary = {**evo.result(wall, evo.global_steps - self.steps0, elite_uri).summary(), "run_id": run_id,
                   **_whole_run(evo, wall, evo.global_steps - self.steps0, prepared.latest, self.gen_wall0),
                   "champion": choice.summary(),
                   "storage_uri": store.uri, "mlflow_run_id": tracker.parent_id if tracker else None,
                   "mlflow_run_url": tracker.run_url if tracker else None, "prefect_flow_run_id": _flow_run("id"),
                   "group_placements": self.placements, **({"stopped_by": hooks.stopped_by} if hooks else {})}
        lineage = [e.to_dict() for e in evo.population.lineage]
        found_yaml = _record_found(prepared, lineage, choice.member.member_id, space_names, summary)
        with tempfile.TemporaryDirectory(prefix="agilerl-end-") as tmp:
            tracked = False
            if tracker is not None and not self.pending:  # the pictures are rendered into tmp beside the champion's logging
                elite_dir = save_member(Path(tmp) / "member", choice.member, evo.arena.env_desc)
                tracked = _track_end(tracker, evo, lineage, space_names, elite_dir, summary, tmp, logger, found_yaml)
            if tracker is not None and not tracked:
                self.end_pending = True
                summary["tracking_pending"] = {"generations": self.pending, "end": True}
                logger.warning(_pending_message(tracker, run_id, store.storage.uri, self.pending))
            tree = Path(tmp) / "family_tree.png"
            if not tree.exists():
                tree, _ = render_lineage(lineage, space_names, tmp, cfg.name)
            lineage_md = lineage_markdown(tree, elite_path(lineage), lineage)
        if tracker is not None and tracked:
            _describe(tracker, run_description(cfg, run_id, store.uri, summary, self.flow_run_url), logger)
        self.view.end(summary, tracker.model_url(summary.get("registered_model"), summary.get("version"))
                      if tracker else None, lineage_md)
        store.storage.put_bytes(store.key("summary.json"), json.dumps(summary, indent=1).encode())
        if isinstance(store.storage, LocalStorage):  # OUTPUT_DIR/NAME-latest, as evolve and --local runs make it
            point_latest(cfg, Path(store.uri))
        self.view.close(ARTIFACTS_TIMEOUT_S)  # the summary artifact is among them: `agilerl-flow trigger` reads it
        return summary

    def close(self, status: str) -> None:
        """The attempt's teardown, finished or failed: the view's queue, the run's lease and worker state, the
        tracking queue, and the MLflow run ended unless something is left for `resume` to deliver."""
        self.view.close(0, quiet=True)  # a failed run: what the API has not taken yet is dropped
        self.prepared.lease.stop()
        WORKER_RUNS.drop(self.prepared.run_id)
        if self.tracking is not None:
            self.pending = self.pending or self.tracking.close(0)  # a failed run: resume logs its committed generations
        if self.tracker is not None and not self.pending and not self.end_pending:
            with contextlib.suppress(Exception):
                self.tracker.end(status)


def end_finished_run(prepared: PreparedRun, finished: dict[str, Any], logger) -> dict[str, Any]:
    """A run whose last committed generation ended it: never repeat its ending (a second model version, the
    alias); deliver what its tracking server missed, if anything; the stored summary, marked already finished."""
    try:
        if finished.get("tracking_pending") and prepared.cfg.tracking.enabled:
            return _deliver_pending(prepared, finished, logger)
    finally:
        prepared.lease.stop()
    logger.info("run %s finished already (generation %s, best fitness %s); nothing to resume", prepared.run_id,
                finished.get("generations", 0) - 1, finished.get("best_fitness"))
    return {**finished, "already_finished": True}


def _record_found(prepared: PreparedRun, lineage: list[dict], member_id: int, space_names: list[str],
                  summary: dict[str, Any]) -> str:
    """What the run found (the champion's hyperparameters and their moves) into `summary`, and the config that
    re-runs from them stored beside the run (``found_config.yaml``); returns that file's text."""
    store = prepared.store
    found = found_hyperparameters(lineage, member_id, space_names)
    text = rerun_yaml(rerun_data(prepared.cfg), found["values"], prepared.run_id)
    key = store.key(FOUND_CONFIG)
    store.storage.put_bytes(key, text.encode())
    summary.update(found=found, found_config_uri=store.storage.url(key))
    return text


def _stored_found_yaml(store: RunStore) -> str | None:
    key = store.key(FOUND_CONFIG)
    return store.storage.get_bytes(key).decode() if store.storage.exists(key) else None


def _track_end(tracker: Tracker, evo: Evolution, lineage: list[dict], space_names: list[str], elite_dir: Path,
               summary: dict[str, Any], tmp: str, logger, found_yaml: str | None = None) -> bool:
    """The run's ending in MLflow: lineage table and pictures, what it found, the champion logged, registered
    and (by policy) promoted; `summary` updated. False when the tracking server failed (the summary then marks
    it pending)."""
    signature, example = champion_io(evo.arena)
    try:
        summary.update(log_run_end_task(tracker, lineage, space_names, str(elite_dir), summary, tmp, signature,
                                        example, found_yaml))
    except Exception as err:
        logger.warning("run %s: logging the run's end to %s failed: %s", tracker.run_id, tracker.uri, err)
        return False
    return True


def _pending_message(tracker: Tracker, run_id: str, storage_uri: str, pending: list[int]) -> str:
    gens = f"generation(s) {', '.join(map(str, pending))}, " if pending else ""
    return (f"run {run_id} finished, but the tracking server {tracker.uri} did not take everything: {gens}the "
            f"lineage and the champion model are not logged yet (nothing is lost: they are in storage). Once the "
            f"server is back, `agilerl-flow resume {run_id} --storage {storage_uri}` delivers them, each exactly once")


FOUND_CONFIG = "found_config.yaml"  # beside summary.json in the run's storage


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
                                             (summary.get("champion") or {}).get("fitness"),
                                             (summary.get("champion") or {}).get("input_fitness")))
            tracker.log_lineage(lineage, space_names, tmp)
        elif not _track_end(tracker, evo, lineage, space_names, elite_dir, summary, tmp, logger,
                            _stored_found_yaml(store)):
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
    tracker.log_generation(stats, member_rows(pop, stats["train_returns"], space_names, stats.get("train_metrics"),
                                              stats.get("train_metric_points")), only_missing=True)
