"""MLflow tracking of an evolution run.

Experiment = the config's name. One parent run per evolution run (tagged with our run id, so a resumed
run logs into the same parent), one child run per member slot. Every write names its run explicitly
through :class:`MlflowClient` (safe from task threads) and goes out in batches: one ``log_batch`` per
run per generation, never per env step. Credentials never reach params, tags or logs: the config's
secret fields are dropped before logging.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from agilerl_core.errors import TrackingError
from tasks.artifacts import champion_words, subject
from tasks.config import PipelineConfig
from tasks.reports import lineage_table, render_lineage

SECRET_FIELDS = ("storage.access_key_id", "storage.secret_access_key")
CHAMPION_ALIAS = "champion"
ML_VIEW = "?workflowType=machine_learning"  # MLflow 3's UI opens the GenAI view without it, "Model training" with it


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


# the pyfunc's code per experiment kind (default champion_model.py)
CHAMPION_CODE = {"llm": "champion_llm.py", "language": "champion_language.py"}


def champion_requirements(kind: str, torch_version: str) -> list[str]:
    """The champion's pip requirements (given, so MLflow does not infer them: seconds saved per log)."""
    reqs = ["agilerl-flow", f"torch=={torch_version.split('+')[0]}"]
    if kind == "llm":
        from importlib.metadata import version

        reqs += [f"{name}=={version(name)}" for name in ("transformers", "peft", "tokenizers")]
    return reqs


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


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


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
        lines = [f"Best fitness **{summary['best_fitness']:.2f}** over {summary['generations']} generations "
                 f"({summary['global_steps']:,} steps, {summary['wall_s']:.0f} s). Champion: "
                 f"{champion_words(summary)}.", "",
                 *lines, "", "Lineage: the artifacts `lineage/family_tree.png` (who descends from whom, edges coloured by "
                      "the mutation that made each child, the elite's line in red), `lineage/hp_schedules.png` and "
                      "`lineage/lineage.json`. Compare the slots: the child runs `slot-N · " + run_id + "` "
                      "(metrics `fitness`, `hp.*`)."]
    return "\n".join(lines)


class Tracker:
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

    def registered_version(self):
        """The model version this run registered already (None if none): a delivery after a failed ending must not
        register a second one."""
        if not self.cfg.tracking.register_model:
            return None
        name = self.cfg.tracking.model_name or self.cfg.name
        try:
            found = self.client.search_model_versions(f"name='{name}' and run_id='{self.parent_id}'")
        except mlflow.exceptions.MlflowException:
            return None
        return found[0] if found else None

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

    def log_champion(self, member_dir: Path, summary: dict[str, Any], signature: Any = None,
                     input_example: Any = None) -> dict[str, Any]:
        """Log the chosen champion (``summary["champion"]``) as a pyfunc model (code + safetensors checkpoint)
        with its typed `signature` (:func:`champion_signature`) and an `input_example` (:func:`champion_example`),
        register it with tags saying what it is, and move the ``champion`` alias to it as ``champion.promote``
        says (:meth:`promote`)."""
        import torch

        name = self.cfg.tracking.model_name or self.cfg.name
        fitness = (summary.get("champion") or {}).get("fitness", summary.get("best_fitness"))
        code = str(Path(__file__).with_name(CHAMPION_CODE.get(self.cfg.kind, "champion_model.py")))
        mlflow.set_tracking_uri(self.uri)
        with mlflow.start_run(run_id=self.parent_id):
            info = mlflow.pyfunc.log_model(
                name="champion", python_model=code, artifacts={"member": str(member_dir)},
                pip_requirements=champion_requirements(self.cfg.kind, torch.__version__),
                registered_model_name=name if self.cfg.tracking.register_model else None,
                signature=signature, input_example=input_example,
                step=int(summary.get("generations", 1)) - 1,  # links the final generation's metrics
                metadata={"fitness": fitness, "run_id": self.run_id})
        out: dict[str, Any] = {"model_uri": info.model_uri}
        if self.cfg.tracking.register_model:
            version = str(info.registered_model_version)
            for key, value in self.version_tags(fitness).items():
                self.client.set_model_version_tag(name, version, key, value)
            out.update(registered_model=name, version=version, **self.promote(name, version, fitness))
        return out

    def version_tags(self, fitness: float | None) -> dict[str, str]:
        """What a registered version records about itself: the fitness promotion compares, the run, the
        config's digest (secrets left out) and the seed."""
        import hashlib

        digest = hashlib.sha256(json.dumps(flat_params(self.cfg), sort_keys=True).encode()).hexdigest()
        return {"agilerl.fitness": "nan" if fitness is None else repr(float(fitness)), "agilerl.run_id": self.run_id,
                "agilerl.config_digest": digest, "agilerl.seed": str(self.cfg.seed)}

    def promote(self, name: str, version: str, fitness: float | None) -> dict[str, Any]:
        """Move ``NAME@champion`` to `version` as ``champion.promote`` says: ``always``; ``never``; ``if_better``
        (the default): only when `fitness` beats the ``agilerl.fitness`` tag of the version the alias points at
        (a version without one, or no alias yet, is beaten by any finite fitness). Returns what happened."""
        policy = self.cfg.champion.promote
        try:
            current = self.client.get_model_version_by_alias(name, CHAMPION_ALIAS)
        except mlflow.exceptions.MlflowException:
            current = None
        held = None if current is None else _float(current.tags.get("agilerl.fitness"))
        if current is not None and current.version == version:
            promoted, why = True, "it holds the alias already"
        elif policy == "never":
            promoted, why = False, "champion.promote is never"
        elif policy == "always":
            promoted, why = True, "champion.promote is always"
        elif fitness is None or not math.isfinite(fitness):
            promoted, why = False, "its fitness is not a number"
        elif current is None or held is None or not math.isfinite(held):
            promoted, why = True, "no champion with a recorded fitness yet"
        elif fitness > held:
            promoted, why = True, f"fitness {fitness:.2f} beats the champion's (version {current.version}) {held:.2f}"
        else:
            promoted, why = False, (f"fitness {fitness:.2f} does not beat the champion's (version {current.version}) "
                                    f"{held:.2f}")
        if promoted:
            self.client.set_registered_model_alias(name, CHAMPION_ALIAS, version)
        champion = version if promoted else (current.version if current is not None else None)
        return {"promoted": promoted, "promotion": f"{'promoted' if promoted else 'not promoted'}: {why}",
                "champion_version": champion,
                "champion_uri": f"models:/{name}@{CHAMPION_ALIAS}" if champion is not None else None}

    def end(self, status: str = "FINISHED") -> None:
        for rid in [*self.child_ids, self.parent_id]:
            self.client.set_terminated(rid, status)


