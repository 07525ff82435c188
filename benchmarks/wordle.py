"""Wordle language agents at a stated budget: held-out mean return (-(wrong guesses); -6 is a lost game), win rate
and mean guesses of the data's players, the BC elite and the ILQL elite (character-level GPTs from scratch, the
shipped wordle_bc.yaml / wordle_ilql.yaml with the budget and seed as overrides), and, with ``--llm``, of
SmolLM2-135M-Instruct's base and its multi-turn GRPO elite (smollm2_wordle_grpo.yaml), and, with ``--llm-offline``, SmolLM2 LoRA
populations trained offline on recorded games by llm_bc and llm_ilql (smollm2_wordle_ilql.yaml).

    python benchmarks/wordle.py [--steps 8000] [--seeds 0 1] [--vocabulary 500] [--llm --llm-games 256]
    python benchmarks/wordle.py --skip-scratch --seeds 0 --llm-offline 256 --llm-eval 16
    python benchmarks/wordle.py --skip-scratch --seeds 0 --llm --llm-games 128 --llm-eval 16

Every agent is judged on the same held-out secrets (the game's fixed split; never played in the data nor in
training), greedily; the players are judged on them too. Speeds: gradient steps per second (whole population,
evaluation included) and, for the LLM, games per second of greedy play. Prints one JSON object; progress goes to
stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agilerl_core.experiment import train_local
from agilerl_core.language.players import make_player, mix_report, play_games
from agilerl_core.language.wordle import word_list
from tasks.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"


def players(vocabulary: int | None, held_out: float, mix: str, games: int) -> dict:
    """Each data player's (and the mix's) results on the held-out secrets."""
    words = word_list(vocabulary, held_out)
    names = [piece.split(":")[0] for piece in mix.split(",")]
    out = {}
    for name in names:
        records = play_games([(make_player(name, words), 1.0)], words.held_out, words, games, seed=1)
        out[name] = mix_report(records)["overall"]
    from agilerl_core.language.players import parse_mix

    out["mix (the data's average policy)"] = mix_report(play_games(parse_mix(mix, words), words.held_out, words,
                                                                   games, seed=1))["overall"]
    return out


def language_run(config: str, seed: int, steps: int, vocabulary: int | None) -> dict:
    """Train a shipped language config for `steps` global gradient steps; the final elite's held-out results."""
    over = {"seed": seed, "max_env_steps": steps, "target_fitness": None}
    if vocabulary is not None:
        over["env.vocabulary"] = vocabulary
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(CONFIGS / config, {**over, "output_dir": out})
        t0 = time.perf_counter()
        res = train_local(cfg, progress=False)
        wall = time.perf_counter() - t0
    elite = res.best_member.agent if res.best_member is not None else None  # the champion rule's choice
    metrics = dict(getattr(elite, "eval_metrics", {}) or {})
    return {"seed": seed, "best_fitness": res.best_fitness, "elite_fitness": res.elite_fitness,
            "champion": (res.champion or {}).get("fitness"), **metrics, "generations": res.generations,
            "wall_s": round(wall, 1), "steps_per_s": round(res.global_steps / wall, 1),
            "architecture": elite.describe() if elite is not None else None}


def llm_run(games: int, seed: int, eval_games: int) -> dict:
    """SmolLM2's base and its multi-turn GRPO elite on Wordle (smollm2_wordle_grpo.yaml, `games` training games in
    all, population 2), both judged on `eval_games` held-out secrets."""
    from agilerl_core.experiment import build_evolution

    over = {"seed": seed, "max_env_steps": games, "population_size": 2, "evo_steps": games // 4,
            "eval_prompts": eval_games}
    cfg = load_config(CONFIGS / "smollm2_wordle_grpo.yaml", over)
    evo = build_evolution(cfg)
    t0 = time.perf_counter()
    base_fit = evo.evaluate_group((0,))[0]
    base_wall = time.perf_counter() - t0
    base = {"mean_return": base_fit, **evo.population.members[0].agent.eval_metrics,
            "games_per_s": round(len(evo.arena.eval_data) / base_wall, 2)}
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(CONFIGS / "smollm2_wordle_grpo.yaml", {**over, "output_dir": out})
        t0 = time.perf_counter()
        res = train_local(cfg, progress=False)
        wall = time.perf_counter() - t0
    return {"base": base, "grpo": {"best_fitness": res.best_fitness, "elite_fitness": res.elite_fitness,
                                   "champion": (res.champion or {}).get("fitness"),
                                   "history": [round(h.best_fitness, 3) for h in res.history],
                                   **dict(getattr(getattr(res.best_member, "agent", None), "eval_metrics", {}) or {}),
                                   "training_games_per_s": round(res.global_steps / wall, 2), "wall_s": round(wall, 1)}}


