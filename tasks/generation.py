"""The generation step as Prefect tasks: thin calls into :mod:`agilerl_core`, each a function of its inputs.

Every task takes the job (run, config, generation, the members' budget share), a group of slots (the members
that learn together, :meth:`Evolution.groups`) and a reference to the members' state:

* ``threads`` runner: the flow's live :class:`Evolution` itself. Tasks train and evaluate its members in
  place; fresh experience stays in the arena's staging slots (nothing is serialised).
* ``process`` runners (Dask, Ray): a :class:`MemberState` (tensors + JSON-able metadata). The worker trains a copy
  in its own Evolution, taken from :data:`WORKER_RUNS`, an explicit cache keyed by run and config that keeps
  the worker's envs and its copy of the committed experience (synced from the run's shards in storage)
  between tasks. The fresh transitions go to storage as a shard and come back as a reference.

Retries only where failures are transient (storage, the tracking server) and the work is idempotent, never
around learning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from agilerl_core.errors import NonFiniteError
from agilerl_core.evolution import Evolution
from agilerl_core.experiment import build_evolution
from agilerl_core.io.manifest import ShardRef
from agilerl_core.io.run_store import RunStore
from agilerl_core.io.storage import storage_from_config
from agilerl_core.results import TrainResult
from tasks.config import PipelineConfig, grouping, validate_config

Mode = Literal["threads", "process"]


@dataclass(frozen=True)
class GenerationJob:
    """What every task of one generation shares."""

    run_id: str
    config: PipelineConfig
    storage_uri: str
    generation: int
    steps: int  # budget units per member this generation (the last generation may be shorter)
    mode: Mode = "threads"


@dataclass
class MemberState:
    """A member as data (process runners): :meth:`Evolvable.state` output."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    member_id: int | None = None  # the flow's id of the member (a worker's own population does not know it)


@dataclass
class TrainOutput:
    result: TrainResult
    state: MemberState | None = None  # process runners: the trained member
    shard: ShardRef | None = None  # process runners: its fresh transitions in storage
    placement: dict[str, Any] = field(default_factory=dict)  # process runners: where its group trained


@dataclass
class Evaluation:
    fitness: float
    notes: dict[str, Any] = field(default_factory=dict)  # process runners: what evaluation noted on the member


@dataclass
class WorkerRun:
    """A worker process's copy of a run: its Evolution, store, and how far its shared experience is synced."""

    evo: Evolution
    store: RunStore
    synced: int = -1  # the committed generation its experience reflects (-1: empty)
    staged: int | None = None  # the generation whose staging area is reserved
    lock: threading.Lock = field(default_factory=threading.Lock)


class WorkerRuns:
    """Worker processes' runs, keyed by (run id, config hash): built on a worker's first task of a run and
    reused by its later ones, synced to the commit before the job's generation."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], WorkerRun] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(job: GenerationJob) -> tuple[str, str]:
        digest = hashlib.sha256(json.dumps(job.config.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
        return job.run_id, digest

    def get(self, job: GenerationJob) -> WorkerRun:
        with self._lock:
            run = self._runs.get(self.key(job))
            if run is None:
                store = RunStore(storage_from_config(job.config, job.storage_uri), job.run_id)
                run = self._runs[self.key(job)] = WorkerRun(build_evolution(job.config, **grouping(job.config)), store)
        with run.lock:
            target = job.generation - 1
            run.evo.arena.sync_experience(run.store, run.synced, target)
            run.synced = target
            if run.staged != job.generation:
                run.evo.begin_generation()
                run.staged = job.generation
        return run

    def drop(self, run_id: str) -> None:
        with self._lock:
            for key in [k for k in self._runs if k[0] == run_id]:
                del self._runs[key]


WORKER_RUNS = WorkerRuns()


def worker_run(job: GenerationJob) -> WorkerRun:
    """This worker process's copy of the job's run. The tasks reach the cache through this function: a
    process runner ships a task's function by value with the globals it names, and a function is shipped by
    reference (the cache and its locks never travel)."""
    return WORKER_RUNS.get(job)


def group_label(slots: tuple[int, ...] | list[int]) -> str:
    """A group's name in task names: ``m3``, ``m0-3`` (contiguous), ``m0,2,5``."""
    if len(slots) == 1:
        return f"m{slots[0]}"
    if list(slots) == list(range(slots[0], slots[-1] + 1)):
        return f"m{slots[0]}-{slots[-1]}"
    return "m" + ",".join(str(s) for s in slots)


