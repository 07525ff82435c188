"""Start, stop and inspect the local stack, health-checked, all on loopback.

Services (each its own process group, logs in ``<data dir>/logs/``, pids in ``<data dir>/state.json``):

* ``s3``: SeaweedFS (``weed mini``) with authentication enforced by an ``s3.json`` of generated
  credentials (``<data dir>/s3.json``, mode 0600; never printed), buckets ``agilerl`` and ``mlflow``;
* ``mlflow``: MLflow server, SQLite backend, artifacts proxied to ``s3://mlflow/artifacts``;
* ``prefect``: Prefect server (SQLite in ``<data dir>/prefect``) with its UI at ``http://<host>:<port>``
  (flow runs, their logs and artifacts; the UI's API URL set to the stack's);
* ``worker``: a Prefect worker of the ``agilerl-process`` process work pool, whose environment points
  flow runs at the MLflow server and the S3 store;
* ``gpu0``, ``gpu1``...: with ``--gpu-workers N``, one worker of the ``agilerl-gpu`` process pool per GPU,
  each seeing only its own device (``CUDA_VISIBLE_DEVICES=i``) and running one flow run at a time
  (``--limit 1``), so a deployment on that pool gets a GPU to itself.

Ports come from ``AGILERL_STACK_<SERVICE>_PORT`` (defaults below) and the data directory from
``--data-dir`` / ``AGILERL_STACK_DIR``. ``<data dir>/env.sh`` (0600) exports what a client needs.
The test suite starts the same services through this module, on free ports.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from agilerl_core.errors import AgileRLError
from agilerl_core.net import free_port

WORK_POOL = "agilerl-process"
GPU_WORK_POOL = "agilerl-gpu"
STORAGE_BUCKET = "agilerl"
ARTIFACT_BUCKET = "mlflow"
DEFAULT_PORTS = {"s3": 8333, "mlflow": 5000, "prefect": 4200}


class StackError(AgileRLError):
    """A stack service failed to start or to pass its health check."""


def _http_ok(url: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise StackError(f"`{name}` is not installed; run pip install -e '.[stack]'")
    return found


@dataclass
class Stack:
    data_dir: Path
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))

    auth: bool = False  # Prefect's and MLflow's own authentication on (also on once auth.json exists)
    # more of the workers' environment (beside what they inherit), e.g. AGILERL_TRUSTED_URIS: the storage a
    # train-group run may be pointed at besides the stack's own (docs/security.md)
    worker_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, data_dir: str | os.PathLike | None = None) -> Stack:
        ports = {k: int(os.environ.get(f"AGILERL_STACK_{k.upper()}_PORT", v)) for k, v in DEFAULT_PORTS.items()}
        return cls(Path(data_dir or os.environ.get("AGILERL_STACK_DIR", ".stack")).resolve(), ports=ports)

    # ---- endpoints and credentials -----------------------------------------------------------------
    @property
    def s3_url(self) -> str:
        return f"http://{self.host}:{self.ports['s3']}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.host}:{self.ports['mlflow']}"

    @property
    def prefect_api(self) -> str:
        return f"http://{self.host}:{self.ports['prefect']}/api"

    @property
    def prefect_ui(self) -> str:
        return f"http://{self.host}:{self.ports['prefect']}"

    def credentials(self) -> dict[str, str]:
        """The stack's S3 credentials, generated on first use and kept in a 0600 file."""
        path = self.data_dir / "s3-credentials.json"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            creds = {"access_key_id": "agilerl-" + secrets.token_hex(6), "secret_access_key": secrets.token_hex(20)}
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(creds, f)
        return json.loads(path.read_text())

    @property
    def authenticated(self) -> bool:
        """Whether the Prefect and MLflow servers ask for credentials (asked for once, kept in auth.json)."""
        return self.auth or (self.data_dir / "auth.json").exists()

    def auth_credentials(self) -> dict[str, str]:
        """The Prefect API's basic-auth string and the MLflow admin's name and password, generated on first
        use and kept in a 0600 file (never printed)."""
        path = self.data_dir / "auth.json"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            creds = {"prefect_auth_string": "agilerl:" + secrets.token_hex(16), "mlflow_username": "agilerl-admin",
                     "mlflow_password": secrets.token_hex(16), "mlflow_flask_secret": secrets.token_hex(32)}
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(creds, f)
        return json.loads(path.read_text())

    def _prefect_headers(self) -> dict[str, str]:
        if not self.authenticated:
            return {}
        token = base64.b64encode(self.auth_credentials()["prefect_auth_string"].encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def client_env(self, services: tuple[str, ...] = ("s3", "mlflow", "prefect")) -> dict[str, str]:
        """Environment variables that point a client (or a flow run) at the stack."""
        env = {}
        if "s3" in services:
            c = self.credentials()
            env.update(AWS_ENDPOINT_URL=self.s3_url, AWS_ACCESS_KEY_ID=c["access_key_id"],
                       AWS_SECRET_ACCESS_KEY=c["secret_access_key"], AWS_REGION="us-east-1",
                       AGILERL_STORAGE_URI=f"s3://{STORAGE_BUCKET}/runs")
        auth = self.auth_credentials() if self.authenticated else None
        if "mlflow" in services:
            env["MLFLOW_TRACKING_URI"] = self.mlflow_url
            if auth:
                env.update(MLFLOW_TRACKING_USERNAME=auth["mlflow_username"],
                           MLFLOW_TRACKING_PASSWORD=auth["mlflow_password"])
        if "prefect" in services:
            env["PREFECT_API_URL"] = self.prefect_api
            if auth:
                env["PREFECT_API_AUTH_STRING"] = auth["prefect_auth_string"]
        return env

    # ---- state ------------------------------------------------------------------------------------------
    def _state_path(self) -> Path:
        return self.data_dir / "state.json"

    def _state(self) -> dict:
        p = self._state_path()
        return json.loads(p.read_text()) if p.exists() else {}

    def _save_state(self, state: dict) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._state_path().write_text(json.dumps(state, indent=1))

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> int:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **env}, cwd=self.data_dir, start_new_session=True)
        state = self._state()
        state[name] = {"pid": proc.pid, "port": self.ports.get(name), "cmd": cmd[0]}
        self._save_state(state)
        self._procs = getattr(self, "_procs", {})
        self._procs[name] = proc
        return proc.pid

    def _wait(self, name: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pid = self._state().get(name, {}).get("pid")
        while time.monotonic() < deadline:
            if check():
                return
            proc = getattr(self, "_procs", {}).get(name)
            if (proc is not None and proc.poll() is not None) or not _alive(pid):
                break
            time.sleep(0.25)
        tail = self._log_tail(name)
        self.stop(name)
        raise StackError(f"{name} did not become healthy within {timeout:.0f}s; log {self.data_dir}/logs/{name}.log "
                         f"ends with:\n{tail}")

    def _log_tail(self, name: str, lines: int = 15) -> str:
        p = self.data_dir / "logs" / f"{name}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else "(no log)"

    def running(self, name: str) -> bool:
        return _alive(self._state().get(name, {}).get("pid"))

    # ---- services ---------------------------------------------------------------------------------------
    def start_s3(self, timeout: float = 60) -> None:
        if self.running("s3"):
            return
        creds = self.credentials()
        conf = self.data_dir / "s3.json"
        identity = {"name": "agilerl", "credentials": [{"accessKey": creds["access_key_id"],
                                                        "secretKey": creds["secret_access_key"]}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"identities": [identity]}, f)
        data = self.data_dir / "s3-data"
        data.mkdir(parents=True, exist_ok=True)
        p = {k: free_port() for k in ("master", "volume", "filer", "admin", "master_g", "volume_g", "filer_g",
                                      "s3_g", "admin_g")}
        cmd = [_bin("weed"), "mini", f"-dir={data}", f"-ip={self.host}", f"-ip.bind={self.host}",
               f"-s3.config={conf.resolve()}", "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
               f"-s3.port={self.ports['s3']}", f"-s3.port.grpc={p['s3_g']}",
               f"-master.port={p['master']}", f"-master.port.grpc={p['master_g']}",
               f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_g']}",
               f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_g']}",
               f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin_g']}",
               # its Iceberg and Lance catalogs are unused here, and on fixed ports two stacks would fight over
               "-s3.port.iceberg=0", "-s3.port.lance=0",
               f"-bucket={STORAGE_BUCKET},{ARTIFACT_BUCKET}"]
        self._spawn("s3", cmd, {})
        self._wait("s3", self._s3_ready, timeout)

    def _s3_ready(self) -> bool:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError

            c = self.credentials()
            client = boto3.client("s3", endpoint_url=self.s3_url, aws_access_key_id=c["access_key_id"],
                                  aws_secret_access_key=c["secret_access_key"], region_name="us-east-1",
                                  config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}))
            client.put_object(Bucket=STORAGE_BUCKET, Key=".stack-probe", Body=b"ok")
            client.head_bucket(Bucket=ARTIFACT_BUCKET)
            return True
        except (BotoCoreError, ClientError):
            return False

    def start_mlflow(self, timeout: float = 120) -> None:
        if self.running("mlflow"):
            return
        db = self.data_dir / "mlflow.db"
        c = self.credentials()
        env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_S3_ENDPOINT_URL": self.s3_url,
               "AWS_ACCESS_KEY_ID": c["access_key_id"], "AWS_SECRET_ACCESS_KEY": c["secret_access_key"],
               "AWS_REGION": "us-east-1"}
        cmd = [_bin("mlflow"), "server", "--host", self.host, "--port", str(self.ports["mlflow"]),
               "--backend-store-uri", f"sqlite:///{db}", "--serve-artifacts",
               "--artifacts-destination", f"s3://{ARTIFACT_BUCKET}/artifacts", "--workers", "1"]
        if self.authenticated:  # MLflow's basic-auth app: every request names a user; the admin is ours
            a = self.auth_credentials()
            ini = self.data_dir / "mlflow-auth.ini"
            fd = os.open(ini, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
                        f"database_uri = sqlite:///{self.data_dir / 'mlflow-auth.db'}\n"
                        f"admin_username = {a['mlflow_username']}\nadmin_password = {a['mlflow_password']}\n"
                        f"authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
            env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
            env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = a["mlflow_flask_secret"]  # the CSRF key basic-auth asks for
            cmd += ["--app-name", "basic-auth"]
        self._spawn("mlflow", cmd, env)
        self._wait("mlflow", lambda: _http_ok(f"{self.mlflow_url}/health"), timeout)

    def start_prefect(self, timeout: float = 120) -> None:
        if self.running("prefect"):
            return
        env = {"PREFECT_HOME": str(self.data_dir / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_API_URL": "", "PREFECT_UI_ENABLED": "true", "PREFECT_UI_API_URL": self.prefect_api,
               "PREFECT_LOGGING_LEVEL": "WARNING"}
        if self.authenticated:  # Prefect's own basic auth: the API and the UI ask for the string
            env["PREFECT_SERVER_API_AUTH_STRING"] = self.auth_credentials()["prefect_auth_string"]
        cmd = [_bin("prefect"), "server", "start", "--host", self.host, "--port", str(self.ports["prefect"])]
        self._spawn("prefect", cmd, env)
        self._wait("prefect", lambda: _http_ok(f"{self.prefect_api}/health", headers=self._prefect_headers()),
                   timeout)

    def start_worker(self, cwd: str | os.PathLike | None = None, timeout: float = 90) -> None:
        """A process worker for WORK_POOL; its flow runs see the stack through client_env()."""
        if self.running("worker"):
            return
        env = {**self.client_env(), **self.worker_env, "PREFECT_HOME": str(self.data_dir / "prefect-worker"),
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
               "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO"}  # the runs' lines reach the UI
        cmd = [_bin("prefect"), "worker", "start", "--pool", WORK_POOL, "--type", "process",
               "--name", f"agilerl-{self.ports['prefect']}"]
        self._spawn("worker", cmd, env)
        self._wait("worker", self._worker_ready, timeout)
        self.ensure_pool(GPU_WORK_POOL)  # GPU configs deploy to it; its workers come with --gpu-workers N

    def ensure_pool(self, pool: str) -> None:
        """Create process work pool `pool` on the server unless it exists (so `prefect deploy --all` finds
        every pool the deployments name, the GPU one included before any GPU worker is started)."""
        body = json.dumps({"name": pool, "type": "process"}).encode()
        req = urllib.request.Request(f"{self.prefect_api}/work_pools/", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **self._prefect_headers()})
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError as err:
            if err.code != 409:  # 409: it exists already
                raise StackError(f"could not create work pool {pool}: HTTP {err.code} {err.read()[:300]!r}") from None

    def start_gpu_workers(self, count: int, timeout: float = 90) -> None:
        """`count` workers of GPU_WORK_POOL, worker i seeing GPU i only and taking one flow run at a time."""
        for i in range(count):
            name = f"gpu{i}"
            if self.running(name):
                continue
            env = {**self.client_env(), **self.worker_env, "PREFECT_HOME": str(self.data_dir / f"prefect-{name}"),
                   "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
                   "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
                   "CUDA_VISIBLE_DEVICES": str(i)}
            cmd = [_bin("prefect"), "worker", "start", "--pool", GPU_WORK_POOL, "--type", "process", "--limit", "1",
                   "--name", f"agilerl-{name}-{self.ports['prefect']}"]
            self._spawn(name, cmd, env)
        self._wait("gpu0", lambda: self.online_workers(GPU_WORK_POOL) >= count, timeout)

    def online_workers(self, pool: str) -> int:
        """How many workers of `pool` the server sees online (0 when it cannot be asked)."""
        req = urllib.request.Request(f"{self.prefect_api}/work_pools/{pool}/workers/filter", data=b"{}",
                                     headers={"Content-Type": "application/json", **self._prefect_headers()},
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return sum(w.get("status") == "ONLINE" for w in json.loads(resp.read()))
        except (urllib.error.URLError, OSError, ValueError):
            return 0

    def _worker_ready(self) -> bool:
        return self.online_workers(WORK_POOL) > 0

    def gpu_worker_names(self) -> list[str]:
        return sorted((n for n in self._state() if n.startswith("gpu") and n[3:].isdigit()), key=lambda n: int(n[3:]))

    def stop(self, name: str, timeout: float = 20) -> None:
        """SIGTERM the service's process group (we started it in its own session), SIGKILL if it lingers."""
        state = self._state()
        pid = state.get(name, {}).get("pid")
        proc = getattr(self, "_procs", {}).pop(name, None)
        if pid and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                if proc is not None:
                    proc.poll()
                time.sleep(0.1)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=5)
        state.pop(name, None)
        self._save_state(state)

    # ---- commands ---------------------------------------------------------------------------------------
    def up(self, gpu_workers: int = 0) -> dict:
        """Start every service (those already running are left alone) and write env.sh; with `gpu_workers`,
        also one worker of the GPU pool per GPU."""
        self.start_s3()
        self.start_mlflow()
        self.start_prefect()
        self.start_worker()
        if gpu_workers:
            self.start_gpu_workers(gpu_workers)
        env_sh = self.data_dir / "env.sh"
        fd = os.open(env_sh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"export {k}={v}\n" for k, v in self.client_env().items())
        print(f"stack up: Prefect UI {self.prefect_ui} (API {self.prefect_api}), MLflow UI {self.mlflow_url}, "
              f"S3 {self.s3_url} (bucket {STORAGE_BUCKET}); `source {env_sh}` points clients at it; logs in "
              f"{self.data_dir}/logs", file=sys.stderr)
        return self.status()

    def down(self) -> dict:
        for name in (*self.gpu_worker_names(), "worker", "prefect", "mlflow", "s3"):
            self.stop(name)
        return self.status()

    def status(self) -> dict:
        checks = {"s3": self._s3_ready, "mlflow": lambda: _http_ok(f"{self.mlflow_url}/health"),
                  "prefect": lambda: _http_ok(f"{self.prefect_api}/health", headers=self._prefect_headers()),
                  "worker": self._worker_ready}
        out = {"data_dir": str(self.data_dir)}
        for name, check in checks.items():
            running = self.running(name)
            out[name] = {"running": running, "healthy": bool(running and check()),
                         "pid": self._state().get(name, {}).get("pid")}
        gpus = self.gpu_worker_names()
        if gpus:
            online = self.online_workers(GPU_WORK_POOL)
            out["gpu_workers"] = {"pool": GPU_WORK_POOL, "running": sum(self.running(n) for n in gpus),
                                  "online": online, "pids": [self._state()[n].get("pid") for n in gpus]}
        out["endpoints"] = {"prefect": self.prefect_api, "prefect_ui": self.prefect_ui, "mlflow": self.mlflow_url,
                            "s3": self.s3_url}
        return out
