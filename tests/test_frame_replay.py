"""Frame-stacked image replay (agilerl_core.buffers.frames): each frame stored once, transitions identical to
whole-stack storage, compact shards, older whole-stack shards loading, and rows dropped (never corrupted) when
episodes are too short for the frame pools."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.buffers.frame_format import FramePart, frame_parts, stacks_frames
from agilerl_core.buffers.frames import FrameReplayBuffer
from agilerl_core.buffers.memory import replay_bytes
from agilerl_core.buffers.prioritized import MemberPriorities
from agilerl_core.buffers.replay import ReplayBuffer, shard_rows, transition_fields
from agilerl_core.envs.spaces import ObsSpec
from tests.test_replay_memory import per_draw

S, H, W = 4, 12, 10


def fields_for(channels_last: bool = False):
    shape = (H, W, S) if channels_last else (S, H, W)
    spec = ObsSpec(spaces.Box(0, 255, shape, np.uint8))
    return spec, transition_fields(spec)


class Streams:
    """K x N envs of a frame-stacking env (FrameStackObservation's 'reset' padding, same-step autoreset):
    each step's obs, next_obs (the final one when the episode ends), rewards numbering the transitions."""

    def __init__(self, k: int, n: int, seed: int, mean_len: float, channels_last: bool = False) -> None:
        self.k, self.n, self.rng, self.mean_len, self.last = k, n, np.random.default_rng(seed), mean_len, channels_last
        self.count = 0
        self.stacks = [self.reset() for _ in range(k * n)]

    def frame(self) -> np.ndarray:
        return self.rng.integers(0, 256, (H, W), dtype=np.uint8)

    def reset(self) -> np.ndarray:
        f = self.frame()
        return np.stack([f] * S)

    def view(self, x: np.ndarray) -> torch.Tensor:
        t = torch.as_tensor(x)
        return t.permute(0, 2, 3, 1).contiguous() if self.last else t

    def step(self) -> dict[str, torch.Tensor]:
        obs = np.stack(self.stacks)
        nxt = np.stack([np.concatenate([s[1:], self.frame()[None]]) for s in self.stacks])
        done = self.rng.random(self.k * self.n) < 1.0 / self.mean_len
        self.stacks = [self.reset() if d else nxt[i] for i, d in enumerate(done)]
        m = self.k * self.n
        reward = torch.arange(self.count, self.count + m, dtype=torch.float32)
        self.count += m
        return {"obs.obs": self.view(obs), "next_obs.obs": self.view(nxt),
                "action": torch.zeros(m, dtype=torch.int64), "reward": reward,
                "terminated": torch.as_tensor(done, dtype=torch.float32)}


def run_generation(buffers, streams: Streams, steps: int, slots: list[int]):
    for b in buffers:
        b.reserve_staging(len(slots), steps * streams.n)
        for s in slots:
            b.reset_slot(s)
    truth = {}
    for _ in range(steps):
        data = streams.step()
        for r, o, x in zip(data["reward"].tolist(), data["obs.obs"], data["next_obs.obs"],
                           strict=True):
            truth[int(r)] = (o, x)
        for b in buffers:
            b.add_group(slots, data)
    return truth


def test_frame_buffer_samples_what_whole_stacks_sample_in_a_fraction_of_the_memory():
    spec, fields = fields_for()
    parts = frame_parts(spec)
    assert parts == {"obs": FramePart("obs", S, (H, W))}
    plain = ReplayBuffer(fields, 300)
    framed = FrameReplayBuffer(fields, 300, parts)
    streams = Streams(3, 2, 0, mean_len=30)
    for _ in range(3):  # generations: stage, sample, commit (the ring wraps in the third)
        run_generation([plain, framed], streams, 60, [0, 1, 2])
        for slot in (None, 0, 2) if plain.size else (0, 2):
            a = plain.sample(64, slot, torch.Generator().manual_seed(1))
            b = framed.sample(64, slot, torch.Generator().manual_seed(1))
            for x, y in zip(a, b, strict=True):
                if isinstance(x, dict):
                    for key in x:
                        assert torch.equal(x[key], y[key])
                elif x is not None:
                    assert torch.equal(x, y)
        for slot in (0, 1, 2):
            assert framed.staged_count(slot) == plain.staged_count(slot) == 120
        plain.commit([plain.shard(s) for s in (0, 1, 2)])
        framed.commit([framed.shard(s) for s in (0, 1, 2)])
        assert framed.size == plain.size
    assert plain.size == 300
    # the batched draw maps alike
    def last(bound):  # every member's last row (one bound for all when the slots stage alike)
        return torch.zeros(2, 4, dtype=torch.int64) + torch.as_tensor(bound).view(-1, 1) - 1

    rows_a, rows_b = plain.sample_rows_group([0, 1], last), framed.sample_rows_group([0, 1], last)
    assert torch.equal(rows_a, rows_b)
    assert framed.memory_bytes < plain.memory_bytes / 3
    assert framed.memory_bytes == replay_bytes(framed.fields, 300, 3, 120, parts)


def test_compact_shards_and_checkpoints_round_trip_and_whole_stack_shards_load():
    spec, fields = fields_for(channels_last=True)
    parts = frame_parts(spec)
    assert parts["obs"].channels_last
    plain = ReplayBuffer(fields, 500)
    framed = FrameReplayBuffer(fields, 500, parts)
    streams = Streams(2, 3, 1, mean_len=12, channels_last=True)
    run_generation([plain, framed], streams, 50, [0, 1])
    shards = [framed.shard(s) for s in (0, 1)]
    assert shard_rows(shards[0]) == 150
    assert shards[0]["frames.obs"].shape[0] < 150 * 2  # about one frame per transition
    plain.commit([plain.shard(s) for s in (0, 1)])
    framed.commit(shards)

    def same(a: ReplayBuffer, b: ReplayBuffer) -> None:
        ta = a.sample(200, None, torch.Generator().manual_seed(3))
        tb = b.sample(200, None, torch.Generator().manual_seed(3))
        assert torch.equal(ta.obs["obs"], tb.obs["obs"])
        assert torch.equal(ta.next_obs["obs"], tb.next_obs["obs"])
        assert torch.equal(ta.reward, tb.reward)

    copy = FrameReplayBuffer(fields, 500, parts)  # a checkpoint: compact
    copy.load_committed(framed.committed(), framed.pos)
    same(plain, copy)
    legacy = FrameReplayBuffer(fields, 500, parts)  # an older version's whole stacks
    assert legacy.missing_fields(plain.committed()) == []
    legacy.load_committed(plain.committed(), plain.pos)
    same(plain, legacy)
    rebuilt = FrameReplayBuffer(fields, 500, parts)  # a run store's shards, oldest first
    rebuilt.load_shards(shards, 280, 300)
    assert rebuilt.size == 280 and rebuilt.pos == 300
    tail = {k: v[20:] for k, v in plain.committed().items()}
    reference = ReplayBuffer(fields, 500)
    reference.load_committed(tail, 280)  # the same rows (a ring that dropped none must end at its size)
    same(reference, rebuilt)
    with pytest.raises(ValueError, match="frame ids outside"):  # a tampered shard
        bad = dict(framed.committed())
        bad["obs.obs@frames"] = bad["obs.obs@frames"] + 10_000
        FrameReplayBuffer(fields, 500, parts).load_committed(bad, framed.pos)
    assert "frames.obs" in FrameReplayBuffer(fields, 500, parts).missing_fields(
        {k: v for k, v in shards[0].items() if k != "frames.obs"})


def test_short_episodes_drop_the_oldest_rows_never_serve_overwritten_frames():
    spec, fields = fields_for()
    parts = frame_parts(spec)
    framed = FrameReplayBuffer(fields, 200, parts)
    per = MemberPriorities(200, 0, 0.6, 1e-6)
    streams = Streams(2, 2, 2, mean_len=1.5)  # most steps start an episode: ~5 frames per transition
    for _ in range(3):
        truth = run_generation([framed], streams, 40, [0, 1])
        assert framed.staged_count(0) < 80  # the slot's frame pool could not hold all 80
        for slot in (0, 1):
            t = framed.sample(256, slot, torch.Generator().manual_seed(0))
            staged = t.index >= framed.capacity
            for r, o, x in zip(t.reward[staged].tolist(), t.obs["obs"][staged],
                               t.next_obs["obs"][staged], strict=True):
                assert torch.equal(o, truth[int(r)][0]) and torch.equal(x, truth[int(r)][1])
        rows, _, _ = per_draw(per, framed, 0, 512, 0.4, torch.Generator().manual_seed(0))
        held = set((framed.capacity + (np.arange(framed.written_count(0)) % framed.slot_rows))[-framed.staged_count(0):]
                   .tolist())
        assert set(rows.tolist()) - set(range(framed.capacity)) <= held  # dropped rows carry no mass
        first = framed.pos
        framed.commit([framed.shard(s) for s in (0, 1)])
        per.committed(first, 0, framed.dead_committed_rows())
    assert 0 < framed.size < 200
    t = framed.sample(400, None, torch.Generator().manual_seed(5))
    assert (t.index < framed.capacity).all()
    reward = t.reward.long()
    assert len(set(reward.tolist())) > 1


class Corridor(gym.Env):
    """A 5x6 grey image whose lit column is the agent's position (reward at the right end)."""

    observation_space = spaces.Box(0, 255, (5, 6), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.x = int(self.np_random.integers(0, 3))
        return self.obs(), {}

    def obs(self):
        img = np.zeros((5, 6), np.uint8)
        img[:, self.x] = 255
        return img

    def step(self, action):
        self.x = min(5, max(0, self.x + (1 if action else -1)))
        return self.obs(), float(self.x == 5), self.x == 5, False, {}


def corridor_config():
    from tests.conftest import tiny_config

    if "FrameCorridor-v0" not in gym.registry:
        gym.register("FrameCorridor-v0", entry_point=Corridor, max_episode_steps=12)
    return tiny_config(env_id="FrameCorridor-v0", population_size=2, num_envs=2, evo_steps=64, max_env_steps=512,
                       env_wrappers=[{"wrapper": "gymnasium.wrappers.FrameStackObservation",
                                      "kwargs": {"stack_size": 3}}],
                       network={"hidden_sizes": [16], "min_nodes": 8,
                                "cnn": {"channels": [4], "kernel_sizes": [2], "strides": [1], "latent_dim": 16}},
                       hyperparameters={"buffer_size": 100, "batch_size": 32, "learning_delay": 16})


def test_the_off_policy_arena_stores_stacked_frames_once_and_learns_as_with_whole_stacks(monkeypatch):
    from agilerl_core.arenas import build_arena, gym_off_policy

    cfg = corridor_config()
    framed = build_arena(cfg)
    assert isinstance(framed.buffer, FrameReplayBuffer)
    assert stacks_frames(np.zeros((3, 5, 6), np.uint8), np.ones((3, 5, 6), np.uint8),
                         framed.buffer.frame_parts["obs"]) is False
    monkeypatch.setattr(gym_off_policy, "probe_frame_stacking", lambda recipe, parts: {})
    whole = build_arena(cfg)  # the same arena storing whole stacks
    assert type(whole.buffer) is ReplayBuffer
    results = []
    for arena in (framed, whole):
        members = arena.build_members([1, 2])
        for _ in range(3):  # generations: the ring (100 rows) wraps
            arena.begin_generation(2)
            out = arena.train_group(members, [0, 1], [7, 8], cfg.evo_steps)
            arena.commit_experience([arena.shard(s) for s in (0, 1)], members)
        results.append(([r.mean_return for r in out], [r.mean_loss for r in out],
                        arena.buffer.sample(32, None, torch.Generator().manual_seed(0))))
    assert results[0][0] == results[1][0] and results[0][1] == results[1][1]
    assert torch.equal(results[0][2].obs["obs"], results[1][2].obs["obs"])
    assert framed.buffer.memory_bytes < whole.buffer.memory_bytes


def test_a_frame_stacked_run_resumes_from_its_store_bit_identically(tmp_path):
    from agilerl_core.experiment import build_evolution
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage
    from tests.test_run_store import _run, _weights

    cfg = corridor_config()
    ref = build_evolution(cfg)
    _run(ref, RunStore(LocalStorage(tmp_path / "a"), "r"), 4)
    store = RunStore(LocalStorage(tmp_path / "b"), "r")
    first = build_evolution(cfg)
    assert isinstance(first.arena.buffer, FrameReplayBuffer)
    _run(first, store, 2)
    resumed = build_evolution(cfg)
    resumed.resume(store, store.latest_generation())
    a, b = first.arena.buffer, resumed.arena.buffer
    assert (a.size, a.pos) == (b.size, b.pos) and a.size == 100  # the ring wrapped
    for x, y in zip(a.sample(64, None, torch.Generator().manual_seed(0)),
                    b.sample(64, None, torch.Generator().manual_seed(0)), strict=True):
        if isinstance(x, dict):
            assert torch.equal(x["obs"], y["obs"])
        elif x is not None:
            assert torch.equal(x, y)
    _run(resumed, store, 2)
    assert [h.fitnesses for h in resumed.history] == [h.fitnesses for h in ref.history]
    for wa, wb in zip(_weights(resumed), _weights(ref), strict=True):
        for k in wa:
            assert torch.equal(wa[k], wb[k]), k
