"""Population-batched learning: K members of one algorithm and one architecture learn in one call.

A :class:`MemberGroup` holds the K members' flat buffers (weights, Adam moments, target weights) as [K, P]
states with the member axis first, member i's buffer as row i (stacked once at the start of a training phase: one
copy when no member is padded), and reads every layer of all K networks as a [K, out, in] view of the columns it
occupies (:mod:`agilerl_core.networks.stacked`), so every forward, hand-written backward, Adam step and target
update is one op for the whole group instead of K. Hyperparameters that differ between members
(learning rates, gamma, tau, batch size...) are per-member tensors; every random draw (minibatches, action
samples, exploration noise) is taken for the whole group at once from counter-based streams keyed per member
(:mod:`agilerl_core.rng`), so a member's training is the same maths as when it trains alone (equal up to float
rounding: tests check it).

The state persists: a group of one shape *adopts* its members, re-pointing each member's buffers (and the
parameters of its networks) to its row of the group's state, so a member is a slice of the group and nothing is
copied back at the end of a phase. The next group of the same members in the same order (the evaluation after a
training phase, the next phase) finds them already rows of one state and uses it as it is: no copy at all. A
group that pads narrower members keeps copies and :meth:`MemberGroup.write_back` returns them at the end, so
checkpoints, mutation and cloning always read a member's own buffers.

Which members may share a group is each algorithm's call (:meth:`RLAlgorithm.batch_key`): equal keys mean
equal network shapes and the same structural options. Members that cannot batch train one by one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import torch

from agilerl_core.algorithms.group_state import StackedAdam, group_state, repoint, unstack_into
from agilerl_core.buffers.replay import n_step_return
from agilerl_core.networks.evolvable import Layout
from agilerl_core.networks.obs_norm import StackedObsNorm
from agilerl_core.networks.stacked import StackedNetwork
from agilerl_core.rng import SALT_NOISE, SALT_SAMPLE, KeyedStream, MemberDraws, member_keys
from agilerl_core.train_metrics import MetricSums


class MemberGroup(ABC):
    """K agents' networks stacked for one training phase: the online networks with their Adam states and
    the target networks. Subclasses (one per algorithm family) add the batched acting and learning maths."""

    metrics_every: ClassVar[int] = 1
    """Measure the diagnostics (:attr:`metrics`) of one learn step in this many."""

    def __init__(self, agents: Sequence) -> None:
        self.agents = list(agents)
        self.k = len(self.agents)
        first = self.agents[0]
        self.device = first.device
        self._consts: dict[tuple, torch.Tensor] = {}
        self.activation = first.arch.activation
        # every member's env steps at the start, on the device: a group's members step together, so the phase's
        # schedules (epsilon, warm-up) read them as these plus the steps the first member took since
        self._steps0 = torch.tensor([float(a.env_steps) for a in self.agents], dtype=torch.float64, device=self.device)
        self._first0 = first.env_steps
        norms = [getattr(a, "obs_norm", None) for a in self.agents]
        self.obs_norm = None if norms[0] is None else StackedObsNorm(norms, self.device)
        self.adams = {n: StackedAdam(*spec) for n, spec in self.stacked_optimizers().items()}
        self.targets: dict[str, torch.Tensor] = {}
        self._stream: KeyedStream | None = None
        self._draws: dict[int, MemberDraws] = {}
        self._target_sources = self.stacked_targets()
        self.metrics = MetricSums(self.k, self.device, self.metrics_every)  # the phase's diagnostics, on the device
        for t, (online, flats) in self._target_sources.items():
            adam = self.adams[online]
            self.targets[t], adopt = group_state(flats, adam.shapes, adam.padded, adam.networks)
            if adopt:
                for a, buffer, row in zip(self.agents, flats, self.targets[t], strict=True):
                    if buffer is not row:
                        repoint(a.built_parameters(), buffer, row)
                        a.set_target_buffer(t, row)

    def stacked_optimizers(self) -> dict[str, tuple]:
        """What to stack: name -> :class:`StackedAdam`'s arguments (each member's Adam, each member's
        parameter shapes[, networks per member]). Default: every online network, one stacked Adam each."""
        return {n: ([a.optimizers[n] for a in self.agents], [a.param_shapes(n) for a in self.agents])
                for n in self.agents[0].online_networks}

    def stacked(self, layouts: Sequence[Layout], flat: torch.Tensor, padded: Sequence[tuple[int, ...]],
                trainable: bool = False) -> StackedNetwork:
        """The members' networks of `layouts` over the stacked state `flat` (:class:`StackedNetwork`), normalising
        observations through the group's statistics when its members do."""
        return StackedNetwork(layouts, flat, padded, trainable, self.obs_norm)

    def stacked_targets(self) -> dict[str, tuple[str, list[torch.Tensor]]]:
        """Target name -> (the stacked Adam it follows, each member's flat target buffer, laid out as that
        Adam's). Default: every target network."""
        return {t: (online, [a.target_flat[t] for a in self.agents])
                for t, online in self.agents[0].target_networks.items()}

    @staticmethod
    def joined(obs: Sequence) -> dict[str, torch.Tensor]:
        """Every member's observations (one batch each, the same size) as one member-major batch [K * N, ...]."""
        return {key: torch.cat([o[key] for o in obs]) for key in obs[0]}

    def const(self, values: Sequence, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """`values` as a tensor on the group's device, made once per distinct value: a step's plan (who steps, the
        batch sizes) reused without a host-to-device copy per step."""
        key = (tuple(values), dtype)
        t = self._consts.get(key)
        if t is None:
            t = self._consts[key] = torch.tensor(key[0], dtype=dtype, device=self.device)
        return t

    def env_steps(self) -> torch.Tensor:
        """Every member's env steps so far [K] (float64, on the device; no host list per step)."""
        return self._steps0 + float(self.agents[0].env_steps - self._first0)

    def hp_tensor64(self, name: str, default: float = 0.0) -> torch.Tensor:
        """Hyperparameter `name` of every member (`default` where it has none), [K] float64: a schedule computed
        on the device as a member computes it on the host."""
        return torch.tensor([float(getattr(a.hp, name, default)) for a in self.agents], dtype=torch.float64,
                            device=self.device)

    def observe(self, obs: dict[str, torch.Tensor]) -> None:
        """Fold every member's training observations (member-major [K * B, ...], or [K, B, ...]) into its
        normalisation statistics at once (a no-op unless normalize_obs)."""
        if self.obs_norm is None:
            return
        spec = self.agents[0].obs_spec
        vector, _ = spec.preprocess({p.key: obs[p.key].reshape(-1, *p.shape) for p in spec.parts})
        self.obs_norm.update(vector.view(self.k, -1, vector.shape[-1]))

    def hp_tensor(self, name: str) -> torch.Tensor:
        """Hyperparameter `name` of every member, [K] float32."""
        return torch.tensor([float(getattr(a.hp, name)) for a in self.agents], dtype=torch.float32,
                            device=self.device)

    @torch.no_grad()
    def update_targets(self, weight: Sequence[float]) -> None:
        """Move every target towards its online network by each member's `weight` (host floats, one per
        member: tau, 1 for a hard copy, 0 to leave it)."""
        w = [float(x) for x in weight]
        per_member = None if min(w) == max(w) else torch.tensor(w, dtype=torch.float32, device=self.device)
        for tname, flat in self.targets.items():
            adam = self.adams[self._target_sources[tname][0]]
            if per_member is None:  # one weight for all (every member active at one tau): a scalar lerp
                if w[0] != 0.0:
                    flat.lerp_(adam.flat, w[0])
            else:
                flat.lerp_(adam.flat, per_member.unsqueeze(1))

    def hp_list(self, name: str) -> list[float]:
        """Hyperparameter `name` of every member as host floats."""
        return [float(getattr(a.hp, name)) for a in self.agents]

    @property
    def stream(self) -> KeyedStream:
        """The group's random draws for this phase (exploration, action samples, shuffles): each member's from a
        key drawn from its own generator when the phase starts (:meth:`begin_phase`, or the first draw), so a
        member draws the same values alone or in any group."""
        if self._stream is None:
            self.begin_phase()
        return self._stream

    def begin_phase(self) -> None:
        """A training phase starts: every member draws its phase key from its own generator."""
        self._stream = KeyedStream(member_keys([a.torch_gen for a in self.agents], self.device))

    def member_draws(self, salt: int) -> MemberDraws:
        """The group's draws of one per-member kind (:data:`~agilerl_core.rng.SALT_SAMPLE`, ...) this phase."""
        if salt not in self._draws:
            self._draws[salt] = MemberDraws(self.stream.keys, salt)
        return self._draws[salt]

    def begin_acting(self, num_envs: int) -> None:
        """Called before acting in `num_envs` fresh envs per member (recurrent members zero their state,
        noise processes start at 0). Default: nothing to do."""
        return None

    # the acting protocol: what training, evaluation and Policy.predict call (a member acts as a group of one)
    @abstractmethod
    def greedy(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Every member's greedy actions [K, N(, A)] (agent scale) for member-major observations [K * N, ...] in
        one forward (`mask` [K * N, A]: allowed actions; `starts` [K, N]: envs that begin an episode, for
        recurrent members)."""

    @abstractmethod
    def explore_group(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """Every member's exploration actions [K, N(, A)] (agent scale, on the device) for member-major
        observations, drawn from :attr:`stream`: what it does while it collects experience."""

    @torch.no_grad()
    def write_back(self) -> None:
        """Every member's weights, Adam state and targets back into its own buffers (end of the phase): a copy
        only where the group padded a member (an adopted member's buffers are its rows already)."""
        for adam in self.adams.values():
            adam.write_back()
        if self.obs_norm is not None:
            self.obs_norm.write_back()
        for tname, flat in self.targets.items():
            online, flats = self._target_sources[tname]
            adam = self.adams[online]
            unstack_into(flat, flats, adam.shapes, adam.padded, adam.networks)


class ReplayGroup(MemberGroup):
    """A group of off-policy members: each gradient step draws every member's own minibatch from the shared
    replay buffer. Their steps are many and cheap: diagnostics are measured on one in 32 (the loss, every step's,
    is the arena's)."""

    metrics_every: ClassVar[int] = 32

    def returns(self, batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's return [K, B] and bootstrap discount [K, B] (or [K, 1]) at its member's own gamma
        (`self.gamma` [K], set by the subclass; see
        :func:`~agilerl_core.buffers.replay.n_step_return`)."""
        return n_step_return(batch, self.gamma.unsqueeze(1), k)

    def episodes_done(self, done: torch.Tensor) -> None:
        """After a group step: the episodes that ended (`done` [K * N] on the device), for exploration state
        the group keeps (OU noise). Default: nothing to do."""
        return None

    def learn_step(self, buffer, slots: Sequence[int], active: Sequence[bool]) -> torch.Tensor:
        """One gradient step of every active member on its own uniform minibatch from the committed buffer plus
        its slot's fresh data: every member's rows in one keyed draw (member i's from its own key, counted by its
        own learn steps) and one gather. Returns each member's loss [K] (0 for members that sat out).
        Prioritised replay draws its own way (:class:`~agilerl_core.algorithms.dqn.group.DQNGroup`)."""
        sizes = [a.hp.batch_size if on else 0 for a, on in zip(self.agents, active, strict=True)]
        who = self.const(active, torch.bool)
        draw = self.member_draws(SALT_SAMPLE)
        rows = buffer.sample_rows_group(list(slots), lambda bound: draw.below(who, max(sizes), bound))
        stacked = StackedRows.of_matrix(rows, sizes, self.device, self.const(sizes))
        return self.learn(self.batch(buffer, stacked.index), stacked)

    def batch(self, buffer, index: torch.Tensor):
        """The transitions at storage rows `index` as :meth:`learn` takes them."""
        return buffer.transitions(index)

    def member_noise(self, rows: StackedRows, who: Sequence[bool], dim: int) -> torch.Tensor:
        """Standard normal noise [K, B, dim]: each member in `who` draws its own rows' worth from its keyed
        draws (one op for the group; a member's values do not depend on its group), zeros elsewhere."""
        take = torch.tensor(list(who), device=self.device)
        eps = self.member_draws(SALT_NOISE).normal(take, rows.b * dim).view(rows.k, rows.b, dim)
        return eps * (rows.valid & take.unsqueeze(1)).unsqueeze(2)

    @abstractmethod
    def learn(self, batch, rows: StackedRows) -> torch.Tensor:
        """One step on `batch` (every field [K * B, ...], member-major, see :class:`StackedRows`); returns
        each member's loss [K]."""

    def rows_in(self, batch) -> int:
        """How many transitions `batch` holds."""
        return batch.reward.shape[0]

    def learn_batch(self, batch) -> torch.Tensor:
        """One step on a given member-major batch (every member's rows the same count, uniform weights, or
        `batch.weight` as importance weights): what a test or a caller holding its own batches uses. Returns
        each member's loss [K]."""
        b = self.rows_in(batch) // self.k
        rows = [torch.arange(i * b, (i + 1) * b) for i in range(self.k)]
        weight = getattr(batch, "weight", None)
        importance = None if weight is None else list(weight.view(self.k, b))
        return self.learn(batch, StackedRows(rows, self.device, importance))


def actor_turns(agents: Sequence, active: Sequence[bool], policy_freq: Sequence[int]) -> list[bool]:
    """Count a critic step for every `active` member; which of them also take their (delayed) actor step."""
    turns = []
    for a, on, freq in zip(agents, active, policy_freq, strict=True):
        a.learn_steps += int(on)
        turns.append(bool(on) and a.learn_steps % freq == 0)
    return turns


def gradients(loss: torch.Tensor, *parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The gradient of `loss` for each part (a network's leaf blocks, :attr:`StackedNetwork.leaves`, or any
    list of leaves [K, ...]), laid out as the part's stacked state: [K, P], each leaf's gradient flattened per row
    and the leaves side by side in the part's order. A block the loss does not reach gets zeros."""
    leaves = [t for part in parts for t in part]
    grads = torch.autograd.grad(loss, leaves, materialize_grads=True)
    out, i = [], 0
    for part in parts:
        out.append(torch.cat([g.reshape(g.shape[0], -1) for g in grads[i: i + len(part)]], dim=1))
        i += len(part)
    return out


def clipped_step(adam: StackedAdam, max_grad_norm: float | None, active: torch.Tensor | None, measure: bool = True
                 ) -> torch.Tensor | None:
    """Clip each member's gradient to `max_grad_norm` (when set), then step (the `active` members). Returns each
    member's gradient norm before clipping [K] (a diagnostic: no host read) when clipping computed it or `measure`
    asks for it, else None."""
    norm = adam.clip_grad_norm(max_grad_norm) if max_grad_norm is not None else \
        adam.grad_norm() if measure else None
    adam.step(active)
    return norm


class StackedRows:
    """Each member's own minibatch rows of one learn step, padded to the largest batch: the storage rows
    [K * B] (padding repeats row 0 of the member's draw) and each row's weight in its member's mean loss
    [K, B] (1 / batch size, times the row's importance weight under prioritised replay; 0 on padding and for
    members that sit the step out)."""

    def __init__(self, rows: Sequence[torch.Tensor | None], device: torch.device,
                 importance: Sequence[torch.Tensor | None] | None = None) -> None:
        counts = [0 if r is None else r.shape[0] for r in rows]
        b, k = max(counts), len(rows)
        self.all_active = all(counts)
        if self.all_active and min(counts) == b:  # the common case: one batch size, nobody sitting out
            idx = torch.stack(list(rows)).to(device)
            weight = torch.full((k, b), 1.0 / b, device=device)
        else:
            idx = torch.zeros(k, b, dtype=torch.long, device=device)
            weight = torch.zeros(k, b, device=device)
            for i, (r, n) in enumerate(zip(rows, counts, strict=True)):
                if n:
                    idx[i, :n] = r
                    weight[i, :n] = 1.0 / n
        if importance is not None:
            for i, w in enumerate(importance):
                if w is not None:
                    weight[i, : counts[i]] *= w.to(device)
        self.k, self.b = k, b
        self.counts = counts
        self.index = idx.view(-1)
        self.weight = weight
        self.who = [n > 0 for n in counts]  # which members step
        self._device = device
        self._active: torch.Tensor | None = None
        self._valid: torch.Tensor | None = None

    @classmethod
    def of_matrix(cls, index: torch.Tensor, counts: Sequence[int], device: torch.device,
                  count: torch.Tensor | None = None) -> StackedRows:
        """Rows drawn for every member at once: `index` [K, B] storage rows, member i's first ``counts[i]``
        real (the rest weigh 0); `count`: `counts` already on the device."""
        rows = cls.__new__(cls)
        k, b = index.shape
        rows.k, rows.b, rows.counts = k, b, list(counts)
        rows.all_active = all(rows.counts)
        rows.who = [n > 0 for n in rows.counts]
        count = torch.tensor(rows.counts, device=device) if count is None else count
        real = torch.arange(b, device=device) < count.unsqueeze(1)
        rows.index, rows.weight = index.reshape(-1), real / count.clamp(min=1).unsqueeze(1)
        rows._device, rows._active, rows._valid = device, None, real
        return rows

    @property
    def valid(self) -> torch.Tensor:
        """[K, B] bool: which rows are real (not padding)."""
        if self._valid is None:
            self._valid = torch.arange(self.b, device=self._device) < torch.tensor(self.counts, device=self._device
                                                                                    ).unsqueeze(1)
        return self._valid

    @property
    def active(self) -> torch.Tensor:
        """:attr:`who` as a bool tensor [K] (made on first use: most steps have everyone active)."""
        if self._active is None:
            self._active = torch.tensor(self.who, device=self._device)
        return self._active
