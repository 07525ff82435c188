"""What an operator sees: the run's log lines and artifacts in Prefect, the MLflow run's description and
lineage pictures, checked through the APIs and, where a browser is installed, in the real UIs (Debian's
chromium driven by playwright). Screenshots go to $AGILERL_UI_SCREENSHOTS when set (else the test's tmp dir)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from tasks.artifacts import artifact_key, end_line, generation_line, generation_rows, start_line
from tasks.reports import elite_path, mutation_kind, plot_family_tree, plot_hp_schedules, unchanged_hyperparameters
from tasks.tracker import ML_VIEW

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """\
name: ui-view
env_id: CartPole-v1
num_envs: 4
population_size: 3
evo_steps: 200
eval_episodes: 2
max_env_steps: 1800
seed: 5
hyperparameters: {batch_size: 32, learning_delay: 64, buffer_size: 1000}
network: {hidden_sizes: [32, 32], min_nodes: 8}
mutation: {no_mutation: 0.0, architecture: 0.3, parameters: 0.2, activation: 0.0, rl_hp: 0.5}
"""


# ---- the pieces, for every kind of training ----------------------------------------------------------------
def _lineage():
    ev = [  # gen 0: three members; gen 1: the elite of 1 kept, a child of 1 with a new lr, a child of 0
        (0, 0, 0, None, "init", 5.0), (0, 1, 1, None, "init", 9.0), (0, 2, 2, None, "init", 1.0),
        (1, 0, 3, 1, "elite", 9.5), (1, 1, 4, 1, "hp:lr=0.002", 12.0), (1, 2, 5, 0, "arch:mlp.add_nodes", 3.0)]
    return [{"generation": g, "slot": s, "member_id": m, "parent_id": p, "mutation": mut, "fitness": f,
             "hyperparameters": {"lr": 0.002 if mut.startswith("hp:") else 0.001, "gamma": 0.99},
             "architecture": "mlp"} for g, s, m, p, mut, f in ev]


def test_lineage_edges_name_their_mutation_and_the_elite_line(tmp_path):
    assert [mutation_kind(m) for m in ("elite", "hp:lr=0.1", "arch:mlp.add_layer", "params:noise(0.1)",
                                       "activation:tanh", "rank:4->8", "none(arch at bounds)", "init")] == \
        ["elite", "hp", "arch", "params", "activation", "rank", "none", "none"]
    lineage = _lineage()
    assert elite_path(lineage) == [4, 1]  # the best of the last generation, back to its founder
    assert unchanged_hyperparameters(lineage, ["lr", "gamma"]) == ["gamma"]
    assert plot_family_tree(lineage, tmp_path / "tree.png", "a rather long experiment name").stat().st_size > 10_000
    assert plot_hp_schedules(lineage, ["lr", "gamma"], tmp_path / "hps.png", "x").stat().st_size > 10_000
    assert plot_hp_schedules(lineage, [], tmp_path / "none.png", "x").exists()  # an empty hp space is said


def _rows_of(cfg):
    from agilerl_core.experiment import build_evolution

    evo = build_evolution(cfg)
    evo.run_generation()
    evo.evolve()
    evo.run_generation()
    stats = asdict(evo.history[-1])
    rows = generation_rows(evo.population, stats, sorted(evo.arena.space))
    json.dumps(rows, allow_nan=False)  # a Prefect table: JSON, no NaN
    return rows, stats


def test_generation_tables_fit_each_kind_of_training(tmp_path):
    """Gymnasium and offline members show their training return, teams each agent's return, LLM members their
    training reward and completion length; every row its slot, member, parent, mutation, fitness, evolved
    hyperparameters and network."""
    from agilerl_core.data.collect import collect_episodes, write_dataset
    from tasks.config import validate_config
    from tests.conftest import tiny_config
    from tests.test_llm import TINY_MODEL
    from tests.test_multi_agent import ma_config

    gym = validate_config({**yaml.safe_load(CONFIG), "max_env_steps": 1200})
    rows, stats = _rows_of(gym)
    assert {"slot", "member", "parent", "mutation", "fitness", "train return", "lr", "network"} <= set(rows[0])
    assert [r["mutation"] for r in rows] == stats["mutations"] and rows[0]["mutation"] == "elite"
    assert all(isinstance(r["parent"], int) for r in rows)  # the second generation: every member has one

    rows, _ = _rows_of(ma_config())
    assert {"return pointer_0", "return chooser_0", "train return"} <= set(rows[0])

    data = write_dataset(str(tmp_path / "d.hdf5"), collect_episodes("CartPole-v1", "random", 5, seed=0), "CartPole-v1",
                         "random")
    rows, _ = _rows_of(tiny_config(kind="offline", algorithm="cqn", evo_steps=50, max_env_steps=200,
                                   **{"dataset.uri": data}))
    assert "train return" in rows[0] and "fitness" in rows[0]

    (tmp_path / "const.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": "7"}) + "\n"
                                                  for a in range(10) for b in range(10)))
    llm = validate_config({"name": "llm-view", "kind": "llm", "algorithm": "grpo", "population_size": 2, "seed": 0,
                           "model": json.loads(json.dumps(TINY_MODEL)),
                           "dataset": {"uri": str(tmp_path / "const.jsonl"), "held_out": 20},
                           "hyperparameters": {"batch_size": 8, "group_size": 4, "max_new_tokens": 1},
                           "evo_steps": 64, "max_env_steps": 256})
    rows, _ = _rows_of(llm)
    assert {"train reward", "completion length", "lr"} <= set(rows[0]) and "train return" not in rows[0]


def test_log_lines_say_what_ran_each_generation_and_the_end():
    from tasks.config import validate_config

    cfg = validate_config(yaml.safe_load(CONFIG))
    line = start_line(cfg, "r1", "s3://agilerl/runs/r1", "http://mlflow/#/experiments/1/runs/abc", None)
    assert "gym dqn on CartPole-v1, population 3" in line and "s3://agilerl/runs/r1" in line and "http://mlflow" in line
    assert "resuming after generation 4" in start_line(cfg, "r1", "/tmp/x", None, 4)
    g = generation_line({"generation": 2, "best_fitness": 21.5, "mean_fitness": 10.0, "global_steps": 1800,
                         "wall_s": 0.4, "mutations": ["elite", "hp:lr=0.002", "none"]})
    assert g == "generation 2: best 21.50, mean 10.00, 1,800 global steps, 0.4 s; mutations: 0 elite, " \
                "1 hp:lr=0.002, 2 none"
    done = {"run_id": "r1", "best_fitness": 21.5, "generations": 3, "global_steps": 1800, "wall_s": 3.0,
            "max_env_steps": 1800, "elite_uri": "s3://x/elite", "registered_model": "ui-view", "version": "4",
            "champion": {"chosen": "best_ever", "member_id": 7, "generation": 1, "fitness": 20.0}}
    end = end_line({**done, "promoted": True, "champion_version": "4", "champion_uri": "models:/ui-view@champion",
                    "promotion": "promoted: no champion with a recorded fitness yet"})
    assert "spent its step budget" in end
    # one name for what is on disk and what is registered: the champion, the member named once
    assert "champion: the best ever (member 7 of generation 1, fresh-seed fitness 20.00), saved at s3://x/elite, " \
           "registered as ui-view version 4, now models:/ui-view@champion" in end
    kept = end_line({**done, "promoted": False, "champion_version": "2", "reached_target": True, "target_held": True,
                     "promotion": "not promoted: fitness 20.00 does not beat the champion's (version 2) 30.00"},
                    target=20.0)
    assert "reached its target fitness 20 after 1,800 of 1,800 budgeted steps" in kept
    held = end_line({**done, "reached_target": True, "target_held": True, "target_generations": 3}, target=20.0)
    assert "reached its target fitness 20 and held it 3 generations in a row after 1,800 of 1,800" in held
    missed = end_line({**done, "reached_target": True, "target_held": False, "target_generations": 3}, target=20.0)
    assert "spent its step budget (it reached its target fitness 20 but did not hold it 3 generations in a row)" \
        in missed
    assert "not promoted: fitness 20.00 does not beat the champion's (version 2) 30.00; ui-view@champion stays " \
           "version 2" in kept


# ---- a run through the stack, as a person sees it -----------------------------------------------------------
def _post(url: str, body: dict) -> list | dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def watched_run(servers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watched")
    (tmp / "c.yaml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI",
                                                            "AGILERL_STORAGE_URI", "AWS_ENDPOINT_URL")}
    env.update(servers.client_env(), PREFECT_HOME=str(tmp / "prefect-home"), PYTHONPATH=str(ROOT))
    runs, stderr = [], []
    for seed in (5, 6):  # two runs of one config: told apart by name and artifact keys, two registered versions
        p = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(tmp / "c.yaml"), "--no-progress", "--set",
                            f"seed={seed}"], cwd=tmp, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        stderr.append(p.stderr)
    return {"summary": runs[0], "other": runs[1], "stderr": stderr[0], "tmp": tmp}


@pytest.mark.integration
def test_the_run_logs_and_publishes_its_view(servers, watched_run):
    """Through the APIs: the generation lines in the flow run's logs (and once each on the console), a table per
    generation, links to the MLflow run and the champion, the lineage picture, the MLflow description."""
    s, api = watched_run["summary"], servers.prefect_api
    fr = s["prefect_flow_run_id"]
    logs = [entry["message"] for entry in _post(f"{api}/logs/filter", {"logs": {"flow_run_id": {"any_": [fr]}},
                                                                      "limit": 200})]
    for g in range(s["generations"]):
        assert sum(m.startswith(f"generation {g}: best ") for m in logs) == 1, logs
        assert sum(line.endswith("- " + m) for line in watched_run["stderr"].splitlines() for m in logs
                   if m.startswith(f"generation {g}:")) == 1
    assert any(m.startswith(f"run {s['run_id']}: gym dqn on CartPole-v1") and s["mlflow_run_url"] in m for m in logs)
    assert any(m.startswith(f"run {s['run_id']} finished") and "models:/ui-view@champion" in m for m in logs)
    assert "View run" not in watched_run["stderr"]  # MLflow's own run links are not repeated on the console
    arts = _post(f"{api}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [fr]}}})
    by_key: dict[str, list] = {}
    for a in arts:
        by_key.setdefault(a["key"], []).append(a)
    key = {what: artifact_key(s["run_id"], what) for what in ("generation", "mlflow-run", "model", "lineage",
                                                              "progress", "summary")}
    assert set(by_key) == set(key.values())  # every key names this run
    assert len(by_key[key["generation"]]) == s["generations"]
    table = json.loads(by_key[key["generation"]][0]["data"]) if isinstance(by_key[key["generation"]][0]["data"],
                                                                          str) else by_key[key["generation"]][0]["data"]
    assert {"slot", "member", "parent", "mutation", "fitness", "lr", "network"} <= set(table[0])
    assert s["mlflow_run_url"] in by_key[key["mlflow-run"]][0]["data"]
    assert s["mlflow_run_url"].endswith("?workflowType=machine_learning")
    assert "/#/models/ui-view/versions/" in by_key[key["model"]][0]["data"]
    assert "data:image/png;base64," in by_key[key["lineage"]][0]["data"]
    assert by_key[key["progress"]][0]["data"] == 100.0
    # runs of one config are told apart: the flow run is named by its run id, the other run's keys are its own
    other = watched_run["other"]
    with urllib.request.urlopen(f"{api}/flow_runs/{fr}", timeout=20) as resp:
        assert json.loads(resp.read())["name"] == s["run_id"]
    theirs = {a["key"] for a in _post(f"{api}/artifacts/filter",
                                      {"artifacts": {"flow_run_id": {"any_": [other["prefect_flow_run_id"]]}}})}
    assert theirs == {artifact_key(other["run_id"], what) for what in key} and not theirs & set(by_key)
    from mlflow.tracking import MlflowClient

    note = MlflowClient(servers.mlflow_url).get_run(s["mlflow_run_id"]).data.tags["mlflow.note.content"]
    assert f"Best fitness **{s['best_fitness']:.2f}**" in note and "lineage/family_tree.png" in note


@pytest.mark.integration
def test_a_run_that_reaches_its_target_says_so_and_fills_its_progress(servers, tmp_path):
    """Stopped early on its target: the last log line says it reached the target (not just 'finished') and the
    progress artifact shows 100 %, not the share of the step budget it spent."""
    (tmp_path / "c.yaml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI",
                                                            "AGILERL_STORAGE_URI", "AWS_ENDPOINT_URL")}
    env.update(servers.client_env(), PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(tmp_path / "c.yaml"), "--no-progress", "--set",
                        "target_fitness=9", "--set", "max_env_steps=100000", "--set", "tracking.enabled=false"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads(p.stdout.strip().splitlines()[-1])
    assert s["reached_target"] and s["global_steps"] < 100000
    logs = [e["message"] for e in _post(f"{servers.prefect_api}/logs/filter",
                                        {"logs": {"flow_run_id": {"any_": [s["prefect_flow_run_id"]]}}, "limit": 200})]
    assert any(f"finished (reached its target fitness 9 after {s['global_steps']:,} of 100,000 budgeted steps)" in m
               for m in logs), logs
    arts = _post(f"{servers.prefect_api}/artifacts/filter",
                 {"artifacts": {"flow_run_id": {"any_": [s["prefect_flow_run_id"]]}}})
    assert [a["data"] for a in arts if a["key"] == artifact_key(s["run_id"], "progress")] == [100.0]


def _browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("no browser: install Debian's chromium (apt-get install -y chromium) to see the UIs")
    return sync_playwright, chromium


def _workflow_buttons(page) -> dict[str, str]:
    """How MLflow draws its two workflow buttons (GenAI, Model training): text colour and weight, the selected one
    apart from the other."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('[role=button]')]
        .filter(e => ['GenAI', 'Model training'].includes(e.innerText.trim()))
        .map(e => { const t = getComputedStyle(e.querySelector('span') || e);
                    return [e.innerText.trim(), `${t.color} ${t.fontWeight}`]; }))""")


@pytest.mark.integration
def test_prefect_and_mlflow_uis_show_the_run(servers, watched_run):
    """In a real browser: the flow run's page lists the generation lines and the artifacts, the lineage
    artifact shows its picture; the MLflow run shows its description and the family tree."""
    sync_playwright, chromium = _browser()
    s = watched_run["summary"]
    shots = Path(os.environ.get("AGILERL_UI_SCREENSHOTS") or watched_run["tmp"] / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    fr = s["prefect_flow_run_id"]
    arts = _post(f"{servers.prefect_api}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [fr]}}})
    other = watched_run["other"]

    def key(what: str) -> str:
        return artifact_key(s["run_id"], what)

    lineage_id = next(a["id"] for a in arts if a["key"] == key("lineage"))
    table_id = next(a["id"] for a in arts if a["key"] == key("generation"))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{servers.prefect_ui}/runs/flow-run/{fr}", wait_until="load")
            page.get_by_text(f"generation {s['generations'] - 1}: best", exact=False).first.wait_for(timeout=30_000)
            for g in range(s["generations"]):
                assert page.get_by_text(f"generation {g}: best", exact=False).count() == 1
            page.screenshot(path=str(shots / "prefect-flow-run-logs.png"), full_page=True)
            page.get_by_text("Artifacts", exact=True).first.click()
            page.get_by_text(key("lineage")).first.wait_for(timeout=30_000)
            for what in ("generation", "mlflow-run", "model", "progress", "summary"):
                assert page.get_by_text(key(what)).count() >= 1, what
            assert page.get_by_text(artifact_key(other["run_id"], "generation")).count() == 0  # the other run's
            page.screenshot(path=str(shots / "prefect-flow-run-artifacts.png"), full_page=True)
            page.goto(f"{servers.prefect_ui}/artifacts/artifact/{table_id}", wait_until="load")
            page.get_by_text("mutation", exact=True).first.wait_for(timeout=30_000)
            for column in ("slot", "parent", "fitness", "lr", "network"):
                assert page.get_by_text(column, exact=True).count() >= 1, column
            page.screenshot(path=str(shots / "prefect-generation-table.png"), full_page=True)
            page.goto(f"{servers.prefect_ui}/artifacts/artifact/{lineage_id}", wait_until="load")
            page.locator("img[src^='data:image/png']").first.wait_for(timeout=30_000)
            width = page.eval_on_selector("img[src^='data:image/png']", "img => img.naturalWidth")
            assert width > 300  # the picture decoded and shows
            page.screenshot(path=str(shots / "prefect-lineage-artifact.png"), full_page=True)

            page.goto(s["mlflow_run_url"], wait_until="load")
            page.get_by_text("Best fitness").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots / "mlflow-parent-run.png"), full_page=True)
            link = page.locator("a[href*='/flow-run/']").first  # the description links back to the flow run
            href = link.get_attribute("href")
            assert href is not None and fr in href
            back = browser.new_page(viewport={"width": 1400, "height": 1000})
            back.goto(href, wait_until="load")
            back.get_by_text("generation 0: best", exact=False).first.wait_for(timeout=30_000)
            back.close()
            page.goto(s["mlflow_run_url"].removesuffix(ML_VIEW) + "/artifacts/lineage/family_tree.png" + ML_VIEW,
                      wait_until="load")
            page.get_by_text("lineage/family_tree.png").first.wait_for(timeout=60_000)
            page.wait_for_function("() => [...document.images].some(i => i.src.startsWith('blob:') && "
                                   "i.naturalWidth > 300)", timeout=60_000)
            page.screenshot(path=str(shots / "mlflow-family-tree.png"), full_page=True)

            # the Runs list tells the two runs of one config apart: each flow run is named by its run id
            page.goto(f"{servers.prefect_ui}/runs", wait_until="load")
            page.get_by_text(s["run_id"], exact=True).first.wait_for(timeout=30_000)
            page.get_by_text(other["run_id"], exact=True).first.wait_for(timeout=30_000)
            page.screenshot(path=str(shots / "prefect-runs-list.png"), full_page=True)
            # the link the project prints opens MLflow's Model training view, not the GenAI one
            page.goto(s["mlflow_run_url"], wait_until="load")
            page.get_by_text("Best fitness").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots / "mlflow-model-training-view.png"), full_page=True)
            # the registry: both runs' versions, each with its fitness tag; the alias on the fitter one
            ml = _workflow_buttons(page)
            plain = browser.new_page(viewport={"width": 1400, "height": 1000})  # a fresh page without the query
            plain.goto(s["mlflow_run_url"].removesuffix(ML_VIEW), wait_until="load")
            plain.get_by_text("GenAI", exact=True).first.wait_for(timeout=60_000)
            genai = _workflow_buttons(plain)
            plain.close()
            # the two buttons are drawn differently, and the one drawn "selected" moved from GenAI to Model training
            assert ml["GenAI"] != ml["Model training"] and ml == {"GenAI": genai["Model training"],
                                                                 "Model training": genai["GenAI"]}, (ml, genai)
            page.goto(f"{servers.mlflow_url}/#/models/ui-view{ML_VIEW}", wait_until="load")
            best = max((s, other), key=lambda r: r["champion"]["fitness"])
            rows = page.get_by_role("row")
            rows.filter(has_text=f"Version {other['version']}").first.wait_for(timeout=60_000)
            for run in (s, other):
                row = rows.filter(has_text=f"Version {run['version']}").first.inner_text()
                assert f"agilerl.fitness\n: {run['champion']['fitness']}" in row and run["run_id"] in row, row
                assert ("@ champion" in row.replace("\xa0", " ")) is (run is best), row
            page.screenshot(path=str(shots / "mlflow-registry.png"), full_page=True)
            page.goto(f"{servers.mlflow_url}/#/models/ui-view/versions/{best['version']}{ML_VIEW}", wait_until="load")
            page.get_by_text("agilerl.fitness").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots / "mlflow-champion-version.png"), full_page=True)
        finally:
            browser.close()
