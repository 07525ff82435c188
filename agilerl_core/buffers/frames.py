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
stacks (an older version) load by compressing them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from agilerl_core.buffers.replay import FRAMES_PREFIX, FieldSpec, ReplayBuffer, Shard, Transition, shard_rows
from agilerl_core.envs.spaces import ObsSpec

log = logging.getLogger(__name__)

FRAME_SUFFIX = "@frames"
EPISODE_SLACK = 8  # a pool has room for one whole stack per this many rows


@dataclass(frozen=True)
class FramePart:
    """An image part stored frame by frame: `stack` frames of `frame_shape` (uint8) along its channel axis."""

    key: str
    stack: int
    frame_shape: tuple[int, int]
    channels_last: bool = False

    @property
    def frame_bytes(self) -> int:
        return self.frame_shape[0] * self.frame_shape[1]

    def frame_capacity(self, rows: int) -> int:
        """Frames a pool serving `rows` rows holds."""
        return rows + math.ceil(rows * self.stack / EPISODE_SLACK) + self.stack if rows > 0 else 0

    def to_frames(self, x: torch.Tensor) -> torch.Tensor:
        """Stacks [M, *image] -> [M, S, H, W]."""
        return x.permute(0, 3, 1, 2) if self.channels_last else x

    def from_frames(self, x: torch.Tensor) -> torch.Tensor:
        """[M, S, H, W] -> stacks as observed."""
        return x.permute(0, 2, 3, 1) if self.channels_last else x


def frame_parts(obs_spec: ObsSpec) -> dict[str, FramePart]:
    """The image parts of `obs_spec` that can be stored frame by frame: uint8, at least 2 channels."""
    parts = {}
    for p in obs_spec.image_parts:
        c, h, w = p.image_chw
        if p.dtype == torch.uint8 and c >= 2:
            parts[p.key] = FramePart(p.key, c, (h, w), p.channels_last)
    return parts


def stacks_frames(obs: np.ndarray, next_obs: np.ndarray, part: FramePart) -> bool:
    """Whether one step of an env stacks frames: `next_obs` is `obs` shifted by one frame (single stacks, as
    one env returns them)."""
    x = part.to_frames(torch.as_tensor(np.asarray(obs))[None])[0]
    y = part.to_frames(torch.as_tensor(np.asarray(next_obs))[None])[0]
    return bool(torch.equal(y[:-1], x[1:]))


def frame_fields(fields: Mapping[str, FieldSpec], parts: Mapping[str, FramePart]) -> dict[str, FieldSpec]:
    """`fields` with each frame part's ``obs``/``next_obs`` image replaced by its frame ids."""
    out = {}
    for name, spec in fields.items():
        prefix, _, key = name.partition(".")
        if prefix in ("obs", "next_obs") and key in parts:
            out[name + FRAME_SUFFIX] = FieldSpec((parts[key].stack,), torch.int64)
        else:
            out[name] = spec
    return out


def _ids_min(shard: Shard, key: str) -> torch.Tensor:
    """Per row, the oldest frame id it uses of part `key`."""
    return torch.minimum(shard[f"obs.{key}{FRAME_SUFFIX}"].min(1).values,
                         shard[f"next_obs.{key}{FRAME_SUFFIX}"].min(1).values)


def tail_shard(shard: Shard, rows: int, parts: Mapping[str, FramePart]) -> Shard:
    """The newest `rows` rows of a compact shard, with only the frames they use."""
    n = shard_rows(shard)
    if rows >= n:
        return shard
    out = {k: v[n - rows:] for k, v in shard.items() if not k.startswith(FRAMES_PREFIX)}
    for key in parts:
        lo = int(_ids_min(out, key).min()) if rows else 0
        for name in (f"obs.{key}{FRAME_SUFFIX}", f"next_obs.{key}{FRAME_SUFFIX}"):
            out[name] = out[name] - lo
        out[f"{FRAMES_PREFIX}{key}"] = shard[f"{FRAMES_PREFIX}{key}"][lo:]
    return out


