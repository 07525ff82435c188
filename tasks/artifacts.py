"""What an operator sees of a run in the Prefect UI besides its task graph: the run's log lines (start, one per
generation, end) and its artifacts (a table per generation, links to the MLflow run and the registered
champion, the lineage picture, a progress bar over the step budget).

Everything here is built from data the flow already has; :class:`RunView` only formats and publishes it, so
a failure to publish (an old server, a full database) never fails a run: it is logged as a warning.
"""

from __future__ import annotations

import base64
import contextvars
import math
import queue
import re
import threading
from pathlib import Path
from typing import Any

from agilerl_core.hpo.found import found_words
from agilerl_core.train_metrics import headline
from tasks.config import PipelineConfig
from tasks.reports import member_rows


def artifact_key(run_id: str, what: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) for `what` of run `run_id`: per run, so the
    Artifacts page never mixes two runs of one config under one key."""
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-") or "run"
    return f"{slug}-{what}"


def subject(cfg: PipelineConfig) -> str:
    """What the members act on, in words: the env id, a bandit's table (its source and label column), or an LLM
    experiment's base model."""
    if cfg.kind == "llm":
        m = cfg.model
        return m.gguf_file or m.path or f"a {m.config.get('model_type')} built from a config"
    if cfg.kind == "language":
        return f"{cfg.env.game} ({cfg.env.vocabulary or 'all'} words)"
    if cfg.kind == "bandit" and cfg.data is not None:
        return f"the table {cfg.data.source} (label {cfg.data.label}: one arm per class)"
    return cfg.env_id


def _number(x: Any, digits: int = 4) -> Any:
    """A JSON-safe table cell: floats rounded to `digits` significant digits, NaN/inf as None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return x
    if not math.isfinite(float(x)):
        return None
    return x if isinstance(x, int) else float(f"{x:.{digits}g}")


def mutations_line(mutations: list[str]) -> str:
    """The generation's mutations, by slot: "0 elite, 1 hp:lr=0.0013, 2 none"."""
    return ", ".join(f"{slot} {m}" for slot, m in enumerate(mutations))


def generation_line(stats: dict[str, Any]) -> str:
    """One generation in one log line (with the best member's training in two numbers, :func:`headline`)."""
    training = headline(stats.get("fitnesses") or [], stats.get("train_metrics") or [])
    return (f"generation {stats['generation']}: best {stats['best_fitness']:.2f}, mean {stats['mean_fitness']:.2f}, "
            f"{stats['global_steps']:,} global steps, {stats['wall_s']:.1f} s"
            + (f"; best member's training: {training}" if training else "")
            + f"; mutations: {mutations_line(stats['mutations'])}")


def start_line(cfg: PipelineConfig, run_id: str, storage_uri: str, mlflow_where: str | None,
               resumed_after: int | None) -> str:
    where = mlflow_where or "off (tracking.enabled: false)"
    resumed = f"; resuming after generation {resumed_after}" if resumed_after is not None else ""
    return (f"run {run_id}: {cfg.kind} {cfg.algorithm} on {subject(cfg)}, population {cfg.population_size}, "
            f"budget {cfg.max_env_steps:,} steps, seed {cfg.seed}; storage {storage_uri}; MLflow run {where}{resumed}")


def champion_words(summary: dict[str, Any], checkpoint: str | None = None) -> str:
    """Where the run's champion went, in words: which member it is, its `checkpoint` (when given), registered or
    not, promoted or not, and why."""
    chosen = summary.get("champion") or {}
    gen = f" of generation {chosen['generation']}" if chosen.get("generation") is not None else ""
    which = (f"the {chosen['chosen'].replace('_', ' ')} (member {chosen['member_id']}{gen}, fresh-seed fitness "
             f"{chosen['fitness']:.2f})" if chosen.get("fitness") is not None else "the elite")
    if checkpoint is not None:
        which += f", saved at {checkpoint},"
    if summary.get("version") is None:
        where = summary.get("model_uri") or "not logged (tracking off or pending)"
        return f"{which.rstrip(',')}; its model: {where}"
    name, version = summary["registered_model"], summary["version"]
    if summary.get("promoted"):
        return f"{which} registered as {name} version {version}, now {summary['champion_uri']} ({summary['promotion']})"
    held = summary.get("champion_version")
    stays = f"; {name}@champion stays version {held}" if held is not None else ""
    return f"{which} registered as {name} version {version}, {summary.get('promotion', 'not promoted')}{stays}"


