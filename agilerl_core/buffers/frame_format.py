"""How the frame-stacked replay (:mod:`agilerl_core.buffers.frames`) lays out its data: the image parts stored
frame by frame (:class:`FramePart`, :func:`frame_parts`), the rows' frame-id fields (:func:`frame_fields`:
``obs.<part>@frames`` and ``next_obs.<part>@frames``, [S] int64, in place of the two stacks), and its shards.

A shard (what a slot ships to storage and what the committed ring is rebuilt from) is compact: its rows
with shard-local frame ids, and ``frames.<part>``, the frames they use. :func:`tail_shard` keeps a shard's newest
rows, :func:`concat_shards` joins shards in order, and :func:`compress_rows` turns a shard of whole stacks (what
an older version stored) into a compact one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from agilerl_core.buffers.replay import FRAMES_PREFIX, FieldSpec, Shard, shard_rows
from agilerl_core.envs.spaces import ObsSpec

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


def oldest_frame_ids(shard: Shard, key: str) -> torch.Tensor:
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
        lo = int(oldest_frame_ids(out, key).min()) if rows else 0
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
