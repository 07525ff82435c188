"""Replay of stacked image frames, each frame stored once.

An Atari transition is two stacks of 4 frames (84x84 uint8), ``obs`` and ``next_obs``; consecutive stacks of
one env share all but one frame, and a transition's ``next_obs`` is the next transition's ``obs``. Stored as
rows, 100k transitions take 5.6 GB; stored once per frame, about 1 GB. :class:`FrameReplayBuffer` keeps, for
each frame-stacked image part, a pool of frames and, in every row, the ids of the frames of its two stacks
(``obs.<part>@frames`` and ``next_obs.<part>@frames``, [S] int64); sampling gathers the frames by id.

Frames are deduplicated by content, so the buffer never depends on how a wrapper stacks: when a step's
``obs`` of env e equals the previous step's ``next_obs`` of e, it reuses its ids; when ``next_obs`` is ``obs``
shifted by one frame, one new frame is stored; anything else (an episode's first stack, a wrapper that does
not stack) stores the whole stack. Only the one-step path deduplicates across steps (n-step rows come out of
order, and are built per row).

Pools are rings, one for the committed rows and one per staging slot, of ``rows + ceil(rows * S / 8) + S``
frames (:meth:`FramePart.frame_capacity`): room for an episode's first stack every 8 steps on average. When
episodes are shorter than that, the pool overwrites frames that old rows still use, and those oldest rows are
dropped (the buffer then holds fewer than ``buffer_size`` transitions; one warning says so). Prioritised replay
gives dropped rows no mass.

A shard (what a slot ships to storage and what the committed ring is rebuilt from) is compact too: its rows
with shard-local frame ids, and ``frames.<part>``, the frames they use. Shards of a buffer that stored whole
stacks (an older version) load by compressing them. The parts, the rows' frame-id fields and the shard
functions are :mod:`agilerl_core.buffers.frame_format`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import torch

from agilerl_core.buffers.frame_format import (
    EPISODE_SLACK,
    FRAME_SUFFIX,
    FramePart,
    compress_rows,
    concat_shards,
    frame_fields,
    oldest_frame_ids,
    tail_shard,
)
from agilerl_core.buffers.replay import FRAMES_PREFIX, FieldSpec, ReplayBuffer, Shard, Transition, shard_rows

log = logging.getLogger(__name__)


class _Pool:
    """One part's frames: a ring of `cap_c` for the committed rows, then one ring of `cap_s` per staging slot,
    then one scratch frame (where frames a step does not keep are written). Ids are per-region sequence
    numbers; frame ``q`` of a region sits at ``base + q % cap``."""

    def __init__(self, part: FramePart, cap_c: int, device: torch.device) -> None:
        self.part, self.cap_c, self.cap_s, self.slots = part, cap_c, 0, 0
        self.data = torch.zeros((cap_c + 1, *part.frame_shape), dtype=torch.uint8, device=device)
        self.total_c = 0  # frames written to the committed ring
        self.safe_c = 0  # no committed row uses a frame older than this
        self.total: list[int] = []  # per slot: frames written since the slot was emptied
        self.safe: list[float] = []  # per slot: a lower bound of the ids its live rows use (inf: none)
        self.prev: list[torch.Tensor | None] = []  # per slot: each env's last next_obs ids [N, S]

    @property
    def scratch(self) -> int:
        return self.data.shape[0] - 1

    def resize(self, slots: int, cap_s: int) -> None:
        if (slots, cap_s) != (self.slots, self.cap_s):
            new = torch.zeros((self.cap_c + slots * cap_s + 1, *self.part.frame_shape), dtype=torch.uint8,
                              device=self.data.device)
            new[: self.cap_c] = self.data[: self.cap_c]
            self.data, self.slots, self.cap_s = new, slots, cap_s
        self.total, self.safe, self.prev = [0] * slots, [math.inf] * slots, [None] * slots

    def reset_slot(self, slot: int) -> None:
        self.total[slot], self.safe[slot], self.prev[slot] = 0, math.inf, None

    def slot_positions(self, slots: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Pool rows of staging frames `ids` (slot per leading row)."""
        shape = (-1,) + (1,) * (ids.dim() - 1)
        return self.cap_c + slots.view(shape) * self.cap_s + ids % max(self.cap_s, 1)


