"""The Prefect API server a command starts for itself when no ``PREFECT_API_URL`` is set (:class:`LocalPrefect`),
and the Prefect settings every command runs under (:func:`prefect_defaults`)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request

from agilerl_core.net import free_port


class LocalPrefect:
    """A Prefect API server for this run alone, when no PREFECT_API_URL is set: the server Prefect would start
    as its ephemeral one (the same app, database under PREFECT_HOME, no UI), but started as the first thing
    ``run`` and ``resume`` do, so its start-up (~5 s) overlaps the imports and the preparation, and owned here:
    stopped when the run ends, and on Linux also when this process dies (a parent-death signal), so a crash
    never leaves it behind. It is a plain subprocess started from the main thread: an earlier version started
    Prefect's own ephemeral server on a background thread, whose imports raced the main thread's, and the
    process crashed once (SIGSEGV) in the test suite."""

    def __init__(self, port: int, process: subprocess.Popen) -> None:
        self.port, self.process = port, process
        self.api_url = f"http://127.0.0.1:{port}/api"

    @classmethod
    def start_if_needed(cls) -> LocalPrefect | None:
        from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED, get_current_settings

        if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
            return None
        import prefect

        port = free_port()
        env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True),
               "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port), "--log-level",
             "error", "--lifespan", "on"], env=env, preexec_fn=_die_with_parent, start_new_session=True)
        # a session of its own: a terminal's Ctrl-C reaches the run, not the server the run still reports to
        server = cls(port, process)
        atexit.register(server.stop)
        RUNNING.add(server)
        return server

    def wait(self, timeout: float) -> None:
        """Block until the server answers its health check; a RuntimeError if it exits or times out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the local Prefect server exited with code {self.process.returncode} while "
                                   f"starting; run `prefect server start` to see why, or set PREFECT_API_URL")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as r:
                if r.status == 200:  # (OSError: not listening yet)
                    return
            time.sleep(0.05)
        raise RuntimeError(f"the local Prefect server did not answer within {timeout:.0f} s; set PREFECT_API_URL "
                           f"to a running server (`agilerl-flow stack up`)")

    @contextlib.contextmanager
    def serving(self):
        """The flow's Prefect settings (and the environment of the processes it starts) point at this server
        once it answers."""
        from prefect.settings import (
            PREFECT_API_URL,
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
            temporary_settings,
        )

        self.wait(float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()))
        os.environ["PREFECT_API_URL"] = self.api_url  # processes the flow starts (Dask workers) use it too
        # Prefect's "View at http://127.0.0.1:PORT/..." would point at a server gone when the run ends: say instead
        # where the run's records go (the storage and MLflow lines follow) and how to get a Prefect UI that stays
        flow_logger = logging.getLogger("prefect.flow_runs")
        flow_logger.addFilter(_NO_DEAD_LINK)
        print("agilerl-flow: Prefect runs on a server of this command alone (no UI; it stops when the run ends): "
              "the run's records are its storage and MLflow, named below; for a Prefect UI that outlives runs, "
              "start the stack (agilerl-flow stack up) and set PREFECT_API_URL", file=sys.stderr, flush=True)
        try:
            with temporary_settings(updates={PREFECT_API_URL: self.api_url}):
                try:
                    yield self
                finally:  # the run's last log lines reach the server before it stops
                    from prefect.logging.handlers import APILogWorker

                    with contextlib.suppress(Exception):
                        APILogWorker.drain_all(timeout=5)
        finally:
            os.environ.pop("PREFECT_API_URL", None)
            flow_logger.removeFilter(_NO_DEAD_LINK)

    def stop(self) -> None:
        RUNNING.discard(self)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


RUNNING: set[LocalPrefect] = set()  # the servers this process started and has not stopped


def terminate_all() -> None:
    """Send every running server of this process SIGTERM, without waiting (a process about to exit at once)."""
    for server in list(RUNNING):
        with contextlib.suppress(OSError):
            server.process.terminate()


class _DropViewAt(logging.Filter):
    """Drops Prefect's "View at <url>" line (a link into a server that stops with the run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("View at ")


_NO_DEAD_LINK = _DropViewAt()


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGTERM when the parent dies (elsewhere: nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def prefect_defaults() -> None:
    """Prefect's per-task console lines drown the progress bar: keep warnings and our flow's own lines (the
    flow run's logger at INFO: its lines also reach the Prefect UI). The ephemeral server (no PREFECT_API_URL)
    gets 120 s to start instead of Prefect's 20: on a busy 2-core machine it took longer (measured: 1 start
    in 3 timed out while the test suite ran)."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "INFO")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
