"""Trust: storage that survives crashes, power loss and a second writer (the elite never torn, writes fsynced
before they are named, leases, folds, resumes on another runner)."""

from __future__ import annotations

import json

import pytest
import torch

from agilerl_core.algorithms.saved import load_member
from agilerl_core.experiment import build_evolution
from tests.conftest import tiny_config
from tests.test_trust import _cli_config, _s3_opts, _start_run


# ---- storage that survives crashes, power loss and a second writer ------------------------------------------------
class _CrashOn:
    """A storage that dies (raises) on the put of one key: the moment a crash would hit."""

    def __init__(self, inner, suffix: str) -> None:
        self.inner, self.suffix = inner, suffix

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put_bytes(self, key: str, data: bytes) -> None:
        if key.endswith(self.suffix):
            raise KeyboardInterrupt(f"crash before {key}")
        self.inner.put_bytes(key, data)


def _elite_round(store_storage, tmp_path):
    from agilerl_core.io.run_store import RunStore

    evo = build_evolution(tiny_config(population_size=2))
    evo.population.record_fitness([1.0, 2.0])
    store = RunStore(store_storage, "elite-run")
    uri = store.save_elite(evo.elite(), evo.arena.env_desc)
    first = store.storage.list("elite-run/elite/")
    assert sorted(k.rsplit("/", 1)[1] for k in first)[0] == "member.json" and len(first) == 2
    evo.population.members[1].agent.networks["q"].mlp.out.bias.data += 1.0  # a different elite next time
    for crash_at in ("weights-", "member.json"):
        crashing = RunStore(_CrashOn(store_storage, "member.json" if crash_at == "member.json" else ".safetensors"),
                            "elite-run")
        with pytest.raises(KeyboardInterrupt):
            crashing.save_elite(evo.elite(), evo.arena.env_desc)
        local = tmp_path / f"check-{crash_at}"
        store.storage.download_dir("elite-run/elite", local)
        member, _ = load_member(local)  # whole: the old elite, never a mix
        assert not torch.equal(member.agent.networks["q"].mlp.out.bias, evo.elite().agent.networks["q"].mlp.out.bias)
    store.save_elite(evo.elite(), evo.arena.env_desc)
    local = tmp_path / "check-new"
    store.storage.download_dir("elite-run/elite", local)
    member, _ = load_member(local)
    assert torch.equal(member.agent.networks["q"].mlp.out.bias, evo.elite().agent.networks["q"].mlp.out.bias)
    assert len(store.storage.list("elite-run/elite/")) == 2  # the old weights are gone once replaced
    return uri


def test_the_elite_is_never_torn_on_local_storage(tmp_path):
    from agilerl_core.io.storage import LocalStorage

    _elite_round(LocalStorage(tmp_path / "store"), tmp_path)


@pytest.mark.integration
def test_the_elite_is_never_torn_on_s3(s3, tmp_path):
    from agilerl_core.io.storage import S3Storage

    _elite_round(S3Storage(f"s3://agilerl/trust-elite-{tmp_path.name}", _s3_opts(s3)), tmp_path)


def test_local_writes_are_fsynced_before_they_are_named(tmp_path, monkeypatch):
    import os

    from agilerl_core.io.storage import LocalStorage

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    st = LocalStorage(tmp_path / "store")
    st.put_bytes("run/generations/000001/MANIFEST.json", b"{}")
    assert any(p.endswith(".MANIFEST.json." + p.rsplit(".", 1)[-1]) or "MANIFEST.json" in p for p in synced)
    assert str(tmp_path / "store" / "run" / "generations" / "000001") in synced  # the directory entry too


def test_dispatched_member_states_are_deleted_once_the_generation_is_committed(tmp_path):
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage

    evo = build_evolution(tiny_config(population_size=2))
    store = RunStore(LocalStorage(tmp_path / "store"), "dispatch-run")
    store.init_run({"name": "x"})
    for slot in (0, 1):
        tensors, meta = evo.population.members[slot].agent.state()
        store.put_member_state(0, slot, "in", tensors, meta)
        store.put_member_state(0, slot, "out", tensors, meta, {"fitness": 1.0})
    assert len(store.storage.list("dispatch-run/generations/000000/dispatch/")) == 8
    evo.population.record_fitness([1.0, 2.0])
    evo.commit(store, [])
    assert store.storage.list("dispatch-run/generations/000000/dispatch/") == []
    assert store.committed_generations() == [0]


