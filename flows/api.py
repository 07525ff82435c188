"""The flow from Python: :func:`run` is ``agilerl-flow run`` as a function (Prefect flow run, MLflow tracking,
checkpoints in the configured storage), with what only Python can give it: an env factory and callbacks. The CLI's
``run`` and ``resume`` call it.

    import flows

    summary = flows.run("deployments/configs/cartpole_dqn.yaml", env=MyEnv, overrides={"seed": 1})

``flows.run_stages`` (:func:`flows.stages.run_stages`) runs a chain of LLM stages the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl_core.errors import AgileRLError, CheckpointError, ConfigError, StorageError, TrackingError
from flows.local_prefect import LocalPrefect, prefect_defaults

if TYPE_CHECKING:  # the engine is imported when a run starts: a CLI's bad config is told before torch loads
    from agilerl_core.api.callbacks import Callback


class RunStopped(AgileRLError):
    """A run that started and then failed: its message names the cause, what was committed and the command that
    continues the run; `kind` is the cause's kind ("configuration error", "storage error", ...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def run(config: str | Path | dict[str, Any] | Any, *, env: Callable[..., Any] | None = None,
        overrides: dict[str, Any] | None = None, callbacks: Sequence[Callback | Callable] | None = None,
        run_id: str | None = None, storage: str | None = None, progress: bool = True,
        debug: bool = False, on_interrupt: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run an evolution as a Prefect flow in this process and return its summary (what ``agilerl-flow run``
    prints last: best and elite fitness, steps, ``run_id``, ``elite_uri``, ``mlflow_run_url``, the champion...).

    Servers are used as by the CLI: ``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI`` and an ``s3://`` storage URI
    when set, embedded defaults otherwise (a Prefect server of its own for the run's length). The run is prepared
    here first (every check, a committed run loaded back and verified), so a bad input fails before any flow run
    starts; the flow then takes the prepared run as its ``handover`` parameter. Running it again with the same
    `run_id` after a crash continues from the last committed generation.

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
        on_interrupt: called with the interrupt's message (the run id, what is committed, the command that continues
            it) the moment Ctrl-C arrives, before the run unwinds: the CLI prints it and leaves within seconds.

    Raises:
        ConfigError: a bad config, override, env, callback or storage, naming the field, before any work.
        RunStopped: the run started and failed; the message says what is committed and how to continue.
        KeyboardInterrupt: Ctrl-C; its message says the same.
    """
    from agilerl_core.api.callbacks import CallbackHooks
    from agilerl_core.api.evolving import resolve_config
    from tasks.config import PIPELINE_KINDS

    overrides = dict(overrides or {})
    if storage:
        overrides["storage.uri"] = storage
    cfg, _ = resolve_config(config, overrides, env, PIPELINE_KINDS, leave_out=())
    if env is not None and cfg.runner.kind != "threads":
        raise ConfigError(f"runner.kind: {cfg.runner.kind!r} trains in other processes, which cannot build an env "
                          f"factory given as env= (it exists only in this process); use runner.kind: threads, or "
                          f"register the env in an importable module and name it as env_id module:EnvId")
    hooks = CallbackHooks(callbacks, {})
    prefect_defaults()
    if progress:  # the bar is the console's view; the run's log lines still reach the Prefect UI
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    else:  # MLflow draws "Downloading artifacts" bars while it logs the champion
        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    cfg.check_env()  # the likeliest mistake (the env id), before anything starts
    server = LocalPrefect.start_if_needed()  # its start-up overlaps the imports and the preparation
    try:
        from flows.kinds import flow_for
        from flows.run_setup import Handover, prepare_run
        from tasks.server_checks import tracking_uri, warm_tracking_store

        prepared = prepare_run(cfg, run_id)
        if prepared.cfg.tracking.enabled:
            warm_tracking_store(tracking_uri(prepared.cfg))  # while the server starts
        if not debug:
            _console_without_tracebacks()
        def stopped() -> str:
            return (f"run {prepared.run_id} stopped: {_where_it_stands(prepared)}; continue it with: "
                    f"{_resume_command(prepared)}")

        told = None if on_interrupt is None else (lambda: on_interrupt(stopped()))
        with server.serving() if server is not None else contextlib.nullcontext(), _noting_interrupts(told):
            try:
                summary = flow_for(prepared.cfg.kind)(config=prepared.cfg, run_id=prepared.run_id, progress=progress,
                                                      handover=Handover(prepared, hooks or None))
            except KeyboardInterrupt:  # Ctrl-C: the run id and the exact command that continues it
                raise KeyboardInterrupt(stopped()) from None
            except Exception as err:  # one paragraph: what failed, what is safe, the exact command that continues
                if _INTERRUPTED.is_set():  # Ctrl-C inside a task, which Prefect reports as another error
                    raise KeyboardInterrupt(stopped()) from None
                if debug:
                    raise
                raise RunStopped(error_kind(err), f"{str(err).rstrip('.')}. Run {prepared.run_id} stopped: "
                                                  f"{_where_it_stands(prepared)} (--debug shows the traceback). Once "
                                                  f"the cause is fixed, continue it with: {_resume_command(prepared)}"
                                 ) from err
            finally:
                prepared.lease.stop()  # the flow gives it up itself; this covers a flow that never started
    finally:
        if server is not None:
            server.stop()
    if prepared.cfg.tracking.enabled:
        uri = tracking_uri(prepared.cfg)
        how = f"open {uri}" if uri.startswith("http") else f"run `mlflow ui --backend-store-uri {uri}` and open " \
                                                            f"http://127.0.0.1:5000"
        print(f"MLflow: to compare runs, lineage and the champion ({summary.get('champion_uri') or 'not registered'}), "
              f"{how}", file=sys.stderr)
    return summary


def error_kind(err: BaseException) -> str:
    """What kind of failure `err` is, in the words a console line starts with ("configuration error", ...)."""
    if isinstance(err, RunStopped):
        return err.kind
    kinds = [(ConfigError, "configuration error"), (CheckpointError, "checkpoint error"),
             (StorageError, "storage error"), (TrackingError, "tracking error"), (AgileRLError, "error")]
    return next((k for cls, k in kinds if isinstance(err, cls)), f"unexpected {type(err).__name__}")


class _OneLine(logging.Formatter):
    """A console formatter without tracebacks: a failed task or flow run is one line there (the traceback
    still reaches the Prefect UI through the API handler, and `debug` keeps it on the console)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self.inner.format(record).split("\nTraceback (most recent call last)")[0]
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def _console_without_tracebacks() -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    for h in logging.getLogger().handlers:
        if isinstance(h, PrefectConsoleHandler) and not isinstance(h.formatter, _OneLine):
            h.setFormatter(_OneLine(h.formatter))


_INTERRUPTED = threading.Event()


@contextlib.contextmanager
def _noting_interrupts(told: Callable[[], None] | None = None) -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as usual and is also noted, so an interrupt that reaches the flow wrapped in
    another error (Prefect's task engine turns one into its own) is still told as an interrupt; `told` is called
    first, from the signal handler (the CLI's word to the user, before anything unwinds)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum, frame) -> None:
        _INTERRUPTED.set()
        if told is not None:
            told()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _where_it_stands(prepared) -> str:
    uri, last = prepared.store.storage.uri, prepared.committed
    return (f"generations up to {last} are committed in {uri} and nothing committed is lost" if last is not None
            else f"no generation was committed yet in {uri}")


def _resume_command(prepared) -> str:
    return f"agilerl-flow resume {prepared.run_id} --storage {prepared.store.storage.uri}"
