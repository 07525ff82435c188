"""Memory the replay buffer will hold, checked before it is allocated.

:class:`~agilerl_core.buffers.replay.ReplayBuffer` preallocates every row it will ever use: the committed
ring (``hyperparameters.buffer_size`` rows) and, during a generation, one staging area per population slot
(a generation's fresh transitions, ``ceil(evo_steps / num_envs) * num_envs``, capped at ``buffer_size``
rows: a full slot keeps its newest rows). Each row stores every field of a transition, ``obs`` and
``next_obs`` alike, so image observations dominate (84x84x4 uint8 frames: 56,448 of a DQN transition's
56,464 bytes), unless the buffer stores stacked frames once each (:mod:`agilerl_core.buffers.frames`: rows
then hold frame ids, and a pool of frames, ``rows * (1 + S/8)``, serves them: ~10.7 KB per Atari transition).

:func:`check_replay_fits` compares that total (:func:`replay_bytes`) with the memory the device has
available (:func:`available_bytes`) and raises a :class:`~agilerl_core.errors.ConfigError` naming the
config fields to lower, instead of the allocator's bare ``RuntimeError: can't allocate`` (or the kernel's
OOM kill) minutes into a run. The buffer calls it before each allocation.

Set the environment variable ``AGILERL_MEMORY_CHECK=0`` to skip the check (e.g. on a machine whose
available memory is misreported, or with swap you mean to use); the estimate is still returned.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agilerl_core.errors import ConfigError

if TYPE_CHECKING:
    from agilerl_core.buffers.frame_format import FramePart
    from agilerl_core.buffers.replay import FieldSpec

NO_FRAMES: Mapping[str, FramePart] = {}

MEMORY_CHECK_ENV = "AGILERL_MEMORY_CHECK"
HEADROOM = 0.9  # the share of the available memory the replay buffer may take
_CGROUP = Path("/sys/fs/cgroup")  # cgroup v2 of this process's container (read when present)


def field_bytes(spec: FieldSpec) -> int:
    """Bytes one transition's value of a field takes."""
    return math.prod(spec.shape) * spec.dtype.itemsize


def transition_bytes(fields: Mapping[str, FieldSpec]) -> int:
    """Bytes one stored transition (one row of every field) takes."""
    return sum(field_bytes(f) for f in fields.values())


def slot_rows(capacity: int, slot_capacity: int) -> int:
    """Rows a staging slot holds: a generation's fresh transitions, at most the committed capacity (only the
    newest `capacity` can survive the commit, so a slot is a ring of that many rows)."""
    return max(0, min(int(slot_capacity), int(capacity)))


def frame_pool_bytes(frames: Mapping[str, FramePart], capacity: int, slots: int, slot_capacity: int) -> int:
    """Bytes of a frame-stacked buffer's frame pools (:mod:`agilerl_core.buffers.frames`): per image part, a
    ring of frames for the committed rows and one per staging slot (plus one scratch frame)."""
    rows = slot_rows(capacity, slot_capacity)
    return sum(p.frame_bytes * (p.frame_capacity(capacity) + int(slots) * p.frame_capacity(rows) + 1)
               for p in frames.values())


def replay_bytes(fields: Mapping[str, FieldSpec], capacity: int, slots: int, slot_capacity: int,
                 frames: Mapping[str, FramePart] = NO_FRAMES) -> int:
    """Exactly what a ReplayBuffer over `fields` allocates: the committed ring of `capacity` rows plus
    `slots` staging slots of ``min(slot_capacity, capacity)`` rows each, and with `frames` (the buffer's
    frame-stacked image parts, whose rows then hold frame ids) their frame pools."""
    rows = transition_bytes(fields) * (int(capacity) + int(slots) * slot_rows(capacity, slot_capacity))
    return rows + frame_pool_bytes(frames, capacity, slots, slot_capacity)


def dominant_fields(fields: Mapping[str, FieldSpec]) -> tuple[str, int]:
    """(label, bytes per transition) of the largest field group: an observation part counts with its
    ``next_obs`` twin (``"obs.image + next_obs.image"``), every other field alone."""
    groups: dict[str, list[str]] = {}
    for name in fields:
        prefix, _, key = name.partition(".")
        group = f"obs:{key}" if prefix in ("obs", "next_obs") and key else name
        groups.setdefault(group, []).append(name)
    if not groups:
        return "", 0
    names = max(groups.values(), key=lambda ns: sum(field_bytes(fields[n]) for n in ns))
    return " + ".join(names), sum(field_bytes(fields[n]) for n in names)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_available() -> int | None:
    """Memory this process's cgroup (v2) may still take: its limit less its anonymous and shared memory
    (the page cache is reclaimable); None without a limit."""
    limit = _read_int(_CGROUP / "memory.max")  # "max" (no limit) reads as None
    if limit is None:
        return None
    used = 0
    try:
        for line in (_CGROUP / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name in ("anon", "shmem") and value.strip().isdigit():
                used += int(value)
    except OSError:
        used = _read_int(_CGROUP / "memory.current") or 0
    return max(0, limit - used)


def _host_available() -> int:
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))  # OSError/ValueError if unknown


