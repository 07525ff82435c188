"""What an RL user sees of training in the MLflow UI (issue 52): the README's main job, run as a user runs it (the
embedded default, no servers), then `mlflow ui` on the `runs/mlflow.db` it wrote, in a real browser: each member
slot's training curves (loss, entropy, KL) side by side in the experiment's chart view. The screenshot is kept
(``AGILERL_UI_SCREENSHOTS``, else the test's folder)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agilerl_core.net import free_port
from infra.stack import _http_ok
from tests.conftest import cli_summary
from tests.test_operator_view import _browser

ROOT = Path(__file__).resolve().parents[1]


def test_mlflow_ui_shows_every_members_learning_curves(cli, tmp_path):
    sync_playwright, chromium = _browser()
    # the README's first command as it stands: it holds its target over three generations in a row, so it shows
    # evolution (at least three generations, mutations, a family tree with edges) and lines, not one-point bars
    run = cli.run("run", ROOT / "deployments/configs/cartpole_ppo.yaml", "--no-progress", timeout=600)
    summary = cli_summary(run)
    assert summary["generations"] >= 3 and summary["target_held"], summary
    assert "best member's training: loss" in run.stderr  # the per-generation line carries the training numbers
    assert "held it 3 generations in a row" in run.stderr
    mutations = [m for line in run.stderr.splitlines() if "mutations: " in line
                 for m in line.split("mutations: ")[1].split(", ")]
    assert any(not m.endswith((" init", " elite", " none")) for m in mutations), mutations  # a mutation happened
    db = tmp_path / "runs" / "mlflow.db"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("cartpole-ppo")
    runs = client.search_runs([exp.experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 4
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "lineage/lineage.json", str(tmp_path)))
                       .read_text())
    lineage = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    # the family tree has edges: children of later generations with their parents, some made by a mutation
    assert any(e["generation"] > 0 and e["parent_id"] is not None for e in lineage)
    assert any(e["mutation"] not in ("init", "elite", "none") for e in lineage)
    for child in children:  # a point per generation for every member slot's diagnostics
        for key in ("train.loss", "train.entropy", "train.approx_kl", "train.value_loss", "train.explained_variance"):
            assert len(client.get_metric_history(child.info.run_id, key)) == summary["generations"], key

    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    ui = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{db}", "--host",
                           "127.0.0.1", "--port", str(port), "--workers", "1"], cwd=tmp_path, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    shots = Path(os.environ.get("AGILERL_UI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    try:
        deadline = time.monotonic() + 120
        while not _http_ok(f"http://127.0.0.1:{port}/health"):
            assert ui.poll() is None and time.monotonic() < deadline, "mlflow ui did not start"
            time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1300})
                page.goto(f"http://127.0.0.1:{port}/#/experiments/{exp.experiment_id}?compareRunsMode=CHART"
                          "&workflowType=machine_learning", wait_until="load")
                page.get_by_text("matching runs").first.wait_for(timeout=60_000)
                # the parent run's row unfolds into the member slots' runs; the chart view draws them all
                page.locator("[role=gridcell][col-id='attributes.`Run Name`'] button").first.click()
                page.get_by_text("slot-3 ·", exact=False).first.wait_for(timeout=30_000)
                page.locator("label:has(input[value=CHART])").first.click()
                assistant = page.get_by_role("button", name="Close")  # MLflow's assistant panel takes a third
                if assistant.count():
                    assistant.first.click()
                page.get_by_placeholder("Search metric charts").fill("train.")
                for chart in ("train.loss", "train.entropy", "train.approx_kl"):
                    page.get_by_text(chart, exact=True).first.wait_for(timeout=60_000)
                for slot in range(4):  # every member's curve is in the loss chart's legend
                    page.get_by_text(f"slot-{slot} · {summary['run_id']} (train.loss)").first.wait_for(timeout=30_000)
                assert page.get_by_text("best_fitness", exact=True).count() == 0  # the search kept training charts
                # the charts' lines drawn: each of the three charts has its plotted traces in the page
                page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace')"
                                       ".length >= 3", timeout=30_000)
                page.screenshot(path=str(shots / "mlflow-learning-curves.png"), full_page=True)
            finally:
                browser.close()
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)
