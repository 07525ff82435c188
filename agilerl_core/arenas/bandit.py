"""The contextual-bandit arena (``kind: bandit``): members pull arms for contexts and learn from the population's
shared replay of pulls (the off-policy arena's loop, semantics and resume), evaluated by greedy pulls.

The bandit is a classification table (``data``: one arm per class, reward 1 for the right one; see
:mod:`agilerl_core.envs.bandit`) or a Gymnasium env of your own (``env_id``). A table is split once (the same
held-out rows for every run seed, so seeds compare on one test set); every member standardises its contexts with the
training rows' statistics, which it carries (its checkpoint too: a deployed policy takes raw features). Fitness: the
mean reward of each member's greedy pulls on every held-out row, all members in one batched forward
(``eval_max_steps`` caps the rows judged); for an env, the mean return of ``eval_episodes`` greedy episodes of at
most ``eval_max_steps`` pulls divided by ``eval_max_steps`` (an episode that ends early counts its missing pulls as
0). Each generation's training metrics give the mean reward of the member's pulls and, where the best arm's reward
is known (a table: 1), their regret and the member's cumulative regret (its ancestors' included, carried in its
checkpoint).
"""

from __future__ import annotations

from typing import Any

import torch

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.neural_bandit import input_width
from agilerl_core.arenas.gym_off_policy import OffPolicyArena
from agilerl_core.data.fetch import check_pin
from agilerl_core.data.tables import BanditSplit, load_table
from agilerl_core.envs.bandit import BEST_REWARD
from agilerl_core.envs.group import GroupEnv, GroupStep
from agilerl_core.envs.make import EnvRecipe
from agilerl_core.errors import ConfigError
from agilerl_core.io.storage import s3_options
from agilerl_core.limits import check
from agilerl_core.loops.off_policy import train_group_off_policy as train_off_policy
from agilerl_core.results import TrainResult

SPLIT_SEED = 0  # the held-out rows of a table: one split for every run seed
TABLE_ENV_ID = "agilerl/TabularBandit-v0"
TABLE_ENTRY_POINT = "agilerl_core.envs.bandit:TabularBandit"
EVAL_CHUNK = 4096  # held-out rows per batched forward, at most
EVAL_INPUTS = 2**25  # input elements of one batched forward (members x rows x arms x input width), at most


class _Tally(GroupEnv):
    """A group's envs with each member's pulls and rewards summed on the device as they step."""

    def __init__(self, inner: GroupEnv) -> None:
        self.inner, self.k, self.n, self.on_device = inner, inner.k, inner.n, inner.on_device
        self.reward = None

    def reset(self, seeds: list[int]):
        return self.inner.reset(seeds)

    def step(self, actions: torch.Tensor) -> GroupStep:
        step = self.inner.step(actions)
        r = step.reward.view(self.k, self.n).sum(1, dtype=torch.float64)
        self.reward = r if self.reward is None else self.reward + r
        return step

    def check(self, slots: list[int]) -> None:
        self.inner.check(slots)