def available_bytes(device: torch.device | str) -> int:
    """Bytes the device can still allocate. CUDA: the driver's free memory (``torch.cuda.mem_get_info``)
    plus what torch's caching allocator holds unused. Any other device (the CPU, unified-memory MPS): the
    host's available memory (psutil's ``virtual_memory().available`` when psutil is importable, else
    ``MemAvailable`` of /proc/meminfo), at most what the process's cgroup v2 memory limit still allows."""
    device = torch.device(device)
    if device.type == "cuda":
        free = int(torch.cuda.mem_get_info(device)[0])
        return free + int(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    host = _host_available()
    limited = _cgroup_available()
    return host if limited is None else min(host, limited)


def memory_check_enabled() -> bool:
    """False when ``AGILERL_MEMORY_CHECK`` is 0 (or false, no, off)."""
    return os.environ.get(MEMORY_CHECK_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def largest_buffer_size(fields: Mapping[str, FieldSpec], slots: int, slot_capacity: int, budget: float,
                        copy_share: float = 0.0, upper: int | None = None,
                        frames: Mapping[str, FramePart] = NO_FRAMES) -> int:
    """The largest `capacity` whose buffer (plus `copy_share` of its ring while the ring is copied) takes at
    most `budget` bytes (0 when not even one row fits). `upper`: no need to look above it."""
    row = transition_bytes(fields) + sum(p.frame_bytes for p in frames.values())  # a row holds >= 1 frame
    if row == 0:
        return upper or 0

    def need(c: int) -> float:
        return replay_bytes(fields, c, slots, slot_capacity, frames) + copy_share * row * c

    lo, hi = 0, max(1, int(budget // row) + 1)  # need(c) >= row * c
    if upper is not None:
        hi = min(hi, int(upper))
    while lo < hi:  # need is increasing in c: find the last c that fits
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def check_replay_fits(fields: Mapping[str, FieldSpec], capacity: int, slots: int, slot_capacity: int,
                      device: torch.device | str, what: str, *, held_bytes: int = 0, copy_bytes: int = 0,
                      frames: Mapping[str, FramePart] = NO_FRAMES) -> int:
    """The bytes a replay buffer over `fields` takes (:func:`replay_bytes`); a ConfigError naming the
    config fields to lower when its peak exceeds 90% of what `device` has available.

    `held_bytes`: replay storage this process already holds (it is out of the available memory now, and
    stays allocated while the new storage is filled); `copy_bytes`: what the reallocation holds twice at
    worst (the buffer copies its committed rows into the larger storage one field at a time). The peak is
    then ``max(held_bytes, total) + copy_bytes`` against ``available + held_bytes``.

    `frames`: the buffer's frame-stacked image parts (:mod:`agilerl_core.buffers.frames`), whose pools count too.

    ``AGILERL_MEMORY_CHECK=0`` in the environment skips the check (the total is still returned)."""
    total = replay_bytes(fields, capacity, slots, slot_capacity, frames)
    if not memory_check_enabled():
        return total
    device = torch.device(device)
    if device.type not in ("cpu", "cuda", "mps"):  # e.g. meta: nothing is allocated
        return total
    try:
        free = available_bytes(device)
    except (OSError, ValueError, RuntimeError, AssertionError):  # the platform does not say (or no CUDA): no check
        return total
    budget = free + int(held_bytes)
    peak = max(int(held_bytes), total) + int(copy_bytes)
    if peak <= HEADROOM * budget:
        return total
    raise ConfigError(_message(fields, capacity, slots, slot_capacity, device, what, total, peak, budget,
                               copy_bytes, frames))


def _message(fields: Mapping[str, FieldSpec], capacity: int, slots: int, slot_capacity: int, device: torch.device,
             what: str, total: int, peak: int, budget: int, copy_bytes: int,
             frames: Mapping[str, FramePart] = NO_FRAMES) -> str:
    rows = slot_rows(capacity, slot_capacity)
    # bytes per transition, a frame-stacked part's pool shared out over the rows it serves
    served = max(rows, capacity, 1)
    row = round(transition_bytes(fields) + sum(p.frame_bytes * p.frame_capacity(served) / served
                                               for p in frames.values()))
    label, dom = dominant_fields(fields)
    if frames:
        label = " + ".join(f"frames of {k} (stored once: {p.stack} per stack)" for k, p in frames.items())
        dom = row - transition_bytes(fields)
    memory = "GPU" if device.type == "cuda" else "host"
    ring_share = copy_bytes / max(1, row * capacity)  # the copy scales with the ring
    fit = largest_buffer_size(fields, slots, slot_capacity, HEADROOM * budget, ring_share, capacity - 1, frames)
    parts = [f"{what}: the replay buffer needs {_gb(total)}"
             + (f" (at most {_gb(peak)} while it grows)" if peak > total else "")
             + f" but {_gb(budget)} of {memory} memory is available to it on {device} (the check allows "
               f"{HEADROOM:.0%}: {_gb(HEADROOM * budget)})."]
    parts.append(f"Each transition takes {row:,} bytes" + (f" ({label}: {dom:,} bytes of {row:,})" if label else "")
                 + f"; committed ring: hyperparameters.buffer_size ({capacity:,} rows) = {_gb(row * capacity)}")
    if slots:
        capped = ", capped at buffer_size" if slot_capacity > capacity else ""
        parts[-1] += (f"; staging: population_size ({slots}) x staging rows ({rows:,}: a generation's fresh "
                      f"transitions, ceil(evo_steps / num_envs) * num_envs = {slot_capacity:,}{capped}) = "
                      f"{_gb(row * slots * rows)}")
    parts[-1] += "."
    fix = "Lower hyperparameters.buffer_size"
    fix += f" (at most {fit:,} rows fit)" if fit else " (not even one row fits)"
    if slots:
        fix += ", population_size, or evo_steps/num_envs (the staging rows, while below buffer_size)"
    parts.append(fix + f", or run on a device with more memory; set {MEMORY_CHECK_ENV}=0 to skip this check.")
    return " ".join(parts)
