"""Memory of the replay buffer: 1M CartPole transitions (target: under 100 MB), then what every shipped
off-policy config's buffer takes at its peak.

    python benchmarks/buffer_memory.py [--check]

Prints one JSON object per line: the CartPole measurement, one per off-policy config in
deployments/configs (DQN, Rainbow, DDPG, TD3, SAC, MADDPG, MATD3 and the offline CQN/CQL), then a summary.
A config's buffer is computed from its observation and action spaces (one env built, no vector envs, no
allocation): bytes per transition, the committed ring (``hyperparameters.buffer_size`` rows), the staging
(``population_size`` slots of ``min(ceil(evo_steps / num_envs) * num_envs, buffer_size)`` rows) and their
sum, the peak; ``fits`` compares the peak with 90% of the memory the config's device has available here
(what :func:`agilerl_core.buffers.memory.check_replay_fits` does before the buffer allocates). An offline
config's buffer holds its dataset (no staging): measured when the dataset file is on this machine. Configs
whose env package is not installed are reported as skipped, with the reason.

``--check``: exit 1 when any config does not fit this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from agilerl_core.buffers.memory import (
    HEADROOM,
    available_bytes,
    dominant_fields,
    largest_buffer_size,
    replay_bytes,
    slot_rows,
    transition_bytes,
)
from agilerl_core.buffers.replay import FieldSpec, ReplayBuffer, multi_agent_fields, transition_fields
from agilerl_core.envs.spaces import MultiAgentSpec, ObsSpec, action_spec

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "deployments" / "configs"
REPLAY_ARENAS = {"gym_off_policy", "multi_agent_off_policy", "offline"}  # the arenas that hold a ReplayBuffer


def cartpole() -> dict[str, Any]:
    spec = ObsSpec(gym.make("CartPole-v1").observation_space)
    buf = ReplayBuffer(transition_fields(spec), 1_000_000)
    mb = buf.memory_bytes / 1e6
    return {"benchmark": "buffer_memory", "transitions": 1_000_000, "megabytes": round(mb, 1),
            "bytes_per_transition": buf.memory_bytes / 1_000_000, "target_mb": 100, "ok": mb < 100}


def replay_arena(data: dict[str, Any]) -> str | None:
    """The arena a raw config's algorithm trains in (None: unknown algorithm or kind)."""
    from agilerl_core.algorithms.registry import ALGORITHMS

    info = ALGORITHMS.get(data.get("algorithm", ""))
    return None if info is None else info.arenas.get(data.get("kind", "gym"))


def _device(cfg: Any) -> str:
    from agilerl_core.arenas.base import torch_device

    return torch_device(cfg.device)


def _gym_fields(cfg: Any, stores_frames: bool = True) -> tuple[dict[str, FieldSpec], dict[str, Any]]:
    """The fields the off-policy arena stores and its frame-stacked image parts (stored once per frame): from
    one wrapped env (its spaces, the width of the action mask its reset reports, whether it stacks frames, as
    the arena probes them)."""
    from agilerl_core.arenas.gym_off_policy import probe_frame_stacking
    from agilerl_core.buffers.frame_format import frame_fields, frame_parts
    from agilerl_core.envs.make import EnvRecipe

    recipe = EnvRecipe.of(cfg)
    if recipe.backend == "envpool":
        obs_space, act_space = recipe.spaces()
        mask_dim = None
    else:
        env = recipe.make()
        try:
            obs_space, act_space = env.observation_space, env.action_space
            _, info = env.reset(seed=0)
            mask = info.get("action_mask")
            mask_dim = None if mask is None else int(np.asarray(mask).reshape(-1).shape[0])
        finally:
            env.close()
    obs_spec = ObsSpec(obs_space, cfg.network.cnn.channels_last)
    n_step = getattr(cfg.hyperparameters, "n_step", 1)
    frames = probe_frame_stacking(recipe, frame_parts(obs_spec)) if n_step == 1 and stores_frames else {}
    fields = transition_fields(obs_spec, mask_dim, action_spec(act_space), n_step)
    return frame_fields(fields, frames), frames


def _multi_agent_fields(cfg: Any) -> dict[str, FieldSpec]:
    from agilerl_core.envs.multi_agent import make_parallel_env

    env = make_parallel_env(cfg.env_id, cfg.env_kwargs)
    try:
        agents = list(env.possible_agents)
        spec = MultiAgentSpec.from_spaces(agents, {a: env.observation_space(a) for a in agents},
                                          {a: env.action_space(a) for a in agents})
    finally:
        env.close()
    return multi_agent_fields(spec)


