"""MLflow tracking of an evolution run.

Experiment = the config's name. One parent run per evolution run (tagged with our run id, so a resumed
run logs into the same parent), one child run per member slot. Every write names its run explicitly
through :class:`MlflowClient` (safe from task threads) and goes out in batches: one ``log_batch`` per
run per generation, never per env step. Credentials never reach params, tags or logs: the config's
secret fields are dropped before logging.

Beside it: where the server is and whether it answers (:mod:`tasks.server_checks`), the champion in the model
registry (:mod:`tasks.registry`, whose methods :class:`Tracker` has) and the queue that delivers generations off
the training path (:mod:`tasks.delivery`).
"""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from agilerl_core.errors import TrackingError
from agilerl_core.hpo.found import found_words
from tasks.artifacts import champion_words, subject
from tasks.config import PipelineConfig
from tasks.registry import ModelRegistry
from tasks.reports import lineage_table, render_lineage
from tasks.server_checks import check_tracking_server, tracking_uri

SECRET_FIELDS = ("storage.access_key_id", "storage.secret_access_key")
ML_VIEW = "?workflowType=machine_learning"  # MLflow 3's UI opens the GenAI view without it, "Model training" with it


def flat_params(cfg: PipelineConfig) -> dict[str, str]:
    """The whole config as dotted params, secrets removed."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif prefix not in SECRET_FIELDS:
            out[prefix] = str(value)[:6000]

    walk("", cfg.model_dump(mode="json"))
    return out


def _subject_tags(cfg: PipelineConfig) -> dict[str, str]:
    """What the members act on: the env id, or an LLM experiment's base model and dataset."""
    if cfg.kind == "llm":
        m = cfg.model
        name = m.path or m.gguf_file or f"config:{m.config.get('model_type')}"
        return {"agilerl.base_model": f"{name}{'/' + m.gguf_file if m.path and m.gguf_file else ''}",
                "agilerl.dataset": cfg.dataset.label}
    if cfg.kind == "language":
        return {"agilerl.game": cfg.env.game, "agilerl.dataset": cfg.dataset.label}
    return {"agilerl.env_id": cfg.env_id}


def _finite(x: float) -> bool:
    return x is not None and math.isfinite(float(x))


def run_description(cfg: PipelineConfig, run_id: str, storage_uri: str, summary: dict[str, Any] | None = None,
                    flow_run_url: str | None = None) -> str:
    """The parent run's description: what ran and, once it ended, how it did and where to look."""
    lines = [f"**{cfg.name}**: {cfg.kind} {cfg.algorithm} on `{subject(cfg)}`, population {cfg.population_size}, "
             f"budget {cfg.max_env_steps:,} steps, seed {cfg.seed}.", "",
             f"Run `{run_id}`, storage `{storage_uri}`." + (f" Prefect flow run: {flow_run_url}" if flow_run_url else "")]
    if summary is None:
        lines += ["", "Running: the metrics `best_fitness` and `mean_fitness` grow a point per generation; each "
                      "slot of the population is a child run (`slot-N · " + run_id + "`)."]
    else:  # the result first: the UI shows a description's first lines before "Show more"
        found = summary.get("found")
        lines = [f"Best fitness **{summary['best_fitness']:.2f}** over {summary['generations']} generations "
                 f"({summary['global_steps']:,} steps, {summary['wall_s']:.0f} s). Champion: "
                 f"{champion_words(summary)}.", "",
                 *([f"Found: {found_words(found)}. Params `found.*`; the artifact `found/found_config.yaml` "
                    f"re-runs from them.", ""] if found else []),
                 *lines, "", "Lineage: the artifacts `lineage/family_tree.png` (who descends from whom, edges coloured by "
                      "the mutation that made each child, the elite's line in red), `lineage/hp_schedules.png` and "
                      "`lineage/lineage.json`. Compare the slots: the child runs `slot-N · " + run_id + "` "
                      "(metrics `fitness`, `hp.*`)."]
    return "\n".join(lines)


