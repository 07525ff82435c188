"""`agilerl-flow`: run, resume and trigger evolutions; record and inspect datasets (``dataset``:
:mod:`flows.cli_dataset`); draw lineages; run the local stack.

``run`` executes the Prefect flow (ephemeral Prefect, a local MLflow SQLite file and local storage when
nothing else is configured; the servers when ``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI`` or an ``s3://``
storage URI are set); ``--local`` keeps the plain in-process loop. The last stdout line of ``run``,
``resume`` and ``trigger`` is a JSON summary (for scripts and CI). Errors print one paragraph on stderr
and exit non-zero (2 for configuration errors); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import sys
import threading
import traceback
from pathlib import Path

from agilerl_core.code_refs import import_config_modules
from agilerl_core.errors import AgileRLError, ConfigError
from flows.cli_dataset import add_dataset_parser, dataset_command
from flows.cli_stages import add_stages_parser, stages_command
from flows.local_prefect import prefect_defaults

DEFAULT_STORAGE = "runs"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agilerl-flow", description="Evolutionary reinforcement learning pipelines.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")

    run = sub.add_parser("run", parents=[debug], help="evolve a population from a YAML experiment config")
    run.add_argument("config", help="path of the experiment YAML (e.g. deployments/configs/cartpole_dqn.yaml)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config field by dotted path, e.g. --set hyperparameters.lr=3e-4 (repeatable)")
    run.add_argument("--local", action="store_true", help="plain in-process loop: no Prefect, no MLflow")
    run.add_argument("--run-id", default=None, help="run id (default: NAME-sSEED-TIMESTAMP); reuse one to resume")
    run.add_argument("--storage", default=None, metavar="URI", help="storage URI (local dir or s3://BUCKET/PREFIX); "
                                                                    "overrides storage.uri and $AGILERL_STORAGE_URI")
    run.add_argument("--no-progress", action="store_true", help="a line per generation instead of the progress bar "
                                                                "(the default when stderr is not a terminal)")
    run.add_argument("--verbose", action="store_true", help="also show the libraries' own INFO lines (MLflow, "
                                                            "Prefect): quiet by default")
    run.add_argument("--run-dir", default=None, help="--local only: where to save the elite and population "
                                                     "(default: a new OUTPUT_DIR/NAME-sSEED-TIMESTAMP, with "
                                                     "OUTPUT_DIR/NAME-latest pointing at it)")

    res = sub.add_parser("resume", parents=[debug], help="continue a crashed or stopped run from its last commit")
    res.add_argument("run_id")
    res.add_argument("--storage", default=None, metavar="URI",
                     help=f"storage URI holding the run (default: $AGILERL_STORAGE_URI, else {DEFAULT_STORAGE})")
    res.add_argument("--no-progress", action="store_true", help="a line per generation instead of the progress bar "
                                                                "(the default when stderr is not a terminal)")
    res.add_argument("--verbose", action="store_true", help="also show the libraries' own INFO lines (MLflow, "
                                                            "Prefect): quiet by default")

    trig = sub.add_parser("trigger", parents=[debug], help="run a Prefect deployment (for CI)")
    trig.add_argument("deployment", help="FLOW/DEPLOYMENT, e.g. online-evolution/cartpole-dqn")
    trig.add_argument("--param", dest="params", action="append", default=[], metavar="KEY=VALUE",
                      help="override a flow parameter by dotted path, e.g. config.seed=3 (repeatable)")
    trig.add_argument("--wait", action="store_true", help="wait for the run to finish and print its summary")
    trig.add_argument("--min-fitness", type=float, default=None,
                      help="with --wait: exit 1 when the elite's fitness is below this")
    trig.add_argument("--timeout", type=float, default=None, help="with --wait: give up after this many seconds")

    lin = sub.add_parser("lineage", parents=[debug], help="draw a run's family tree (coloured by fitness)")
    lin.add_argument("run_id")
    lin.add_argument("--out", required=True, help="PNG file to write")
    lin.add_argument("--storage", default=None, metavar="URI", help="storage URI holding the run")

    add_dataset_parser(sub, debug)
    add_stages_parser(sub, debug)

    stack = sub.add_parser("stack", parents=[debug], help="start, stop or inspect the local stack")
    stack.add_argument("action", choices=["up", "down", "status"])
    stack.add_argument("--data-dir", default=None, help="where the stack keeps data, logs and pids "
                                                        "(default: $AGILERL_STACK_DIR, else .stack)")
    stack.add_argument("--auth", action="store_true",
                       help="turn on Prefect's and MLflow's own authentication (credentials generated into "
                            "<data dir>/auth.json, exported by env.sh; kept on for this data dir)")
    stack.add_argument("--gpu-workers", type=int, default=0, metavar="N",
                       help="up: also start N workers of the agilerl-gpu pool, worker i seeing only GPU i "
                            "(CUDA_VISIBLE_DEVICES=i) and running one flow run at a time")
    return p


def _storage_uri(arg: str | None) -> str:
    return arg or os.environ.get("AGILERL_STORAGE_URI") or DEFAULT_STORAGE


# ---- commands ----------------------------------------------------------------------------------------------
def _run(args: argparse.Namespace) -> dict:
    from agilerl_core.config import parse_overrides
    from tasks.config import grouping, load_config

    overrides = parse_overrides(args.overrides)
    if args.storage:
        overrides["storage.uri"] = args.storage
    cfg = load_config(args.config, overrides)
    import_config_modules(cfg)
    if args.local:
        from agilerl_core.experiment import build_evolution, train_local

        evolution = build_evolution(cfg, **grouping(cfg))  # every check (env id, spaces, bounds, dataset) happens here
        note = cfg.budget_note()
        if note:
            print(f"agilerl-flow: note: {note}", file=sys.stderr, flush=True)
        try:
            summary = train_local(cfg, progress=_progress(args), run_dir=args.run_dir, evolution=evolution).summary()
        except KeyboardInterrupt:
            raise KeyboardInterrupt("a --local run writes its population only when it ends, so nothing of this one "
                                    "was kept; without --local every generation is committed and `agilerl-flow "
                                    "resume RUN_ID` continues an interrupted run") from None
        if summary.get("found"):
            from agilerl_core.hpo.found import found_words

            print(f"agilerl-flow: found {found_words(summary['found'])}; its config with them: "
                  f"{summary['found_config_uri']}", file=sys.stderr, flush=True)
        return summary
    return _flow(cfg, args.run_id, args)


def _flow(cfg, run_id: str | None, args: argparse.Namespace) -> dict:
    """The run as a Prefect flow (:func:`flows.api.run`: prepared and checked here, then its kind's flow)."""
    from flows.api import run

    return run(cfg, run_id=run_id, progress=_progress(args), debug=args.debug, on_interrupt=_leave_soon)


_TOLD = threading.Event()  # the interrupt's line is printed: the process is on its way out
LEAVE_WITHIN_S = 3.0  # after Ctrl-C, what the run's unwinding may take before the process simply exits


def _leave_soon(line: str) -> None:
    """Ctrl-C on a flow run (from the signal handler): the line that says what is committed and how to continue,
    at once; then nothing more on the console (a run unwinding mid-generation makes Prefect and MLflow report
    crashed tasks and lost connections: not news to someone who pressed Ctrl-C); and the process gone within
    :data:`LEAVE_WITHIN_S` whatever is still running, as a crash would leave it: every committed generation is
    whole (commits are atomic) and `resume` continues from the last. A second Ctrl-C leaves at once."""
    if _TOLD.is_set():
        _exit_now()
    _TOLD.set()
    print(f"agilerl-flow: interrupted: {line}", file=sys.__stderr__, flush=True)
    logging.disable(logging.CRITICAL)
    quiet = open(os.devnull, "w")  # noqa: SIM115 (open until the process ends)
    sys.stdout = sys.stderr = quiet
    timer = threading.Timer(LEAVE_WITHIN_S, _exit_now)
    timer.daemon = True
    timer.start()


def _exit_now() -> None:
    from flows.local_prefect import terminate_all

    terminate_all()
    os._exit(130)


def _progress(args: argparse.Namespace) -> bool:
    """The progress bar on a terminal; a line per generation with --no-progress or when stderr is not a terminal
    (a file, a pipe, CI), where a bar's carriage-return updates would pile up."""
    return not args.no_progress and sys.stderr.isatty()


def _quiet_libraries(verbose: bool) -> None:
    """The libraries' INFO chatter (MLflow's database set-up and registration lines, its download bars) stays off
    the console unless --verbose: their warnings and errors still show."""
    if verbose:
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if "mlflow" in sys.modules:  # configured at import from the variable: set the level it read
        logging.getLogger("mlflow").setLevel(logging.WARNING)


def _resume(args: argparse.Namespace) -> dict:
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage
    from tasks.config import validate_config

    uri = _storage_uri(args.storage)
    store = RunStore(open_storage(uri), args.run_id)
    if not store.exists():
        raise ConfigError(f"run {args.run_id!r} not found in storage {uri}; pass --storage URI (or set "
                          f"AGILERL_STORAGE_URI) to where the run was written")
    data = store.run_info()["config"]
    data.setdefault("storage", {})["uri"] = uri
    data.setdefault("kind", "offline" if data.get("dataset") else "gym")  # records written before kinds existed
    cfg = validate_config(data, source=store.storage.url(store.key("run.json")))
    import_config_modules(cfg)
    return _flow(cfg, args.run_id, args)


def _trigger(args: argparse.Namespace) -> dict:
    prefect_defaults()
    from flows.trigger import trigger_deployment

    summary = trigger_deployment(args.deployment, args.params, wait=args.wait, timeout=args.timeout)
    if args.min_fitness is not None and args.wait:
        best = summary.get("best_fitness")
        summary["min_fitness"] = args.min_fitness
        summary["passed"] = best is not None and best >= args.min_fitness
        if not summary["passed"]:
            raise _Fail(f"the elite's fitness {best} is below --min-fitness {args.min_fitness}", summary)
    return summary


def _lineage(args: argparse.Namespace) -> dict:
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage
    from tasks.reports import plot_family_tree

    uri = _storage_uri(args.storage)
    store = RunStore(open_storage(uri), args.run_id)
    latest = store.latest_generation()
    if latest is None:
        raise ConfigError(f"run {args.run_id!r} has no committed generation in storage {uri}; pass --storage URI")
    lineage = store.lineage(latest)
    out = plot_family_tree(lineage, args.out, args.run_id)
    return {"run_id": args.run_id, "generation": latest, "members": len(lineage), "out": str(Path(out).resolve())}


def _stack(args: argparse.Namespace) -> dict:
    from infra.stack import Stack

    stack = Stack.from_env(args.data_dir)
    stack.auth = bool(getattr(args, "auth", False))
    if args.gpu_workers < 0:
        raise ConfigError("--gpu-workers: must be 0 or more (one worker per GPU)")
    if args.action == "up":
        return stack.up(gpu_workers=args.gpu_workers)
    return {"down": stack.down, "status": stack.status}[args.action]()


class _Fail(AgileRLError):
    """A command ran but its outcome is a failure (a failed flow run, a fitness below the bar); `summary` is
    still the command's JSON summary (printed as stdout's last line, pass or fail)."""

    def __init__(self, message: str, summary: dict | None = None) -> None:
        super().__init__(message)
        self.summary = summary


COMMANDS = {"run": _run, "resume": _resume, "trigger": _trigger, "lineage": _lineage, "stack": _stack,
            "dataset": dataset_command, "stages": stages_command}


def _kind(err: BaseException) -> str:
    """What kind of failure `err` is, in the words the console line starts with."""
    from flows.api import error_kind

    return "failed" if isinstance(err, _Fail) else error_kind(err)


def _stopped(err: BaseException) -> bool:
    """Whether `err` is a run that started and failed (its message already says how to continue)."""
    from flows.api import RunStopped

    return isinstance(err, RunStopped)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _quiet_libraries(getattr(args, "verbose", False))
    try:
        # stdout carries the JSON summary alone (CI parses it): whatever libraries print there while the
        # command runs (MLflow's "View run ..." links against a server) goes to stderr with the logs
        with contextlib.redirect_stdout(sys.stderr):
            summary = COMMANDS[args.command](args)
    except KeyboardInterrupt as err:  # a run interrupted says where it stands and how to continue it
        if not _TOLD.is_set():  # (a flow run's line is out already: _leave_soon)
            print(f"agilerl-flow: interrupted{': ' + str(err) if str(err) else ''}", file=sys.stderr)
        return 130
    except Exception as err:
        if args.debug:
            traceback.print_exc()
        kind = _kind(err)
        hint = "" if args.debug or _stopped(err) else " (run with --debug for the traceback)"
        print(f"agilerl-flow: {kind}: {err}{hint}", file=sys.stderr)
        failed_summary = getattr(err, "summary", None)
        if failed_summary is not None:  # stdout's last line is the JSON summary, pass or fail (CI reads it)
            print(json.dumps(failed_summary), flush=True)
        return 2 if isinstance(err, ConfigError) else 1
    finally:
        # the interpreter's final garbage collection walks every object Prefect, MLflow and torch created:
        # measured 2.4 s after a one-generation run's summary. Frozen objects are left to the process exit.
        gc.freeze()
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