def champion_io(arena) -> tuple[Any, Any]:
    """(signature, input example) of an arena's champion: observations to actions for RL members, prompt texts
    to completion texts for LLM members."""
    if arena.kind == "llm":
        from mlflow.models import ModelSignature
        from mlflow.types.schema import ColSpec, Schema

        signature = ModelSignature(inputs=Schema([ColSpec("string", "prompt")]),
                                   outputs=Schema([ColSpec("string", "completion")]))
        import pandas as pd

        return signature, pd.DataFrame({"prompt": list(arena.eval_data.prompts[:2])})
    if arena.kind == "language":
        import pandas as pd
        from mlflow.models import ModelSignature
        from mlflow.types.schema import ColSpec, Schema

        signature = ModelSignature(inputs=Schema([ColSpec("string", "transcript")]),
                                   outputs=Schema([ColSpec("string", "guess")]))
        return signature, pd.DataFrame({"transcript": ["", arena.games[0].transcript[:12]]})
    return champion_signature(arena.obs_space, arena.act_space), champion_example(arena.obs_space)


def champion_signature(obs_space, act_space) -> Any:
    """The champion's typed MLflow signature: a batch of observations in (one named tensor per key of a Dict
    space; per agent for a team), the greedy actions out (ints for Discrete, floats in the env's bounds for
    Box; a dict of them, one per agent, for a team: `act_space` is then a dict of spaces)."""
    import numpy as np
    from gymnasium import spaces
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def spec(space, name=None, action=False) -> TensorSpec:
        if isinstance(space, spaces.Discrete):
            return TensorSpec(np.dtype(np.int64), (-1,), name)
        dtype = np.dtype(np.uint8) if space.dtype == np.uint8 and not action else np.dtype(np.float32)
        return TensorSpec(dtype, (-1, *space.shape), name)

    def schema(space, action=False) -> Schema:
        named = space.spaces if isinstance(space, spaces.Dict) else space if isinstance(space, dict) else None
        if named is not None:
            return Schema([spec(s, k, action) for k, s in named.items()])
        return Schema([spec(space, action=action)])

    return ModelSignature(inputs=schema(obs_space), outputs=schema(act_space, action=True))


def champion_example(obs_space) -> Any:
    """A batch of two observations drawn from the space (seeded): the champion's input example, so the
    MLflow UI shows what the model takes and MLflow checks it against the signature when logging."""
    import numpy as np
    from gymnasium import spaces

    obs_space.seed(0)
    draws = [obs_space.sample() for _ in range(2)]
    if isinstance(obs_space, spaces.Dict):
        return {k: np.stack([np.asarray(d[k]) for d in draws]) for k in obs_space.spaces}
    return np.stack([np.asarray(d) for d in draws])


