"""The body every evolution flow shares, whatever the kind of training (the flows themselves are one line
each: ``flows/online.py``, ``flows/offline.py``; the CLI and ``deployments/build.py`` pick one by ``kind``).

A run is first *prepared* (:func:`flows.run_setup.prepare_run`): the Evolution is built (config, env, dataset
checked), the storage URI and its credentials and the tracking server are checked, and a run with committed
generations is loaded back (every checksum verified). The CLI prepares before it starts the flow, so a bad
input is one clear paragraph and never a failed flow run; the flow then takes that prepared run as its
``handover`` parameter (:class:`flows.run_setup.Handover`) instead of building it again. A deployment's flow
prepares itself.

Then one DAG of tasks per generation::

    select+mutate --+--> train(group 0) --> evaluate(group 0) --+--> fold --> commit --> log
    (from g-1)      +--> train(group 1) --> evaluate(group 1) --+
                    +--> ...                                     +

A group is one or more members that learn together (population-batched, see Evolution.groups); the task
runner (threads, Dask or Ray: flows/runners.py) places each group's task. Around the generations, one
:class:`~flows.run_attempt.RunAttempt` tracks the run (MLflow, the Prefect UI), then chooses the champion and
ends it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from prefect import get_run_logger
from tqdm import tqdm

from agilerl_core.api.callbacks import CallbackHooks
from agilerl_core.evolution import Evolution
from agilerl_core.io.run_store import RunStore
from agilerl_core.progress import reporting as progress_reporting
from flows.run_attempt import RunAttempt, end_finished_run
from flows.run_setup import finished_summary, handed_over, prepare_run
from flows.runners import check_deployment, dask_cluster, placement, task_runner
from tasks.config import PipelineConfig
from tasks.delivery import TrackingQueue
from tasks.generation import (
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
from tasks.reports import member_rows
from tasks.trust import check_flow_run_code

SUMMARY_ARTIFACT = "summary"  # the run's JSON summary: artifact key RUN-summary (what `trigger` reads)


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
        tracking.put(stats, member_rows(evo.population, last.train_returns, sorted(evo.arena.space), last.train_metrics,
                                        last.train_metric_points))
    return stats


def run_evolution(cfg: PipelineConfig, run_id: str | None, progress: bool, handover: Any = None) -> dict[str, Any]:
    """The body of every evolution flow (called inside a flow run): the run `handover` brings (prepared by
    :func:`flows.api.run` in this process), or prepared now, one DAG per generation (:func:`run_generation`) until
    the run's budget is spent, then the champion and the run's end (:class:`~flows.run_attempt.RunAttempt`)."""
    logger = get_run_logger()
    check_flow_run_code(cfg)  # a deployment's parameters may not name code its own config does not
    given = handed_over(handover, cfg, run_id)
    prepared = given.prepared if given is not None else prepare_run(cfg, run_id)
    cfg, run_id, evo, store = prepared.cfg, prepared.run_id, prepared.evo, prepared.store
    _name_flow_run(run_id, logger)
    if prepared.dropped:
        logger.info("run %s: discarded uncommitted generation(s) %s left by a crash", run_id, prepared.dropped)
    finished = finished_summary(prepared)
    if finished is not None:  # nothing to resume: never repeat the ending (a second model version, the alias)
        return end_finished_run(prepared, finished, logger)
    hooks = None if given is None else given.hooks
    attempt = RunAttempt(prepared, hooks, logger)  # the tracker, the Prefect UI's view, callbacks
    mode = "threads" if cfg.runner.kind == "threads" else "process"
    status = "FAILED"
    try:
        attempt.log_unlogged_generations()
        check_deployment(cfg.runner)
        with (dask_cluster(cfg.runner) as address, task_runner(cfg, address) as runner,
              _progress_bar(cfg, evo, run_id, progress) as bar):
            while not evo.finished():
                prepared.lease.check()  # taken over by another writer (after a long stall): stop, commit nothing
                g = evo.population.generation + (1 if evo.history else 0)
                job = GenerationJob(run_id, cfg, store.storage.uri, g, evo.generation_steps(), mode)
                # select+mutate, train and evaluate the groups in parallel, fold, commit, log
                stats = run_generation(job, evo, store, runner, attempt.tracking, attempt.hooks)
                prepared.committed = stats["generation"]
                if attempt.report_generation(stats, bar):  # True: a callback stopped the run
                    break
        summary = attempt.finish()  # the champion, the elite, the summary, the run's end in MLflow
        status = "FINISHED"
        return summary
    finally:
        attempt.close(status)


@contextlib.contextmanager
def _progress_bar(cfg: PipelineConfig, evo: Evolution, run_id: str, progress: bool) -> Iterator[tqdm]:
    """The run's progress bar over env steps (closed when the generations end; left as it is when they fail).
    Members training in this process (threads) move it as they step; worker processes do not."""
    bar = tqdm(total=cfg.max_env_steps, initial=evo.global_steps, unit="step", file=sys.stderr,
               disable=not progress, dynamic_ncols=True, desc=f"evolution {run_id}")
    with progress_reporting(bar.update) if progress else contextlib.nullcontext():
        yield bar
    bar.close()
