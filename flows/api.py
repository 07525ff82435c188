"""The flow from Python: :func:`run` is ``agilerl-flow run`` as a function (Prefect flow run, MLflow tracking,
checkpoints in the configured storage), with what only Python can give it: an env factory and callbacks.

    import flows

    summary = flows.run("deployments/configs/cartpole_dqn.yaml", env=MyEnv, overrides={"seed": 1})

``flows.run_stages`` (:func:`flows.stages.run_stages`) runs a chain of LLM stages the same way.
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
