"""GPU work pools and the deployments' code delivery: the Kubernetes and Docker job templates render to GPU
jobs, the git pull step clones the repository a remote worker runs, and `stack up --gpu-workers N` starts
one single-run worker per GPU, each seeing only its own."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from prefect.utilities.templating import apply_values, find_placeholders

ROOT = Path(__file__).resolve().parents[1]
POOLS = ROOT / "deployments" / "work_pools"
PREFECT_FILLS = {"command": "prefect flow-run execute", "name": "agilerl-run", "env": {"PREFECT_API_URL": "http://x"},
                 "labels": {"prefect.io/flow-run-id": "1"}}


def _render(name: str, **values):
    template = json.loads((POOLS / name).read_text())
    props = template["variables"]["properties"]
    jsonschema.Draft202012Validator.check_schema(template["variables"])
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert used <= set(props), f"{name}: placeholders without a variable: {sorted(used - set(props))}"
    defaults = {k: v["default"] for k, v in props.items() if "default" in v}
    chosen = {**defaults, **PREFECT_FILLS, **values}
    jsonschema.validate(chosen, template["variables"])
    return apply_values(template["job_configuration"], chosen)


def test_kubernetes_template_renders_a_gpu_job():
    job = _render("kubernetes-gpu.json", gpus=2, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    manifest = job["job_manifest"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["args"] == PREFECT_FILLS["command"] and container["env"] == PREFECT_FILLS["env"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["restartPolicy"] == "Never"
    with pytest.raises(jsonschema.ValidationError):
        _render("kubernetes-gpu.json", gpus=-1)


def test_docker_template_renders_gpu_device_requests():
    job = _render("docker-gpu.json", gpu_ids=["1"])
    (request,) = job["container_create_kwargs"]["device_requests"]
    assert request == {"driver": "nvidia", "device_ids": ["1"], "capabilities": [["gpu"]]}
    assert job["image"].endswith(":latest") and job["command"] == PREFECT_FILLS["command"]


def test_gpu_configs_deploy_to_the_gpu_pool():
    doc = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    pools = {d["name"]: d["work_pool"]["name"] for d in doc["deployments"]}
    assert pools["carracing-ppo"] == "agilerl-gpu" and pools["cartpole-dqn"] == "agilerl-process"


def test_git_pull_step_clones_the_repository(tmp_path, monkeypatch):
    """The pull steps of prefect-git.yaml, run as a remote worker runs them, against this repository."""
    from prefect.deployments.steps.core import run_steps

    ref = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if ref.returncode != 0 or ref.stdout.strip() == "HEAD":
        pytest.skip("the checkout is not on a git branch")
    doc = yaml.safe_load((ROOT / "deployments" / "prefect-git.yaml").read_text())
    monkeypatch.setenv("AGILERL_GIT_URL", f"file://{ROOT}")
    monkeypatch.setenv("AGILERL_GIT_REF", ref.stdout.strip())
    pull = apply_values(doc["pull"], dict(os.environ), remove_notset=False)  # what `prefect deploy` does
    assert pull[0]["prefect.deployments.steps.git_clone"]["repository"] == f"file://{ROOT}"
    monkeypatch.chdir(tmp_path)
    out = asyncio.run(run_steps(pull))
    workdir = Path(out["directory"])
    assert workdir.parent == tmp_path and Path.cwd() == workdir
    assert (workdir / "flows" / "online.py").is_file() and (workdir / "deployments" / "configs").is_dir()
    assert [d["name"] for d in doc["deployments"]] == [d["name"] for d in yaml.safe_load(
        (ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.integration
def test_gpu_workers_see_one_gpu_each_and_take_one_run_at_a_time(servers):
    servers.start_gpu_workers(2)
    try:
        assert servers.online_workers("agilerl-gpu") == 2
        status = servers.status()["gpu_workers"]
        assert status["running"] == 2 and status["online"] == 2
        for i, pid in enumerate(status["pids"]):
            assert _environ(pid)["CUDA_VISIBLE_DEVICES"] == str(i)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert b"--limit" in cmdline and cmdline[cmdline.index(b"--limit") + 1] == b"1"
    finally:
        for name in servers.gpu_worker_names():
            servers.stop(name)
    assert not servers.gpu_worker_names()


@pytest.mark.integration
def test_groups_as_deployment_runs_give_the_threads_result(servers, tmp_path, cli):
    """runner.kind: deployments: each group of each generation is a run of the train-group deployment, picked
    up by the pool's worker in a process of its own; members and experience go through storage. The run
    equals the threads runner's with the same groups, bit for bit; a missing deployment is refused first."""
    from infra.stack import _bin
    from tests.conftest import cli_summary, committed_state
    from tests.test_scale_out import _config

    servers.start_worker()
    env = {**cli.env, **servers.client_env(), "PWD": str(ROOT)}
    storage = str(servers.trusted_runs / tmp_path.name)  # the worker trusts runs below it (AGILERL_TRUSTED_URIS)
    missing = cli.run("run", str(_config(tmp_path, {"kind": "deployments", "deployment": "train-group/nope"})),
                       "--storage", storage, "--no-progress", cwd=tmp_path, env=env)
    assert missing.returncode != 0 and "runner.deployment: 'train-group/nope' is not deployed" in missing.stderr
    p = subprocess.run([_bin("prefect"), "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "-n",
                        "train-group"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    runs = {}
    for kind in ("threads", "deployments"):
        cfg = _config(tmp_path, {"kind": kind}, budget=1600)  # two generations of two groups of two
        runs[kind] = cli_summary(cli.run("run", str(cfg), "--run-id", kind, "--storage", storage, "--no-progress",
                                          cwd=tmp_path, env=env, timeout=600))
    s = runs["deployments"]
    assert s["group_sizes"] == runs["threads"]["group_sizes"] == [2, 2]
    assert {p["group"] for p in s["group_placements"]} == {"m0-1", "m2-3"}
    assert all(p["pid"] for p in s["group_placements"])  # trained in the worker's flow-run processes
    assert committed_state(storage, "deployments") == committed_state(storage, "threads")


def test_the_ci_workflow_validates_and_its_commands_are_real():
    """.github/workflows/evolve.yml against GitHub's workflow schema (check-jsonschema's bundled copy: no
    network), every run: block through `bash -n`, and its trigger command through the CLI's own parser."""
    import shlex
    import shutil

    from flows.cli import _parser

    workflow = ROOT / ".github" / "workflows" / "evolve.yml"
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    p = subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(workflow)], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = yaml.safe_load(workflow.read_text())
    assert set(doc[True]) == {"workflow_dispatch", "pull_request"}  # YAML reads the key `on` as True
    steps = doc["jobs"]["evolve"]["steps"]
    for step in steps:
        if "run" in step:
            check = subprocess.run(["bash", "-n"], input=step["run"], capture_output=True, text=True, check=False)
            assert check.returncode == 0, (step.get("name"), check.stderr)
    gate = next(s["run"] for s in steps if "agilerl-flow trigger" in s.get("run", ""))
    command = gate.split("agilerl-flow", 1)[1].split("|", 1)[0].replace("\\\n", " ")
    args = _parser().parse_args([a.replace("$DEPLOYMENT", "online-evolution/cartpole-dqn").replace("$SEED", "0")
                                 .replace("$MIN_FITNESS", "400") for a in shlex.split(command)])
    assert args.wait and args.min_fitness == 400.0 and args.deployment == "online-evolution/cartpole-dqn"
    assert doc["jobs"]["evolve"]["env"]["PREFECT_API_URL"] == "${{ secrets.PREFECT_API_URL }}"
