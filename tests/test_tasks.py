"""Task functions called directly (`task.fn`): both runner modes give the in-process loop's result."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from agilerl_core.evolution import Evolution
from agilerl_core.experiment import build_evolution
from agilerl_core.io.run_store import RunStore
from agilerl_core.io.storage import LocalStorage
from tasks.generation import (
    WORKER_RUNS,
    GenerationJob,
    MemberState,
    by_slot,
    commit_generation_task,
    evaluate_group_task,
    evaluate_shipped_group_task,
    fold_generation_task,
    group_label,
    select_and_mutate_task,
    train_group_task,
    train_shipped_group_task,
)
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]


def _generations(cfg, store, run_id: str, mode: str, n: int, exp: Evolution | None = None) -> Evolution:
    """Generations up to `n` through the tasks, committed to `store`; from generation 0 on a fresh evolution, or
    from where `exp` (one resumed from the store) stands."""
    exp = exp or build_evolution(cfg)
    try:
        for g in range(len(exp.history), n):
            job = GenerationJob(run_id, cfg, store.storage.uri, g, exp.generation_steps(), mode)
            if exp.history:
                select_and_mutate_task.fn(job, exp)
            exp.begin_generation()
            groups = exp.groups()
            members = exp.population.members
            outs, fits = [], []
            for group in groups:
                label = group_label(group)
                if mode == "process":
                    outs.append(train_shipped_group_task.fn(job, group, label,
                                                            [MemberState(*members[s].agent.state()) for s in group]))
                    fits.append(evaluate_shipped_group_task.fn(job, group, label, outs[-1]))
                else:
                    outs.append(train_group_task.fn(job, group, label, exp))
                    fits.append(evaluate_group_task.fn(job, group, label, exp))
            outs, fits = by_slot(groups, outs, fits)
            shards = fold_generation_task.fn(job, exp, store, outs, fits)
            info = commit_generation_task.fn(job, exp, store, shards)
            assert info["generation"] == g
            assert commit_generation_task.fn(job, exp, store, shards) == info  # a retried commit changes nothing
    finally:
        WORKER_RUNS.drop(run_id)
    return exp


def _config(kind: str):
    if kind == "dqn":
        return tiny_config(**{"hyperparameters.buffer_size": 1000})
    from tests.test_algorithms import _tiny

    return _tiny(kind)


@pytest.mark.parametrize("kind", ["dqn", "cartpole_rainbow.yaml", "pendulum_td3.yaml", "cartpole_ppo.yaml",
                                  "speaker_listener_matd3.yaml", "speaker_listener_ippo.yaml",
                                  "smollm2_arithmetic_grpo.yaml"])
def test_thread_and_process_tasks_match_the_local_loop(kind, tmp_path):
    """Same fitness, lineage, experience and weights whichever runner, and the same evaluation notes
    (per-agent returns, sample completions): a process runner evaluates a copy and carries them back."""
    cfg = _config(kind)
    local = build_evolution(cfg)
    for _ in range(3):
        if local.history:
            local.evolve()
        local.run_generation()
    runs = {}
    for mode in ("threads", "process"):
        store = RunStore(LocalStorage(tmp_path / mode), "r")
        runs[mode] = _generations(cfg, store, "r", mode, 3)
        assert store.committed_generations() == [0, 1, 2]
    for exp in runs.values():
        assert [h.fitnesses for h in exp.history] == [h.fitnesses for h in local.history]
        assert [e.to_dict() for e in exp.population.lineage] == [e.to_dict() for e in local.population.lineage]
        if local.arena.buffer is not None:
            assert (exp.arena.buffer.size, exp.arena.buffer.pos) == (local.arena.buffer.size, local.arena.buffer.pos)
        for a, b in zip(exp.population.members, local.population.members, strict=True):
            ta, tb = a.agent.state()[0], b.agent.state()[0]
            assert all(torch.equal(ta[k], tb[k]) for k in tb)
    notes = [local.evaluation_notes(s) for s in range(len(local.population.members))]
    assert all(notes) == bool(local.arena.evaluation_notes)
    for exp in runs.values():
        assert [exp.evaluation_notes(s) for s in range(len(exp.population.members))] == notes


def _same_run(a: Evolution, b: Evolution) -> None:
    assert [h.fitnesses for h in a.history] == [h.fitnesses for h in b.history]
    assert [h.mutations for h in a.history] == [h.mutations for h in b.history]
    assert [e.to_dict() for e in a.population.lineage] == [e.to_dict() for e in b.population.lineage]
    assert a.global_steps == b.global_steps
    if b.arena.buffer is not None:
        assert (a.arena.buffer.size, a.arena.buffer.pos) == (b.arena.buffer.size, b.arena.buffer.pos)
    for x, y in zip(a.population.members, b.population.members, strict=True):
        tx, ty = x.agent.state()[0], y.agent.state()[0]
        assert tx.keys() == ty.keys() and all(torch.equal(tx[k], ty[k]) for k in ty)


@pytest.mark.parametrize("kind", ["dqn", "cartpole_ppo.yaml", "speaker_listener_matd3.yaml",
                                  "speaker_listener_ippo.yaml", "smollm2_arithmetic_grpo.yaml", "wordle_ilql.yaml",
                                  "iris_neural_ucb.yaml",
                                  "cartpole_cqn.yaml"])
def test_a_run_resumed_from_its_store_ends_as_an_uninterrupted_one(kind, tmp_path):
    """What the flow does after a crash, in process, for each kind of training: a new evolution resumes from the
    last committed generation (members, RNGs, history, shared experience rebuilt from its shards, the workers'
    state dropped) and the run ends bit-identical to one never interrupted. The CLI kill -9 tests (threads, Ray)
    prove the same through the flow."""
    cfg = _config(kind)
    straight = _generations(cfg, RunStore(LocalStorage(tmp_path / "straight"), "r"), "r", "threads", 3)
    store = RunStore(LocalStorage(tmp_path / "crashed"), "r")
    _generations(cfg, store, "r", "threads", 2)  # the run dies after committing generation 1
    resumed = build_evolution(cfg)
    resumed.resume(store, store.latest_generation())
    assert len(resumed.history) == 2
    _generations(cfg, store, "r", "threads", 3, exp=resumed)
    _same_run(resumed, straight)


def test_process_tasks_resync_a_fresh_worker_from_storage(tmp_path):
    """A worker that joins late (or after a crash) rebuilds the committed buffer from the shards."""
    cfg = tiny_config(**{"hyperparameters.buffer_size": 1000})
    store = RunStore(LocalStorage(tmp_path), "r")
    exp = _generations(cfg, store, "r", "threads", 2)
    exp.evolve()
    job = GenerationJob("r", cfg, str(tmp_path), 2, exp.generation_steps(), "process")
    try:
        out, = train_shipped_group_task.fn(job, (1,), "m1", [MemberState(*exp.population.members[1].agent.state())])
        exp.begin_generation()
        ref = exp.train(1)
    finally:
        WORKER_RUNS.drop("r")
    assert out.result.mean_loss == ref.mean_loss and out.result.env_steps == ref.env_steps
    assert out.shard.rows == ref.env_steps


def test_prefect_yaml_is_generated_from_the_configs():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, str(ROOT / "deployments" / "build.py"), "--check"], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0, p.stderr


def test_only_configs_that_ask_get_a_schedule_written_once_under_definitions():
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("deploy_build", ROOT / "deployments" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    text = build.render()
    doc = yaml.safe_load(text)  # the aliases resolve to the definitions
    scheduled = {d["name"]: d["schedules"] for d in doc["deployments"] if d["schedules"]}
    nightly = {"cron": "0 2 * * *", "timezone": "UTC", "active": True}
    assert scheduled == {"cartpole-dqn": [nightly], "cartpole-ppo": [nightly],
                         "carracing-ppo": [{"cron": "0 3 * * 0", "timezone": "UTC", "active": False}]}
    # one per config, one per stages file, and the train-group deployment
    assert len(doc["deployments"]) == len(list((ROOT / "deployments" / "configs").glob("*.yaml"))) + \
        len(list((ROOT / "deployments" / "stages").glob("*.yaml"))) + 1
    assert text.count("&daily_0200_utc") == 1 and text.count("- *daily_0200_utc") == 2  # defined once, aliased
    assert text.count("name: agilerl-process") == 1 and "work_pool: *agilerl_process" in text
    assert build.schedule_name({"cron": "30 6 * * 1", "timezone": "Europe/London", "active": True}) == \
        "weekly_mon_0630_europe_london"
    every_15 = build.schedule_name({"cron": "*/15 * * * *", "timezone": "UTC", "active": False})
    assert every_15.startswith("cron_") and every_15.endswith("_utc_paused")
    assert every_15 != build.schedule_name({"cron": "15 * * * *", "timezone": "UTC", "active": False})


def test_the_flow_takes_its_prepared_run_as_a_parameter_and_refuses_one_from_outside(tmp_path):
    """flows.api.run hands the flow the run it prepared as the `handover` parameter (no process-global hand-over):
    Prefect records it as a placeholder, never as data; a deployment's flow-run parameter in its place, or a
    handover prepared for another config, is refused naming the field."""
    from agilerl_core.errors import ConfigError
    from flows.online import online_evolution
    from flows.run_setup import Handover, handed_over, prepare_run

    cfg = tiny_config(output_dir=str(tmp_path / "out"), **{"storage.uri": str(tmp_path / "runs"),
                                                           "tracking.enabled": False})
    prepared = prepare_run(cfg, "handover-test")
    try:
        given = Handover(prepared)
        assert online_evolution.serialize_parameters({"handover": given}) == {"handover": "<Handover>"}
        assert pickle.loads(pickle.dumps(given)) is None  # what a Dask worker receives with the flow run's context
        assert handed_over(given, cfg, "handover-test") is given and handed_over(None, cfg, None) is None
        with pytest.raises(ConfigError, match="handover: .*deployment's parameters"):
            handed_over({"prepared": {"run_id": "other"}}, cfg, None)
        with pytest.raises(ConfigError, match="handover: prepared for run handover-test with another config"):
            handed_over(given, cfg.model_copy(update={"seed": 1}), None)
        with pytest.raises(ConfigError, match="handover: "):
            handed_over(given, cfg, "another-run")
    finally:
        prepared.lease.stop()