class Tracker(ModelRegistry):
    """Parent and child runs of one evolution run."""

    def __init__(self, cfg: PipelineConfig, run_id: str, storage_uri: str) -> None:
        # MLflow prints "View run ... at URL" for every run it ends: the flow logs the parent run's URL once
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        # MLflow's client retries a refused request 7 times over minutes; TrackingQueue retries generations itself,
        # so a request gives up after ~6 s and the queue's thread notices a returning server within its backoff
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        self.cfg = cfg
        self.uri = tracking_uri(cfg)
        check_tracking_server(self.uri)
        self.client = MlflowClient(self.uri)
        self.run_id = run_id
        try:
            exp = self.client.get_experiment_by_name(cfg.name)
            if exp is None:
                location = None
                if self.uri.startswith("sqlite:"):
                    location = (Path(self.uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
                self.experiment_id = self.client.create_experiment(cfg.name, artifact_location=location)
            else:
                self.experiment_id = exp.experiment_id
            self.parent_id = self._find_or_create_parent(storage_uri)
            self.child_ids = [self._find_or_create_child(slot) for slot in range(cfg.population_size)]
            self._stamps: dict[int, int] = {}  # generation -> the timestamp its metrics are logged with
        except mlflow.exceptions.MlflowException as err:
            raise TrackingError(f"tracking server {self.uri}: {err.message}") from None

    # ---- runs ------------------------------------------------------------------------------------------
    def _search(self, filt: str):
        return self.client.search_runs([self.experiment_id], filter_string=filt, max_results=5)

    def _find_or_create_parent(self, storage_uri: str) -> str:
        found = self._search(f"tags.`agilerl.run_id` = '{self.run_id}' and tags.`agilerl.role` = 'parent'")
        if found:
            self.client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        run = self.client.create_run(self.experiment_id, run_name=self.run_id, tags={
            "agilerl.run_id": self.run_id, "agilerl.role": "parent", "agilerl.storage_uri": storage_uri,
            "agilerl.algorithm": self.cfg.algorithm, **_subject_tags(self.cfg)})
        # storage.uri as resolved (the config's may be None: the embedded default or $AGILERL_STORAGE_URI)
        params = [Param(k, v) for k, v in {**flat_params(self.cfg), "storage.uri": storage_uri}.items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(run.info.run_id, params=params[i: i + 100], synchronous=True)
        return run.info.run_id

    def _find_or_create_child(self, slot: int) -> str:
        found = self._search(f"tags.`agilerl.parent` = '{self.parent_id}' and tags.`agilerl.slot` = '{slot}'")
        if found:
            self.client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        run = self.client.create_run(self.experiment_id, run_name=f"slot-{slot} · {self.run_id}", tags={
            "mlflow.parentRunId": self.parent_id, "agilerl.parent": self.parent_id, "agilerl.role": "member",
            "agilerl.slot": str(slot), "agilerl.run_id": self.run_id})
        return run.info.run_id

    def log_dataset(self, info: dict[str, Any]) -> None:
        """The offline dataset as the parent run's input (name, content hash, source, profile) and its size
        and return statistics as params. Idempotent: a resumed run logs the same values again."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        profile = {k: info[k] for k in ("transitions", "episodes", "return_mean", "return_std") if k in info}
        source_type = "s3" if info["uri"].startswith("s3://") else "local"
        ds = Dataset(name=Path(info["uri"].rstrip("/")).name or info["uri"], digest=info["sha256"][:32],
                     source_type=source_type, source=json.dumps({"uri": info["uri"], "format": info["format"]}),
                     profile=json.dumps(profile))
        try:
            self.client.log_inputs(self.parent_id, [DatasetInput(ds, [InputTag("mlflow.data.context", "training")])])
            params = [Param(f"dataset.{k}", str(v)) for k, v in info.items()
                      if k in ("transitions", "episodes", "return_mean", "return_std")]  # the config's own
            # dataset.* params (uri, format, the pinned sha256) are logged with the config
            self.client.log_batch(self.parent_id, params=params, synchronous=True)
        except mlflow.exceptions.MlflowException as err:
            raise TrackingError(f"tracking server {self.uri}: logging the dataset failed: {err.message}") from None

    def logged_generations(self) -> set[int]:
        """The generations logged completely (the parent's metrics go last: they mark a generation done)."""
        return {m.step for m in self.client.get_metric_history(self.parent_id, "best_fitness")}

    def _logged_steps(self, run_id: str, key: str) -> set[int]:
        return {m.step for m in self.client.get_metric_history(run_id, key)}

    # ---- per generation --------------------------------------------------------------------------------
    def log_generation(self, stats: dict[str, Any], members: list[dict[str, Any]], only_missing: bool = False) -> None:
        """One batch per run: each slot's member metrics, then the parent's population metrics (last, so that
        :meth:`logged_generations` only counts a generation every run has).

        Exactly once: a retry in this process reuses the generation's timestamp (MLflow drops a metric identical
        in key, value, step and timestamp); `only_missing` (a later process delivering what an earlier one could
        not) first asks each run whether it has the generation and skips those that do."""
        g = int(stats["generation"])
        now = self._stamps.setdefault(g, int(time.time() * 1000))
        for slot, m in enumerate(members):
            if only_missing and g in self._logged_steps(self.child_ids[slot], "fitness"):
                continue
            metrics = [Metric("fitness", float(m["fitness"]), now, g),
                       Metric("param_count", float(m["param_count"]), now, g)]
            if _finite(m.get("train_return")):
                metrics.append(Metric("train_return", float(m["train_return"]), now, g))
            metrics += [Metric(f"hp.{k}", float(v), now, g) for k, v in m["hyperparameters"].items()]
            metrics += [Metric(f"return.{a}", float(v), now, g) for a, v in m.get("agent_returns", {}).items()
                        if _finite(v)]
            metrics += [Metric(f"train.{k}", float(v), now, g) for k, v in m.get("train_metrics", {}).items()
                        if _finite(v)]
            # within a long phase, a few points: the same diagnostics at the member's env steps (MLflow's step)
            metrics += [Metric(f"phase.{k}", float(v), now, int(at)) for at, values in m.get("train_points", [])
                        for k, v in values.items() if _finite(v)]
            metrics += [Metric(f"eval.{k}", float(v), now, g) for k, v in m.get("eval_metrics", {}).items()
                        if _finite(v)]
            tags = [RunTag("agilerl.member_id", str(m["member_id"])), RunTag("agilerl.mutation", m["mutation"]),
                    RunTag("agilerl.architecture", m["architecture"][:5000])]
            self.client.log_batch(self.child_ids[slot], metrics=metrics, tags=tags, synchronous=True)
        samples = [{"generation": g, "slot": slot, "member_id": m["member_id"], **row}
                   for slot, m in enumerate(members) for row in m.get("samples", [])]
        if samples:  # LLM members' held-out answers, language agents' games (a table per generation; rewritten whole)
            self.client.log_table(self.parent_id, {k: [r.get(k) for r in samples] for k in samples[0]},
                                  f"samples/generation_{g:04d}.json")
        if only_missing and g in self.logged_generations():
            return
        parent = [Metric("best_fitness", float(stats["best_fitness"]), now, g),
                  Metric("mean_fitness", float(stats["mean_fitness"]), now, g),
                  Metric("global_env_steps", float(stats["global_steps"]), now, g),
                  Metric("generation_wall_s", float(stats["wall_s"]), now, g)]
        self.client.log_batch(self.parent_id, metrics=parent, synchronous=True)

    # ---- the end of the run ----------------------------------------------------------------------------
    def log_lineage(self, lineage: list[dict[str, Any]], hp_names: list[str], out_dir: str | Path) -> None:
        """The lineage table and both pictures (rendered into `out_dir`, where the flow reads them back)."""
        self.client.log_table(self.parent_id, lineage_table(lineage), "lineage/lineage.json")
        for picture in render_lineage(lineage, hp_names, out_dir, self.cfg.name):
            self.client.log_artifact(self.parent_id, str(picture), "lineage")

    def log_found(self, found: dict[str, Any], found_yaml: str | None) -> None:
        """What the run found on the parent run: the champion's hyperparameters as params ``found.NAME``, the
        whole record (moves along its line, the population's spread) and the config that re-runs from them."""
        params = [Param(f"found.{n}", str(v)) for n, v in found["values"].items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.parent_id, params=params[i: i + 100], synchronous=True)
        self.client.log_dict(self.parent_id, found, "found/found_hyperparameters.json")
        if found_yaml is not None:
            self.client.log_text(self.parent_id, found_yaml, "found/found_config.yaml")

    # ---- where a person finds things ---------------------------------------------------------------------
    @property
    def run_url(self) -> str | None:
        """The parent run in the MLflow UI (None when tracking goes to a file store, not a server)."""
        if not self.uri.startswith(("http://", "https://")):
            return None
        return f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.parent_id}{ML_VIEW}"

    @property
    def where(self) -> str:
        """The parent run, for a log line: its URL, or its id and the tracking URI."""
        return self.run_url or f"{self.parent_id} in {self.uri}"

    def model_url(self, name: str | None, version: str | None) -> str | None:
        if name is None or version is None or not self.uri.startswith(("http://", "https://")):
            return None
        return f"{self.uri.rstrip('/')}/#/models/{name}/versions/{version}{ML_VIEW}"

    def describe(self, text: str) -> None:
        """The parent run's description (markdown, shown on its page in the MLflow UI)."""
        self.client.set_tag(self.parent_id, "mlflow.note.content", text)

    def version_tags(self, fitness: float | None) -> dict[str, str]:
        """What a registered version records about itself: the fitness promotion compares, the run, the
        config's digest (secrets left out) and the seed."""
        import hashlib

        digest = hashlib.sha256(json.dumps(flat_params(self.cfg), sort_keys=True).encode()).hexdigest()
        return {"agilerl.fitness": "nan" if fitness is None else repr(float(fitness)), "agilerl.run_id": self.run_id,
                "agilerl.config_digest": digest, "agilerl.seed": str(self.cfg.seed)}

    def end(self, status: str = "FINISHED") -> None:
        for rid in [*self.child_ids, self.parent_id]:
            self.client.set_terminated(rid, status)


@task(name="log-run-end", cache_policy=NO_CACHE)  # not retried: registering the champion twice makes two versions
def log_run_end_task(tracker: Tracker, lineage: list[dict[str, Any]], hp_names: list[str], elite_dir: str,
                     summary: dict[str, Any], report_dir: str, signature: Any = None, input_example: Any = None,
                     found_yaml: str | None = None) -> dict[str, Any]:
    """Lineage table and pictures (rendered into `report_dir`) and what the run found on the parent run; the
    elite as a registered model aliased champion. The two run side by side: rendering the pictures is CPU work,
    logging the model mostly waits on the server."""
    if summary.get("found"):
        tracker.log_found(summary["found"], found_yaml)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="agilerl-lineage") as pool:
        lineage_done = pool.submit(tracker.log_lineage, lineage, hp_names, report_dir)
        champion = tracker.log_champion(Path(elite_dir), summary, signature, input_example)
        lineage_done.result()
    return champion
