"""A run survives its servers (issue 26): each server of the stack stopped mid-run, against real servers these tests
start (a stack of their own, so the session's shared servers are never disturbed). What must hold each time:
training goes on or stops cleanly, nothing committed is lost, the final population equals an undisturbed run's,
and MLflow holds each generation's metrics exactly once."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading

import pytest

from tests.conftest import Cli, cli_summary, committed_state, wait_for_commit, wait_until

pytestmark = pytest.mark.integration

STEPS = 8000  # 16 generations: room for a fault after the first commit and three more generations during it
CONFIG = ("name: faults\nenv_id: CartPole-v1\nnum_envs: 4\npopulation_size: 2\nevo_steps: 250\n"
          f"max_env_steps: {STEPS}\neval_episodes: 2\nhyperparameters: {{batch_size: 32, learning_delay: 64}}\n")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """S3, MLflow and Prefect servers that the tests stop and start again."""
    from infra.stack import Stack, free_port

    s = Stack(tmp_path_factory.mktemp("fault-stack"), ports={k: free_port() for k in ("s3", "mlflow", "prefect")})
    s.start_s3()
    s.start_mlflow()
    yield s
    s.down()


class _Run:
    """A CLI run in the background, its stderr read line by line as it comes (so a test can wait for a line)."""

    def __init__(self, tmp_path, env: dict, run_id: str, storage: str, *extra: str) -> None:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(CONFIG)
        self.proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(cfg), "--run-id", run_id,
                                      "--storage", storage, "--no-progress", *extra], cwd=tmp_path, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    def poll(self):
        return self.proc.poll()

    @property
    def stderr(self):  # what wait_for_commit reads when the run exits early
        return io.BytesIO("".join(self.lines).encode())

    def wait_line(self, text: str, timeout: float) -> None:
        wait_until(lambda: any(text in line for line in self.lines) or self.proc.poll() is not None, timeout,
                   f"a log line with {text!r}")
        assert any(text in line for line in self.lines), "".join(self.lines)[-3000:]

    def finish(self) -> tuple[int, str, str]:
        out = self.proc.stdout.read()
        self.proc.wait(timeout=300)
        self._reader.join(timeout=30)
        return self.proc.returncode, out, "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _store(storage: str, run_id: str, stack=None):
    """The run's store as the test reads it (the stack's S3 credentials for an s3:// URI)."""
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import S3Options, open_storage

    opts = None
    if stack is not None:
        c = stack.credentials()
        opts = S3Options(stack.s3_url, "us-east-1", c["access_key_id"], c["secret_access_key"])
    return RunStore(open_storage(storage, opts), run_id)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The same config run once undisturbed (local storage, no servers): its committed state, what every faulty
    run of this module must end with."""
    tmp = tmp_path_factory.mktemp("straight")
    (tmp / "c.yaml").write_text(CONFIG)
    storage = str(tmp / "runs")
    cli_summary(Cli(tmp).run("run", tmp / "c.yaml", "--run-id", "straight", "--storage", storage, "--no-progress",
                             "--set", f"output_dir={tmp / 'out'}", "--set", "tracking.enabled=false"))
    return committed_state(storage, "straight")


def _logged_once(client, parent: str, storage: str, run_id: str) -> None:
    """Every committed generation's metrics exactly once on the parent run and on each slot's run, with the
    committed values."""
    fitnesses = committed_state(storage, run_id)[1]
    gens = list(range(len(fitnesses)))
    for key in ("best_fitness", "mean_fitness", "global_env_steps", "generation_wall_s"):
        assert sorted(m.step for m in client.get_metric_history(parent, key)) == gens, key
    assert [m.value for m in sorted(client.get_metric_history(parent, "best_fitness"), key=lambda m: m.step)] == \
        [max(f) for f in fitnesses]
    children = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.`agilerl.parent` = '{parent}'")
    assert len(children) == len(fitnesses[0])
    for child in children:
        slot = int(child.data.tags["agilerl.slot"])
        history = sorted(client.get_metric_history(child.info.run_id, "fitness"), key=lambda m: m.step)
        assert [m.step for m in history] == gens, slot
        assert [m.value for m in history] == [f[slot] for f in fitnesses]


def test_training_goes_on_while_mlflow_is_down_and_each_generation_is_logged_once(faulty, tmp_path, cli,
                                                                                   straight):
    """MLflow stopped mid-run: generations keep committing, the queue flushes in order when the server is back.
    Stopped until the end: the run finishes and says what is pending and how to deliver it; `resume` delivers
    it exactly once. Both runs end with the population of an undisturbed run."""
    import mlflow

    storage = str(tmp_path / "runs")
    env = {**cli.env, **faulty.client_env(("mlflow",)), "MLFLOW_TRACKING_URI": faulty.mlflow_url}
    client = mlflow.MlflowClient(faulty.mlflow_url)

    # 1. down for a while in the middle
    run = _Run(tmp_path, env, "outage", storage)
    store = _store(storage, "outage")
    try:
        wait_for_commit(store, 1, run)
        faulty.stop("mlflow")
        at = store.latest_generation()
        wait_for_commit(store, at + 3, run, timeout=60)  # training did not wait for the tracking server
        run.wait_line("is not answering", timeout=120)  # the queue noticed (the server stays down until then)
        faulty.start_mlflow()
        code, out, err = run.finish()
    finally:
        faulty.start_mlflow()
        run.kill()
    assert code == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert "tracking_pending" not in summary
    assert "training goes on" in err and "is back after" in err and "Traceback" not in err
    _logged_once(client, summary["mlflow_run_id"], storage, "outage")
    assert client.get_model_version(summary["registered_model"], summary["version"]).tags["agilerl.run_id"] == "outage"
    kept = tmp_path / "runs" / "outage" / "tracking"
    assert not kept.exists() or not list(kept.iterdir())  # the rows kept in storage are gone once delivered

    # 2. down until the run ends
    run = _Run(tmp_path, env, "late", storage, "--set", "tracking.flush_timeout=1")
    store = _store(storage, "late")
    try:
        wait_for_commit(store, 1, run)
        faulty.stop("mlflow")
        code, out, err = run.finish()
    finally:
        run.kill()
    assert code == 0, err[-3000:]
    late = json.loads(out.strip().splitlines()[-1])
    pending = late["tracking_pending"]
    assert pending["end"] is True and pending["generations"] and pending["generations"] == sorted(pending["generations"])
    assert f"agilerl-flow resume late --storage {storage}` delivers them" in err
    assert "version" not in late  # nothing registered while the server was down
    faulty.start_mlflow()
    delivered = cli_summary(cli.run("resume", "late", "--storage", storage, "--no-progress", cwd=tmp_path, env=env))
    assert delivered["already_finished"] is True and set(pending["generations"]) <= set(delivered["tracking_delivered"])
    assert "tracking_pending" not in json.loads((tmp_path / "runs" / "late" / "summary.json").read_text())
    _logged_once(client, delivered["mlflow_run_id"], storage, "late")
    versions = client.search_model_versions(f"name='faults' and run_id='{delivered['mlflow_run_id']}'")
    assert len(versions) == 1 and versions[0].tags["agilerl.run_id"] == "late"
    again = cli_summary(cli.run("resume", "late", "--storage", storage, "--no-progress", cwd=tmp_path, env=env))
    assert "tracking_delivered" not in again  # delivered once: a second resume has nothing to do
    assert len(client.search_model_versions(f"name='faults' and run_id='{delivered['mlflow_run_id']}'")) == 1
    _logged_once(client, delivered["mlflow_run_id"], storage, "late")

    assert committed_state(storage, "outage") == straight
    assert committed_state(storage, "late") == straight


def test_a_store_that_restarts_loses_nothing_and_one_that_stays_down_ends_in_the_resume_command(faulty, tmp_path,
                                                                                                monkeypatch, cli,
                                                                                                straight):
    """SeaweedFS restarted mid-run: S3 requests retry with backoff and the run ends as an undisturbed one. Down for
    longer than the retries (two attempts here): the run fails in one paragraph, no traceback, ending with the
    exact resume command, and that command (once S3 is back) ends as an undisturbed run."""
    from infra.stack import STORAGE_BUCKET

    env = {**cli.env, **faulty.client_env(("s3",))}
    for k, v in faulty.client_env(("s3",)).items():  # this process reads the runs back too
        monkeypatch.setenv(k, v)
    storage = f"s3://{STORAGE_BUCKET}/faults-{tmp_path.name.lower().replace('_', '-')}"
    local = ["--set", f"output_dir={tmp_path / 'out'}"]

    run = _Run(tmp_path, env, "blip", storage, *local)
    try:
        wait_for_commit(_store(storage, "blip"), 1, run)
        faulty.stop("s3")
        faulty.start_s3()  # down while it restarts (seconds): within the retry window
        code, _, err = run.finish()
    finally:
        faulty.start_s3()
        run.kill()
    assert code == 0, err[-3000:]

    run = _Run(tmp_path, env, "cut", storage, "--set", "storage.max_attempts=2", *local)
    try:
        wait_for_commit(_store(storage, "cut"), 1, run)
        faulty.stop("s3")
        code, _, err = run.finish()
    finally:
        faulty.start_s3()
        run.kill()
    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("agilerl-flow: storage error: ") and "Run cut stopped: generations up to" in last
    assert last.endswith(f"continue it with: agilerl-flow resume cut --storage {storage}"), last
    assert "Traceback" not in err
    command = last.split("continue it with: ")[1].split()  # exactly what the operator is told to run
    assert command[:2] == ["agilerl-flow", "resume"]
    resumed = cli_summary(cli.run(*command[1:], "--no-progress", cwd=tmp_path, env=env))
    assert resumed["resumed_after_generation"] >= 1 and resumed["global_steps"] == STEPS

    assert committed_state(storage, "blip") == straight
    assert committed_state(storage, "cut") == straight
    _tracked_locally_once(tmp_path, storage, ("blip", "cut"))


def _tracked_locally_once(tmp_path, storage: str, run_ids) -> None:
    """The runs tracked to the local SQLite file in output_dir hold each generation's metrics exactly once."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("faults").experiment_id
    for run_id in run_ids:
        parent = client.search_runs([experiment], f"tags.`agilerl.run_id` = '{run_id}' and tags.`agilerl.role` = 'parent'")
        assert len(parent) == 1
        _logged_once(client, parent[0].info.run_id, storage, run_id)


def test_a_prefect_api_outage_mid_run(faulty, tmp_path, cli, straight):
    """The Prefect server stopped mid-run and started again: the run ends as an undisturbed one."""
    faulty.start_prefect()
    storage = str(tmp_path / "runs")
    env = {**cli.env, **faulty.client_env(("prefect",)), "PREFECT_API_URL": faulty.prefect_api}
    run = _Run(tmp_path, env, "api", storage, "--set", f"output_dir={tmp_path / 'out'}")
    store = _store(storage, "api")
    try:
        wait_for_commit(store, 1, run)
        faulty.stop("prefect")
        at = store.latest_generation()  # then three more generations while the API is down
        wait_for_commit(store, at + 3, run, timeout=60)
        faulty.start_prefect()
        code, _, err = run.finish()
    finally:
        faulty.start_prefect()
        run.kill()
    assert code == 0, err[-3000:]
    assert committed_state(storage, "api") == straight
    _tracked_locally_once(tmp_path, storage, ("api",))
