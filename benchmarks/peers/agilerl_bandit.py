"""AgileRL 2.58's contextual bandits (NeuralTS or NeuralUCB) on a split our side wrote, through the peer's public
API only: its ``BanditEnv`` on the training rows, ``create_population``, ``TournamentSelection``, ``Mutations`` and
``train_bandits``; then every member's greedy pull on the held-out rows. Run it under the peer's own venv (see
../../../shared/bench/README.md for setting one up); ``benchmarks/bandits.py --peer`` calls it.

    ~/peer-venv/bin/python agilerl_bandit.py --split SPLIT.npz --algo NeuralTS --seed 0 --pulls-per-member 10000

SPLIT.npz holds ``train_x``, ``train_y``, ``held_x``, ``held_y`` (labels as class indices; features as the members
see them). The peer numbers its arms by first appearance of a label (``pd.factorize``), not sorted: held-out rows
are scored by the label its arm stands for. The peer is instrumented from outside only: a wrapper counts the pulls
and their rewards (the population's training regret). Prints ``RESULT {json}``: the elite's and the best member's
held-out reward, the population's regret, the pulls and the wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np
import pandas as pd
import torch
from agilerl.components.replay_buffer import ReplayBuffer
from agilerl.hpo.mutation import Mutations
from agilerl.hpo.tournament import TournamentSelection
from agilerl.training.train_bandits import train_bandits
from agilerl.utils.utils import create_population
from agilerl.wrappers.learning import BanditEnv


class CountingEnv:
    """The peer's BanditEnv, counting training pulls and their rewards (not while `counting` is off: the
    evaluation's pulls, see :func:`uncounted_tests`)."""

    def __init__(self, env: BanditEnv) -> None:
        self.env = env
        self.pulls, self.reward, self.counting = 0, 0.0, True

    def __getattr__(self, name: str):
        return getattr(self.env, name)

    def reset(self):
        return self.env.reset()

    def step(self, action):
        context, reward = self.env.step(action)
        if self.counting:
            self.pulls += 1
            self.reward += float(reward)
        return context, reward


def uncounted_tests(cls: type, env: CountingEnv) -> None:
    """The peer's evaluation (its class's ``test``, which every clone shares) pulls with counting off."""
    test = cls.test

    def quiet(self, *args, **kwargs):
        env.counting = False
        try:
            return test(self, *args, **kwargs)
        finally:
            env.counting = True

    cls.test = quiet


def contexts(x: np.ndarray, arms: int) -> np.ndarray:
    """Each row as the peer's BanditEnv lays a context out: [rows, arms, arms * D], arm i's copy in block i."""
    n, d = x.shape
    out = np.zeros((n, arms, arms * d), dtype=np.float32)
    for i in range(arms):
        out[:, i, i * d:(i + 1) * d] = x
    return out


@torch.no_grad()
def held_out_reward(agent, x: np.ndarray, y: np.ndarray, arm_labels: np.ndarray) -> float:
    """The share of held-out rows whose greedy arm (the actor's highest score, as the peer's own test pulls)
    stands for the row's label."""
    agent.set_training_mode(False)
    right = 0
    for ctx, label in zip(contexts(x, len(arm_labels)), y, strict=True):
        scores = agent.actor(agent.preprocess_observation(ctx)).reshape(-1)
        right += int(arm_labels[int(scores.argmax())] == label)
    agent.set_training_mode(True)
    return right / len(y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", required=True, help="the .npz our side wrote (train_x, train_y, held_x, held_y)")
    p.add_argument("--algo", choices=["NeuralTS", "NeuralUCB"], default="NeuralTS")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pulls-per-member", type=int, default=10_000)
    p.add_argument("--population", type=int, default=4)
    p.add_argument("--evo-steps", type=int, default=1_000, help="pulls per member between selections")
    p.add_argument("--hidden", type=int, nargs="+", default=None,
                   help="the encoder's hidden sizes (default: the peer's own network)")
    p.add_argument("--learn-step", type=int, default=2, help="gradient steps per pull (the peer's default: 2)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    split = np.load(args.split)
    train_y = split["train_y"]
    env = CountingEnv(BanditEnv(pd.DataFrame(split["train_x"]), pd.DataFrame(train_y)))
    arm_labels = pd.factorize(train_y)[1]  # the peer's arm i is the i-th label to appear in the training rows
    hp = {"POPULATION_SIZE": args.population, "BATCH_SIZE": args.batch_size, "LR": args.lr, "GAMMA": 1.0,
          "LAMBDA": 1.0, "REG": 0.000625, "LEARN_STEP": args.learn_step}
    net = None if args.hidden is None else {"encoder_config": {"hidden_size": list(args.hidden)}}
    pop = create_population(args.algo, net, hp,
                            observation_space=env.single_observation_space, action_space=env.single_action_space,
                            population_size=args.population)
    uncounted_tests(type(pop[0]), env)
    tournament = TournamentSelection(2, True, args.population)
    mutation = Mutations(no_mutation=0.4, architecture=0.2, new_layer_prob=0.5, parameters=0.2, activation=0.0,
                         rl_hp=0.2, rand_seed=args.seed)
    t0 = time.perf_counter()
    pop, fitnesses = train_bandits(env, "digits", args.algo, pop, ReplayBuffer(max_size=10_000), init_hp=hp,
                                   max_steps=args.pulls_per_member, episode_steps=args.evo_steps,
                                   evo_steps=args.evo_steps, eval_steps=500, tournament=tournament,
                                   mutation=mutation, verbose=False)
    wall = time.perf_counter() - t0
    training = {"pulls": env.pulls, "reward": env.reward}  # the population's training pulls only
    held = [held_out_reward(a, split["held_x"], split["held_y"], arm_labels) for a in pop]
    elite = int(np.argmax(fitnesses))
    print("RESULT " + json.dumps({"algo": args.algo, "seed": args.seed, "holdout_reward_elite": held[elite],
                                  "holdout_reward_best": max(held), "population_regret_total":
                                  training["pulls"] - training["reward"], "total_pulls": training["pulls"],
                                  "wall_s": wall}))


if __name__ == "__main__":
    main()
