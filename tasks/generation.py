"""The generation step as Prefect tasks.

Each task is a thin call into :mod:`agilerl_core`. The same tasks serve both runner kinds:

* ``threads``: the flow process holds one :class:`Experiment` (population, shared buffer, envs). Tasks
  find it by run id in this process's registry and train the live agents in place; fresh experience
  stays in the buffer's staging slots (no serialisation).
* ``process`` (Dask): each worker process builds its own Experiment from the config and keeps it
  cached across tasks, its buffer synced to the last committed generation from the run's shards.
  A member's state travels as tensors + JSON-able metadata; its fresh transitions are written to
  storage as a shard and returned as a reference.

Retries only where failures are transient (storage writes, the tracking server), never around learning.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from agilerl_core.config import ExperimentConfig
from agilerl_core.envs.make import make_vector_env
from agilerl_core.io.run_store import RunStore, ShardRef
from agilerl_core.io.storage import storage_from_config
from agilerl_core.training.experiment import Experiment
from agilerl_core.training.generation import TrainResult

Mode = Literal["threads", "process"]


@dataclass(frozen=True)
class GenerationJob:
    """What a task needs to find its run and generation, in this process or in a worker."""

    run_id: str
    config: ExperimentConfig
    storage_uri: str
    generation: int
    mode: Mode = "threads"


@dataclass
class MemberState:
    """An agent as data (process runners): :meth:`RLAlgorithm.state` output."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]


@dataclass
class TrainOutput:
    result: TrainResult
    state: MemberState | None = None  # process runners: the trained agent
    shard: ShardRef | None = None  # process runners: its fresh transitions in storage


@dataclass
class RunContext:
    """One process's view of a run: its Experiment, store, and (workers) how far its buffer is synced."""

    exp: Experiment
    store: RunStore
    synced: int = -1  # workers: the committed generation their buffer reflects (-1: empty)
    staged: int | None = None  # the generation whose staging area is reserved
    eval_envs: dict[int, Any] = field(default_factory=dict)
    pending: list[ShardRef] = field(default_factory=list)  # the shards of the generation being committed
    tracker: Any = None  # the flow process's tasks.tracking.Tracker, when tracking is on
    log_future: Any = None  # the last generation's logging, when it runs beside the next generation
    lock: threading.Lock = field(default_factory=threading.Lock)

    def eval_env(self, slot: int):
        """One evaluation env per slot, so that members evaluate concurrently in threads."""
        with self.lock:
            if slot not in self.eval_envs:
                cfg = self.exp.cfg
                self.eval_envs[slot] = make_vector_env(cfg.env_id, cfg.eval_episodes, cfg.env_kwargs)
            return self.eval_envs[slot]


_CONTEXTS: dict[tuple[str, Mode], RunContext] = {}
_REGISTRY_LOCK = threading.Lock()


def register_context(run_id: str, exp: Experiment, store: RunStore, tracker: Any = None) -> RunContext:
    """The flow process registers its live Experiment (and tracker) for its tasks."""
    ctx = RunContext(exp, store, tracker=tracker)
    with _REGISTRY_LOCK:
        _CONTEXTS[(run_id, "threads")] = ctx
    return ctx


def release_context(run_id: str) -> None:
    with _REGISTRY_LOCK:
        for mode in ("threads", "process"):
            _CONTEXTS.pop((run_id, mode), None)


def flow_context(run_id: str) -> RunContext:
    """The context the flow process registered for `run_id`."""
    return _CONTEXTS[(run_id, "threads")]


def _context(job: GenerationJob) -> RunContext:
    key = (job.run_id, job.mode)
    with _REGISTRY_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            if job.mode == "threads":
                raise RuntimeError(f"run {job.run_id}: no experiment registered in this process; thread-runner "
                                   f"tasks must run inside the flow process")
            store = RunStore(storage_from_config(job.config, job.storage_uri), job.run_id)
            ctx = _CONTEXTS[key] = RunContext(Experiment(job.config), store)
    if job.mode == "process":
        _sync_worker(ctx, job.generation)
    return ctx