def llm_offline_run(algorithm: str, games: int, seed: int, eval_games: int) -> dict:
    """An offline LoRA population on SmolLM2 (smollm2_wordle_ilql.yaml, `algorithm` llm_bc or llm_ilql) after `games`
    recorded games in all (population 2), judged on `eval_games` held-out secrets."""
    over = {"seed": seed, "algorithm": algorithm, "max_env_steps": games, "population_size": 2,
            "evo_steps": games // 4, "eval_prompts": eval_games}
    if algorithm == "llm_bc":  # the same members and data, the BC loss alone
        over["hyperparameters"] = {"lr": 5.0e-4, "batch_size": 8, "micro_batch_size": 16, "max_new_tokens": 8}
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(CONFIGS / "smollm2_wordle_ilql.yaml", {**over, "output_dir": out})
        t0 = time.perf_counter()
        res = train_local(cfg, progress=False)
        wall = time.perf_counter() - t0
    return {"best_fitness": res.best_fitness, "elite_fitness": res.elite_fitness,
            "champion": (res.champion or {}).get("fitness"),
            **dict(getattr(getattr(res.best_member, "agent", None), "eval_metrics", {}) or {}),
            "history": [round(h.best_fitness, 3) for h in res.history],
            "games_per_s": round(res.global_steps / wall, 2), "wall_s": round(wall, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8000, help="global gradient steps per run (population of 4)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--vocabulary", type=int, default=None, help="override env.vocabulary (default: the configs')")
    p.add_argument("--llm", action="store_true", help="also SmolLM2's base and its multi-turn GRPO elite (slow)")
    p.add_argument("--llm-games", type=int, default=256, help="training games of the GRPO run")
    p.add_argument("--llm-offline", type=int, default=0, metavar="GAMES",
                   help="also SmolLM2 LoRA populations trained offline (llm_bc, llm_ilql) on GAMES recorded games")
    p.add_argument("--llm-eval", type=int, default=32, help="held-out secrets judging the SmolLM2 runs (base, GRPO, offline)")
    p.add_argument("--skip-scratch", action="store_true", help="skip the players and the from-scratch GPT runs")
    args = p.parse_args()
    bc_cfg = load_config(CONFIGS / "wordle_bc.yaml")
    vocabulary = args.vocabulary if args.vocabulary is not None else bc_cfg.env.vocabulary
    out: dict = {"budget": {"seeds": args.seeds}}
    if not args.skip_scratch:
        out["budget"].update({"global_gradient_steps": args.steps, "population": bc_cfg.population_size,
                              "vocabulary": vocabulary, "data": f"{bc_cfg.dataset.games} games of {bc_cfg.dataset.players}"})
    if args.llm or args.llm_offline:  # the SmolLM2 runs: population 2, their own game of 500 words
        out["budget"]["smollm2"] = {"population": 2, "held_out_games": args.llm_eval,
                                    **({"grpo_training_games": args.llm_games} if args.llm else {}),
                                    **({"offline_recorded_games": args.llm_offline} if args.llm_offline else {})}
    if not args.skip_scratch:
        print("players...", file=sys.stderr)
        out["players"] = players(vocabulary, bc_cfg.env.held_out, bc_cfg.dataset.players, 2000)
    for name, config in () if args.skip_scratch else (("bc", "wordle_bc.yaml"), ("ilql", "wordle_ilql.yaml")):
        runs = []
        for seed in args.seeds:
            print(f"{name} seed {seed}...", file=sys.stderr)
            runs.append(language_run(config, seed, args.steps, args.vocabulary))
        out[name] = {"runs": runs, "median_champion": statistics.median(r["champion"] for r in runs),
                     "mean_champion": float(np.mean([r["champion"] for r in runs]))}
    if args.llm:
        print("llm...", file=sys.stderr)
        out["smollm2"] = llm_run(args.llm_games, args.seeds[0], args.llm_eval)
    if args.llm_offline:
        for algorithm in ("llm_bc", "llm_ilql"):
            print(f"{algorithm}...", file=sys.stderr)
            out[f"smollm2_{algorithm}"] = llm_offline_run(algorithm, args.llm_offline, args.seeds[0], args.llm_eval)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
