"""Preallocated ring replay buffer shared by a population.

Shared-experience semantics (see DESIGN.md): during a generation, member i samples from the buffer as
committed at the end of the previous generation plus its *own* fresh transitions, which it writes to
its own staging slot. At the commit, the shards are appended to the ring in member order. Slots are
disjoint, so members can train in threads without ever seeing each other's fresh data.

A slot holds at most `capacity` rows (only the newest `capacity` transitions can survive the commit): when
a generation brings more, the slot is a ring that keeps its newest rows, and the member samples those. The
memory is checked before every allocation (:mod:`agilerl_core.buffers.memory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from agilerl_core.buffers.memory import check_replay_fits, slot_rows
from agilerl_core.envs.spaces import ActionSpec, MultiAgentSpec, Obs, ObsSpec

if TYPE_CHECKING:
    from agilerl_core.buffers.frame_format import FramePart


class Transition(NamedTuple):
    """A batch of transitions (leading batch dim on every tensor)."""

    obs: Obs
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: Obs
    terminated: torch.Tensor
    next_action_mask: torch.Tensor | None = None
    step_rewards: torch.Tensor | None = None  # n-step transitions: r_t .. r_{t+n-1}, zero past L ([B, n])
    length: torch.Tensor | None = None  # n-step transitions: their horizon L ([B]; None: one step)
    index: torch.Tensor | None = None  # storage rows sampled
    weight: torch.Tensor | None = None  # prioritised replay: importance-sampling weights


def n_step_return(batch: Transition, gamma: float | torch.Tensor, k: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | float]:
    """(return, bootstrap discount) of each row at the learner's own `gamma`: (r, gamma) for one-step rows,
    (sum_{i<L} gamma^i r_{t+i}, gamma^L) for n-step rows, from their stored per-step rewards, so members
    whose gamma evolved apart still learn from one shared buffer. With `k` (a stacked group: gamma [K, 1],
    rows K x B) both come back as [K, B]."""
    if batch.step_rewards is None:
        return (batch.reward if k is None else batch.reward.view(k, -1)), gamma
    rewards, length = batch.step_rewards, batch.length
    if k is not None:
        rewards, length = rewards.view(k, -1, rewards.shape[-1]), length.view(k, -1)
    g = torch.as_tensor(gamma, dtype=torch.float32, device=rewards.device)
    powers = g.unsqueeze(-1) ** torch.arange(rewards.shape[-1], device=rewards.device, dtype=torch.float32)
    return (rewards * powers).sum(-1), g ** length


@dataclass(frozen=True)
class FieldSpec:
    """Shape (of one transition) and dtype of a stored field."""

    shape: tuple[int, ...]
    dtype: torch.dtype


Shard = dict[str, torch.Tensor]
FRAMES_PREFIX = "frames."  # a shard's frame pools (not row-aligned): see agilerl_core.buffers.frames


def shard_rows(shard: Shard) -> int:
    """Transitions a shard holds: the length of its row-aligned fields (a frame-stacked buffer's shards also
    carry frame pools, ``frames.<part>``, whose length is their frame count)."""
    for name, t in shard.items():
        if not name.startswith(FRAMES_PREFIX):
            return int(t.shape[0])
    return 0


def transition_fields(obs_spec: ObsSpec, action_mask_dim: int | None = None, action_spec: ActionSpec | None = None,
                      n_step: int = 1) -> dict[str, FieldSpec]:
    """Stored fields of a transition over `obs_spec` (discrete actions unless `action_spec` is a Box;
    `n_step` > 1 adds each transition's per-step rewards and horizon: each learner discounts them with its
    own gamma)."""
    fields = {}
    for prefix in ("obs", "next_obs"):
        for p in obs_spec.parts:
            fields[f"{prefix}.{p.key}"] = FieldSpec(tuple(p.shape), p.dtype)
    if action_spec is not None and not action_spec.discrete:
        fields["action"] = FieldSpec((action_spec.dim,), torch.float32)
    else:
        fields["action"] = FieldSpec((), torch.int64)
    fields["reward"] = FieldSpec((), torch.float32)
    fields["terminated"] = FieldSpec((), torch.float32)
    if action_mask_dim is not None:
        fields["next_action_mask"] = FieldSpec((action_mask_dim,), torch.bool)
    if n_step > 1:
        fields["step_rewards"] = FieldSpec((n_step,), torch.float32)
        fields["length"] = FieldSpec((), torch.float32)
    return fields


def multi_agent_fields(spec: MultiAgentSpec) -> dict[str, FieldSpec]:
    """Stored fields of a multi-agent transition: per agent obs, next_obs, action, reward, terminated, acted,
    and for a Discrete agent its action masks on obs and next_obs (what the actor and the target actor may
    choose among)."""
    fields = {}
    for a in spec.agents:
        part = spec.obs[a].parts[0]
        fields[f"obs.{a}"] = FieldSpec(tuple(part.shape), part.dtype)
        fields[f"next_obs.{a}"] = FieldSpec(tuple(part.shape), part.dtype)
        act = spec.actions[a]
        fields[f"action.{a}"] = FieldSpec((), torch.int64) if act.discrete else FieldSpec((act.dim,), torch.float32)
        for name in ("reward", "terminated", "acted"):
            fields[f"{name}.{a}"] = FieldSpec((), torch.float32)
        if act.discrete:
            fields[f"mask.{a}"] = FieldSpec((act.dim,), torch.bool)
            fields[f"next_mask.{a}"] = FieldSpec((act.dim,), torch.bool)
    return fields


AgentTensors = dict[str, torch.Tensor]


class MultiAgentBatch(NamedTuple):
    """A batch of multi-agent transitions: every field a dict keyed by agent id (leading batch dim); `acted`
    is 1 where the agent acted (0 once it is out of its episode)."""

    obs: AgentTensors
    action: AgentTensors
    reward: AgentTensors
    next_obs: AgentTensors
    terminated: AgentTensors
    acted: AgentTensors
    mask: AgentTensors | None = None  # Discrete agents' action masks on obs (None or a missing agent: all allowed)
    next_mask: AgentTensors | None = None  # ... and on next_obs

    @classmethod
    def from_fields(cls, fields: dict[str, torch.Tensor], agents: tuple[str, ...]) -> MultiAgentBatch:
        """Gathered buffer fields (``obs.<agent>``, ...) regrouped by field."""
        def pick(prefix: str) -> AgentTensors:
            return {a: fields[f"{prefix}.{a}"] for a in agents}

        def masks(prefix: str) -> AgentTensors:
            return {a: fields[f"{prefix}.{a}"] for a in agents if f"{prefix}.{a}" in fields}
        return cls(pick("obs"), pick("action"), pick("reward"), pick("next_obs"), pick("terminated"), pick("acted"),
                   masks("mask"), masks("next_mask"))

    def agent_mask(self, agent: str, following: bool = False) -> torch.Tensor | None:
        """Agent `agent`'s action mask on obs (on next_obs when `following`), None when it has none."""
        masks = self.next_mask if following else self.mask
        return None if masks is None else masks.get(agent)


