"""`agilerl-flow dataset`: record episodes of a policy as an offline dataset (``collect``; ``--env wordle``:
games of a mix of players, as JSON Lines), print a dataset's size, spaces and return statistics (``info``),
write a prompt set of additions (``make-arithmetic``). :mod:`flows.cli` adds the subcommand and runs it."""

from __future__ import annotations

import argparse
import sys

from agilerl_core.errors import ConfigError


def add_dataset_parser(sub, debug: argparse.ArgumentParser) -> None:
    """The ``dataset`` subcommand and its own subcommands, added to the CLI's subparsers `sub` (`debug`: the
    parent parser that gives each its ``--debug``)."""
    data = sub.add_parser("dataset", parents=[debug], help="record or inspect an offline dataset")
    dsub = data.add_subparsers(dest="dataset_command", required=True)
    col = dsub.add_parser("collect", parents=[debug], help="record episodes of a policy as a dataset")
    col.add_argument("--env", default=None, help="Gymnasium env id, e.g. CartPole-v1 (default: --config's env_id), "
                                                  "or wordle: games of a mix of players, as JSONL")
    col.add_argument("--config", default=None, metavar="CONFIG.yaml",
                     help="record in the env this config trains in: its env_id, env_kwargs, env_entry_point and "
                          "env_wrappers (e.g. Atari preprocessing), so the dataset has the spaces its members see")
    col.add_argument("--policy", default=None, help="random (the default), or a saved member directory (e.g. a run's "
                                                     "elite/); for wordle the players' mix (default "
                                                     "random:0.2,solver:0.3,noisy_solver_0.5:0.5)")
    col.add_argument("--episodes", type=int, required=True, help="episodes to record")
    col.add_argument("--out", required=True, metavar="URI",
                     help="file path (HDF5), directory or minari:DATASET_ID (Minari), or s3://BUCKET/KEY")
    col.add_argument("--format", choices=["auto", "hdf5", "minari"], default="auto",
                     help="auto: minari for minari:ID outs, else hdf5 (minari needs the minari extra)")
    col.add_argument("--epsilon", type=float, default=0.0,
                     help="probability of replacing each action by a random one (a noisier behaviour policy)")
    col.add_argument("--seed", type=int, default=0)
    col.add_argument("--num-envs", type=int, default=8, help="vectorised envs recording in parallel")
    col.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    col.add_argument("--vocabulary", type=int, default=None, help="wordle: play on the first N words of the list")
    col.add_argument("--held-out", type=float, default=None,
                     help="wordle: fraction of secrets held out for evaluation (default 0.2); games use the rest")
    info = dsub.add_parser("info", parents=[debug], help="print a dataset's size, spaces and return statistics")
    info.add_argument("uri", help="file, Minari directory, minari:DATASET_ID or s3://BUCKET/KEY")
    info.add_argument("--format", choices=["auto", "hdf5", "minari"], default="auto")

    ar = dsub.add_parser("make-arithmetic", parents=[debug],
                         help="write a prompt set of additions with exact answers (GRPO), or preference pairs (DPO)")
    ar.add_argument("--out", required=True, help="JSON Lines file to write, e.g. data/add2.jsonl")
    ar.add_argument("--count", type=int, default=2000, help="distinct additions")
    ar.add_argument("--digits", type=int, default=2, help="digits of each operand")
    ar.add_argument("--seed", type=int, default=0)
    ar.add_argument("--preferences", action="store_true",
                    help="add chosen (the correct sum) and rejected (a wrong one) to every record")


