"""Post-training stages: a file of LLM runs chained so that each stage's population starts from the previous
stage's champion (SFT, then DPO, then GRPO...), the usual recipe as one command.

    name: wordle-post-training
    stages:
      - name: sft
        config: smollm2_wordle_bc.yaml      # a config file (relative to this one), or the config inline
      - name: grpo
        config: smollm2_wordle_grpo.yaml
        set: {max_env_steps: 2048}          # dotted overrides of that stage's config

Every stage is an ordinary ``kind: llm`` run of its own (its own run id ``PIPELINE-STAGE``, storage, MLflow run and
registered model), with two things set by the chain: ``model.init_adapter``, the saved champion it starts from,
and ``champion.promote: if_beats_input``, the gate (a stage's champion is promoted only if it beats, on fresh
held-out seeds, what the stage started from). What a stage hands on is the version its registry alias points at
once it is promoted; a stage whose champion is not promoted hands on its own input. This module checks the file
(:func:`load_stages`) and moves a champion from the registry to the next stage's folder (:func:`hand_on`); the
flow is :mod:`flows.stages`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agilerl_core.config.common import check_run_name
from agilerl_core.config.load import read_config_file
from agilerl_core.errors import AgileRLError, ConfigError, TrackingError
from agilerl_core.io.records import read_record
from tasks.config import PIPELINE_KINDS, LLMPipelineConfig

log = logging.getLogger(__name__)

STAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
SOURCE_FILE = "stage_input.json"  # beside a handed-on member: which registered version it is


class StageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The stage's name: letters, digits, '_' or '-' (its run id is PIPELINE-NAME).")
    config: str | dict[str, Any] = Field(description="A kind: llm config file (relative to the stages file) or "
                                                     "the config itself.")
    set: dict[str, Any] = Field(default_factory=dict, description="Dotted overrides of the stage's config.")


class StagesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The chain's name: the start of its run id (NAME-sSEED-TIMESTAMP).")
    stages: list[StageSpec] = Field(min_length=1, max_length=16, description="The stages, in order.")


@dataclass
class Stages:
    """A checked chain: its name, the stages' names and their validated configs (overrides applied)."""

    name: str
    names: list[str]
    configs: list[LLMPipelineConfig]

    def new_run_id(self) -> str:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S-%f")
        return f"{self.name}-s{self.configs[0].seed}-{stamp}"


_MODEL_SOURCE = ("path", "gguf_file", "config", "tokenizer_chars", "init_seed")  # what names the base's weights


def load_stages(path: str | Path, overrides: dict[str, Any] | None = None) -> Stages:
    """The stages file at `path` checked before anything runs: every stage a valid ``kind: llm`` config, the same
    base model throughout, distinct names and registered models, tracking on (the champion is handed on
    through the model registry). `overrides`: ``STAGE.dotted.field`` -> value."""
    path = Path(path)
    return stages_from_data(read_config_file(path), f"stages file {str(path)!r}", overrides, path.parent)


def inline_stages(path: str | Path) -> dict[str, Any]:
    """The stages file's data with every stage's config file read in its place (a deployment's parameter: the
    chain whole, naming no file the worker would read)."""
    path = Path(path)
    data = read_config_file(path)
    spec = _spec(data, f"stages file {str(path)!r}")
    out = spec.model_dump(mode="json")
    for stage in out["stages"]:
        if isinstance(stage["config"], str):
            file = Path(stage["config"]) if Path(stage["config"]).is_absolute() else path.parent / stage["config"]
            stage["config"] = read_config_file(file)
    return out


def _spec(data: Any, label: str) -> StagesFile:
    try:
        return StagesFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{label}: {where}: {first['msg']}") from None