class BanditArena(OffPolicyArena):
    """Members pull arms in their own envs and learn from the shared replay of pulls."""

    kind = "bandit"

    def env_recipe(self, cfg) -> EnvRecipe:
        """A table's env (its training rows) or the config's own env."""
        self.split: BanditSplit | None = None
        if cfg.data is None:
            return EnvRecipe.of(cfg)
        d = cfg.data
        table = load_table(d.source, d.label, d.features, s3_options(cfg), d.cache_dir)
        if table.sha256 is not None:
            check_pin(d.source, table.sha256, d.sha256, "data", "source")
        elif d.sha256 is not None:
            raise ConfigError(f"data.sha256: {d.source} is bundled with scikit-learn (its version pins it); remove "
                              f"data.sha256")
        self.table = table
        self.split = BanditSplit.of(table, d.held_out, SPLIT_SEED, d.standardize)
        return EnvRecipe(TABLE_ENV_ID, {"contexts": self.split.train_x, "labels": self.split.train_y,
                                        "arms": self.split.arms}, TABLE_ENTRY_POINT)

    def _check_action_space(self) -> None:
        """Besides the algorithm's actions: the arms within ``limits.bandit_arms`` and the value network's input
        width (D + K for ``one_hot``, K x D for ``block``) and first parameters within ``limits.space_elements`` and
        ``limits.network_params``, before any member, network or arm one-hot is built."""
        super()._check_action_space()
        cfg = self.cfg
        where = f"data.source {cfg.data.source}" if cfg.data is not None else f"env_id {cfg.env_id}"
        arms, d = self.action_spec.dim, self.obs_spec.vector_dim
        check("bandit_arms", arms, f"{where}: arms (each scored for every context)", ConfigError)
        layout = cfg.hyperparameters.arm_features
        width = input_width(d, arms, layout)
        form = f"{d:,} features + {arms:,} arms" if layout == "one_hot" else f"{arms:,} arms x {d:,} features"
        at = f"hyperparameters.arm_features: {layout} for {where} ({form})"
        check("space_elements", width, f"{at}: inputs of the value network", ConfigError)
        dims = [width, *cfg.network.hidden_sizes, 1]
        params = sum(a * b + b for a, b in zip(dims[:-1], dims[1:], strict=False))
        check("network_params", params, f"{at}: parameters of the value network (hidden {cfg.network.hidden_sizes})",
              ConfigError)

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        super().__init__(cfg, algo_cls)
        self.env_desc["kind"] = "bandit"
        if self.split is not None:
            t = self.table
            self.env_desc = {"kind": "bandit", "bandit": {"source": t.source, "sha256": t.sha256,
                                                          "label": cfg.data.label, "classes": list(t.classes),
                                                          **self.split.describe()}}
            rows = cfg.eval_max_steps or len(self.split.held_y)  # the first rows of the split: all by default
            self._held_x = torch.as_tensor(self.split.held_x[:rows], device=self.device)
            self._held_y = torch.as_tensor(self.split.held_y[:rows], device=self.device)

    def build_members(self, seeds: list[int]) -> list[RLAlgorithm]:
        """New members; a table's standardise their contexts by its training rows' statistics."""
        members = super().build_members(seeds)
        for m in members if self.split is not None else ():
            m.set_context_scaling(self.split.mean, self.split.std)
        return members

    # ---- training: the off-policy loop, with each member's rewards and regret ----------------------------
    def group_env(self, slots: list[int], device: torch.device | str, evaluation: bool = False) -> GroupEnv:
        envs = super().group_env(slots, device, evaluation)
        return envs if evaluation else _Tally(envs)

    def train_group(self, members: list[RLAlgorithm], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        for s in slots:
            self.buffer.reset_slot(s)
        group = self.learning_group(members)
        envs = self.group_env(slots, group.device)
        results = train_off_policy(group, slots, envs, self.buffer, steps, seeds)
        rewards = envs.reward.tolist() if envs.reward is not None else [0.0] * len(members)
        for member, res, total in zip(members, results, rewards, strict=True):
            pulls = max(res.env_steps, 1)
            res.metrics["mean_reward"] = total / pulls
            if self.split is not None:  # the best arm pays BEST_REWARD
                regret = pulls * BEST_REWARD - total
                member.regret += regret
                res.metrics["regret"] = regret
                res.metrics["cumulative_regret"] = member.regret
        return results

    # ---- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, member: RLAlgorithm, seed: int, slot: int | None = None) -> float:
        if self.split is None:
            return super().evaluate(member, seed, slot) / self.cfg.eval_max_steps
        return self.evaluate_group([member], seed, [slot])[0]

    @torch.no_grad()
    def evaluate_group(self, members: list[RLAlgorithm], seed: int, slots: list[Any]) -> list[float]:
        """Every member's mean reward over the held-out rows (a table: all of them, greedily, in one batched
        forward per chunk of rows; `seed` plays no part) or per pull of its evaluation envs (an env)."""
        if self.split is None:
            return [f / self.cfg.eval_max_steps for f in super().evaluate_group(members, seed, slots)]
        keys = [m.batch_key() for m in members]
        if len(members) > 1 and any(key != keys[0] for key in keys):
            return [self.evaluate_group([m], seed, [s])[0] for m, s in zip(members, slots, strict=True)]
        group = self.algo_cls.group(members)
        k, rows = len(members), len(self._held_y)
        right = torch.zeros(k, dtype=torch.float64, device=self.device)
        # every row is paired with every arm: fewer rows per forward when arms x input width is large
        width = input_width(self._held_x.shape[1], group.arms, group.layout)
        chunk = max(1, min(EVAL_CHUNK, EVAL_INPUTS // (k * group.arms * width)))
        for start in range(0, rows, chunk):
            x = self._held_x[start: start + chunk]
            arms = group.greedy({group.ctx_key: x.repeat(k, 1)}, None)  # member-major [K * R, D] -> [K, R]
            right += (arms == self._held_y[start: start + chunk]).sum(1, dtype=torch.float64)
        return (right / rows * BEST_REWARD).tolist()