def end_line(summary: dict[str, Any], target: float | None = None) -> str:
    hold = int(summary.get("target_generations", 1))
    held = f" and held it {hold} generations in a row" if hold > 1 else ""
    missed = (f" (it reached its target fitness {target:g} but did not hold it {hold} generations in a row)"
              if summary.get("reached_target") and hold > 1 and target is not None else "")
    why = (f"reached its target fitness {target:g}{held} after {summary['global_steps']:,} of "
           f"{summary['max_env_steps']:,} budgeted steps" if summary.get("target_held") and target is not None else
           f"stopped by callback {summary['stopped_by']}" if summary.get("stopped_by") else
           f"spent its step budget{missed}")
    found = summary.get("found")
    return (f"run {summary['run_id']} finished ({why}): best fitness {summary['best_fitness']:.2f} over "
            f"{summary['generations']} generations, {summary['global_steps']:,} steps in {summary['wall_s']:.1f} s; "
            f"champion: {champion_words(summary, summary['elite_uri'])}"
            + (f"\nfound: {found_words(found)}; its config with them: {summary['found_config_uri']}" if found else ""))


def generation_rows(population, stats: dict[str, Any], space_names: list[str]) -> list[dict[str, Any]]:
    """The generation's table: one row per slot with its member, parent, the mutation that made it, its
    fitness, what it did in training (return; per-agent returns for teams; mean reward and completion length
    for LLM members), its evolved hyperparameters and its network (the slots' MLflow metrics, as a table)."""
    rows = []
    for slot, (m, r) in enumerate(zip(population.members, member_rows(population, stats["train_returns"], space_names,
                                                                       stats.get("train_metrics")), strict=True)):
        row: dict[str, Any] = {"slot": slot, "member": r["member_id"],
                               "parent": "" if m.parent_id is None else m.parent_id, "mutation": r["mutation"],
                               "fitness": _number(r["fitness"])}
        metrics = r["train_metrics"]
        if "completion_length" in metrics or "reward" in metrics:  # an LLM member's training phase
            row["train reward"] = _number(metrics.get("reward"))
            row["completion length"] = _number(metrics.get("completion_length"))
        else:
            row["train return"] = _number(r["train_return"])
        row.update({f"return {agent}": _number(v) for agent, v in r["agent_returns"].items()})
        row.update({name: _number(v) for name, v in r["hyperparameters"].items()})
        row["network"] = r["architecture"]
        rows.append(row)
    return rows


def lineage_markdown(tree_png: Path, path_ids: list[int], lineage: list[dict[str, Any]]) -> str:
    """The family tree as markdown: the picture (embedded) and the elite's line of descent as a table."""
    data = base64.b64encode(Path(tree_png).read_bytes()).decode()
    by_id = {e["member_id"]: e for e in lineage}
    lines = ["## Lineage", "",
             "Who descends from whom: edges coloured by the mutation that made each child, nodes by fitness; "
             "the final elite's line in red.", "",
             f"![family tree](data:image/png;base64,{data})", "",
             "### The elite's line of descent", "", "| generation | slot | member | mutation | fitness |",
             "|---|---|---|---|---|"]
    for mid in reversed(path_ids):
        e = by_id[mid]
        fit = _number(e.get("fitness"))
        lines.append(f"| {e['generation']} | {e['slot']} | {mid} | {e['mutation']} | {'' if fit is None else fit} |")
    return "\n".join(lines) + "\n"


