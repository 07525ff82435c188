"""`agilerl-flow`: run an evolution from a YAML config.

The last line on stdout is a JSON summary (for scripts and CI). Errors print one paragraph on
stderr and exit non-zero; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from agilerl_core.errors import AgileRLError, CheckpointError, ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agilerl-flow", description="Evolutionary reinforcement learning.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="evolve a population from a YAML experiment config")
    run.add_argument("config", help="path of the experiment YAML (e.g. deployments/configs/cartpole_dqn.yaml)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config field by dotted path, e.g. --set hyperparameters.lr=3e-4 (repeatable)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument("--run-dir", default=None, help="where to save the elite and population "
                                                     "(default: OUTPUT_DIR/NAME-seedSEED)")
    run.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
    return p


def _run(args: argparse.Namespace) -> dict:
    from agilerl_core.config import load_config, parse_overrides
    from agilerl_core.training.off_policy import Experiment, train_off_policy

    cfg = load_config(args.config, parse_overrides(args.overrides))
    experiment = Experiment(cfg)  # every check (env id, spaces, bounds) happens here, before training
    result = train_off_policy(cfg, progress=not args.no_progress, run_dir=args.run_dir, experiment=experiment)
    return result.summary()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        summary = _run(args)  # "run" is the only command so far; argparse enforces it
    except KeyboardInterrupt:
        print("agilerl-flow: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if args.debug:
            traceback.print_exc()
        if isinstance(err, ConfigError):
            kind = "configuration error"
        elif isinstance(err, CheckpointError):
            kind = "checkpoint error"
        elif isinstance(err, AgileRLError):
            kind = "error"
        else:
            kind = f"unexpected {type(err).__name__}"
        hint = "" if args.debug else " (run with --debug for the traceback)"
        print(f"agilerl-flow: {kind}: {err}{hint}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
