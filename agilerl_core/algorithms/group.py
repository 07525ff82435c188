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

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace

import torch

from agilerl_core.algorithms.optim import FlatAdam
from agilerl_core.buffers.replay import n_step_return
from agilerl_core.networks.obs_norm import StackedObsNorm
from agilerl_core.networks.stacked import Layers, parameter_blocks
from agilerl_core.rng import SALT_NOISE, SALT_SAMPLE, KeyedStream, MemberDraws, member_keys

_ADAM_STATE = ("flat", "m", "v", "beta1_pow", "beta2_pow")

Shapes = list[tuple[int, ...]]


def param_shapes(net: torch.nn.Module) -> Shapes:
    return [tuple(p.shape) for p in net.parameters()]


def padded_shapes(shapes: Sequence[Shapes]) -> Shapes:
    """Per parameter, the largest extent of each dimension over the members (their common stacked shape)."""
    return [tuple(max(dims) for dims in zip(*per_param, strict=True)) for per_param in zip(*shapes, strict=True)]


def plain_mlp_shape_key(arch) -> str:
    """A plain MLP's architecture without its hidden widths: members that differ only in widths stack, the
    narrower ones zero-padded (see :func:`stack_flats`)."""
    if arch.rnn is not None:  # a recurrent core's hidden size pads like a width (the head reads it)
        arch = replace(arch, rnn=replace(arch.rnn, hidden=0), mlp=replace(arch.mlp, in_dim=0))
    return repr(replace(arch, mlp=replace(arch.mlp, hidden=(0,) * len(arch.mlp.hidden))))


def stack_flats(flats: Sequence[torch.Tensor], shapes: Sequence[Shapes], padded: Shapes, networks: int = 1
                ) -> torch.Tensor:
    """K flat buffers, each laid out parameter by parameter with its member's `shapes` (`networks` M times over,
    network after network), as one [K, P] state: member i's buffer is row i, each parameter padded to its
    `padded` shape (a narrower member's values in the leading corner, zeros around them). Parameter j of all K
    members is then a [K, *shape] view of the columns it occupies (:func:`~agilerl_core.networks.stacked.
    parameter_blocks`).

    Zero padding is exact for plain MLPs: a padded hidden unit has zero in- and out-weights and bias, so
    its activation is act(0) = 0 (relu, tanh, elu, leaky relu) and every gradient reaching a padded weight
    is 0; Adam then never moves it (its moments stay 0 and its bias-correction powers are 0 here, so
    0 / (0 + eps) = 0). The padded members compute exactly what they compute alone."""
    if all(s == padded for s in shapes):  # nothing to pad: each member's buffer is its row
        return torch.stack(list(flats))
    k, net = len(flats), sum(math.prod(shape) for shape in padded)
    out = torch.zeros((k, networks * net), dtype=flats[0].dtype, device=flats[0].device)
    for i, f in enumerate(flats):
        for src, dst in _padded_views(f, out[i], shapes[i], padded, networks):
            dst.copy_(src)
    return out


def unstack_into(stacked: torch.Tensor, flats: Sequence[torch.Tensor], shapes: Sequence[Shapes],
                 padded: Shapes, networks: int = 1) -> None:
    """The inverse of :func:`stack_flats`, in place into `flats` (a member's buffer that is its row already, an
    adopted member, is left as it is)."""
    for i, f in enumerate(flats):
        if shapes[i] == padded:
            if f.data_ptr() != stacked[i].data_ptr():
                f.copy_(stacked[i])
            continue
        for own, row in _padded_views(f, stacked[i], shapes[i], padded, networks):
            own.copy_(row)


