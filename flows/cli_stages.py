"""``agilerl-flow stages``: its arguments and the command (the flow is :mod:`flows.stages`, imported when the
command runs, so the CLI starts without Prefect)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from agilerl_core.io.run_store import check_run_id


def add_stages_parser(sub, debug: argparse.ArgumentParser) -> None:
    p = sub.add_parser("stages", parents=[debug], help="run LLM stages in order, each starting from the previous "
                                                       "stage's champion (SFT, then DPO, then GRPO...)")
    p.add_argument("config", help="the stages file (name, stages: [{name, config, set}])")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="STAGE.KEY=VALUE",
                   help="override a stage's config field, e.g. --set grpo.max_env_steps=64 (repeatable)")
    p.add_argument("--run-id", default=None, help="the chain's run id (default: NAME-sSEED-TIMESTAMP); the same id "
                                                  "resumes it at the stage that was running")
    p.add_argument("--no-progress", action="store_true", help="a line per generation instead of progress bars")
    p.add_argument("--verbose", action="store_true", help="also show the libraries' own INFO lines")


def stages_command(args: argparse.Namespace) -> dict[str, Any]:
    """``agilerl-flow stages``: check the whole chain (every stage's config and base, the first stage's data and
    model) before starting the parent flow on this process's Prefect server (or PREFECT_API_URL's)."""
    from agilerl_core.config import parse_overrides
    from flows.local_prefect import LocalPrefect, prefect_defaults
    from flows.stages import llm_stages
    from tasks.stages import load_stages

    stages = load_stages(args.config, parse_overrides(args.overrides))
    run_id = check_run_id(args.run_id or stages.new_run_id())
    for name in stages.names:
        check_run_id(f"{run_id}-{name}")
    for cfg in stages.configs:
        cfg.check_env()
    progress = not args.no_progress and sys.stderr.isatty()
    prefect_defaults()
    print(f"agilerl-flow: stages {run_id}: {' -> '.join(stages.names)}; if it stops, the same command with "
          f"--run-id {run_id} resumes it", file=sys.stderr, flush=True)
    server = LocalPrefect.start_if_needed()
    try:
        with server.serving() if server is not None else contextlib.nullcontext():
            return llm_stages(names=stages.names, configs=stages.configs, run_id=run_id, progress=progress)
    finally:
        if server is not None:
            server.stop()
