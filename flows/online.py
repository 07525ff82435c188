"""The online (Gymnasium) evolution flow.

``online_evolution`` sets a run up (every check before any training: config, env, storage access,
tracking server), resumes from the last committed generation when the run id already has one, then
runs one DAG of tasks per generation::

    select+mutate --+--> train(m0) --> evaluate(m0) --+--> commit --> log
    (from g-1)      +--> train(m1) --> evaluate(m1) --+
                    +--> ...                           +

Each member is evaluated as soon as it is trained. The task runner is ``config.runner.kind``: a
thread pool in the flow process (the population shares one buffer object) or Dask worker processes
(experience travels as shards through storage). Both give the same result as ``agilerl-flow run
--local`` for the same config and seed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.task_runners import ThreadPoolTaskRunner
from tqdm import tqdm

from agilerl_core.config import ExperimentConfig
from agilerl_core.errors import CheckpointError, ConfigError
from agilerl_core.io.run_store import RunStore, check_run_id
from agilerl_core.io.storage import storage_from_config
from agilerl_core.training.experiment import Experiment
from tasks.generation import (
    GenerationJob,
    MemberState,
    commit_generation_task,
    evaluate_member_task,
    flow_context,
    register_context,
    release_context,
    select_and_mutate_task,
    train_member_task,
)
from tasks.tracking import (
    SECRET_FIELDS,
    Tracker,
    check_tracking_server,
    log_generation_task,
    log_run_end_task,
    member_rows,
    tracking_uri,
)

SUMMARY_ARTIFACT = "evolution-summary"


def new_run_id(cfg: ExperimentConfig) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S-%f")
    return f"{cfg.name}-s{cfg.seed}-{stamp}"


def stored_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as persisted in run.json: JSON, secrets removed."""
    data = cfg.model_dump(mode="json")
    for dotted in SECRET_FIELDS:
        section, name = dotted.split(".")
        data[section].pop(name, None)
    return data


def _task_runner(cfg: ExperimentConfig, dask_address: str | None):
    if cfg.runner.kind == "dask":
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=dask_address)
    return ThreadPoolTaskRunner(max_workers=cfg.runner.max_threads)


def preflight(cfg: ExperimentConfig) -> None:
    """Every check that needs no training, in the order a user would fix them: the config and env, the
    storage URI and its credentials, the tracking server. The CLI runs it before starting the flow (so a
    bad input is one clear line, not a failed flow run); the flow runs it again for deployments."""
    Experiment.check(cfg)
    storage_from_config(cfg).check()
    if cfg.tracking.enabled:
        check_tracking_server(tracking_uri(cfg))


