"""The stages flow: one parent Prefect flow run for a chain of LLM runs (:mod:`tasks.stages`), each stage the
LLM evolution flow as a child flow run of it, started from the previous stage's champion; :func:`run_stages` runs
it from Python (``flows.run_stages``) and for ``agilerl-flow stages``.

    chain = flows.run_stages("deployments/stages/smollm2_wordle.yaml", {"grpo.max_env_steps": 128})

Running the same stages file again with the chain's run id (``agilerl-flow stages FILE --run-id ID``) resumes
it: a finished stage is not run again (its stored summary is read back and its champion handed on as before),
the stage that was running continues from its last committed generation, and the rest follow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows.llm import llm_evolution
from tasks.config import LLMPipelineConfig
from tasks.stages import hand_on, stage_config


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    return str((flow_run.parameters or {}).get("run_id") or "stages")


def stage_inputs_dir(cfg: LLMPipelineConfig, run_id: str) -> Path:
    """Where the chain `run_id` keeps the champions it hands on (one folder per receiving stage)."""
    return Path(cfg.output_dir).expanduser() / "stage-inputs" / run_id


@flow(name="llm-stages", flow_run_name=_flow_run_name, validate_parameters=True)
def llm_stages(names: list[str], configs: list[LLMPipelineConfig], run_id: str, progress: bool = False
               ) -> dict[str, Any]:
    """Run the stages in order, each one's population starting from the previous stage's champion (as its
    registry alias names it once the champion beat the stage's input; else the stage's own input); each stage
    is a child flow run named ``RUN_ID-STAGE``. Returns every stage's outcome and what it handed on, and the
    chain's champion: the last promoted stage's registered version (None when no stage beat its input)."""
    logger = get_run_logger()
    stage_input: str | None = None
    out: list[dict[str, Any]] = []
    holder: dict[str, Any] = {}  # the registered champion the chain carries on (none while it is the base)
    for i, (name, cfg) in enumerate(zip(names, configs, strict=True)):
        stage_run = f"{run_id}-{name}"
        logger.info("stages %s: stage %d/%d %s (run %s) starts from %s", run_id, i + 1, len(names), name, stage_run,
                    stage_input or cfg.model.init_adapter or "the base model")
        received = dict(holder)  # the registered champion this stage starts from ({}: the base, or its own input)
        cfg = stage_config(cfg, stage_input)
        summary = llm_evolution(config=cfg, run_id=stage_run, progress=progress)
        nxt = names[i + 1] if i + 1 < len(names) else "end"
        stage_input, handed = hand_on(cfg, summary, cfg.model.init_adapter, stage_inputs_dir(cfg, run_id) / nxt)
        if handed["handed_on"] == "champion":
            holder = handed
        champion = summary.get("champion") or {}
        logger.info("stages %s: stage %s's champion scores %s against its input's %s: %s; hands on %s", run_id, name,
                    champion.get("fitness"), champion.get("input_fitness"), summary.get("promotion"),
                    handed.get("model_uri") or handed.get("path") or "the base model")
        _tag_stage_run(cfg, summary, run_id, name, i, received)
        out.append({"stage": name, "run_id": stage_run, "input": cfg.model.init_adapter,
                    "fitness": champion.get("fitness"), "input_fitness": champion.get("input_fitness"),
                    "promoted": summary.get("promoted"), "promotion": summary.get("promotion"),
                    "champion_uri": summary.get("champion_uri"), "mlflow_run_id": summary.get("mlflow_run_id"),
                    "already_finished": bool(summary.get("already_finished")),
                    "resumed_after_generation": summary.get("resumed_after_generation"), "handed_on": handed})
    return {"run_id": run_id, "stages": out, "champion_uri": holder.get("model_uri"),
            "champion_version": holder.get("version"), "champion_path": out[-1]["handed_on"].get("path")}


@flow(name="llm-stages-deployment", flow_run_name=_flow_run_name, validate_parameters=True)
def stages_deployment(stages: dict[str, Any], run_id: str | None = None, progress: bool = False) -> dict[str, Any]:
    """A stages file as a deployment runs it (``deployments/build.py`` writes one per ``deployments/stages/*.yaml``,
    the file's data with every stage's config inline): the chain checked here as ``agilerl-flow stages`` checks the
    file (every stage a valid LLM config, the same base throughout, distinct names, tracking on; a stage naming a
    config file is refused: a flow run's parameters name no file on the worker), then :func:`llm_stages` in this
    flow run. `run_id`: the chain's (a new one by default; the same one resumes it)."""
    from agilerl_core.io.run_store import check_run_id
    from tasks.stages import stages_from_data

    chain = stages_from_data(stages, "the flow run's stages parameter")
    run_id = check_run_id(run_id or chain.new_run_id())
    for name in chain.names:
        check_run_id(f"{run_id}-{name}")
    return llm_stages.fn(names=chain.names, configs=chain.configs, run_id=run_id, progress=progress)


def _tag_stage_run(cfg: LLMPipelineConfig, summary: dict[str, Any], run_id: str, name: str, index: int,
                   received: dict[str, Any]) -> None:
    """The lineage across stages on the stage's MLflow run: the chain, the stage, and the registered version it
    started from (`received`; empty when it started from the base or its config's own init_adapter). A
    convenience: a failure is a warning."""
    if not summary.get("mlflow_run_id"):
        return
    try:
        from mlflow.tracking import MlflowClient

        from tasks.server_checks import tracking_uri

        client = MlflowClient(tracking_uri(cfg))
        tags = {"agilerl.stages": run_id, "agilerl.stage": f"{index}:{name}"}
        tags["agilerl.stage_input"] = received.get("model_uri") or cfg.model.init_adapter or "the base model"
        for key, value in tags.items():
            client.set_tag(summary["mlflow_run_id"], key, value)
    except Exception as err:
        get_run_logger().warning("stages %s: could not tag stage %s's MLflow run: %s", run_id, name, err)


def run_stages(path: str | Path, overrides: dict[str, Any] | None = None, *, run_id: str | None = None,
               progress: bool = True) -> dict[str, Any]:
    """Run a stages file (:mod:`tasks.stages`) as one parent Prefect flow run in this process and return the
    chain's summary (each stage's fitness, its input's, whether it was promoted, what it handed on;
    ``champion_uri``). The whole chain is checked first: every stage's config, the same base throughout, every
    stage's data and model found. Running it again with the same `run_id` resumes it at the stage that was
    running.

    Args:
        path: the stages file.
        overrides: ``STAGE.dotted.field`` -> value, e.g. ``{"grpo.max_env_steps": 128}``.
        run_id: the chain's id (default: a new one from its name, the first stage's seed and the time); each
            stage's run id is ``RUN_ID-STAGE``.
        progress: progress bars on stderr (else the runs' log lines).

    Raises:
        ConfigError: a bad stages file, stage config, override or run id, naming it, before any work.
    """
    import contextlib
    import sys

    from agilerl_core.io.run_store import check_run_id
    from flows.local_prefect import LocalPrefect, prefect_defaults
    from tasks.stages import load_stages

    stages = load_stages(path, overrides)
    run_id = check_run_id(run_id or stages.new_run_id())
    for name in stages.names:
        check_run_id(f"{run_id}-{name}")
    for cfg in stages.configs:
        cfg.check_env()
    prefect_defaults()
    print(f"agilerl-flow: stages {run_id}: {' -> '.join(stages.names)}; if it stops, running it again with run id "
          f"{run_id} resumes it", file=sys.stderr, flush=True)
    server = LocalPrefect.start_if_needed()
    try:
        with server.serving() if server is not None else contextlib.nullcontext():
            return llm_stages(names=stages.names, configs=stages.configs, run_id=run_id, progress=progress)
    finally:
        if server is not None:
            server.stop()
