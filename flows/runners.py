"""The task runners a flow can run its generations on, and where each group's task is placed.

``threads``: Prefect's thread pool in the flow's process. ``dask``: prefect-dask's DaskTaskRunner on a local
process cluster (started for the run; with ``runner.worker_gpus`` one worker per GPU, each with the worker
resource ``GPU=1`` and its own ``CUDA_VISIBLE_DEVICES``) or the cluster at ``runner.address``. ``ray``:
prefect-ray's RayTaskRunner on a local Ray started for the run or the cluster at ``runner.address``.
``deployments``: each group a run of the per-group train deployment on its work pool
(``flows/train_group.py``), waited on from threads.

Placement is the engine's, never ours: a group's task asks for ``runner.gpus_per_shard`` GPUs and
``runner.cpus_per_shard`` CPUs (Ray ``num_gpus`` / ``num_cpus``, fractions allowed; Dask task resources
through ``dask.annotate``), and the engine puts it where they are free; a deployment run goes where its
work pool's workers are.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from prefect.task_runners import ThreadPoolTaskRunner

from agilerl_core.errors import ConfigError
from tasks.config import PipelineConfig, RunnerConfig

# Dask's statistical profiler samples every task thread's stack every 10 ms; on a Python-heavy training loop
# that costs ~40% of the worker's time (measured: 4 CartPole members on 2 workers, 22.3 s with it, 13.2 s
# without). Workers of an external cluster should set the same option.
_DASK_QUIET = {"distributed.worker.profile.enabled": False}


def check_runner(runner: RunnerConfig) -> None:
    """A ConfigError for a runner that would wait forever or cannot start, before any work."""
    if runner.kind == "ray":
        try:
            import prefect_ray  # noqa: F401
        except ImportError:
            raise ConfigError("runner.kind: 'ray' needs prefect-ray and ray; install them with "
                              "pip install -e '.[ray]' (or choose runner.kind: threads or dask)") from None
    if runner.kind == "threads" and runner.gpus_per_shard:
        raise ConfigError("runner.gpus_per_shard: the threads runner places nothing; use runner.kind: ray or "
                          "dask, or set `device` to choose the GPU of a threads run")
    if runner.kind == "dask" and runner.gpus_per_shard and runner.address is None and not runner.worker_gpus:
        raise ConfigError(f"runner.gpus_per_shard: {runner.gpus_per_shard} asks for GPU workers, but the local "
                          f"Dask cluster gets none (runner.worker_gpus: 0): tasks would wait forever; set "
                          f"runner.worker_gpus to the number of GPUs")
    if runner.kind == "dask" and runner.worker_gpus and runner.gpus_per_shard > 1:
        raise ConfigError(f"runner.gpus_per_shard: {runner.gpus_per_shard} exceeds the one GPU each local Dask "
                          f"worker has; use at most 1 (fractions share a worker's GPU)")


@contextlib.contextmanager
def dask_cluster(runner: RunnerConfig) -> Iterator[str | None]:
    """The scheduler address of the configured cluster; a local process cluster lives as long as the run."""
    if runner.kind != "dask":
        yield None
        return
    if runner.address:
        yield runner.address
        return
    import dask
    from distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    os.environ["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"
    with dask.config.set(_DASK_QUIET):
        if runner.worker_gpus:
            with _gpu_cluster(runner.worker_gpus, SpecCluster, Scheduler, Nanny) as cluster:
                yield cluster.scheduler_address
            return
        with LocalCluster(n_workers=runner.workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster:
            yield cluster.scheduler_address


@contextlib.contextmanager
def _gpu_cluster(gpus: int, spec_cluster, scheduler, nanny):
    """One single-threaded worker process per GPU, each seeing only its own (CUDA_VISIBLE_DEVICES) and
    offering the resource GPU=1: dask-cuda's LocalCUDACluster where installed, else the same by hand."""
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        LocalCUDACluster = None
    if LocalCUDACluster is not None:
        with LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(gpus)), threads_per_worker=1,
                              resources={"GPU": 1}, dashboard_address=None) as cluster:
            yield cluster
        return
    workers = {f"gpu{i}": {"cls": nanny, "options": {"nthreads": 1, "resources": {"GPU": 1},
                                                      "env": {"CUDA_VISIBLE_DEVICES": str(i)}}}
               for i in range(gpus)}
    with spec_cluster(workers=workers, scheduler={"cls": scheduler, "options": {"dashboard_address": None}}) as c:
        yield c


def ray_task_runner(runner: RunnerConfig):
    """prefect-ray's RayTaskRunner: the cluster at `runner.address`, else a local Ray for the run with
    `workers` CPUs (and `worker_gpus` GPUs when given: logical ones work without a device)."""
    from prefect_ray import RayTaskRunner

    if runner.address:
        return RayTaskRunner(address=runner.address)
    init = {"num_cpus": runner.workers, "include_dashboard": False, "log_to_driver": False,
            "runtime_env": {"env_vars": {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}}}
    if runner.worker_gpus:
        init["num_gpus"] = runner.worker_gpus
    return RayTaskRunner(init_kwargs=init)


def check_deployment(runner: RunnerConfig) -> None:
    """For ``runner.kind: deployments``, a ConfigError before any generation when the per-group train
    deployment is not on the Prefect server the flow talks to."""
    if runner.kind != "deployments":
        return
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(runner.deployment)
        except ObjectNotFound:
            raise ConfigError(f"runner.deployment: {runner.deployment!r} is not deployed on the Prefect server at "
                              f"{PREFECT_API_URL.value() or 'the embedded default'}; deploy it with `prefect deploy "
                              f"--prefect-file deployments/prefect.yaml -n train-group` and start a worker of its "
                              f"pool (agilerl-flow stack up)") from None


def task_runner(cfg: PipelineConfig, dask_address: str | None):
    if cfg.runner.kind == "dask":
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=dask_address)
    if cfg.runner.kind == "ray":
        return ray_task_runner(cfg.runner)
    if cfg.runner.kind == "deployments":  # threads that wait on the groups' deployment runs
        return ThreadPoolTaskRunner(max_workers=cfg.runner.workers)
    return ThreadPoolTaskRunner(max_workers=cfg.runner.max_threads)


@contextlib.contextmanager
def placement(runner: RunnerConfig) -> Iterator[None]:
    """What each group's task asks the engine for, around its submission."""
    if runner.kind == "ray":
        from prefect_ray.context import remote_options

        opts = {"num_cpus": runner.cpus_per_shard}
        if runner.gpus_per_shard:
            opts["num_gpus"] = runner.gpus_per_shard
        with remote_options(**opts):
            yield
    elif runner.kind == "dask" and runner.gpus_per_shard:
        import dask

        with dask.annotate(resources={"GPU": runner.gpus_per_shard}):
            yield
    else:
        yield
