"""The pipeline's experiment config: each kind of the engine's config (:mod:`agilerl_core.config`) with the
sections only the pipeline reads: how a generation's tasks run (``runner``), MLflow ``tracking`` and the
deployment's ``schedule``. One YAML holds both; the engine never reads these sections (the group size it
needs comes from :func:`grouping` as arguments).

:func:`validate_config` and :func:`load_config` are what the CLI, the flows, the tasks and the deployments
use; a pipeline config is an instance of its engine kind, so the engine takes it as it is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agilerl_core.config import (
    BanditExperimentConfig,
    ConfigKinds,
    GymExperimentConfig,
    LanguageExperimentConfig,
    LLMExperimentConfig,
    MultiAgentExperimentConfig,
    OfflineExperimentConfig,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TrackingConfig(_Section):
    """MLflow tracking of the pipeline (the in-process --local loop does not track)."""

    enabled: bool = Field(True, description="Log runs to MLflow.")
    uri: str | None = Field(None, description="Tracking URI; None: $MLFLOW_TRACKING_URI, else a SQLite file in "
                                              "output_dir.")
    register_model: bool = Field(True, description="Register the final elite and alias it 'champion'.")
    model_name: str | None = Field(None, description="Registered model name; None: the experiment name.")
    flush_timeout: float = Field(60.0, ge=0, description="Seconds a run waits at its end for the tracking server "
                                                         "to take what is still queued (it queues while the server "
                                                         "is down and training goes on); after that the run ends "
                                                         "with the rest pending, delivered by `agilerl-flow resume`.")


_CRON_NICKNAMES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly")


class ScheduleConfig(_Section):
    """When the deployment made from this config runs by itself (``deployments/build.py`` turns the section
    into the deployment's schedule; a config without it deploys unscheduled: runs start when triggered)."""

    cron: str = Field(..., description="Cron expression: minute hour day-of-month month day-of-week, e.g. "
                                       "'0 2 * * *' (02:00 every day), or @daily / @weekly / @hourly...")
    timezone: str = Field("UTC", description="IANA time zone the cron is read in, e.g. Europe/London.")
    active: bool = Field(True, description="Created active; false creates it paused (switch it on in the UI).")

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        fields = value.split()
        if value.strip() in _CRON_NICKNAMES:
            return value.strip()
        if len(fields) != 5 or not all(re.fullmatch(r"[0-9A-Za-z*/,\-?LW#]+", f) for f in fields):
            raise ValueError(f"{value!r} is not a cron expression: give 5 fields (minute hour day-of-month month "
                             f"day-of-week), e.g. '0 2 * * *' for 02:00 daily, or one of {', '.join(_CRON_NICKNAMES)}")
        return " ".join(fields)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone (e.g. UTC, Europe/London, America/New_York)") \
                from None
        return value


class RunnerConfig(_Section):
    """How the pipeline runs a generation's tasks: one task trains one group of members (a shard)."""

    kind: Literal["threads", "dask", "ray", "deployments"] = Field(
        "threads", description="threads: one process, shared buffer; dask / ray: worker processes (local, or "
                               "the cluster at `address`), experience shards via storage; deployments: each "
                               "group trains as a run of the `deployment` on its work pool (machines of "
                               "their own), members and experience through storage.")
    deployment: str = Field("train-group/train-group", description="deployments: the per-group train "
                                                                   "deployment (FLOW/DEPLOYMENT), made by "
                                                                   "`prefect deploy -n train-group`.")
    deployment_timeout: float = Field(3600.0, gt=0, description="deployments: seconds a group's run may take.")
    address: str | None = Field(None, description="Dask scheduler or Ray cluster address; None starts a local one.")
    workers: int = Field(2, ge=1, description="Worker processes of the local Dask cluster; CPUs of the local Ray; "
                                              "deployments: group runs at once.")
    max_threads: int = Field(1, ge=1, description="Groups the thread runner trains at once. Keep 1 for CPU-bound "
                                                  "small networks: their Python-heavy loops fight over the GIL "
                                                  "(4 threads measured 2.7x slower); use dask or ray for CPU "
                                                  "parallelism.")
    batch_members: bool = Field(True, description="Population-batched learning: members of one architecture "
                                                  "learn as one stacked group (one forward, backward and Adam "
                                                  "step for all); the algorithms without a batched path train "
                                                  "one by one and the run's summary says so.")
    group_size: int | None = Field(None, ge=1, description="At most this many members per group (one task "
                                                           "each). None: no limit for threads, the population "
                                                           "shared out over `workers` for dask and ray. Groups "
                                                           "depend only on the population and this size, so "
                                                           "runners with the same size give the same result.")
    gpus_per_shard: float = Field(0.0, ge=0, description="GPUs each group's task asks the engine for (ray: "
                                                         "num_gpus, fractions allowed: 0.25 puts four on a GPU; "
                                                         "dask: the GPU worker resource). 0: CPU.")
    cpus_per_shard: float = Field(1.0, gt=0, description="CPUs each group's task asks Ray for (num_cpus). Dask "
                                                         "workers are single-threaded and take one task at a "
                                                         "time, so it does not apply there.")
    worker_gpus: int = Field(0, ge=0, description="Local Dask cluster: GPUs to give one worker each (resource "
                                                  "GPU=1 and its own CUDA_VISIBLE_DEVICES); local Ray: its GPU "
                                                  "count. 0: none (or, for Ray, what it detects).")

    def group_cap(self, population: int) -> int | None:
        """The largest group a task trains (see `group_size`)."""
        if self.group_size is not None:
            return self.group_size
        if self.kind == "threads":
            return None if self.max_threads == 1 else -(-population // self.max_threads)
        return -(-population // self.workers)


class _PipelineSections(BaseModel):
    """The sections every kind of pipeline config adds to its engine kind."""

    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow tracking.")
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="Task runner of the pipeline.")
    schedule: ScheduleConfig | None = Field(None, description="When the deployment made from this config runs by "
                                                              "itself; none: only when triggered.")


class GymPipelineConfig(GymExperimentConfig, _PipelineSections):
    """A Gymnasium experiment as the pipeline runs it."""


class OfflinePipelineConfig(OfflineExperimentConfig, _PipelineSections):
    """An offline experiment as the pipeline runs it."""


class MultiAgentPipelineConfig(MultiAgentExperimentConfig, _PipelineSections):
    """A multi-agent experiment as the pipeline runs it."""


class LLMPipelineConfig(LLMExperimentConfig, _PipelineSections):
    """An LLM fine-tuning experiment as the pipeline runs it."""


class BanditPipelineConfig(BanditExperimentConfig, _PipelineSections):
    """A contextual-bandit experiment as the pipeline runs it."""


class LanguagePipelineConfig(LanguageExperimentConfig, _PipelineSections):
    """A language-game experiment (Wordle agents learning from games) as the pipeline runs it."""


PIPELINE_KINDS = ConfigKinds({"gym": GymPipelineConfig, "offline": OfflinePipelineConfig,
                              "multi_agent": MultiAgentPipelineConfig, "llm": LLMPipelineConfig,
                              "language": LanguagePipelineConfig, "bandit": BanditPipelineConfig})
PipelineConfig = PIPELINE_KINDS.annotation
"""One evolution run as the pipeline reads it, discriminated by `kind` (default gym)."""


def validate_config(data: dict[str, Any], source: str = "config") -> Any:
    """Build a PipelineConfig from plain data, raising ConfigError that names each bad field."""
    return PIPELINE_KINDS.validate(data, source)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Any:
    """Load a YAML config file and apply dotted overrides (`hyperparameters.lr`: 3e-4)."""
    return PIPELINE_KINDS.load(path, overrides)


def config_schema() -> dict[str, Any]:
    """JSON schema of every kind of pipeline config (what a YAML may hold)."""
    return PIPELINE_KINDS.schema()


def grouping(cfg: Any) -> dict[str, Any]:
    """The engine's grouping arguments a pipeline config asks for (:func:`agilerl_core.experiment.build_evolution`):
    whether members batch, and the largest group one task trains."""
    return {"batch_members": cfg.runner.batch_members, "group_cap": cfg.runner.group_cap(cfg.population_size)}