def stages_from_data(data: Any, label: str, overrides: dict[str, Any] | None = None, base: Path | None = None
                     ) -> Stages:
    """A chain from a stages file's data (`label` names it in errors), checked as :func:`load_stages` checks a
    file. A stage's config given as a file name is read relative to `base`; with no `base` (a flow run's
    parameter, which may name no file on the worker) it is refused: the config must be inline."""
    spec = _spec(data, label)
    try:
        check_run_name(spec.name)
    except ValueError as err:
        raise ConfigError(f"{label}: name: {err}") from None
    names = [s.name for s in spec.stages]
    for i, name in enumerate(names):
        if not STAGE_NAME.fullmatch(name):
            raise ConfigError(f"{label}: stages[{i}].name {name!r}: use 1-32 letters, digits, "
                              f"'_' or '-', starting with a letter or digit")
        if names.index(name) != i:
            raise ConfigError(f"{label}: stages[{i}].name {name!r} is used twice; name every "
                              f"stage differently")
    per_stage: dict[str, dict[str, Any]] = {n: {} for n in names}
    for key, value in (overrides or {}).items():
        stage, _, field = key.partition(".")
        if stage not in per_stage or not field:
            raise ConfigError(f"--set {key}: name the stage first, e.g. {names[-1]}.max_env_steps=64 (stages: "
                              f"{', '.join(names)})")
        per_stage[stage][field] = value
    configs = []
    for i, stage in enumerate(spec.stages):
        where = f"stages[{i}] ({stage.name})"
        if isinstance(stage.config, str):
            if base is None:
                raise ConfigError(f"{label}: {where}: config {stage.config!r} names a file; a flow run's stages "
                                  f"name none (the worker would read it): give the config itself, as "
                                  f"deployments/build.py writes it")
            file = (base / stage.config) if not Path(stage.config).is_absolute() else Path(stage.config)
            raw, source = read_config_file(file), str(file)
        else:
            raw, source = dict(stage.config), f"{label}: {where}"
        cfg, _ = PIPELINE_KINDS.resolve(raw, {**stage.set, **per_stage[stage.name]})
        configs.append(_checked_stage(cfg, i, where, source, configs))
    return Stages(spec.name, names, configs)


def _checked_stage(cfg: Any, i: int, where: str, source: str, before: list[LLMPipelineConfig]) -> LLMPipelineConfig:
    if cfg.kind != "llm":
        raise ConfigError(f"{where}: kind {cfg.kind}; stages chain LLM runs (each starts from the previous "
                          f"champion's LoRA adapter), so every stage is kind: llm ({source})")
    if i and cfg.model.init_adapter is not None:
        raise ConfigError(f"{where}: model.init_adapter is set by the chain (the previous stage's champion); "
                          f"remove it ({source})")
    if "promote" in cfg.champion.model_fields_set and cfg.champion.promote != "if_beats_input":
        raise ConfigError(f"{where}: champion.promote {cfg.champion.promote}: a stage's champion is promoted only "
                          f"if it beats the stage's input (if_beats_input); remove champion.promote ({source})")
    if not (cfg.tracking.enabled and cfg.tracking.register_model):
        raise ConfigError(f"{where}: a stage hands its champion on through the MLflow model registry; set "
                          f"tracking.enabled and tracking.register_model to true ({source})")
    if before:
        first = before[0].model
        for key in _MODEL_SOURCE:
            if getattr(cfg.model, key) != getattr(first, key):
                raise ConfigError(f"{where}: model.{key} differs from the first stage's; every stage adapts the "
                                  f"same base model ({source})")
        model_name = cfg.tracking.model_name or cfg.name
        if model_name in {c.tracking.model_name or c.name for c in before}:
            raise ConfigError(f"{where}: registers its champion as {model_name!r}, as an earlier stage does; give "
                              f"each stage its own name (or tracking.model_name) ({source})")
    return cfg


def stage_config(cfg: LLMPipelineConfig, init_adapter: str | None) -> LLMPipelineConfig:
    """A stage's config as the chain runs it: starting from `init_adapter` (None: the bare base, or the first
    stage's own), its champion gated against that input."""
    model = cfg.model.model_copy(update={"init_adapter": init_adapter or cfg.model.init_adapter})
    champion = cfg.champion.model_copy(update={"promote": "if_beats_input"})
    return cfg.model_copy(update={"model": model, "champion": champion})