def placement() -> dict[str, Any]:
    """Where this task runs: host, process, the GPUs it sees, and the engine's own view (Ray's assigned GPU
    ids, the Dask worker and its resources)."""
    out: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(),
                           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            out["ray_gpu_ids"] = [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
    if "distributed" in sys.modules:
        from distributed import get_worker

        with contextlib.suppress(ValueError):
            worker = get_worker()
            out["dask_worker"] = worker.address
            out["dask_resources"] = dict(worker.state.total_resources)
    return out


@task(name="train-group", cache_policy=NO_CACHE, task_run_name="train g{job.generation} {label}")
def train_group_task(job: GenerationJob, slots: tuple[int, ...], label: str, evolution: Evolution) -> list[TrainOutput]:
    """Train one group of the live members (thread runner) for the job's steps, learning as it goes."""
    return [TrainOutput(r) for r in evolution.train_group(slots, job.generation, job.steps)]


@task(name="train-group", cache_policy=NO_CACHE, task_run_name="train g{job.generation} {label}")
def train_shipped_group_task(job: GenerationJob, slots: tuple[int, ...], label: str, members: list[MemberState]
                             ) -> list[TrainOutput]:
    """Train one group of members shipped as data to a worker process (Dask, Ray) for the job's steps."""
    return _train_in_worker(worker_run(job), job, slots, members)


def _train_in_worker(run: WorkerRun, job: GenerationJob, slots: tuple[int, ...], members: list[MemberState]
                     ) -> list[TrainOutput]:
    """A worker process's side of a group's training: the members loaded into its copy of the run, trained
    together, returned as data with their fresh experience written to storage as shards."""
    for slot, m in zip(slots, members, strict=True):
        run.evo.load_member_state(slot, m.tensors, m.meta)
    try:
        results = run.evo.train_group(slots, job.generation, job.steps)
    except NonFiniteError as err:  # named by the flow's member id (None where it did not travel), not the worker's
        ids = {s: m.member_id for s, m in zip(slots, members, strict=True)}
        raise NonFiniteError(err.source, err.slot, err.what, err.step, err.step_kind, ids.get(err.slot),
                             err.generation) from None
    where = placement()
    outputs = []
    for r in results:
        tensors, meta = run.evo.population.members[r.slot].agent.state()
        shard = run.evo.arena.shard(r.slot)
        ref = None if shard is None else run.store.put_shard(job.generation, r.slot, shard)
        outputs.append(TrainOutput(r, MemberState(tensors, meta), ref, where))
    return outputs


@task(name="evaluate-group", cache_policy=NO_CACHE, task_run_name="evaluate g{job.generation} {label}")
def evaluate_group_task(job: GenerationJob, slots: tuple[int, ...], label: str, evolution: Evolution
                        ) -> list[Evaluation]:
    """Fitness of each trained live member of a group (the arena's: mean return of greedy episodes, held-out
    reward...), in the group's own evaluation envs."""
    return [Evaluation(f) for f in evolution.evaluate_group(slots, job.generation, own_env=True)]


@task(name="evaluate-group", cache_policy=NO_CACHE, task_run_name="evaluate g{job.generation} {label}")
def evaluate_shipped_group_task(job: GenerationJob, slots: tuple[int, ...], label: str, trained: list[TrainOutput]
                                ) -> list[Evaluation]:
    """Fitness of each member a worker process trained (their states in `trained`): the worker evaluates
    copies, so what evaluation noted on them (per-agent returns, sample completions) travels back with the
    fitness."""
    run = worker_run(job)
    for slot, out in zip(slots, trained, strict=True):
        run.evo.load_member_state(slot, out.state.tensors, out.state.meta)
    fitnesses = run.evo.evaluate_group(slots, job.generation)
    return [Evaluation(f, run.evo.evaluation_notes(s)) for s, f in zip(slots, fitnesses, strict=True)]


@task(name="dispatch-group", cache_policy=NO_CACHE, task_run_name="train g{job.generation} {label} (deployment)")
def dispatch_group_task(job: GenerationJob, slots: tuple[int, ...], label: str, members: list[MemberState]
                        ) -> tuple[list[TrainOutput], list[Evaluation]]:
    """Train and evaluate one group as a run of the per-group deployment (`runner.deployment`, on its work
    pool): the members go to storage, the run trains them as a Dask or Ray worker would
    (:func:`train_stored_group`), and their trained states, experience shards and evaluations come back
    through storage."""
    from prefect.deployments import run_deployment

    store = RunStore(storage_from_config(job.config, job.storage_uri), job.run_id)
    for slot, m in zip(slots, members, strict=True):
        store.put_member_state(job.generation, slot, "in", m.tensors, m.meta)
    params = {"run_id": job.run_id, "storage_uri": job.storage_uri, "generation": job.generation,
              "steps": job.steps, "slots": list(slots)}
    run = run_deployment(job.config.runner.deployment, parameters=params, timeout=job.config.runner.deployment_timeout,
                         poll_interval=1, flow_run_name=f"{job.run_id} g{job.generation} {label}")
    if run.state is None or not run.state.is_completed():
        state = "not finished" if run.state is None else run.state.name
        raise RuntimeError(f"the {job.config.runner.deployment} run {run.name} for group {label} of generation "
                           f"{job.generation} ended {state}; see it in the Prefect UI")
    outputs, evaluations = [], []
    for slot in slots:
        tensors, meta, extra = store.get_member_state(job.generation, slot, "out")
        shard = None if extra["shard"] is None else ShardRef(**extra["shard"])
        outputs.append(TrainOutput(TrainResult(**extra["result"]), MemberState(tensors, meta), shard, extra["placement"]))
        evaluations.append(Evaluation(extra["fitness"], extra["notes"]))
    return outputs, evaluations


def train_stored_group(run_id: str, storage_uri: str, generation: int, steps: int, slots: list[int]) -> dict[str, Any]:
    """The deployment run's side of :func:`dispatch_group_task`: the run's config from its record (secrets
    stay out of it: the worker takes S3 credentials from its environment), the members from storage, one
    group's training and evaluation, everything written back to storage."""
    from agilerl_core.io.storage import open_storage
    from tasks.trust import check_stored_run_code, check_stored_run_storage

    check_stored_run_storage(storage_uri)  # a parameter: only storage the worker trusts, before anything is read
    store = RunStore(open_storage(storage_uri), run_id)
    cfg = validate_config(store.run_info()["config"])
    check_stored_run_code(cfg)  # the storage URI is a parameter: the config it points at is not trusted
    job = GenerationJob(run_id, cfg, storage_uri, generation, steps, "process")
    run = worker_run(job)
    members = [MemberState(*store.get_member_state(generation, slot, "in")[:2]) for slot in slots]
    outputs = _train_in_worker(run, job, tuple(slots), members)
    fitnesses = run.evo.evaluate_group(slots, generation)  # the trained members are the worker's live copies
    for o, fitness in zip(outputs, fitnesses, strict=True):
        slot = o.result.slot
        store.put_member_state(generation, slot, "out", o.state.tensors, o.state.meta, {
            "result": asdict(o.result), "fitness": fitness, "notes": run.evo.evaluation_notes(slot),
            "shard": None if o.shard is None else asdict(o.shard), "placement": o.placement})
    return {"slots": slots, "placement": outputs[0].placement}


def by_slot(groups: list[tuple[int, ...]], outputs: list[list[TrainOutput]], evaluations: list[list[Evaluation]]
            ) -> tuple[list[TrainOutput], list[Evaluation]]:
    """The groups' training outputs and evaluations in slot order (what the fold takes)."""
    rows = sorted((s, i) for i, g in enumerate(groups) for s in g)
    pos = {s: (i, g.index(s)) for i, g in enumerate(groups) for s in g}
    return ([outputs[pos[s][0]][pos[s][1]] for s, _ in rows], [evaluations[pos[s][0]][pos[s][1]] for s, _ in rows])


@task(name="fold-generation", cache_policy=NO_CACHE, task_run_name="fold g{job.generation}")
def fold_generation_task(job: GenerationJob, evolution: Evolution, store: RunStore, outputs: list[TrainOutput],
                         evaluations: list[Evaluation]) -> list[ShardRef]:
    """Fold the trained members and their experience into the flow's Evolution; returns the shards' refs.
    Not retried by Prefect (folding changes the Evolution in place): storage calls carry their own client
    retries, and a second call for a generation already folded changes nothing (idempotent)."""
    results = [o.result for o in outputs]
    folded = bool(evolution.history) and evolution.history[-1].generation == job.generation
    if not evolution.arena.shares_experience:
        refs: list[ShardRef] = []
        shards = None
    elif job.mode == "threads":  # the staged shards are written before the in-memory commit empties them
        shards = [evolution.arena.shard(r.slot) for r in results]
        refs = [store.shard_ref(job.generation, r.slot) if folded else store.put_shard(job.generation, r.slot, sh)
                for r, sh in zip(results, shards, strict=True)]
    else:
        refs = [o.shard for o in outputs]
        shards = None if folded else [store.get_shard(ref) for ref in refs]
    if folded:  # this generation is in the Evolution already: folding it twice would count it twice
        return refs
    if job.mode == "process":  # the trained members come back as data, their evaluation's notes beside
        for slot, (o, e) in enumerate(zip(outputs, evaluations, strict=True)):
            evolution.load_member_state(slot, o.state.tensors, o.state.meta)
            evolution.take_evaluation_notes(slot, e.notes)
    evolution.finish_generation(results, [e.fitness for e in evaluations], shards)
    return refs


@task(name="commit-generation", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2,
      task_run_name="commit g{job.generation}")
def commit_generation_task(job: GenerationJob, evolution: Evolution, store: RunStore, shards: list[ShardRef]) -> dict:
    """Write the folded generation to storage (members, evolution state, manifest last) and apply
    retention. Idempotent: a retry rewrites the same files."""
    evolution.commit(store, shards)
    store.prune(job.config.storage.keep_generations)
    stats = evolution.history[-1]
    return {"generation": stats.generation, "best_fitness": stats.best_fitness, "mean_fitness": stats.mean_fitness,
            "global_steps": stats.global_steps}


@task(name="select-and-mutate", cache_policy=NO_CACHE, task_run_name="evolve g{job.generation}")
def select_and_mutate_task(job: GenerationJob, evolution: Evolution) -> list[str]:
    """Tournament selection with elitism, then mutation: the next generation's population."""
    evolution.evolve()
    return [m.mutation for m in evolution.population.members]