class RunView:
    """Publishes a run's view in Prefect (create it inside the flow run). The log lines go out at once (Prefect
    ships logs from a thread of its own); the artifacts are published in order by a thread of this view, in
    the flow run's context, so that a Prefect API that stops answering never holds training up (its client
    retries for tens of seconds per call): :meth:`close` waits for them, up to a timeout."""

    def __init__(self, cfg: PipelineConfig, run_id: str, logger) -> None:
        self.cfg, self.run_id, self.logger = cfg, run_id, logger
        self._progress = None
        self._context = contextvars.copy_context()  # the flow run's: artifacts are linked to it
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="agilerl-artifacts", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            what, create, args, kwargs, keep = job
            try:
                result = self._context.run(create, *args, **kwargs)
                if keep:
                    self._progress = result
            except Exception as err:
                self.logger.warning("run %s: could not publish the %s artifact: %s", self.run_id, what, err)

    def _publish(self, what: str, create, *args, _keep: bool = False, **kwargs) -> None:
        self._jobs.put((what, create, args, kwargs, _keep))

    def _update_progress(self, percent: float) -> None:
        from prefect.artifacts import update_progress_artifact

        if self._progress is not None:  # read when the job runs: after the creating job, in order
            update_progress_artifact(self._progress, percent)

    def close(self, timeout: float, quiet: bool = False) -> bool:
        """Wait up to `timeout` seconds for the queued artifacts; False when some were left unpublished (said
        unless `quiet`)."""
        if not self._thread.is_alive():
            return True
        self._jobs.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            if quiet:
                return False
            self.logger.warning("run %s: the Prefect API did not take every artifact within %.0f s; the rest are "
                                "dropped (the run's record in storage and MLflow is complete)", self.run_id, timeout)
            return False
        return True

    def start(self, storage_uri: str, mlflow_where: str | None, mlflow_url: str | None, resumed_after: int | None,
              global_steps: int) -> None:
        from prefect.artifacts import create_link_artifact, create_progress_artifact

        self.logger.info(start_line(self.cfg, self.run_id, storage_uri, mlflow_where, resumed_after))
        note = self.cfg.budget_note() if resumed_after is None else None
        if note:  # once, before training: a budget this small is not an evolution
            self.logger.warning("run %s: %s", self.run_id, note)
        if mlflow_url is not None:
            self._publish("MLflow link", create_link_artifact, mlflow_url, link_text=f"MLflow run {self.run_id}",
                          key=artifact_key(self.run_id, "mlflow-run"),
                          description="The MLflow parent run: parameters, fitness curves, lineage pictures; "
                                      "its child runs are the population's slots")
        self._publish("progress", create_progress_artifact, self._percent(global_steps), _keep=True,
                      key=artifact_key(self.run_id, "progress"),
                      description=f"run {self.run_id}: global steps of the budget")

    def _percent(self, steps: int) -> float:
        return round(min(100.0, 100.0 * steps / self.cfg.max_env_steps), 1)

    def generation(self, stats: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        from prefect.artifacts import create_table_artifact

        self.logger.info(generation_line(stats))
        self._publish("generation table", create_table_artifact, rows,
                      key=artifact_key(self.run_id, "generation"),
                      description=f"run {self.run_id}, generation {stats['generation']}: each slot's member, parent, "
                                  f"mutation, fitness and evolved hyperparameters")
        self._publish("progress", self._update_progress, self._percent(stats["global_steps"]))

    def end(self, summary: dict[str, Any], champion_url: str | None, lineage_md: str | None) -> None:
        from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

        if summary.get("target_held"):  # done: the target ends the run early
            self._publish("progress", self._update_progress, 100.0)

        if champion_url is not None:
            self._publish("champion link", create_link_artifact, champion_url,
                          link_text=f"{summary.get('registered_model')} version {summary.get('version')}"
                                    f"{' (champion)' if summary.get('promoted') else ' (not promoted)'}",
                          key=artifact_key(self.run_id, "model"),
                          description=f"The model this run registered: {champion_words(summary)}")
        if lineage_md is not None:
            self._publish("lineage", create_markdown_artifact, lineage_md, key=artifact_key(self.run_id, "lineage"),
                          description=f"run {self.run_id}: the population's family tree")
        self._publish("summary", create_table_artifact, [summary], key=artifact_key(self.run_id, "summary"),
                      description="the run's JSON summary (one row): what `agilerl-flow trigger` reads")
        self.logger.info(end_line(summary, self.cfg.target_fitness))