def hand_on(cfg: LLMPipelineConfig, summary: dict[str, Any], stage_input: str | None, dest: Path
            ) -> tuple[str | None, dict[str, Any]]:
    """What the next stage starts from, after a stage with config `cfg` ended with `summary`: its champion, loaded
    from the registry by its ``champion`` alias into folder `dest` (reused when it holds that version already),
    if it was promoted; else the stage's own input `stage_input`. Returns (member folder or None for the bare
    base, a record of the hand-over)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from tasks.server_checks import tracking_uri

    if summary.get("tracking_pending"):
        raise TrackingError(f"run {summary.get('run_id')}: its champion is not registered yet (the tracking server "
                            f"missed the run's end); run the stages again once the server is back")
    if not summary.get("promoted"):
        return stage_input, {"handed_on": "input", "why": summary.get("promotion"), "path": stage_input}
    name, version = summary["registered_model"], str(summary["version"])
    uri = tracking_uri(cfg)
    client = MlflowClient(uri)
    try:
        held = str(client.get_model_version_by_alias(name, "champion").version)
    except mlflow.exceptions.MlflowException:
        held = None
    model_uri = f"models:/{name}@champion"
    if held != version:  # moved (or removed) since by someone else: hand on the version this stage promoted
        log.warning("%s@champion points at version %s now, not the version %s this stage promoted; handing on "
                    "version %s", name, held, version, version)
        model_uri = f"models:/{name}/{version}"
    record = {"handed_on": "champion", "model_uri": model_uri, "registered_model": name, "version": version,
              "from_run": summary.get("run_id"), "member_id": (summary.get("champion") or {}).get("member_id"),
              "path": str(dest)}
    known = dest / SOURCE_FILE
    mlflow.set_tracking_uri(uri)
    if known.is_file():
        try:
            held = read_record(known, root=dest)  # bounded: a tampered or huge file is refused, then fetched anew
        except (AgileRLError, OSError):
            held = None
        if isinstance(held, dict) and held.get("registered_model") == name and held.get("version") == version:
            if _holds_registered(dest, name, version):
                return str(dest), record
            log.warning("%s says it holds %s version %s, but its member.json or a file it lists differs from that "
                        "registered version's; fetching the version again", dest, name, version)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".incoming-", dir=dest.parent) as tmp:
        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=tmp))
        member = got / "artifacts" / "member"
        if not (member / "member.json").is_file():
            raise TrackingError(f"{model_uri}: the registered champion holds no member checkpoint (artifacts/member)")
        (member / SOURCE_FILE).write_text(json.dumps({k: record[k] for k in ("registered_model", "version",
                                                                             "from_run", "member_id")}))
        if dest.exists():
            shutil.rmtree(dest)
        member.rename(dest)
    return str(dest), record


def _holds_registered(dest: Path, name: str, version: str) -> bool:
    """Whether member folder `dest` holds registered version `version` of model `name`: its member.json is byte
    for byte the registry's (``artifacts/member/member.json`` of that version, fetched alone: a few KB), and every
    file that record lists hashes to the SHA-256 it records (what :func:`agilerl_core.io.checkpoint.load_member`
    checks again when the next stage loads it). ``stage_input.json`` alone proves nothing: whoever can write
    the folder can write it too."""
    import mlflow

    from agilerl_core.io.digest import sha256_file

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".check-", dir=dest.parent) as tmp:
        got = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{name}/{version}/artifacts/member/member.json", dst_path=tmp))
        try:
            theirs = read_record(got)
            if sha256_file(dest / "member.json", root=dest) != sha256_file(got):
                return False
        except (AgileRLError, OSError):
            return False
    files = theirs.get("files") if isinstance(theirs, dict) else None
    if not isinstance(files, dict) or not files:
        return False
    for file, sha in files.items():
        if not isinstance(file, str) or Path(file).name != file or not isinstance(sha, str):
            return False
        try:
            if sha256_file(dest / file, root=dest) != sha:
                return False
        except (AgileRLError, OSError):
            return False
    return True

