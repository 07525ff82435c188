"""Does ILQL's Q steer? One from-scratch ILQL member (wordle_ilql.yaml, population 1) and one BC member
(wordle_bc.yaml) trained on the same recorded games, the ILQL member judged at several acting betas (beta only
scales ``Q' - V`` when acting, so one trained member is judged at every beta: beta 0 is its language model alone).

    python benchmarks/ilql_beta.py [--seeds 0 1 2] [--steps 3000] [--every 1000] [--vocabulary 100]
        [--betas 0 0.5 1 2 4 8] [--mix random:0.2,solver:0.3,noisy_solver_0.5:0.5] [--set KEY=VALUE ...]
        [--skip-bc | --only-bc] [--probe]

``--probe`` also reads the trained ILQL member's heads on games the data's players play on the held-out secrets:
per player, the mean advantage ``min Q' - V`` of the letters it chose, how often the advantage's best letter and
the language model's best letter are the letter the solver chose, and the spread (max - min over the 26 letters)
of the advantage beside the language model's logits.

Every agent plays greedily on every held-out secret of the game (never played in the data nor in training). Prints one
JSON object: per seed and checkpoint (gradient steps of the member), BC's and ILQL's (per beta) mean return, win
rate and share of guesses that are not words, and the mean over seeds; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from agilerl_core.config import parse_overrides
from agilerl_core.experiment import build_evolution
from tasks.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"


def _metrics(member) -> dict:
    return {k: round(member.eval_metrics[k], 4) for k in ("win_rate", "invalid_guesses")}


def member_run(config: str, seed: int, args: argparse.Namespace, betas: list[float] | None) -> dict:
    """Train one member of `config` for ``args.steps`` gradient steps, judged every ``args.every``: its mean return
    and win rate (an ILQL member at each of `betas`)."""
    over = {"seed": seed, "population_size": 1, "env.vocabulary": args.vocabulary, "eval_games": None,
            "dataset.players": args.mix, "dataset.games": args.games, **parse_overrides(args.set)}
    if config == "wordle_bc.yaml":
        over = {k: v for k, v in over.items() if not k.startswith("hyperparameters.")}
    evo = build_evolution(load_config(CONFIGS / config, over))
    arena, member = evo.arena, evo.population.members[0].agent
    out, done, t0 = {}, 0, time.perf_counter()
    while done < args.steps:
        arena.train_group([member], [0], [seed * 1000 + done], args.every)
        done += args.every
        if betas is None:
            score = arena.evaluate(member, seed)
            out[done] = {"mean_return": score, **_metrics(member)}
        else:
            judged = []
            for b in betas:
                clone = member.clone()
                clone.hp.beta = b
                judged.append(clone)
            scores = arena.evaluate_group(judged, seed, list(range(len(judged))))
            out[done] = {f"beta_{b:g}": {"mean_return": s, **_metrics(c)}
                         for b, s, c in zip(betas, scores, judged, strict=True)}
        print(f"{config} seed {seed} step {done}: {json.dumps(out[done])} ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    result = {"checkpoints": out, "wall_s": round(time.perf_counter() - t0, 1), "held_out": len(arena.eval_secrets)}
    if args.probe and betas is not None:
        result["probe"] = probe(member, arena)
    return result


@torch.no_grad()
def probe(member, arena) -> dict:
    """What the member's Q and V heads say about the players' choices on held-out secrets (see the module doc)."""
    from agilerl_core.language.agent import target_call
    from agilerl_core.language.players import make_player, play_games
    from agilerl_core.language.tensors import game_tensors, sequence_length

    words, guesses = arena.words, arena.cfg.env.max_guesses
    out = {}
    for name in ("random", "noisy_solver_0.5", "solver"):
        games = play_games([(make_player(name, words), 1.0)], words.held_out, words, 64, seed=7, max_guesses=guesses)
        data = game_tensors(games, sequence_length(guesses))
        res = member.net(data.ids)
        target = target_call([member], res["hidden"][None])
        adv = (torch.stack([target[q][0] for q in ("q1", "q2") if q in target]).amin(0) - res["v"]).float()
        act = data.act
        taken = adv.gather(-1, data.action[..., None]).squeeze(-1)[act]
        lm = res["lm"].float()
        out[name] = {"mean_advantage_of_its_letters": round(float(taken.mean()), 4),
                     "advantage_spread": round(float((adv.amax(-1) - adv.amin(-1))[act].mean()), 4),
                     "lm_logit_spread": round(float((lm.amax(-1) - lm.amin(-1))[act].mean()), 4),
                     "advantage_argmax_is_its_letter": round(float((adv.argmax(-1) == data.action)[act].float().mean()), 4),
                     "lm_argmax_is_its_letter": round(float((lm.argmax(-1) == data.action)[act].float().mean()), 4),
                     "mean_return": round(sum(g.total_return for g in games) / len(games), 3)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=3000, help="gradient steps per member")
    p.add_argument("--every", type=int, default=1000, help="judge every this many steps")
    p.add_argument("--vocabulary", type=int, default=100)
    p.add_argument("--games", type=int, default=5000, help="recorded games")
    p.add_argument("--mix", default="random:0.2,solver:0.3,noisy_solver_0.5:0.5", help="the players' mix")
    p.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an ILQL config field, e.g. --set hyperparameters.cql_weight=1 (repeatable)")
    p.add_argument("--skip-bc", action="store_true", help="the ILQL member alone")
    p.add_argument("--only-bc", action="store_true", help="the BC member alone")
    p.add_argument("--probe", action="store_true", help="read the ILQL member's heads on the players' games")
    args = p.parse_args()
    runs = {}
    for seed in args.seeds:
        runs[seed] = {} if args.only_bc else {"ilql": member_run("wordle_ilql.yaml", seed, args, args.betas)}
        if not args.skip_bc:
            runs[seed]["bc"] = member_run("wordle_bc.yaml", seed, args, None)
    last = args.steps
    mean = {} if args.only_bc else {
        f"beta_{b:g}": statistics.mean(runs[s]["ilql"]["checkpoints"][last][f"beta_{b:g}"]["mean_return"]
                                       for s in args.seeds) for b in args.betas}
    if not args.skip_bc:
        mean["bc"] = statistics.mean(runs[s]["bc"]["checkpoints"][last]["mean_return"] for s in args.seeds)
    print(json.dumps({"config": {k: v for k, v in vars(args).items()}, "mean_return_at_end": mean, "runs": runs}))


if __name__ == "__main__":
    main()
