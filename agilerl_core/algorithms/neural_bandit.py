"""Neural contextual bandits, written once over the member axis: NeuralUCB, NeuralTS and an epsilon-greedy
baseline share one network f(x, a) (an MLP scoring a context x with arm a, from the arm features
``arm_features`` names), fitted by mean squared error to the rewards of past pulls drawn from the population's
shared replay; they differ only in how they pull.

The exploration bonus uses the diagonal of the gradient covariance (the approximation the NeuralUCB and NeuralTS
papers run their experiments with): Z = lambda + S, S the sum over the member's past pulls of g * g, g the
gradient of f(x, a) for every parameter, and sigma(x, a)^2 = lambda * sum_j g_j^2 / Z_j. For an MLP the
per-pull squared gradient of a linear layer's weight is the outer product of the squared gradient at its output
and its squared input, so sigma^2 for every context and arm, and the update of S after a
pull, are a few batched matmuls over the layers (no per-sample autograd): :meth:`NeuralBanditGroup.gradient_walk`.

S lives in each member as a flat tensor laid out as its network's parameters (a checkpoint's ``extra/sq_grads``):
it is cloned with the member, kept where an architecture mutation keeps the weights (zero, i.e. no information,
for new units), and stacked [K, P] beside the weights in a group.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.group import ReplayGroup, StackedRows, clipped_step
from agilerl_core.algorithms.group_state import group_state, unstack_into
from agilerl_core.algorithms.hyperparameters.bandit import (
    NeuralEpsilonGreedyHyperparameters,
    NeuralTSHyperparameters,
    NeuralUCBHyperparameters,
)
from agilerl_core.buffers.replay import Transition
from agilerl_core.data.tables import STD_FLOOR
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.hpo.evolvable import RL_MUTATION_KINDS
from agilerl_core.networks.stacked import _DERIVATIVES, parameter_blocks
from agilerl_core.networks.transfer import copy_overlap


def arm_inputs(ctx: torch.Tensor, arms: torch.Tensor, layout: str) -> torch.Tensor:
    """The network's inputs [K, M * J, F] for contexts `ctx` [K, M, D] with J arms each, given as one-hots `arms`
    [K, M, J, A]: ``one_hot`` -> [x, e_a] (F = D + A); ``block`` -> x in block a of A x D zeros (F = A * D)."""
    k, m, j, a = arms.shape
    d = ctx.shape[-1]
    if layout == "one_hot":
        return torch.cat([ctx.unsqueeze(2).expand(k, m, j, d), arms], dim=3).view(k, m * j, d + a)
    return (arms.unsqueeze(-1) * ctx[:, :, None, None, :]).reshape(k, m * j, a * d)


def input_width(context_dim: int, arms: int, layout: str) -> int:
    return context_dim + arms if layout == "one_hot" else context_dim * arms


def _as_float32(t: torch.Tensor, name: str) -> torch.Tensor:
    """Checkpoint tensor extra/`name` in the float32 the member computes in (a ValueError when it is not numbers)."""
    if not (t.is_floating_point() or t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)):
        raise ValueError(f"extra/{name}: {str(t.dtype).removeprefix('torch.')} where numbers are needed")
    return t.to(torch.float32)


class NeuralBanditGroup(ReplayGroup):
    """K bandit members: one stacked value network, the members' gradient second moments S [K, P] (laid out as
    the stacked weights), each member on its own minibatches, learning rate and exploration scale."""

    metrics_every: ClassVar[int] = 32

    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        first = self.agents[0]
        self.adam = self.adams["value"]
        self.value = self.stacked([a.layouts["value"] for a in self.agents], self.adam.flat, self.adam.padded)
        if not self.value.hand_backward:
            raise ValueError(f"{first.name}: the bonus walks a plain ReLU or tanh MLP (this one is "
                             f"{first.arch.activation}); use network.activation relu or tanh")
        self.arms, self.layout = first.action_dim, first.hp.arm_features
        self.ctx_key = first.obs_spec.parts[0].key
        self.in_key = self.value.obs_spec.parts[0].key
        self.max_grad_norm = first.hp.max_grad_norm
        flats = [a.sq_grads for a in self.agents]
        self.sq, self._adopted = group_state(flats, self.adam.shapes, self.adam.padded)
        if self._adopted:
            for a, row in zip(self.agents, self.sq, strict=True):
                a.sq_grads = row
        self.sq_blocks = dict(zip(self.value.p, parameter_blocks(self.sq, self.k, self.adam.padded), strict=True))
        self.lamb = self.hp_tensor("lamb").view(-1, 1, 1) if hasattr(first.hp, "lamb") else None
        self.scale = self.hp_tensor(first.exploration_field) if first.exploration_field else None
        self._eye = torch.eye(self.arms, device=self.device)
        # each member's context scaling [K, 1, D] (a table's training-row statistics; identity for an env)
        self.ctx_mean = torch.stack([a.ctx_mean for a in self.agents]).unsqueeze(1)
        self.ctx_std = torch.stack([a.ctx_std for a in self.agents]).unsqueeze(1)

    # ---- the network on (context, arm) pairs ----------------------------------------------------------
    def contexts(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Member-major raw contexts [K * N, D] as each member's standardised contexts [K, N, D]."""
        x = obs[self.ctx_key]
        return (x.view(self.k, -1, x.shape[-1]).to(torch.float32) - self.ctx_mean) / self.ctx_std

    def every_arm(self, ctx: torch.Tensor) -> torch.Tensor:
        """Inputs [K, N * A, F] pairing each context with every arm (arm-minor)."""
        k, n, _ = ctx.shape
        return arm_inputs(ctx, self._eye.expand(k, n, self.arms, self.arms), self.layout)

    def pulled(self, ctx: torch.Tensor, arm: torch.Tensor) -> torch.Tensor:
        """Inputs [K, N, F] of each context with its pulled arm (`arm` [K, N])."""
        return arm_inputs(ctx, self._eye[arm].unsqueeze(2), self.layout)

    def scores(self, inputs: torch.Tensor) -> torch.Tensor:
        """f for every input [K, M, F] -> [K, M]."""
        return self.value({self.in_key: inputs.reshape(-1, inputs.shape[-1])}).squeeze(-1)

    @torch.no_grad()
    def gradient_walk(self, inputs: torch.Tensor, accumulate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(f [K, M], sum_j g_j^2 / (lambda + S_j) [K, M]) for every input [K, M, F], g the gradient of f at that
        input for every parameter (per input, never summed over inputs). With `accumulate`, S += sum over the
        inputs of g^2 instead (the second value is then zeros): a pull's information entering the member's Z.

        For a linear layer z = W h + b reached by upstream gradient delta = df/dz: dW = delta (outer) h, so
        sum_ij dW_ij^2 / Z_ij = sum_i (delta^2 @ (1 / Z_W))_i h_i^2 and the inputs' sum of dW^2 = (delta^2)^T h^2."""
        out, saved = self.value.forward_saving({self.in_key: inputs.reshape(-1, inputs.shape[-1])})
        derivative = _DERIVATIVES[self.value.arch.mlp.activation]
        names = [f"mlp.hidden.{i}" for i in range(len(self.value.arch.mlp.hidden))] + ["mlp.out"]
        delta = torch.ones_like(out)  # df/d(output) [K, M, 1]
        total = torch.zeros(out.shape[:2], device=out.device)
        for i in range(len(names) - 1, -1, -1):
            h = saved[i]
            d2, h2 = delta.square(), h.square()
            s_w, s_b = self.sq_blocks[f"{names[i]}.weight"], self.sq_blocks[f"{names[i]}.bias"]
            if accumulate:
                s_w += torch.bmm(d2.transpose(1, 2), h2)
                s_b += d2.sum(1)
            else:
                total += (torch.bmm(d2, 1.0 / (self.lamb + s_w)) * h2).sum(2)
                total += (d2 / (self.lamb.squeeze(2) + s_b).unsqueeze(1)).sum(2)
            if i:
                delta = derivative(torch.bmm(delta, self.value.p[f"{names[i]}.weight"]), h)
        return out.squeeze(-1), total

    def sigma(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(f, sigma) [K, N, A] each for contexts [K, N, D] and every arm: the mean and the confidence width
        sqrt(lambda * sum g^2 / Z)."""
        k, n, _ = ctx.shape
        f, q = self.gradient_walk(self.every_arm(ctx))
        return f.view(k, n, self.arms), (self.lamb.view(-1, 1) * q).sqrt().view(k, n, self.arms)

    # ---- acting ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def greedy(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Every member's best arm by its mean estimate f [K, N] (no bonus: evaluation and deployment)."""
        ctx = self.contexts(obs)
        k, n, _ = ctx.shape
        return self._masked(self.scores(self.every_arm(ctx)).view(k, n, self.arms), mask).argmax(dim=2)

    def _masked(self, score: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            return score
        mask = mask.view(score.shape)
        return score.masked_fill(~(mask | ~mask.any(dim=2, keepdim=True)), float("-inf"))

    @torch.no_grad()
    def explore_group(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """Every member's pulls [K, N] (its own rule, :meth:`pull_scores`), then each pull's squared gradient
        added to the member's S."""
        ctx = self.contexts(obs)
        arm = self._masked(self.agents[0].pull_scores(self, ctx), mask).argmax(dim=2)
        if self.lamb is not None:
            self.gradient_walk(self.pulled(ctx, arm), accumulate=True)
        return arm

    # ---- learning -------------------------------------------------------------------------------------
    def learn(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        """One MSE step of f(x, a) on each member's minibatch of past pulls; returns each member's loss [K]."""
        k = rows.k
        ctx = self.contexts(batch.obs)
        inputs = self.pulled(ctx, batch.action.view(k, -1).long())
        out, saved = self.value.forward_saving({self.in_key: inputs.reshape(-1, inputs.shape[-1])})
        err = out.squeeze(-1) - batch.reward.view(k, -1)
        losses = (err.square() * rows.weight).sum(1)
        # the MLP's backward by hand (StackedNetwork.backward: the walk the width uses) from d loss / d f
        self.value.backward(saved, (2.0 * err * rows.weight).unsqueeze(-1), out=self.adam.grad)
        due = self.metrics.due()
        norm = clipped_step(self.adam, self.max_grad_norm, None if rows.all_active else rows.active, due)
        for a, on in zip(self.agents, rows.who, strict=True):
            a.learn_steps += int(on)
        if due:
            self.metrics.add(None if rows.all_active else rows.active, grad_norm=norm)
        return losses.detach()

    @torch.no_grad()
    def write_back(self) -> None:
        super().write_back()
        if not self._adopted:
            unstack_into(self.sq, [a.sq_grads for a in self.agents], self.adam.shapes, self.adam.padded)


class NeuralBandit(RLAlgorithm):
    """What the neural bandits share: the value network on (context, arm) inputs, S, state and mutation."""

    hp_model = NeuralUCBHyperparameters
    online_networks = ("value",)
    target_networks: ClassVar[dict[str, str]] = {}
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete",)
    mutation_kinds = RL_MUTATION_KINDS - {"activation"}  # the bonus walks ReLU or tanh layers
    group_class = NeuralBanditGroup
    exploration_field: ClassVar[str | None] = None  # the hyperparameter scaling exploration (gamma, nu, epsilon)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sq_grads = torch.zeros_like(self.optimizers["value"].flat)
        self.regret = 0.0  # the regret of every pull this member and its ancestors made (where it is known)
        d = self.obs_spec.vector_dim
        self.ctx_mean = torch.zeros(d, device=self.device)  # contexts are standardised as (x - mean) / std
        self.ctx_std = torch.ones(d, device=self.device)

    def set_context_scaling(self, mean: Any, std: Any) -> None:
        """Standardise contexts by `mean` and `std` [D] (a table's training rows: the arena sets them at birth;
        they travel with the member, so a deployed policy takes raw features)."""
        self.ctx_mean = torch.as_tensor(mean, dtype=torch.float32, device=self.device).clone()
        self.ctx_std = torch.as_tensor(std, dtype=torch.float32, device=self.device).clone()

    def network_obs_spec(self, name: str) -> ObsSpec:
        d = self.obs_spec.vector_dim
        width = input_width(d, self.action_dim, self.hp.arm_features)
        return ObsSpec(gym.spaces.Box(-np.inf, np.inf, shape=(width,), dtype=np.float32))

    def network_io(self, name: str) -> tuple[int, int]:
        """The value network reads (context, arm) inputs wider than the context by the arm's part, and has one output."""
        d = self.obs_spec.vector_dim
        return input_width(d, self.action_dim, self.hp.arm_features) - d, 1

    def batch_key(self) -> tuple:
        return self._group_key(self.hp.arm_features, self.hp.max_grad_norm, self.obs_norm is not None)

    @abstractmethod
    def pull_scores(self, group: NeuralBanditGroup, ctx: torch.Tensor) -> torch.Tensor:
        """The scores [K, N, A] whose argmax each member pulls (drawing from the group's keyed stream)."""

    # ---- S: the gradient second moments -----------------------------------------------------------------
    def _blocks(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """`flat` (laid out as the value network's parameters) as views by parameter name."""
        return self.layouts["value"].views(flat)

    def apply_architecture(self, arch: Any) -> list[str]:
        old = {n: t.clone() for n, t in self._blocks(self.sq_grads).items()}
        kept = super().apply_architecture(arch)
        self.sq_grads = torch.zeros_like(self.optimizers["value"].flat)
        with torch.no_grad():
            for name, block in self._blocks(self.sq_grads).items():
                if name in old:
                    copy_overlap(block, old[name])
        return kept

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {"sq_grads": self.sq_grads, "regret": torch.tensor([self.regret], dtype=torch.float64),
                "ctx_mean": self.ctx_mean, "ctx_std": self.ctx_std}

    def load_extra_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """S, the regret and the context scaling from a checkpoint, each checked in the float32 the member computes
        in (a float64 1e300 is finite as stored and inf once cast): a ValueError names the tensor."""
        sq = tensors.get("sq_grads")
        want = self.optimizers["value"].flat.shape
        if sq is None or tuple(sq.shape) != tuple(want):
            raise ValueError(f"extra/sq_grads: {None if sq is None else tuple(sq.shape)} where the network's "
                             f"parameters need {tuple(want)}")
        sq = _as_float32(sq, "sq_grads")
        if not bool(torch.isfinite(sq).all()) or bool((sq < 0).any()):
            raise ValueError("extra/sq_grads: sums of squares must be finite and non-negative (as float32)")
        self.sq_grads = sq.to(self.device).clone()
        regret = tensors.get("regret")
        if regret is not None:
            if regret.numel() != 1 or not bool(torch.isfinite(regret).all()):
                raise ValueError("extra/regret: one finite number")
            self.regret = float(regret.reshape(()))
        d = self.obs_spec.vector_dim
        mean, std = tensors.get("ctx_mean"), tensors.get("ctx_std")
        for name, t in (("ctx_mean", mean), ("ctx_std", std)):
            if t is not None and (tuple(t.shape) != (d,) or not bool(torch.isfinite(_as_float32(t, name)).all())):
                raise ValueError(f"extra/{name}: {d} finite numbers as float32 (one per context feature)")
        if std is not None and bool((_as_float32(std, "ctx_std") < STD_FLOOR).any()):
            raise ValueError(f"extra/ctx_std: every scale must be at least {STD_FLOOR:g} (the floor a table's split "
                             f"gives a feature's std; a smaller one makes every score and width NaN), found "
                             f"{float(std.min()):.3g}")
        if mean is not None and std is not None:
            mean, std = _as_float32(mean, "ctx_mean"), _as_float32(std, "ctx_std")
            if not bool(torch.isfinite(mean / std).all()):
                raise ValueError("extra/ctx_mean, extra/ctx_std: a mean over its scale overflows float32, so a zero "
                                 "context would standardise to inf")
            self.set_context_scaling(mean, std)


class NeuralUCB(NeuralBandit):
    """Pull argmax_a f(x, a) + gamma * sigma(x, a)."""

    name: ClassVar[str] = "neural_ucb"
    hp_model = NeuralUCBHyperparameters
    exploration_field = "gamma"

    def pull_scores(self, group: NeuralBanditGroup, ctx: torch.Tensor) -> torch.Tensor:
        f, sigma = group.sigma(ctx)
        return f + group.scale.view(-1, 1, 1) * sigma


class NeuralTS(NeuralBandit):
    """Pull argmax_a of a draw from N(f(x, a), (nu * sigma(x, a))^2), each member from its own keyed stream."""

    name: ClassVar[str] = "neural_ts"
    hp_model = NeuralTSHyperparameters
    exploration_field = "nu"

    def pull_scores(self, group: NeuralBanditGroup, ctx: torch.Tensor) -> torch.Tensor:
        f, sigma = group.sigma(ctx)
        return f + group.scale.view(-1, 1, 1) * sigma * group.stream.normal(ctx.shape[1], group.arms)


class NeuralEpsilonGreedy(NeuralBandit):
    """The baseline: a uniformly random arm with probability epsilon, else argmax_a f(x, a); no bonus, no S."""

    name: ClassVar[str] = "neural_eps_greedy"
    hp_model = NeuralEpsilonGreedyHyperparameters
    exploration_field = "epsilon"

    def pull_scores(self, group: NeuralBanditGroup, ctx: torch.Tensor) -> torch.Tensor:
        k, n, _ = ctx.shape
        f = group.scores(group.every_arm(ctx)).view(k, n, group.arms)
        u = group.stream.uniform(n, 1 + group.arms)
        explore = u[..., :1] < group.scale.view(-1, 1, 1)
        return torch.where(explore, u[..., 1:], f)  # a random arm: the argmax of uniforms