def concat_shards(shards: list[Shard], parts: Mapping[str, FramePart]) -> Shard:
    """Compact shards as one (rows in order, frame ids offset by the frames before)."""
    if len(shards) == 1:
        return shards[0]
    out = {k: torch.cat([s[k] for s in shards]) for k in shards[0] if not k.startswith(FRAMES_PREFIX)}
    for key in parts:
        offsets, total = [], 0
        for s in shards:
            offsets.append(total)
            total += s[f"{FRAMES_PREFIX}{key}"].shape[0]
        for name in (f"obs.{key}{FRAME_SUFFIX}", f"next_obs.{key}{FRAME_SUFFIX}"):
            out[name] = torch.cat([s[name] + off for s, off in zip(shards, offsets, strict=True)])
        out[f"{FRAMES_PREFIX}{key}"] = torch.cat([s[f"{FRAMES_PREFIX}{key}"] for s in shards])
    return out


def _stack_hashes(x: torch.Tensor) -> list[int]:
    """A 64-bit hash of each stack [M, S, H, W] (equal stacks, equal hashes; a match is confirmed exactly)."""
    flat = x.reshape(x.shape[0], -1).to(torch.int64)
    weights = torch.randint(-2**62, 2**62, (flat.shape[1],), generator=torch.Generator().manual_seed(0))
    return (flat * weights).sum(1).tolist()


def compress_rows(shard: Shard, parts: Mapping[str, FramePart]) -> Shard:
    """A shard of whole stacks (``obs.<part>`` images, as an older version stored them) as a compact one. A row's
    ``obs`` reuses the frames of the latest earlier row whose ``next_obs`` it equals (the same env's previous
    step), and of its ``next_obs`` only the newest frame is new when it is ``obs`` shifted by one."""
    out = {k: v for k, v in shard.items() if not any(k in (f"obs.{p}", f"next_obs.{p}") for p in parts)}
    for key, part in parts.items():
        x = part.to_frames(shard[f"obs.{key}"]).cpu()
        y = part.to_frames(shard[f"next_obs.{key}"]).cpu()
        m, s = x.shape[0], part.stack
        shift = (y[:, :-1] == x[:, 1:]).flatten(1).all(1).tolist()
        latest: dict[int, int] = {}
        match = [-1] * m
        for r, (hx, hy) in enumerate(zip(_stack_hashes(x), _stack_hashes(y), strict=True)):
            match[r] = latest.get(hx, -1)
            latest[hy] = r
        found = torch.tensor([r for r in range(m) if match[r] >= 0], dtype=torch.int64)
        if found.numel():  # confirm the hash matches
            same = (x[found] == y[torch.tensor([match[r] for r in found.tolist()])]).flatten(1).all(1).tolist()
            for r, ok in zip(found.tolist(), same, strict=True):
                if not ok:
                    match[r] = -1
        obs_ids, next_ids = np.zeros((m, s), np.int64), np.zeros((m, s), np.int64)
        keep = np.zeros((m, 2 * s), bool)
        c = 0
        for r in range(m):  # ids in the order frames are kept: a row's new obs frames, then its new next frames
            if match[r] >= 0:
                obs_ids[r] = next_ids[match[r]]
            else:
                obs_ids[r], keep[r, :s], c = np.arange(c, c + s), True, c + s
            if shift[r]:
                next_ids[r, :-1], next_ids[r, -1], keep[r, -1], c = obs_ids[r, 1:], c, True, c + 1
            else:
                next_ids[r], keep[r, s:], c = np.arange(c, c + s), True, c + s
        out[f"obs.{key}{FRAME_SUFFIX}"] = torch.from_numpy(obs_ids)
        out[f"next_obs.{key}{FRAME_SUFFIX}"] = torch.from_numpy(next_ids)
        out[f"{FRAMES_PREFIX}{key}"] = torch.cat([x, y], 1)[torch.from_numpy(keep)]
    return out


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
    :func:`frame_parts`) are stored once per frame. `fields` are the transition's fields as
    :func:`~agilerl_core.buffers.replay.transition_fields` gives them (whole images); the rows keep frame ids."""

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
            lo = int(_ids_min(out, key).min()) if at.numel() else hi
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
            pool.safe_c = min(pool.safe_c, int(_ids_min(rows, key).min())) if self.size else \
                int(_ids_min(rows, key).min())
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
        idx = draw(torch.tensor([self.size + st for st in staged], device=self.device))
        return self._map_draws(idx, slots)

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
