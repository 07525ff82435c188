"""``agilerl-flow stages``: its arguments and the command (the flow is :mod:`flows.stages`, imported when the
command runs, so the CLI starts without Prefect or torch)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


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
    """``agilerl-flow stages``: :func:`flows.stages.run_stages` with the command's arguments."""
    from agilerl_core.code_refs import import_config_modules
    from agilerl_core.config import parse_overrides
    from flows.stages import run_stages
    from tasks.stages import load_stages

    import_config_modules(*load_stages(args.config, parse_overrides(args.overrides)).configs)  # python rewards
    return run_stages(args.config, parse_overrides(args.overrides), run_id=args.run_id,
                      progress=not args.no_progress and sys.stderr.isatty())