class ReplayBuffer:
    """Ring buffer of `capacity` committed transitions plus `slots` staging areas for fresh ones."""

    frame_parts: Mapping[str, FramePart] = {}  # image parts stored frame by frame (FrameReplayBuffer)

    def __init__(self, fields: dict[str, FieldSpec], capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.fields = dict(fields)
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.size = 0  # committed transitions held
        self.pos = 0  # next ring index to write
        self.slot_capacity = 0  # fresh transitions a slot may take in a generation
        self.slot_rows = 0  # rows a slot holds: min(slot_capacity, capacity), a ring of its newest rows
        self._staged: list[int] = []  # rows of each slot its member may sample (<= slot_rows)
        self._written: list[int] = []  # transitions added to each slot since it was emptied (>= _staged)
        # made once per group of slots (one entry each: groups training in threads never share one), emptied with
        # the staging: a group step's write rows (_write_group), a group draw's staging offsets (_slot_offset)
        self._targets: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._offsets: dict[tuple, tuple[int, torch.Tensor]] = {}
        check_replay_fits(self.fields, self.capacity, 0, 0, self.device, "replay buffer", frames=self.frame_parts)
        self._storage = self._alloc(self.capacity)
        self._obs_keys = [k.split(".", 1)[1] for k in fields if k.startswith("obs.")]

    def _alloc(self, rows: int) -> dict[str, torch.Tensor]:
        return {k: torch.zeros((rows, *f.shape), dtype=f.dtype, device=self.device) for k, f in self.fields.items()}

    # ---- staging -------------------------------------------------------------------------------------
    def reserve_staging(self, slots: int, slot_capacity: int) -> None:
        """Make room for `slots` members' fresh data of up to `slot_capacity` transitions each (a slot holds
        at most `capacity` rows: the newest, see :meth:`add`). Raises a ConfigError before allocating when
        the buffer would not fit the device's memory."""
        rows = slot_rows(self.capacity, slot_capacity)
        self._targets.clear()  # (between generations: no group is training)
        self._offsets.clear()
        if slots == len(self._staged) and rows <= self.slot_rows:
            self.slot_capacity = max(self.slot_capacity, int(slot_capacity))
            self._staged, self._written = [0] * slots, [0] * slots
            return
        keep = self.size > 0  # committed rows to carry over (else the old ring is dropped before allocating)
        largest = max((t.numel() * t.element_size() for t in self._storage.values()), default=0)
        check_replay_fits(self.fields, self.capacity, slots, slot_capacity, self.device, "replay buffer staging",
                          held_bytes=self.memory_bytes, copy_bytes=largest if keep else 0, frames=self.frame_parts)
        total = self.capacity + slots * rows
        for k, f in self.fields.items():  # one field at a time: the old and new storage overlap by one field
            old = self._storage.pop(k)
            if not keep:
                del old
            new = torch.zeros((total, *f.shape), dtype=f.dtype, device=self.device)
            if keep:
                new[: self.capacity] = old[: self.capacity]
                del old
            self._storage[k] = new  # re-inserted in field order
        self.slot_capacity = int(slot_capacity)
        self.slot_rows = rows
        self._staged, self._written = [0] * slots, [0] * slots

    @property
    def staging_rows(self) -> int:
        """Rows allocated for staging: slots x slot_rows."""
        return len(self._staged) * self.slot_rows

    def staged_count(self, slot: int) -> int:
        """Rows of member `slot`'s staging area it may sample (at most :attr:`slot_rows`)."""
        return self._staged[slot]

    def written_count(self, slot: int) -> int:
        """Transitions added to member `slot`'s staging area since it was emptied: beyond
        :attr:`slot_rows`, the slot's row ``i % slot_rows`` holds the newest of them."""
        return self._written[slot]

    def add(self, slot: int, data: dict[str, torch.Tensor]) -> None:
        """Append a whole vectorised step (leading dim = num_envs) to member `slot`'s staging area. Past
        :attr:`slot_rows` rows it wraps around, overwriting the slot's oldest rows."""
        self._write(slot, data)

    def _write(self, slot: int, data: dict[str, torch.Tensor]) -> None:
        """:meth:`add` of rows as stored (every field of :attr:`fields`)."""
        n = next(iter(data.values())).shape[0]
        written = self._written[slot]
        if written + n > self.slot_capacity:
            raise RuntimeError(f"staging slot {slot} is full ({self.slot_capacity} transitions); "
                               f"reserve_staging with a larger slot_capacity")
        rows = self.slot_rows
        base = self.capacity + slot * rows
        if written + n <= rows:  # no wrap (always so when slot_capacity <= capacity)
            for k, t in self._storage.items():
                t[base + written: base + written + n] = data[k]
        else:
            drop = max(0, n - rows)  # only the newest `rows` of this step can stay
            start, m = (written + drop) % rows, n - drop
            first = min(m, rows - start)
            for k, t in self._storage.items():
                src = data[k][drop:]
                t[base + start: base + start + first] = src[:first]
                if first < m:
                    t[base: base + m - first] = src[first:]
        self._written[slot] = written + n
        self._staged[slot] = min(written + n, rows)

    def add_group(self, slots: list[int], data: dict[str, torch.Tensor]) -> None:
        """:meth:`add` for a group's vector step at once: `data` rows member-major (slot ``slots[i]``'s N rows at
        i*N .. i*N+N-1), every slot at the same count (a group steps together): one indexed copy per field."""
        self._write_group(slots, data)

    def _write_group(self, slots: list[int], data: dict[str, torch.Tensor]) -> None:
        """:meth:`add_group` of rows as stored."""
        k = len(slots)
        n = next(iter(data.values())).shape[0] // k
        written = self._written[slots[0]]
        rows = self.slot_rows
        if n > rows or written + n > self.slot_capacity or any(self._written[s] != written for s in slots):
            for i, s in enumerate(slots):  # unusual layouts: slot by slot
                self._write(s, {key: v[i * n: (i + 1) * n] for key, v in data.items()})
            return
        key = (tuple(slots), self.capacity, rows, n)
        cached = self._targets.get(key)  # the step's n rows and where each slot's rows start
        if cached is None:
            cached = self._targets[key] = (torch.arange(n, device=self.device), (
                self.capacity + torch.tensor(slots, dtype=torch.int64, device=self.device) * rows).unsqueeze(1))
        at = ((cached[0] + written) % rows + cached[1]).reshape(-1)
        for key, t in self._storage.items():
            t.index_copy_(0, at, data[key].to(t.dtype))
        for s in slots:
            self._written[s] = written + n
            self._staged[s] = min(written + n, rows)

    def shard(self, slot: int) -> Shard:
        """A copy of member `slot`'s fresh transitions, oldest first (what a process runner ships to
        storage): its newest :attr:`slot_rows` when the slot wrapped."""
        rows = self.slot_rows
        base = self.capacity + slot * rows
        written = self._written[slot]
        if written <= rows:
            n = self._staged[slot]
            return {k: t[base: base + n].clone() for k, t in self._storage.items()}
        head = written % rows  # the oldest row kept
        return {k: torch.cat([t[base + head: base + rows], t[base: base + head]]) for k, t in self._storage.items()}

    def commit(self, shards: list[Shard]) -> None:
        """Append shards to the ring in order, then empty every staging slot."""
        for shard in shards:
            self.extend(shard)
        for s in range(len(self._staged)):
            self.reset_slot(s)

    def extend(self, shard: Shard) -> None:
        """Append transitions to the committed ring, overwriting the oldest when full."""
        n = shard_rows(shard)
        if n == 0:
            return
        if n > self.capacity:  # only the newest `capacity` can survive
            shard = {k: t[n - self.capacity:] for k, t in shard.items()}
            n = self.capacity
        first = min(n, self.capacity - self.pos)
        for k, t in self._storage.items():
            src = shard[k].to(self.device)
            t[self.pos: self.pos + first] = src[:first]
            if first < n:
                t[: n - first] = src[first:]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    # ---- sampling ------------------------------------------------------------------------------------
    def available(self, slot: int | None = None) -> int:
        """Transitions member `slot` may sample: committed plus its own staged ones."""
        return self.size + (self._staged[slot] if slot is not None and self._staged else 0)

    def sample(self, batch_size: int, slot: int | None = None, generator: torch.Generator | None = None) -> Transition:
        """Uniform sample (with replacement) from the committed ring plus `slot`'s staged data."""
        return self.transitions(self.sample_rows(batch_size, slot, generator))

    def sample_rows(self, batch_size: int, slot: int | None = None,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        """Storage rows of a uniform sample (with replacement) from the committed ring plus `slot`'s staged data.
        Draw ``i >= size`` is the slot's row ``i - size``: its rows ``[0, staged)`` are exactly the ones held
        (all of them once the slot wrapped), so the draw is uniform over them whatever their order."""
        staged = self._staged[slot] if slot is not None and self._staged else 0
        n = self.size + staged
        if n == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        idx = torch.randint(0, n, (batch_size,), generator=generator)  # CPU generator: same draws on any device
        if staged:
            offset = self.capacity + slot * self.slot_rows - self.size
            idx = idx + (idx >= self.size) * offset
        return idx if self.device.type == "cpu" else idx.to(self.device)

    def sample_rows_group(self, slots: list[int], draw) -> torch.Tensor:
        """Storage rows [K, B] of every member's uniform minibatch at once: ``draw(bound)`` gives [K, B]
        integers in [0, bound[i]) (bound [K]: member i's committed plus staged rows), mapped as
        :meth:`sample_rows` maps one member's draw."""
        staged = [self._staged[s] if self._staged else 0 for s in slots]
        if self.size + max(staged) == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        # a group's slots stage alike: one bound for all (a scalar, no per-step copy to the device)
        bound = self.size + staged[0] if min(staged) == max(staged) else \
            torch.tensor([self.size + st for st in staged], device=self.device)
        idx = draw(bound)
        if any(staged):
            idx = idx + (idx >= self.size) * self._slot_offset(slots).unsqueeze(1)
        return idx

    def _slot_offset(self, slots: list[int]) -> torch.Tensor:
        """Per slot, what maps a draw past the committed rows onto the slot's staging rows [K] (made once per
        slots and buffer size: it changes at commits only)."""
        key = (tuple(slots), self.capacity, self.slot_rows)
        cached = self._offsets.get(key)
        if cached is None or cached[0] != self.size:
            cached = self._offsets[key] = (self.size, torch.tensor(
                [self.capacity + s * self.slot_rows - self.size for s in slots], device=self.device))
        return cached[1]

    def gather(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every field at storage rows `idx`, by field name (what multi-agent batches are built from)."""
        return {k: t.index_select(0, idx) for k, t in self._storage.items()}

    def transitions(self, idx: torch.Tensor) -> Transition:
        """The transitions at storage rows `idx` (what a sample gathers)."""
        s = self._storage
        obs = {k: s[f"obs.{k}"].index_select(0, idx) for k in self._obs_keys}
        next_obs = {k: s[f"next_obs.{k}"].index_select(0, idx) for k in self._obs_keys}
        mask = s["next_action_mask"].index_select(0, idx) if "next_action_mask" in s else None
        step_rewards = s["step_rewards"].index_select(0, idx) if "step_rewards" in s else None
        length = s["length"].index_select(0, idx) if "length" in s else None
        return Transition(obs, s["action"].index_select(0, idx), s["reward"].index_select(0, idx), next_obs,
                          s["terminated"].index_select(0, idx), mask, step_rewards, length, idx)

    # ---- introspection / persistence -----------------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        """Bytes held by the preallocated storage (committed ring and staging)."""
        return sum(t.numel() * t.element_size() for t in self._storage.values())

    def committed(self) -> Shard:
        """The committed transitions, oldest first (for checkpoints)."""
        if self.size < self.capacity:
            return {k: t[: self.size].clone() for k, t in self._storage.items()}
        return {k: torch.cat([t[self.pos: self.capacity], t[: self.pos]]) for k, t in self._storage.items()}

    def load_committed(self, shard: Shard, pos: int | None = None) -> None:
        """Replace the committed contents with `shard` (oldest first), laid out so that the next write
        goes to ring index `pos` (default: right after the data). Passing the saved :attr:`pos` restores
        the exact ring layout, so sampling continues bit-identically."""
        missing = self.missing_fields(shard)
        if missing:
            raise ValueError(f"buffer data lacks fields {missing}")
        n = min(shard_rows(shard), self.capacity)
        pos = n % self.capacity if pos is None else int(pos)
        if not 0 <= pos < self.capacity or (n < self.capacity and pos != n):
            raise ValueError(f"ring position {pos} does not fit {n} transitions in capacity {self.capacity}")
        self.size = 0
        self.pos = (pos - n) % self.capacity
        self.extend({k: shard[k] for k in self.fields})

    def missing_fields(self, shard: Shard) -> list[str]:
        """Fields this buffer keeps that `shard` lacks (sorted; empty: it loads)."""
        return sorted(set(self.fields) - set(shard))

    def load_shards(self, shards: list[Shard], size: int, pos: int) -> None:
        """Committed contents from consecutive shards (oldest first): their newest `size` rows, laid out so the
        next write goes to ring index `pos` (what a run's storage rebuilds the buffer from)."""
        self.load_committed({k: torch.cat([p[k] for p in shards])[-size:] for k in self.fields}, pos)

    def dead_committed_rows(self) -> torch.Tensor:
        """Committed ring rows written once but no longer held (a frame-stacked buffer drops its oldest rows when
        their frames are overwritten): prioritised replay gives them no mass. None here."""
        return torch.zeros(0, dtype=torch.int64)

    def reset_slot(self, slot: int) -> None:
        """Empty member `slot`'s staging area (before it trains again)."""
        self._staged[slot] = 0
        self._written[slot] = 0