def _dataset_rows(cfg: Any) -> tuple[int | None, str | None]:
    """Transitions in an offline config's dataset, when its file is on this machine."""
    uri = cfg.dataset.uri
    path = next((p for p in (Path(uri), ROOT / uri) if p.is_file()), None) if "://" not in uri else None
    if path is None:
        return None, f"dataset {uri} is not on this machine (the offline buffer holds exactly the dataset)"
    from agilerl_core.data.loader import load_dataset

    return len(load_dataset(str(path), cfg.dataset.format).transitions), None


def measure(path: Path, arena: str) -> dict[str, Any]:
    from tasks.config import load_config

    cfg = load_config(path)
    out: dict[str, Any] = {"config": path.name, "algorithm": cfg.algorithm, "kind": cfg.kind}
    frames: dict[str, Any] = {}
    if arena == "multi_agent_off_policy":
        fields = _multi_agent_fields(cfg)
    else:
        fields, frames = _gym_fields(cfg, stores_frames=arena != "offline")  # a dataset's buffer holds whole rows
    row = transition_bytes(fields)
    label, dom = dominant_fields(fields)
    out.update(bytes_per_transition=row, dominant=f"{label}: {dom:,} bytes of {row:,}")
    if frames:  # rows hold frame ids; each frame is stored once, its pool sized per row
        per_row = {k: p.frame_bytes * p.frame_capacity(10**6) / 10**6 for k, p in frames.items()}
        out.update(frames_stored_once=sorted(frames), bytes_per_transition=round(row + sum(per_row.values()), 1),
                   dominant=f"frames of {', '.join(frames)}: {sum(per_row.values()):,.1f} bytes of "
                            f"{row + sum(per_row.values()):,.1f} (ids {row:,})",
                   gb_per_100k_transitions=round(replay_bytes(fields, 100_000, 0, 0, frames) / 1e9, 3))
    if arena == "offline":
        capacity, reason = _dataset_rows(cfg)
        slots, slot_capacity = 0, 0
        if capacity is None:
            out.update(peak_bytes=None, fits=None, note=reason)
            return out
    else:
        capacity = cfg.hyperparameters.buffer_size
        slots = cfg.population_size
        slot_capacity = math.ceil(cfg.evo_steps / cfg.num_envs) * cfg.num_envs
    device = _device(cfg)
    total = replay_bytes(fields, capacity, slots, slot_capacity, frames)
    committed = replay_bytes(fields, capacity, 0, 0, frames)
    free = available_bytes(device)
    fits = total <= HEADROOM * free
    out.update(buffer_size=capacity, population_size=slots, staging_rows_per_slot=slot_rows(capacity, slot_capacity),
               committed_bytes=committed, staging_bytes=total - committed, peak_bytes=total,
               peak_gb=round(total / 1e9, 3), device=device, available_bytes=free, fits=fits)
    if not fits:
        out["largest_buffer_size_that_fits"] = largest_buffer_size(fields, slots, slot_capacity, HEADROOM * free,
                                                                   upper=capacity, frames=frames)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a config's buffer does not fit here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # tasks.config: the pipeline's config loader (what the CLI reads)
    from agilerl_core.config import read_config_file

    t0 = time.perf_counter()
    print(json.dumps(cartpole()), flush=True)
    measured, skipped, too_big, unsized = [], [], [], []
    for path in sorted(CONFIGS.glob("*.yaml")):
        data = read_config_file(path)
        arena = replay_arena(data)
        if arena not in REPLAY_ARENAS:
            continue
        try:
            row = measure(path, arena)
        except Exception as err:  # e.g. the env's package is not installed: say so and go on
            row = {"config": path.name, "algorithm": data.get("algorithm"), "kind": data.get("kind"),
                   "skipped": f"{type(err).__name__}: {err}"}
            skipped.append(path.name)
        else:
            measured.append(path.name)
            if row.get("fits") is False:
                too_big.append(path.name)
            elif row.get("fits") is None:
                unsized.append(path.name)
        print(json.dumps(row), flush=True)
    print(json.dumps({"summary": "buffer_memory", "configs": len(measured) + len(skipped), "measured": len(measured),
                      "skipped": skipped, "do_not_fit": too_big, "unsized": unsized, "headroom": HEADROOM,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 1 if args.check and too_big else 0


if __name__ == "__main__":
    sys.exit(main())
