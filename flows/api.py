"""The flow from Python: :func:`run` is ``agilerl-flow run`` as a function (Prefect flow run, MLflow tracking,
checkpoints in the configured storage), with what only Python can give it: an env factory and callbacks.

    import flows

    summary = flows.run("deployments/configs/cartpole_dqn.yaml", env=MyEnv, overrides={"seed": 1})
    chain = flows.run_stages("deployments/stages/smollm2_wordle.yaml", {"grpo.max_env_steps": 128})

:func:`run_stages` is ``agilerl-flow stages``: LLM runs in order, each starting from the previous stage's champion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agilerl_core.api.callbacks import Callback, CallbackHooks
from agilerl_core.api.evolving import resolve_config
from agilerl_core.errors import ConfigError
from tasks.config import PIPELINE_KINDS


def run(config: str | Path | dict[str, Any] | Any, *, env: Callable[..., Any] | None = None,
        overrides: dict[str, Any] | None = None, callbacks: Sequence[Callback | Callable] | None = None,
        run_id: str | None = None, storage: str | None = None, progress: bool = True,
        debug: bool = False) -> dict[str, Any]:
    """Run an evolution as a Prefect flow in this process and return its summary (what ``agilerl-flow run``
    prints last: best and elite fitness, steps, ``run_id``, ``elite_uri``, ``mlflow_run_url``, the champion...).

    Servers are used as by the CLI: ``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI`` and an ``s3://`` storage URI
    when set, embedded defaults otherwise. Running it again with the same `run_id` after a crash continues from
    the last committed generation.

    Args:
        config: a YAML path, a dict of config fields or a pipeline config (``tasks.config.validate_config``).
        env: a factory of envs replacing ``env_id`` in this process (see :func:`agilerl_core.evolve`). It cannot
            travel to worker processes: refused unless ``runner.kind`` is ``threads``.
        overrides: dotted config fields, e.g. ``{"runner.group_size": 2, "seed": 3}``.
        callbacks: as for :func:`agilerl_core.evolve`; in a flow, members' callbacks come once their
            generation is folded, and a generation's after it is committed. MLflow and Prefect logging are
            unchanged.
        run_id: the run's id (default: a new one from the config's name, seed and the time).
        storage: the storage URI (``storage.uri``), e.g. ``s3://agilerl/runs``.
        progress: a progress bar on stderr (else the run's log lines).
        debug: raise the original exception (with its traceback) when the run fails.

    Raises:
        ConfigError: a bad config, override, env, callback or storage, naming the field, before any work.
    """
    from agilerl_core.experiment import new_run_id
    from flows.cli import _flow
    from flows.run_setup import RUN_HOOKS

    overrides = dict(overrides or {})
    if storage:
        overrides["storage.uri"] = storage
    cfg, _ = resolve_config(config, overrides, env, PIPELINE_KINDS, leave_out=())
    if env is not None and cfg.runner.kind != "threads":
        raise ConfigError(f"runner.kind: {cfg.runner.kind!r} trains in other processes, which cannot build an env "
                          f"factory given as env= (it exists only in this process); use runner.kind: threads, or "
                          f"register the env in an importable module and name it as env_id module:EnvId")
    hooks = CallbackHooks(callbacks, {})
    run_id = run_id or new_run_id(cfg)
    if hooks:
        RUN_HOOKS.put(run_id, hooks)
    try:
        return _flow(cfg, run_id, progress, debug)
    finally:
        RUN_HOOKS.take(run_id)


def run_stages(path: str | Path, overrides: dict[str, Any] | None = None, *, run_id: str | None = None,
               progress: bool = True) -> dict[str, Any]:
    """Run a stages file (:mod:`tasks.stages`) as one parent Prefect flow run in this process and return the
    chain's summary (each stage's fitness, its input's, whether it was promoted, what it handed on;
    ``champion_uri``). The whole chain is checked first: every stage's config, the same base throughout, every
    stage's data and model found. Running it again with the same `run_id` resumes it at the stage that was
    running.

    Args:
        path: the stages file.
        overrides: ``STAGE.dotted.field`` -> value, e.g. ``{"grpo.max_env_steps": 128}``.
        run_id: the chain's id (default: a new one from its name, the first stage's seed and the time); each
            stage's run id is ``RUN_ID-STAGE``.
        progress: progress bars on stderr (else the runs' log lines).

    Raises:
        ConfigError: a bad stages file, stage config, override or run id, naming it, before any work.
    """
    import contextlib
    import sys

    from agilerl_core.io.run_store import check_run_id
    from flows.local_prefect import LocalPrefect, prefect_defaults
    from flows.stages import llm_stages
    from tasks.stages import load_stages

    stages = load_stages(path, overrides)
    run_id = check_run_id(run_id or stages.new_run_id())
    for name in stages.names:
        check_run_id(f"{run_id}-{name}")
    for cfg in stages.configs:
        cfg.check_env()
    prefect_defaults()
    print(f"agilerl-flow: stages {run_id}: {' -> '.join(stages.names)}; if it stops, running it again with run id "
          f"{run_id} resumes it", file=sys.stderr, flush=True)
    server = LocalPrefect.start_if_needed()
    try:
        with server.serving() if server is not None else contextlib.nullcontext():
            return llm_stages(names=stages.names, configs=stages.configs, run_id=run_id, progress=progress)
    finally:
        if server is not None:
            server.stop()