def dataset_command(args: argparse.Namespace) -> dict:
    """`agilerl-flow dataset ...`: its JSON summary."""
    from agilerl_core.data.loader import load_dataset

    if args.dataset_command == "info":
        if args.uri.endswith(".jsonl"):
            from agilerl_core.language.games import load_games

            return load_games(args.uri).describe()
        return load_dataset(args.uri, args.format).describe()
    if args.dataset_command == "make-arithmetic":
        from agilerl_core.data.prompts import make_arithmetic, write_jsonl
        from agilerl_core.io.digest import sha256_file

        if args.count < 1 or args.digits < 1:
            raise ConfigError("--count and --digits must be at least 1")
        try:
            rows = make_arithmetic(args.count, args.digits, args.seed, args.preferences)
        except ValueError as err:
            raise ConfigError(f"--count {args.count}: {err}") from None
        out = write_jsonl(args.out, rows)
        return {"out": str(out.resolve()), "records": len(rows), "sha256": sha256_file(out),
                "fields": sorted(rows[0])}
    if args.env == "wordle":
        return _collect_wordle(args)
    if args.vocabulary is not None or args.held_out is not None:
        raise ConfigError("--vocabulary and --held-out: only for --env wordle")
    from agilerl_core.algorithms.acting import Acting
    from agilerl_core.algorithms.registry import get_algorithm
    from agilerl_core.data.collect import collect_episodes, write_dataset

    policy = args.policy or "random"
    fmt = args.format if args.format != "auto" else ("minari" if args.out.startswith("minari:") else "hdf5")
    if args.out.startswith("minari:") and fmt != "minari":
        raise ConfigError(f"--out {args.out}: minari:ID outs are Minari datasets; drop --format hdf5")
    recipe = {}
    if args.config:
        from tasks.config import load_config

        cfg = load_config(args.config)
        if not hasattr(cfg, "env_wrappers"):
            raise ConfigError(f"--config {args.config}: a {cfg.kind} config; give a gym or offline config")
        recipe = {"env_kwargs": cfg.env_kwargs, "entry_point": cfg.env_entry_point, "wrappers": cfg.env_wrappers}
    env_id = args.env or (cfg.env_id if args.config else None)
    if env_id is None:
        raise ConfigError("--env: name the env to record in (e.g. --env CartPole-v1), or give --config")
    from agilerl_core.code_refs import import_config_modules, import_from_working_directory, split_env_id

    if args.config:
        import_config_modules(cfg)
    module = split_env_id(env_id, "--env")[0]
    if module is not None:  # --env my_pkg.envs:GridWorld-v0 beside my_pkg/, as python -m finds it
        import_from_working_directory([module])
    episodes = collect_episodes(env_id, policy, args.episodes, args.seed, args.num_envs, args.epsilon,
                                progress=_bar(args), algorithms=get_algorithm, acting=Acting,
                                **recipe)
    where = write_dataset(args.out, episodes, env_id, policy, fmt)
    return {"out": where, **load_dataset(where, fmt).describe()}  # read back: what a run would load


def _collect_wordle(args: argparse.Namespace) -> dict:
    """`dataset collect --env wordle`: games of a mix of players on the train secrets, as JSON Lines."""
    from agilerl_core.language.games import describe_games, load_games, s3_target, save_games
    from agilerl_core.language.players import DEFAULT_MIX, parse_mix, play_games
    from agilerl_core.language.wordle import word_list

    if args.config or args.epsilon:
        raise ConfigError("--env wordle: --config and --epsilon do not apply; give the players' mix as --policy")
    if not args.out.endswith(".jsonl") or args.episodes < 1:
        raise ConfigError(f"--env wordle: --out {args.out!r} must be a .jsonl file and --episodes at least 1")
    if args.out.startswith("s3://"):
        s3_target(args.out)  # a bad s3:// out is refused before any game is played
    policy, held_out, max_guesses = args.policy or DEFAULT_MIX, 0.2 if args.held_out is None else args.held_out, 6
    try:
        words = word_list(args.vocabulary, held_out)
        records = play_games(parse_mix(policy, words), words.train, words, args.episodes, args.seed, max_guesses,
                             progress=_bar(args))
    except ValueError as err:
        raise ConfigError(f"--env wordle: {err}") from None
    description = describe_games(words, args.vocabulary, held_out, max_guesses, args.seed, policy, records)
    where = save_games(args.out, records, description)
    return {"out": where, **load_games(where).describe()}  # read back: what a run would load


def _bar(args: argparse.Namespace) -> bool:
    """A progress bar on a terminal; none with --no-progress or when stderr is a file or a pipe."""
    return not args.no_progress and sys.stderr.isatty()