class FrameReplayBuffer(ReplayBuffer):
    """A :class:`~agilerl_core.buffers.replay.ReplayBuffer` whose frame-stacked image parts (`parts`, see
    :func:`~agilerl_core.buffers.frame_format.frame_parts`) are stored once per frame. `fields` are the
    transition's fields as :func:`~agilerl_core.buffers.replay.transition_fields` gives them (whole images); the
    rows keep frame ids."""

    def __init__(self, fields: Mapping[str, FieldSpec], capacity: int, parts: Mapping[str, FramePart],
                 device: torch.device | str = "cpu") -> None:
        self.frame_parts = dict(parts)
        stored = frame_fields(fields, parts)
        self.image_fields = {n: f for n, f in fields.items() if n not in stored}
        super().__init__(stored, capacity, device)
        self._obs_keys = [k.split(".", 1)[1] for k in fields if k.startswith("obs.")]
        self.pools = {k: _Pool(p, p.frame_capacity(self.capacity), self.device) for k, p in self.frame_parts.items()}
        self._live_from: list[int] = []  # per slot: the first written index still held (older ones dropped)
        self._dead: list[int] = []  # committed rows dropped for their frames since the last commit
        self._warned = False

    @property
    def memory_bytes(self) -> int:
        return super().memory_bytes + sum(p.data.numel() for p in self.pools.values())

    # ---- staging -------------------------------------------------------------------------------------
    def reserve_staging(self, slots: int, slot_capacity: int) -> None:
        super().reserve_staging(slots, slot_capacity)
        for key, pool in self.pools.items():
            pool.resize(slots, self.frame_parts[key].frame_capacity(self.slot_rows))
        self._live_from = [0] * slots

    def reset_slot(self, slot: int) -> None:
        super().reset_slot(slot)
        for pool in self.pools.values():
            pool.reset_slot(slot)
        self._live_from[slot] = 0

    def add(self, slot: int, data: dict[str, torch.Tensor]) -> None:
        self.add_group([slot], data)

    def add_group(self, slots: list[int], data: dict[str, torch.Tensor]) -> None:
        k = len(slots)
        n = next(iter(data.values())).shape[0] // k
        rows = self._encode(slots, data, n)
        self._write_group(slots, rows)
        for s in slots:
            self._settle_slot(s)

    def _encode(self, slots: list[int], data: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
        """Rows as stored: each frame part's stacks replaced by frame ids, the frames they need written."""
        out = {name: v for name, v in data.items() if name not in self.image_fields}
        k, dev = len(slots), self.device
        slot_t = torch.tensor(slots, device=dev).repeat_interleave(n)
        for key, pool in self.pools.items():
            part, s = self.frame_parts[key], self.frame_parts[key].stack
            x = part.to_frames(data[f"obs.{key}"].to(dev, torch.uint8))  # [M, S, H, W]
            y = part.to_frames(data[f"next_obs.{key}"].to(dev, torch.uint8))
            ar = torch.arange(s, device=dev)
            prev = [pool.prev[sl] if pool.prev[sl] is not None and pool.prev[sl].shape[0] == n else None
                    for sl in slots]
            if any(p is not None for p in prev):
                had = torch.tensor([p is not None for p in prev], device=dev).repeat_interleave(n)
                prev_ids = torch.cat([p if p is not None else torch.zeros(n, s, dtype=torch.int64, device=dev)
                                      for p in prev])
                same = had & (pool.data[pool.slot_positions(slot_t, prev_ids)] == x).flatten(1).all(1)
            else:
                prev_ids = torch.zeros(k * n, s, dtype=torch.int64, device=dev)
                same = torch.zeros(k * n, dtype=torch.bool, device=dev)
            shift = (y[:, :-1] == x[:, 1:]).flatten(1).all(1)
            c_obs = torch.where(same, 0, s)
            count = (c_obs + torch.where(shift, 1, s)).view(k, n)
            first = torch.tensor([pool.total[sl] for sl in slots], device=dev)
            start = (first[:, None] + torch.cumsum(count, 1) - count).reshape(-1)  # each row's first new id
            obs_ids = torch.where(same[:, None], prev_ids, start[:, None] + ar)
            nxt = start + c_obs
            next_ids = torch.where(shift[:, None], torch.cat([obs_ids[:, 1:], nxt[:, None]], 1), nxt[:, None] + ar)
            # every candidate frame goes somewhere: kept ones to their ring position, the rest to the scratch frame
            keep_x = ~same[:, None].expand(-1, s)
            keep_y = torch.cat([~shift[:, None].expand(-1, s - 1), torch.ones_like(shift)[:, None]], 1)
            to = torch.cat([torch.where(keep_x, pool.slot_positions(slot_t, start[:, None] + ar), pool.scratch),
                            torch.where(keep_y, pool.slot_positions(slot_t, next_ids), pool.scratch)], 1)
            pool.data.index_copy_(0, to.reshape(-1), torch.cat([x, y], 1).reshape(-1, *part.frame_shape))
            oldest = torch.minimum(obs_ids.min(1).values, next_ids.min(1).values).view(k, n).min(1).values
            counts, olds = torch.stack([count.sum(1), oldest]).tolist()  # the step's one read
            for i, sl in enumerate(slots):
                pool.total[sl] += counts[i]
                pool.safe[sl] = min(pool.safe[sl], olds[i])
                pool.prev[sl] = next_ids[i * n: (i + 1) * n]
            out[f"obs.{key}{FRAME_SUFFIX}"] = obs_ids
            out[f"next_obs.{key}{FRAME_SUFFIX}"] = next_ids
        return {name: out[name] for name in self.fields}

    def _slot_live(self, slot: int) -> tuple[int, int]:
        """(first written index held, count held) of a slot."""
        first = max(self._live_from[slot], self._written[slot] - self.slot_rows)
        return first, self._written[slot] - first

    def _settle_slot(self, slot: int) -> None:
        """Count the slot's rows held, dropping its oldest ones whose frames were overwritten."""
        first, held = self._slot_live(slot)
        frontiers = {k: p.total[slot] - p.cap_s for k, p in self.pools.items()}
        if held and any(f > self.pools[k].safe[slot] for k, f in frontiers.items()):
            base = self.capacity + slot * self.slot_rows
            at = base + (first + torch.arange(held, device=self.device)) % self.slot_rows
            drop = self._stale(at, frontiers)
            self._live_from[slot] = first + drop
            first, held = self._slot_live(slot)
            for key, p in self.pools.items():
                p.safe[slot] = self._oldest(at[drop:], key)
        self._staged[slot] = held

    def _stale(self, at: torch.Tensor, frontiers: Mapping[str, int]) -> int:
        """How many of rows `at` (oldest first) to drop: through the newest one using an overwritten frame."""
        bad = torch.zeros(at.shape[0], dtype=torch.bool, device=self.device)
        for key, f in frontiers.items():
            bad |= self._row_min(at, key) < f
        idx = torch.nonzero(bad)
        drop = int(idx[-1]) + 1 if idx.numel() else 0
        if drop and not self._warned:
            self._warned = True
            log.warning("the replay buffer dropped %d of its oldest transitions: their frames were overwritten (a frame "
                        "pool keeps one whole stack per %d transitions; these episodes are shorter)", drop,
                        EPISODE_SLACK)
        return drop

    def _row_min(self, at: torch.Tensor, key: str) -> torch.Tensor:
        s = self._storage
        return torch.minimum(s[f"obs.{key}{FRAME_SUFFIX}"][at].min(1).values,
                             s[f"next_obs.{key}{FRAME_SUFFIX}"][at].min(1).values)

    def _oldest(self, at: torch.Tensor, key: str) -> float:
        return float(self._row_min(at, key).min()) if at.numel() else math.inf

    def _slot_rows_held(self, slot: int) -> torch.Tensor:
        first, held = self._slot_live(slot)
        return self.capacity + slot * self.slot_rows + (first + torch.arange(held, device=self.device)) % self.slot_rows

    def _pack(self, at: torch.Tensor, totals: Mapping[str, int], positions) -> Shard:
        """Rows `at` (oldest first) as a compact shard: their fields, frame ids made shard-local, and the frames
        they use (``frames.<part>``: the region's ids from the oldest used to ``totals[part]``, placed by
        ``positions(pool, ids)``)."""
        out = {k: t[at] for k, t in self._storage.items()}
        for key, pool in self.pools.items():
            hi = totals[key]
            lo = int(oldest_frame_ids(out, key).min()) if at.numel() else hi
            for name in (f"obs.{key}{FRAME_SUFFIX}", f"next_obs.{key}{FRAME_SUFFIX}"):
                out[name] = out[name] - lo
            out[f"{FRAMES_PREFIX}{key}"] = pool.data[positions(pool, torch.arange(lo, hi, device=self.device))]
        return out

    def shard(self, slot: int) -> Shard:
        slot_t = torch.tensor([slot], device=self.device)
        return self._pack(self._slot_rows_held(slot), {k: p.total[slot] for k, p in self.pools.items()},
                          lambda pool, ids: pool.slot_positions(slot_t.expand(ids.shape[0]), ids))

    # ---- the committed ring ----------------------------------------------------------------------------
    def _compact(self, shard: Shard) -> Shard:
        if any(f"obs.{k}" in shard for k in self.frame_parts):  # whole stacks (an older version's shard)
            return compress_rows(shard, self.frame_parts)
        return shard

    def commit(self, shards: list[Shard]) -> None:
        self._dead = []
        super().commit(shards)

    def extend(self, shard: Shard) -> None:
        shard = self._compact(shard)
        n = shard_rows(shard)
        if n == 0:
            return
        shard = tail_shard(shard, min(n, self.capacity), self.frame_parts)
        rows = {k: v.to(self.device) for k, v in shard.items() if not k.startswith(FRAMES_PREFIX)}
        for key, pool in self.pools.items():
            frames = shard[f"{FRAMES_PREFIX}{key}"].to(self.device)
            f = frames.shape[0]
            keep = min(f, pool.cap_c)  # more frames than the ring holds: only the newest can stay
            pool.data[(pool.total_c + f - keep + torch.arange(keep, device=self.device)) % pool.cap_c] = frames[f - keep:]
            for name in (f"obs.{key}{FRAME_SUFFIX}", f"next_obs.{key}{FRAME_SUFFIX}"):
                rows[name] = rows[name] + pool.total_c
            pool.safe_c = min(pool.safe_c, int(oldest_frame_ids(rows, key).min())) if self.size else \
                int(oldest_frame_ids(rows, key).min())
            pool.total_c += f
        super().extend(rows)
        self._settle_committed()

    def _committed_rows_held(self) -> torch.Tensor:
        return (self.pos - self.size + torch.arange(self.size, device=self.device)) % self.capacity

    def _settle_committed(self) -> None:
        frontiers = {k: p.total_c - p.cap_c for k, p in self.pools.items()}
        if not self.size or all(f <= self.pools[k].safe_c for k, f in frontiers.items()):
            return
        at = self._committed_rows_held()
        drop = self._stale(at, frontiers)
        if drop:
            self._dead.extend(at[:drop].tolist())
            self.size -= drop
        for key, p in self.pools.items():
            p.safe_c = int(self._oldest(at[drop:], key)) if self.size else p.total_c

    def dead_committed_rows(self) -> torch.Tensor:
        return torch.tensor(self._dead, dtype=torch.int64)

    def committed(self) -> Shard:
        return self._pack(self._committed_rows_held(), {k: p.total_c for k, p in self.pools.items()},
                          lambda pool, ids: ids % pool.cap_c)

    def missing_fields(self, shard: Shard) -> list[str]:
        have = set(shard)
        for key in self.frame_parts:  # whole stacks stand for the ids and frames
            if f"obs.{key}" in have and f"next_obs.{key}" in have:
                have |= {f"obs.{key}{FRAME_SUFFIX}", f"next_obs.{key}{FRAME_SUFFIX}", f"{FRAMES_PREFIX}{key}"}
        need = set(self.fields) | {f"{FRAMES_PREFIX}{k}" for k in self.frame_parts}
        return sorted(need - have)

    def load_committed(self, shard: Shard, pos: int | None = None) -> None:
        missing = self.missing_fields(shard)
        if missing:
            raise ValueError(f"buffer data lacks fields {missing}")
        shard = self._compact(shard)
        n = min(shard_rows(shard), self.capacity)
        pos = n % self.capacity if pos is None else int(pos)
        if not 0 <= pos < self.capacity:  # a ring that dropped rows holds fewer than it wrote: any position
            raise ValueError(f"ring position {pos} is outside capacity {self.capacity}")
        for key, part in self.frame_parts.items():
            frames = shard[f"{FRAMES_PREFIX}{key}"]
            if tuple(frames.shape[1:]) != part.frame_shape or frames.dtype != torch.uint8:
                raise ValueError(f"frames of {key} are {tuple(frames.shape[1:])} {frames.dtype}, this buffer's "
                                 f"{part.frame_shape} uint8")
            for name in (f"obs.{key}{FRAME_SUFFIX}", f"next_obs.{key}{FRAME_SUFFIX}"):
                ids = shard[name]
                if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= frames.shape[0]):
                    raise ValueError(f"{name} holds frame ids outside the shard's {frames.shape[0]} frames")
            self.pools[key].total_c, self.pools[key].safe_c = 0, 0
        self.size = 0
        self.pos = (pos - n) % self.capacity
        self.extend(shard)

    def load_shards(self, shards: list[Shard], size: int, pos: int) -> None:
        merged = concat_shards([self._compact(s) for s in shards], self.frame_parts)
        self.load_committed(tail_shard(merged, size, self.frame_parts), pos)

    # ---- sampling ------------------------------------------------------------------------------------
    def _committed_start(self) -> int:
        """Ring index of the oldest committed row held (0 while no row was dropped: draws map as the base's)."""
        return 0 if self.size == self.capacity else (self.pos - self.size) % self.capacity

    def _slot_start(self, slot: int) -> int:
        first, held = self._slot_live(slot)
        return 0 if held == min(self._written[slot], self.slot_rows) else first % self.slot_rows

    def sample_rows(self, batch_size: int, slot: int | None = None,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        staged = self._staged[slot] if slot is not None and self._staged else 0
        n = self.size + staged
        if n == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        idx = torch.randint(0, n, (batch_size,), generator=generator).to(self.device)  # CPU generator, as the base
        return self._map_draws(idx, [slot])

    def sample_rows_group(self, slots: list[int], draw) -> torch.Tensor:
        staged = [self._staged[s] if self._staged else 0 for s in slots]
        if self.size + max(staged) == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        bound = self.size + staged[0] if min(staged) == max(staged) else \
            torch.tensor([self.size + st for st in staged], device=self.device)
        return self._map_draws(draw(bound), slots)

    def _map_draws(self, idx: torch.Tensor, slots: list) -> torch.Tensor:
        """Draws [K, B] (or [B] for one slot) in [0, committed + staged) -> storage rows."""
        one = idx.dim() == 1
        idx = idx.view(len(slots), -1)
        c = self.capacity
        out = (idx + self._committed_start()) % c
        if any(s is not None for s in slots):
            rows = max(self.slot_rows, 1)
            base = torch.tensor([c + (s or 0) * self.slot_rows for s in slots], device=self.device)[:, None]
            start = torch.tensor([self._slot_start(s) if s is not None else 0 for s in slots],
                                 device=self.device)[:, None]
            staged_row = base + (idx - self.size + start) % rows
            out = torch.where(idx >= self.size, staged_row, out)
        return out.view(-1) if one else out

    def gather(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {k: t.index_select(0, idx) for k, t in self._storage.items()}
        for key, pool in self.pools.items():
            part = self.frame_parts[key]
            committed = idx < self.capacity
            slot = torch.div(idx - self.capacity, max(self.slot_rows, 1), rounding_mode="floor").clamp_min(0)
            for prefix in ("obs", "next_obs"):
                ids = out.pop(f"{prefix}.{key}{FRAME_SUFFIX}")
                at = torch.where(committed[:, None], ids % pool.cap_c, pool.slot_positions(slot, ids))
                out[f"{prefix}.{key}"] = part.from_frames(pool.data[at])
        return out

    def transitions(self, idx: torch.Tensor) -> Transition:
        g = self.gather(idx)
        keys = self._obs_keys
        return Transition({k: g[f"obs.{k}"] for k in keys}, g["action"], g["reward"],
                          {k: g[f"next_obs.{k}"] for k in keys}, g["terminated"], g.get("next_action_mask"),
                          g.get("step_rewards"), g.get("length"), idx)