def _sync_worker(ctx: RunContext, generation: int) -> None:
    """Bring a worker's buffer to the commit of `generation - 1` and reserve this generation's staging."""
    with ctx.lock:
        target = generation - 1
        if ctx.exp.buffer is None:  # on-policy: nothing shared to sync
            ctx.synced = target
        if ctx.synced != target:
            if ctx.synced == target - 1 and target >= 0:
                ctx.store.extend_buffer(target, ctx.exp.buffer)
            elif target >= 0:
                ctx.store.rebuild_buffer(target, ctx.exp.buffer)
            else:
                ctx.exp.buffer.size, ctx.exp.buffer.pos = 0, 0
            ctx.synced = target
        if ctx.staged != generation:
            ctx.exp.begin_generation()
            ctx.staged = generation


@task(name="train-member", cache_policy=NO_CACHE, task_run_name="train g{job.generation} m{slot}")
def train_member_task(job: GenerationJob, slot: int, state: MemberState | None = None) -> TrainOutput:
    """Train one member for evo_steps env steps (learning as it goes)."""
    ctx = _context(job)
    if job.mode == "threads":
        return TrainOutput(ctx.exp.train(slot, job.generation))
    ctx.exp.load_member_state(slot, state.tensors, state.meta)
    result = ctx.exp.train(slot, job.generation)
    tensors, meta = ctx.exp.population.members[slot].agent.state()
    buf = ctx.exp.buffer
    shard = None if buf is None else ctx.store.put_shard(job.generation, slot, buf.shard(slot))
    return TrainOutput(result, MemberState(tensors, meta), shard)


@task(name="evaluate-member", cache_policy=NO_CACHE, task_run_name="evaluate g{job.generation} m{slot}")
def evaluate_member_task(job: GenerationJob, slot: int, trained: TrainOutput) -> float:
    """Fitness of one trained member: mean return of greedy evaluation episodes."""
    ctx = _context(job)
    if job.mode == "process":
        ctx.exp.load_member_state(slot, trained.state.tensors, trained.state.meta)
        return ctx.exp.evaluate(slot, job.generation)
    return ctx.exp.evaluate(slot, job.generation, eval_env=ctx.eval_env(slot))


@task(name="commit-generation", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2,
      task_run_name="commit g{job.generation}")
def commit_generation_task(job: GenerationJob, outputs: list[TrainOutput], fitnesses: list[float]) -> dict:
    """Fold the trained members and their experience into the flow's Experiment (once), then write the
    generation to storage: shards, members, manifest last. A retry after a storage hiccup only redoes
    the writes, which are idempotent."""
    ctx = flow_context(job.run_id)
    exp = ctx.exp
    done = bool(exp.history) and exp.history[-1].generation == job.generation
    if not done:
        results = [o.result for o in outputs]
        if job.mode == "process":  # the trained agents come back as data
            for slot, o in enumerate(outputs):
                exp.load_member_state(slot, o.state.tensors, o.state.meta)
        if exp.buffer is None:  # on-policy: members keep no shared experience
            ctx.pending = []
            exp.finish_generation(results, fitnesses)
        elif job.mode == "threads":  # the shards leave the staging slots before the in-memory commit empties them
            shards = [exp.buffer.shard(r.slot) for r in results]
            ctx.pending = [ctx.store.put_shard(job.generation, r.slot, sh) for r, sh in zip(results, shards, strict=True)]
            exp.finish_generation(results, fitnesses, shards)
        else:
            ctx.pending = [o.shard for o in outputs]
            exp.finish_generation(results, fitnesses, [ctx.store.get_shard(ref) for ref in ctx.pending])
    elif job.mode == "threads" and not ctx.pending and exp.buffer is not None:
        raise RuntimeError(f"generation {job.generation} was folded in but its shards were never written")
    exp.commit(ctx.store, ctx.pending)
    ctx.store.prune(job.config.storage.keep_generations)
    stats = exp.history[-1]
    return {"generation": stats.generation, "best_fitness": stats.best_fitness, "mean_fitness": stats.mean_fitness,
            "global_steps": stats.global_steps}


@task(name="select-and-mutate", cache_policy=NO_CACHE, task_run_name="evolve g{job.generation}")
def select_and_mutate_task(job: GenerationJob) -> list[str]:
    """Tournament selection with elitism, then mutation: the next generation's population."""
    exp = flow_context(job.run_id).exp
    exp.evolve()
    return [m.mutation for m in exp.population.members]