def rows_of(flats: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The [K, P] state whose rows 0..K-1 `flats` are, in that order (members a group adopted), else None."""
    base = flats[0]._base
    if base is None or base.dim() != 2 or base.shape[0] != len(flats) or not base.is_contiguous():
        return None
    width = base.shape[1]
    for i, f in enumerate(flats):
        if f._base is not base or tuple(f.shape) != (width,) or f.storage_offset() != base.storage_offset() + i * width:
            return None
    return base


def group_state(flats: Sequence[torch.Tensor], shapes: Sequence[Shapes], padded: Shapes, networks: int = 1
                ) -> tuple[torch.Tensor, bool]:
    """The [K, P] state of K members' buffers: the state they are rows of already (no copy), or a new one
    (:func:`stack_flats`). Returns (state, whether the members may be re-pointed to its rows: every member at
    the padded shape)."""
    whole = all(s == padded for s in shapes)
    base = rows_of(flats) if whole else None
    return (base if base is not None else stack_flats(flats, shapes, padded, networks)), whole


@torch.no_grad()
def repoint(params: Sequence[torch.Tensor], old: torch.Tensor, new: torch.Tensor) -> None:
    """Every parameter of `params` that is a view of buffer `old` becomes the same view of `new` (a buffer laid
    out as `old`, holding the same values): a member's networks then read and train the group's row."""
    ptr, start, n = old.untyped_storage().data_ptr(), old.storage_offset(), old.numel()
    for p in params:
        offset = p.storage_offset() - start
        if p.untyped_storage().data_ptr() == ptr and 0 <= offset < n:
            p.data = new.as_strided(p.shape, p.stride(), new.storage_offset() + offset)


def _padded_views(own: torch.Tensor, row: torch.Tensor, shapes: Shapes, padded: Shapes, networks: int
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each parameter of each network in a member's own buffer and in its padded row: (own view, the leading
    corner of the row's view)."""
    pairs, i, j = [], 0, 0
    for _ in range(networks):
        for shape, big in zip(shapes, padded, strict=True):
            n, m = math.prod(shape), math.prod(big)
            pairs.append((own[i: i + n].view(shape), row[j: j + m].view(big)[tuple(slice(0, d) for d in shape)]))
            i, j = i + n, j + m
    return pairs


def stacked_blocks(flat: torch.Tensor, k: int, padded: Shapes) -> Layers:
    """The (weight [K, out, in], bias [K, out]) blocks of a stacked plain-MLP state [K, P], in layer order."""
    views = parameter_blocks(flat, k, padded)
    return list(zip(views[0::2], views[1::2], strict=True))


class StackedAdam:
    """The Adam states of K members' copies of one network, stacked: one step for the group. Learning rates
    are per member; a member left out of a step (``active``) keeps its weights and moments exactly."""

    def __init__(self, opts: Sequence[FlatAdam], shapes: Sequence[Shapes], networks_per_member: int = 1) -> None:
        """`opts`: each member's Adam; `shapes`: each member's parameter shapes in its flat buffer's order.
        With `networks_per_member` M > 1 each member's Adam steps M networks of those shapes, one after another
        in its buffer (:func:`~agilerl_core.algorithms.optim.stack_parameters`), and gradient clipping is per
        network, as that Adam clips alone. Every state tensor is [K, P]: member i's buffer is row i."""
        first = opts[0]
        if any(o.betas != first.betas or o.eps != first.eps for o in opts):
            raise ValueError("a group's members must share Adam betas and eps")
        self.opts = list(opts)
        self.k = len(opts)
        self.shapes = list(shapes)
        self.padded = padded_shapes(self.shapes)
        self.networks = networks_per_member
        self.betas, self.eps = first.betas, first.eps
        for name in _ADAM_STATE:
            own = [getattr(o, name) for o in opts]
            state, adopt = group_state(own, self.shapes, self.padded, networks_per_member)
            if adopt:  # each member's buffer becomes its row (its networks' parameters with it)
                for o, buffer, row in zip(opts, own, state, strict=True):
                    if buffer is not row:
                        if name == "flat":
                            repoint([p for m in o.modules for p in m.parameters()], buffer, row)
                        setattr(o, name, row)
            setattr(self, name, state)
        self.grad = torch.zeros_like(self.flat)
        device = self.flat.device
        # each element's network (member i's networks are i*M .. i*M+M-1), for per-network clipping
        self._clip_owner = torch.arange(self.k * networks_per_member, device=device).repeat_interleave(
            self.flat.shape[1] // networks_per_member)
        self.lr = torch.tensor([o.lr for o in opts], dtype=torch.float32, device=device)
        self._lr_el = self.lr.unsqueeze(1)

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float, extra: torch.Tensor | None = None) -> None:
        """Scale each member's (network's) gradient to a norm of at most `max_norm` (as FlatAdam.clip_grad_norm
        on its own). `extra` [K, ...]: each member's gradients of parameters outside the stack (PPO's log_std),
        counted in its norm and scaled with it (one network per member only)."""
        owner = self._clip_owner
        sq = torch.zeros(self.k * self.networks, device=self.grad.device).index_add_(0, owner,
                                                                                  (self.grad * self.grad).view(-1))
        if extra is not None:
            if self.networks != 1:
                raise ValueError("extra gradients are clipped with a stack of one network per member")
            sq = sq + extra.reshape(self.k, -1).pow(2).sum(1)
        scale = torch.clamp(max_norm / (sq.sqrt() + 1e-6), max=1.0)
        self.grad.view(self.k * self.networks, -1).mul_(scale.unsqueeze(1))
        if extra is not None:
            extra.mul_(scale.view(self.k, *([1] * (extra.dim() - 1))))

    @torch.no_grad()
    def step(self, active: torch.Tensor | None = None) -> None:
        """One Adam step of every member (`active` None) or of the members where `active` [K] is True."""
        b1, b2 = self.betas
        if active is None:
            self.beta1_pow.mul_(b1)
            self.beta2_pow.mul_(b2)
            self.m.lerp_(self.grad, 1.0 - b1)
            self.v.mul_(b2).addcmul_(self.grad, self.grad, value=1.0 - b2)
            denom = self.v.div(torch.rsub(self.beta2_pow, 1.0)).sqrt_().add_(self.eps)
            self.flat.sub_(self.m.div(torch.rsub(self.beta1_pow, 1.0)).mul_(self._lr_el).div_(denom))
            return
        on = active.unsqueeze(1)
        a = on.to(self.flat.dtype)
        self.beta1_pow.mul_(torch.where(on, b1, 1.0))
        self.beta2_pow.mul_(torch.where(on, b2, 1.0))
        self.m.lerp_(self.grad, a * (1.0 - b1))
        self.v.mul_(1.0 - a * (1.0 - b2)).addcmul_(self.grad * a, self.grad, value=1.0 - b2)
        denom = self.v.div(1.0 - self.beta2_pow).sqrt_().add_(self.eps)
        update = self.m.div(1.0 - self.beta1_pow).mul_(self._lr_el).div_(denom)
        self.flat.sub_(torch.where(on, update, 0.0))  # where: a never-stepped member's 0/0 stays out

    @torch.no_grad()
    def write_back(self) -> None:
        for name in _ADAM_STATE:
            unstack_into(getattr(self, name), [getattr(o, name) for o in self.opts], self.shapes, self.padded,
                         self.networks)


class MemberGroup(ABC):
    """K agents' networks stacked for one training phase: the online networks with their Adam states and
    the target networks. Subclasses (one per algorithm family) add the batched acting and learning maths."""

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
        for t, (online, flats) in self._target_sources.items():
            adam = self.adams[online]
            self.targets[t], adopt = group_state(flats, adam.shapes, adam.padded, adam.networks)
            if adopt:
                for a, buffer, row in zip(self.agents, flats, self.targets[t], strict=True):
                    if buffer is not row:
                        repoint([p for net in a.networks.values() for p in net.parameters()], buffer, row)
                        self.set_target(a, t, row)

    def stacked_optimizers(self) -> dict[str, tuple]:
        """What to stack: name -> :class:`StackedAdam`'s arguments (each member's Adam, each member's
        parameter shapes[, networks per member]). Default: every online network, one stacked Adam each."""
        return {n: ([a.optimizers[n] for a in self.agents], [param_shapes(a.networks[n]) for a in self.agents])
                for n in self.agents[0].online_networks}

    def stacked_targets(self) -> dict[str, tuple[str, list[torch.Tensor]]]:
        """Target name -> (the stacked Adam it follows, each member's flat target buffer, laid out as that
        Adam's). Default: every target network."""
        return {t: (online, [a.target_flat[t] for a in self.agents])
                for t, online in self.agents[0].target_networks.items()}

    @staticmethod
    def set_target(agent, name: str, flat: torch.Tensor) -> None:
        """Make `flat` member `agent`'s buffer of target `name` (one of :meth:`stacked_targets`)."""
        agent.target_flat[name] = flat

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
    replay buffer."""

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


def clipped_step(adam: StackedAdam, max_grad_norm: float | None, active: torch.Tensor | None) -> None:
    """Clip each member's gradient to `max_grad_norm` (when set), then step (the `active` members)."""
    if max_grad_norm is not None:
        adam.clip_grad_norm(max_grad_norm)
    adam.step(active)


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