def test_a_second_writer_is_refused_naming_the_owner_and_a_stale_lease_is_taken_over(tmp_path):
    import subprocess
    import sys

    from agilerl_core.errors import LeaseError
    from agilerl_core.io.lease import LeaseKeeper, new_lease_owner
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage

    store = RunStore(LocalStorage(tmp_path / "store"), "leased")
    first = LeaseKeeper(store, ttl_s=30).start()
    with pytest.raises(LeaseError, match=r"is being written by .*:\d+:[0-9a-f]{8} \(its last heartbeat"):
        RunStore(LocalStorage(tmp_path / "store"), "leased").acquire_lease(new_lease_owner())
    first.stop()
    assert store.lease() is None  # given up at the end
    # a stale heartbeat (another host's writer that stopped beating) is taken over
    store.acquire_lease("elsewhere:1:abcdef01", ttl_s=60)
    stale = {**store.lease(), "heartbeat": store.lease()["heartbeat"] - 61}  # its last beat, 61 s ago
    store.storage.put_bytes(store.key("LEASE.json"), json.dumps(stale).encode())
    store.acquire_lease("me:2:abcdef02")
    assert store.lease()["owner"] == "me:2:abcdef02"
    # ... and the old writer, beating again, learns it lost the run
    with pytest.raises(LeaseError, match="taken over by me:2:abcdef02"):
        store.heartbeat("elsewhere:1:abcdef01")
    # a writer on this host whose process is gone (kill -9) leaves a lease that is stale at once
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    store.release_lease("me:2:abcdef02")
    store.acquire_lease(f"{socket.gethostname()}:{dead.stdout.strip()}:abcdef03", ttl_s=3600)
    store.acquire_lease("me:3:abcdef04")
    assert store.lease()["owner"] == "me:3:abcdef04"


@pytest.mark.integration
def test_resuming_a_run_while_its_writer_is_alive_is_refused_and_the_writer_goes_on(tmp_path, cli):
    import os
    import signal

    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage
    from tests.conftest import wait_until

    path, env, storage = _cli_config(cli, tmp_path, name="lease-test", population_size=2, evo_steps=400,
                                     max_env_steps=10_000_000)
    proc = _start_run(path, "busy", storage, env, tmp_path)
    try:
        store = RunStore(open_storage(storage), "busy")
        wait_until(lambda: store.lease() is not None and store.committed_generations(), 240, "the first commit")
        second = cli.run("resume", "busy", "--storage", storage, "--no-progress", cwd=tmp_path, env=env)
        assert second.returncode != 0 and "is being written by" in second.stderr, second.stderr[-2000:]
        assert "Traceback" not in second.stderr
        seen = store.committed_generations()
        wait_until(lambda: store.committed_generations()[-1] > seen[-1], 240, "a commit after the refusal")
        assert set(seen) <= set(store.committed_generations())  # nothing of the live writer's was discarded
        assert proc.poll() is None  # and it is still running
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_fold_is_not_retried_and_folding_twice_changes_nothing(tmp_path):
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage
    from tasks.generation import Evaluation, GenerationJob, fold_generation_task, train_group_task

    assert fold_generation_task.retries == 0  # every task Prefect may retry must be idempotent; this one is not
    cfg = tiny_config(population_size=2)
    evo = build_evolution(cfg)
    store = RunStore(LocalStorage(tmp_path / "store"), "fold-run")
    job = GenerationJob("fold-run", cfg, str(tmp_path / "store"), 0, evo.generation_steps(), "threads")
    evo.begin_generation()
    outputs = [o for g in evo.groups() for o in train_group_task.fn(job, g, "g", evo)]
    evaluations = [Evaluation(f) for f in (1.0, 2.0)]
    refs = fold_generation_task.fn(job, evo, store, outputs, evaluations)
    state = (evo.global_steps, len(evo.history), evo.arena.buffer.size, evo.population.members[0].fitness_history)
    again = fold_generation_task.fn(job, evo, store, outputs, evaluations)
    assert again == refs
    assert (evo.global_steps, len(evo.history), evo.arena.buffer.size,
            evo.population.members[0].fitness_history) == state


@pytest.mark.integration
def test_a_resume_on_another_runner_trains_the_groups_the_run_was_started_with(tmp_path, cli):
    """Started with groups of 2, killed after a commit, continued with `--set runner.group_size=1`: the run
    keeps its pinned groups and ends exactly as the uninterrupted run."""
    import os
    import signal

    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage
    from tests.conftest import cli_summary, committed_state, wait_for_commit

    path, env, storage = _cli_config(cli, tmp_path, name="pin-test", population_size=4, evo_steps=200,
                                     max_env_steps=4000, runner={"group_size": 2})
    common = ["--storage", storage, "--no-progress"]
    proc = _start_run(path, "crashed", storage, env, tmp_path)
    wait_for_commit(RunStore(open_storage(storage), "crashed"), 1, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = cli_summary(cli.run("run", str(path), "--run-id", "crashed", *common, "--set", "runner.group_size=1",
                                   cwd=tmp_path, env=env))
    straight = cli_summary(cli.run("run", str(path), "--run-id", "straight", *common, cwd=tmp_path, env=env))
    assert resumed["group_sizes"] == straight["group_sizes"] == [2, 2]
    assert committed_state(storage, "crashed") == committed_state(storage, "straight")
