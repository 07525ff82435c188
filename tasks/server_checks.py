"""Where an evolution run's MLflow tracking goes, and whether its server answers.

``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else a SQLite file in ``output_dir``. An HTTP tracking server is
asked for its health before a run starts (failing early, with the fix); a local store is opened once, so that a
new SQLite file gets its tables before the flow's tracker first writes.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from agilerl_core.errors import TrackingError
from tasks.config import PipelineConfig


def tracking_uri(cfg: PipelineConfig) -> str:
    """tracking.uri, else $MLFLOW_TRACKING_URI, else a SQLite file in output_dir."""
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    path = Path(cfg.output_dir).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path / 'mlflow.db'}"


def check_tracking_server(uri: str, timeout: float = 5.0) -> None:
    """Fail early, with the fix, when an HTTP tracking server does not answer its health check."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as resp:
            if resp.status == 200:
                return
            problem = f"health check answered HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        problem = f"health check answered HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        problem = f"cannot connect ({getattr(err, 'reason', err)})"
    raise TrackingError(f"tracking server {uri} (tracking.uri / MLFLOW_TRACKING_URI): {problem}; start it "
                        f"(`agilerl-flow stack up`) or unset MLFLOW_TRACKING_URI to track in a local SQLite file")


def warm_tracking_store(uri: str) -> None:
    """Open the tracking store once, so that a new local SQLite file gets its tables now (~2 s of MLflow
    migrations, measured) rather than when the flow's tracker first writes. MLflow caches the store per URI."""
    if uri.startswith(("http://", "https://")):
        return  # a server: nothing to create here (its health was checked)
    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except mlflow.exceptions.MlflowException as err:
        raise TrackingError(f"tracking store {uri} (tracking.uri / MLFLOW_TRACKING_URI): {err.message}") from None