@contextlib.contextmanager
def _dask_cluster(cfg: ExperimentConfig):
    """The scheduler address of the configured cluster; a local process cluster lives as long as the run."""
    if cfg.runner.kind != "dask":
        yield None
        return
    if cfg.runner.address:
        yield cfg.runner.address
        return
    import dask
    from distributed import LocalCluster

    # Dask's statistical profiler samples every task thread's stack every 10 ms; on a Python-heavy
    # training loop that costs ~40% of the worker's time (measured: 4 CartPole members on 2 workers,
    # 22.3 s with it, 13.2 s without). Workers of an external cluster should set the same option.
    os.environ["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"
    with dask.config.set({"distributed.worker.profile.enabled": False}), \
            LocalCluster(n_workers=cfg.runner.workers, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def run_generation(job: GenerationJob, runner) -> dict[str, Any]:
    """One generation's DAG in the flow run (select+mutate from the previous one first).

    The tasks are submitted to `runner`, a started task runner of the configured kind, so that one flow
    serves every runner; a generation is not a subflow of its own (a subflow costs ~0.4 s of API calls
    and heartbeat teardown per generation, measured; its task names carry the generation instead)."""
    ctx = flow_context(job.run_id)
    exp = ctx.exp
    if exp.history:
        select_and_mutate_task(job)
    exp.begin_generation()
    n = len(exp.population.members)
    if job.mode == "threads" and job.config.runner.max_threads == 1:
        # one member at a time: run the tasks in this thread (no hand-off to a pool thread), each member
        # evaluated right after it is trained
        outputs, fitnesses = [], []
        for slot in range(n):
            outputs.append(train_member_task(job, slot))
            fitnesses.append(evaluate_member_task(job, slot, outputs[-1]))
    else:  # a process runner ships each member's state; threads train the live agents
        states = [MemberState(*m.agent.state()) if job.mode == "process" else None for m in exp.population.members]
        trained = [runner.submit(train_member_task, {"job": job, "slot": slot, "state": states[slot]})
                   for slot in range(n)]
        evaluated = [runner.submit(evaluate_member_task, {"job": job, "slot": slot, "trained": trained[slot]})
                     for slot in range(n)]
        outputs = [f.result() for f in trained]
        fitnesses = [f.result() for f in evaluated]
    commit_generation_task(job, outputs, fitnesses)
    last = exp.history[-1]
    stats = asdict(last)
    if ctx.tracker is not None:
        params = {"tracker": ctx.tracker, "stats": stats,
                  "members": member_rows(exp.population, last.train_returns, sorted(exp.space))}
        wait_for_logging(ctx)  # one generation in flight at most, logged in order
        if job.mode == "threads" and job.config.runner.max_threads == 1:
            # the pool's thread is idle while members train in this one: log there, beside the next
            # generation (a crash before it lands is covered: resume logs committed, unlogged generations)
            ctx.log_future = runner.submit(log_generation_task, params)
        else:
            log_generation_task(**params)
    return stats


def wait_for_logging(ctx) -> None:
    """Wait for the generation being logged in the background (raising its error, after its retries)."""
    if ctx.log_future is not None:
        future, ctx.log_future = ctx.log_future, None
        future.result()


@flow(name="online-evolution", flow_run_name="{config.name}", validate_parameters=True)
def online_evolution(config: ExperimentConfig, run_id: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Evolve a population on a Gymnasium env until the target fitness or the env-step budget.

    Running it again with the same `run_id` after a crash continues from the last committed generation
    and ends exactly as an uninterrupted run would.
    """
    if config.dataset is not None:
        raise ConfigError(f"dataset: {config.name} learns from a dataset; run it with the offline-evolution flow "
                          f"(`agilerl-flow run` chooses it)")
    return run_evolution(config, run_id, progress)


def run_evolution(cfg: ExperimentConfig, run_id: str | None, progress: bool) -> dict[str, Any]:
    """The body of the online and offline flows (called inside a flow run): setup and every check,
    resume, one DAG per generation, the elite, tracking."""
    logger = get_run_logger()
    run_id = check_run_id(run_id or new_run_id(cfg))
    exp = Experiment(cfg)  # config, env id, spaces, bounds, dataset: checked here, before anything is written
    if exp.dataset is not None and cfg.dataset.sha256 is None:
        # pin the data: the run's record, its MLflow params and every worker then name (and check) this content
        cfg = cfg.model_copy(update={"dataset": cfg.dataset.model_copy(update={"sha256": exp.dataset.sha256})})
        exp.cfg = cfg
    storage = storage_from_config(cfg)
    storage.check()  # URI, endpoint and credentials, before any training
    tracker = Tracker(cfg, run_id, storage.uri) if cfg.tracking.enabled else None
    if tracker is not None and exp.dataset is not None:
        tracker.log_dataset(exp.dataset.describe())
    store = RunStore(storage, run_id)
    store.init_run(stored_config(cfg))
    latest = store.latest_generation()
    dropped = store.discard_uncommitted()
    if dropped:
        logger.info("run %s: discarded uncommitted generation(s) %s left by a crash", run_id, dropped)
    if latest is not None:
        exp.resume(store, latest)
        logger.info("run %s: resuming after committed generation %d (%d env steps)", run_id, latest,
                    exp.global_steps)
    space_names = sorted(exp.space)
    mode = "process" if cfg.runner.kind == "dask" else "threads"
    register_context(run_id, exp, store, tracker)
    t0 = time.perf_counter()
    steps0 = exp.global_steps
    status = "FAILED"
    try:
        if tracker is not None and exp.history:  # generations committed before a crash but never logged
            logged = tracker.logged_generations()
            for h in exp.history:
                if h.generation not in logged:
                    logger.info("run %s: logging generation %d, committed before the crash", run_id, h.generation)
                    _log_from_store(tracker, store, h.generation, asdict(h), exp, space_names)
        with _dask_cluster(cfg) as address, _task_runner(cfg, address) as runner:
            bar = tqdm(total=cfg.max_env_steps, initial=exp.global_steps, unit="step", file=sys.stderr,
                       disable=not progress, dynamic_ncols=True, desc=f"evolution {run_id}")
            while not exp.finished():
                g = exp.population.generation + (1 if exp.history else 0)
                job = GenerationJob(run_id, cfg, storage.uri, g, mode)
                stats = run_generation(job, runner)
                logger.info("generation %d: best %.2f mean %.2f, %d env steps", stats["generation"],
                            stats["best_fitness"], stats["mean_fitness"], stats["global_steps"])
                bar.update(stats["global_steps"] - bar.n)
                bar.set_postfix(gen=stats["generation"], best=f"{stats['best_fitness']:.1f}",
                                mean=f"{stats['mean_fitness']:.1f}")
            bar.close()
            wait_for_logging(flow_context(run_id))
        wall = time.perf_counter() - t0
        elite_uri = store.save_elite(exp.population.elite(), exp.env_desc)
        summary = {**exp.result(wall, exp.global_steps - steps0, elite_uri).summary(), "run_id": run_id,
                   "storage_uri": store.uri, "mlflow_run_id": tracker.parent_id if tracker else None}
        if tracker is not None:
            with tempfile.TemporaryDirectory(prefix="agilerl-elite-") as tmp:
                elite_dir = exp.save_elite(Path(tmp) / "member")
                summary.update(log_run_end_task(tracker, [e.to_dict() for e in exp.population.lineage],
                                                space_names, str(elite_dir), summary))
        store.storage.put_bytes(store.key("summary.json"), json.dumps(summary, indent=1).encode())
        with contextlib.suppress(Exception):  # the summary artifact is a convenience for `agilerl-flow trigger`
            create_table_artifact([summary], key=SUMMARY_ARTIFACT, description="evolution summary (JSON row)")
        status = "FINISHED"
        return summary
    finally:
        release_context(run_id)
        if tracker is not None:
            with contextlib.suppress(Exception):
                tracker.end(status)


def _log_from_store(tracker: Tracker, store: RunStore, generation: int, stats: dict, exp: Experiment,
                    space_names: list[str]) -> None:
    """Log a committed generation read back from storage (its members as they were then)."""
    try:
        pop = exp.population if generation == exp.population.generation else \
            store.load_generation(generation, exp.obs_spec, exp.device)[0]
    except CheckpointError:  # pruned by retention: its members are gone, the population metrics remain
        tracker.log_generation(stats, [])
        return
    tracker.log_generation(stats, member_rows(pop, stats["train_returns"], space_names))
