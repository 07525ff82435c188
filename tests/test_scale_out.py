"""Scale-out without a GPU: the Ray runner (logical GPUs) and a Dask cluster with GPU worker resources place
each group's task as asked and give the threads runner's result; the Ray runner resumes after kill -9
bit-identically. Every run goes through the CLI and the flow, groups of two members (runner.group_size)."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import Cli, cli_summary, committed_state

pytest.importorskip("prefect_ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
pytestmark = pytest.mark.slow  # Ray and Dask clusters start in each test

POP = 4


def _config(tmp_path, runner: dict, evo_steps: int = 200, budget: int = 1600):  # two generations
    data = {"name": "scale", "env_id": "CartPole-v1", "num_envs": 4, "population_size": POP, "evo_steps": evo_steps,
            "eval_episodes": 2, "max_env_steps": budget, "seed": 3,
            "hyperparameters": {"batch_size": 32, "learning_delay": 64, "buffer_size": 5000},
            "network": {"hidden_sizes": [32, 32], "min_nodes": 8},
            "tracking": {"enabled": False}, "runner": {"group_size": 2, **runner}}
    path = tmp_path / f"{runner.get('kind', 'threads')}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(cli, tmp_path, runner: dict, run_id: str, budget: int = 1600) -> dict:
    storage = str(tmp_path / "runs")
    p = cli.run("run", str(_config(tmp_path, runner, budget=budget)), "--run-id", run_id, "--storage", storage, "--no-progress",
                 cwd=tmp_path, env=cli.env, timeout=600)
    return {"summary": cli_summary(p), "state": committed_state(storage, run_id)}


@pytest.fixture(scope="module")
def threads_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("threads")
    return _run(Cli(tmp), tmp, {}, "threads")


def test_ray_places_each_group_on_its_logical_gpu_and_matches_threads(threads_run, tmp_path, cli):
    """Two logical GPUs, one per group: the two groups land on different GPUs (Ray sets each task's
    CUDA_VISIBLE_DEVICES), batched two by two, and the run is the threads runner's to the bit."""
    ray = _run(cli, tmp_path, {"kind": "ray", "workers": 2, "worker_gpus": 2, "gpus_per_shard": 1}, "ray")
    s = ray["summary"]
    assert s["group_sizes"] == threads_run["summary"]["group_sizes"] == [2, 2]
    places = s["group_placements"]
    assert [p["group"] for p in places] == ["m0-1", "m2-3"]
    assert all(len(p["ray_gpu_ids"]) == 1 for p in places)
    assert {p["ray_gpu_ids"][0] for p in places} == {"0", "1"}
    assert all(p["cuda_visible_devices"] == p["ray_gpu_ids"][0] for p in places)
    assert s["best_fitness"] == threads_run["summary"]["best_fitness"]
    assert ray["state"] == threads_run["state"]


def test_ray_fractional_gpus_share_one_device(tmp_path, cli):
    """gpus_per_shard 0.5 on one logical GPU: both groups' tasks fit on it."""
    ray = _run(cli, tmp_path, {"kind": "ray", "workers": 2, "worker_gpus": 1, "gpus_per_shard": 0.5}, "ray-half",
               budget=800)  # one generation: the placements are what it checks
    places = ray["summary"]["group_placements"]
    assert [p["ray_gpu_ids"] for p in places] == [["0"], ["0"]]


def test_dask_gpu_workers_take_the_annotated_tasks_and_match_threads(threads_run, tmp_path, cli):
    """A local cluster of one worker per GPU (resource GPU=1, its own CUDA_VISIBLE_DEVICES); each group's
    task, annotated GPU=1, runs on a GPU worker, one group per worker."""
    dask = _run(cli, tmp_path, {"kind": "dask", "worker_gpus": 2, "gpus_per_shard": 1}, "dask")
    places = dask["summary"]["group_placements"]
    assert all(p["dask_resources"] == {"GPU": 1} for p in places)
    assert {p["cuda_visible_devices"] for p in places} == {"0", "1"}
    assert len({p["dask_worker"] for p in places}) == 2
    assert dask["state"] == threads_run["state"]


def test_gpu_placement_that_would_hang_is_refused_before_work(tmp_path, cli):
    p = cli.run("run", str(_config(tmp_path, {"kind": "dask", "gpus_per_shard": 1})), "--no-progress",
                 "--storage", str(tmp_path / "runs"), cwd=tmp_path, env=cli.env)
    assert p.returncode != 0
    assert "runner.gpus_per_shard" in p.stderr and "runner.worker_gpus" in p.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_ray_run_resumes_after_kill_9_as_if_uninterrupted(tmp_path, cli):
    """Killed mid-run and resumed on Ray, the run ends as the uninterrupted one, run on the threads runner (which
    the Ray runner equals to the bit: the placement test above)."""
    cfg = _config(tmp_path, {"kind": "ray", "workers": 2}, evo_steps=200, budget=4000)  # 5 generations
    straight_cfg = _config(tmp_path, {}, evo_steps=200, budget=4000)
    storage = str(tmp_path / "runs")
    resumed, straight = cli.crash_and_resume(cfg, storage, straight_cfg=straight_cfg)
    assert resumed["generations"] == straight["generations"] == 5
    assert committed_state(storage, "crashed") == committed_state(storage, "straight")