# ---- Prefect tasks (the tracking server is remote: transient failures are retried) ----------------------


class TrackingQueue:
    """Generations waiting to be logged, delivered in order by one background thread, so that training never
    waits on the tracking server: while it is down the queue grows, a failed delivery is tried again (the same
    generation, the same timestamps: exactly once) after a backoff of 1 s doubling to `max_backoff`, and once it
    is back the queue drains in order."""

    def __init__(self, tracker: Tracker, logger, max_backoff: float = 30.0, spill=None, unspill=None) -> None:
        """`spill(stats, members)`: keep an undelivered generation's rows somewhere durable (called once per
        generation, when a delivery first fails: what a later process delivers if this one cannot);
        `unspill(generation)`: forget them once delivered."""
        self.tracker, self.logger, self.max_backoff = tracker, logger, max_backoff
        self.spill, self.unspill = spill, unspill
        self._spilled: set[int] = set()
        self._items: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._abandon = False
        self._down_since: float | None = None
        self._thread = threading.Thread(target=self._deliver, name="agilerl-tracking", daemon=True)
        self._thread.start()

    def put(self, stats: dict[str, Any], members: list[dict[str, Any]]) -> None:
        with self._cv:
            self._items.append((stats, members))
            self._cv.notify_all()

    def pending(self) -> list[int]:
        with self._cv:
            return [int(stats["generation"]) for stats, _ in self._items]

    def _deliver(self) -> None:
        delay = 1.0
        while True:
            with self._cv:
                while not self._items and not self._closing:
                    self._cv.wait()
                if not self._items or self._abandon:
                    return
                stats, members = self._items[0]
            try:
                self.tracker.log_generation(stats, members)
            except Exception as err:  # the server is down (MLflow's own client retries are spent): keep it queued
                self._spill_queued()
                with self._cv:
                    if self._down_since is None:
                        self._down_since = time.monotonic()
                        self.logger.warning(
                            "run %s: the tracking server %s is not answering (%s); training goes on, generation %s "
                            "and later ones are queued and will be logged in order when it is back",
                            self.tracker.run_id, self.tracker.uri, _short(err), stats["generation"])
                    if self._abandon:
                        return
                    self._cv.wait(delay)
                delay = min(2 * delay, self.max_backoff)
                continue
            delay = 1.0
            if int(stats["generation"]) in self._spilled and self.unspill is not None:
                with contextlib.suppress(Exception):
                    self.unspill(int(stats["generation"]))
            with self._cv:
                self._items.popleft()
                if self._down_since is not None:
                    self.logger.info("run %s: the tracking server is back after %.0f s; logged generation %s "
                                     "(%d still queued)", self.tracker.run_id, time.monotonic() - self._down_since,
                                     stats["generation"], len(self._items))
                    self._down_since = None
                self._cv.notify_all()

    def _spill_queued(self) -> None:
        if self.spill is None:
            return
        with self._cv:
            items = [(st, m) for st, m in self._items if int(st["generation"]) not in self._spilled]
        for stats, members in items:
            try:
                self.spill(stats, members)
                self._spilled.add(int(stats["generation"]))
            except Exception as err:  # storage down too: resume rebuilds the rows from the committed generation
                self.logger.warning("run %s: could not keep generation %s's tracking rows in storage: %s",
                                    self.tracker.run_id, stats["generation"], _short(err))
                return

    def close(self, timeout: float) -> list[int]:
        """Wait up to `timeout` seconds for the queue to drain; returns the generations still undelivered (the
        thread then stops after its current attempt; a later process delivers them exactly once)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            while self._items and time.monotonic() < deadline:
                self._cv.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            self._abandon = True
            self._cv.notify_all()
            left = [int(stats["generation"]) for stats, _ in self._items]
        if left:
            self._spill_queued()
        return left


def _short(err: Exception) -> str:
    text = str(getattr(err, "message", None) or err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


@task(name="log-run-end", cache_policy=NO_CACHE)  # not retried: registering the champion twice makes two versions
def log_run_end_task(tracker: Tracker, lineage: list[dict[str, Any]], hp_names: list[str], elite_dir: str,
                     summary: dict[str, Any], report_dir: str, signature: Any = None, input_example: Any = None
                     ) -> dict[str, Any]:
    """Lineage table and pictures (rendered into `report_dir`) on the parent run; the elite as a registered
    model aliased champion. The two run side by side: rendering the pictures is CPU work, logging the model
    mostly waits on the server."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="agilerl-lineage") as pool:
        lineage_done = pool.submit(tracker.log_lineage, lineage, hp_names, report_dir)
        champion = tracker.log_champion(Path(elite_dir), summary, signature, input_example)
        lineage_done.result()
    return champion
