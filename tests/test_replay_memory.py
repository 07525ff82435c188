"""Replay buffer memory: staging slots capped at the committed capacity (a ring of each slot's newest rows),
the old layout kept bit for bit when a generation fits, and the memory check before any allocation."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.buffers import memory
from agilerl_core.buffers.memory import (
    MEMORY_CHECK_ENV,
    available_bytes,
    check_replay_fits,
    largest_buffer_size,
    replay_bytes,
)
from agilerl_core.buffers.prioritized import GroupPriorities, MemberPriorities
from agilerl_core.buffers.replay import ReplayBuffer, multi_agent_fields, transition_fields
from agilerl_core.envs.spaces import MultiAgentSpec, ObsSpec, action_spec
from agilerl_core.errors import ConfigError

VECTOR = transition_fields(ObsSpec(spaces.Box(-1, 1, (2,), np.float32)))
FRAMES = transition_fields(ObsSpec(spaces.Box(0, 255, (4, 84, 84), np.uint8)))  # an Atari frame stack
GB = 10**9


@pytest.fixture(autouse=True)
def _check_on(monkeypatch):
    monkeypatch.delenv(MEMORY_CHECK_ENV, raising=False)


def _step(values) -> dict[str, torch.Tensor]:
    """Transitions identified by their reward (obs and next_obs derived from it)."""
    v = torch.as_tensor(values, dtype=torch.float32)
    n = v.shape[0]
    return {"obs.obs": v[:, None].repeat(1, 2), "next_obs.obs": v[:, None].repeat(1, 2) + 0.5,
            "action": torch.arange(n) % 2, "reward": v, "terminated": torch.zeros(n)}


def _fill(buf: ReplayBuffer, slot: int, values: list[float], num_envs: int) -> None:
    for i in range(0, len(values), num_envs):
        buf.add(slot, _step(values[i: i + num_envs]))


def _consistent(buf: ReplayBuffer, batch) -> None:
    assert torch.equal(batch.obs["obs"], batch.reward[:, None].repeat(1, 2))
    assert torch.equal(batch.next_obs["obs"], batch.reward[:, None].repeat(1, 2) + 0.5)


# ---- staging capped at capacity -----------------------------------------------------------------------
def test_a_slot_past_capacity_keeps_and_samples_its_newest_rows():
    buf = ReplayBuffer(VECTOR, 6)
    buf.extend(_step([0, 1, 2]))
    buf.reserve_staging(2, 20)  # a generation of 20 fresh transitions per slot, capacity 6
    assert buf.slot_capacity == 20 and buf.slot_rows == 6 and buf.staging_rows == 12
    assert buf.memory_bytes == replay_bytes(VECTOR, 6, 2, 20) == (6 + 2 * 6) * 32
    own = [100.0 + i for i in range(20)]
    _fill(buf, 0, own, num_envs=4)
    _fill(buf, 1, [200.0 + i for i in range(3)], num_envs=3)
    assert buf.staged_count(0) == 6 and buf.written_count(0) == 20 and buf.available(0) == 9
    g = torch.Generator().manual_seed(0)
    batch = buf.sample(3000, 0, g)
    assert set(batch.reward.tolist()) == {0, 1, 2, *own[-6:]}  # committed plus its newest 6 only
    _consistent(buf, batch)
    assert set(buf.sample(500, 1, g).reward.tolist()) == {0, 1, 2, 200, 201, 202}
    assert buf.shard(0)["reward"].tolist() == own[-6:]  # oldest first
    assert buf.shard(1)["reward"].tolist() == [200, 201, 202]
    with pytest.raises(RuntimeError, match="is full"):  # a generation still takes at most slot_capacity
        buf.add(0, _step([1.0]))
    buf.commit([buf.shard(0), buf.shard(1)])
    assert buf.committed()["reward"].tolist() == [*own[-3:], 200, 201, 202]  # the newest `capacity`
    assert buf.staged_count(0) == buf.written_count(0) == 0


def test_commit_past_capacity_equals_the_uncapped_buffer():
    """Whatever the slots wrap, the committed ring ends up as with whole-generation slots."""
    rng = np.random.default_rng(0)
    capped, whole = ReplayBuffer(VECTOR, 7), ReplayBuffer(VECTOR, 7)
    capped.reserve_staging(3, 24)
    whole.reserve_staging(3, 24)
    whole.slot_rows = 24  # what the buffer did before staging was capped: a slot holds the generation
    whole._storage = whole._alloc(7 + 3 * 24)
    next_id = 0
    for _generation in range(4):
        for slot in range(3):
            for b in (capped, whole):
                b.reset_slot(slot)
            count = int(rng.integers(0, 25))
            values = [float(next_id + i) for i in range(count)]
            next_id += count
            _fill(capped, slot, values, num_envs=3)
            _fill(whole, slot, values, num_envs=3)
            assert capped.shard(slot)["reward"].tolist() == values[-7:]
        capped.commit([capped.shard(s) for s in range(3)])
        whole.commit([whole.shard(s) for s in range(3)])
        assert capped.size == whole.size and capped.pos == whole.pos
        for k in capped.fields:
            assert torch.equal(capped.committed()[k], whole.committed()[k])
        assert torch.equal(capped.gather(torch.arange(7))["reward"], whole.gather(torch.arange(7))["reward"])


def test_a_step_wider_than_the_slot_keeps_its_newest_rows():
    buf = ReplayBuffer(VECTOR, 3)
    buf.reserve_staging(1, 10)
    buf.add(0, _step([1, 2]))
    buf.add(0, _step([3, 4, 5, 6, 7]))  # more sub-envs than rows
    assert buf.staged_count(0) == 3 and buf.shard(0)["reward"].tolist() == [5, 6, 7]
    buf.add(0, _step([8]))
    assert buf.shard(0)["reward"].tolist() == [6, 7, 8]
    assert set(buf.sample(300, 0, torch.Generator().manual_seed(1)).reward.tolist()) == {6, 7, 8}


def test_reserving_again_reuses_or_grows_the_staging():
    buf = ReplayBuffer(VECTOR, 10)
    buf.extend(_step(list(range(4))))
    buf.reserve_staging(2, 50)
    storage = buf._storage["reward"]
    buf.reserve_staging(2, 80)  # capped at the same rows: nothing reallocated
    assert buf._storage["reward"] is storage and buf.slot_capacity == 80 and buf.slot_rows == 10
    buf.reserve_staging(3, 5)  # another population size: reallocated, the committed rows kept
    assert buf.slot_rows == 5 and buf.memory_bytes == replay_bytes(VECTOR, 10, 3, 5)
    assert buf.committed()["reward"].tolist() == [0, 1, 2, 3]


# ---- unchanged when a generation fits the capacity ----------------------------------------------------
class OldReplay:
    """The semantics before staging was capped, written plainly: the committed ring plus, per slot, the list
    of its staged transitions, stored after the ring at ``capacity + slot * slot_capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.ring, self.pos, self.size = capacity, [None] * capacity, 0, 0
        self.slot_capacity, self.slots = 0, []

    def reserve(self, slots: int, slot_capacity: int) -> None:
        if not (slots == len(self.slots) and slot_capacity <= self.slot_capacity):
            self.slot_capacity = slot_capacity
        self.slots = [[] for _ in range(slots)]

    def add(self, slot: int, values: list[float]) -> None:
        assert len(self.slots[slot]) + len(values) <= self.slot_capacity
        self.slots[slot].extend(values)

    def commit(self) -> None:
        for staged in self.slots:
            for v in staged:
                self.ring[self.pos] = v
                self.pos = (self.pos + 1) % self.capacity
                self.size = min(self.size + 1, self.capacity)
        self.slots = [[] for _ in self.slots]

    def sample(self, batch: int, slot: int, g: torch.Generator) -> tuple[list[int], list[float]]:
        staged = self.slots[slot]
        idx = torch.randint(0, self.size + len(staged), (batch,), generator=g).tolist()
        rows = [i if i < self.size else self.capacity + slot * self.slot_capacity + i - self.size for i in idx]
        values = [self.ring[i] if i < self.size else staged[i - self.size] for i in idx]
        return rows, values


@pytest.mark.parametrize("capacity,slot_capacity", [(40, 12), (40, 40), (9, 9)])
def test_identical_to_the_old_layout_when_slot_capacity_fits(capacity, slot_capacity):
    rng = np.random.default_rng(capacity + slot_capacity)
    buf, ref = ReplayBuffer(VECTOR, capacity), OldReplay(capacity)
    next_id = 0
    for generation in range(5):
        slots = 3 if generation < 3 else 2
        buf.reserve_staging(slots, slot_capacity - generation % 2)  # smaller again: the staging is reused
        ref.reserve(slots, slot_capacity - generation % 2)
        assert buf.slot_rows == ref.slot_capacity and buf.slot_capacity == ref.slot_capacity
        for slot in range(slots):
            count = int(rng.integers(0, ref.slot_capacity // 3 + 1)) * 3
            values = [float(next_id + i) for i in range(count)]
            next_id += count
            _fill(buf, slot, values, num_envs=3)
            ref.add(slot, values)
            assert buf.staged_count(slot) == buf.written_count(slot) == count
            if buf.available(slot):
                g1, g2 = torch.Generator().manual_seed(generation), torch.Generator().manual_seed(generation)
                rows = buf.sample_rows(64, slot, g1)
                ref_rows, ref_values = ref.sample(64, slot, g2)
                assert rows.tolist() == ref_rows  # the same draws, the same storage rows
                assert buf.transitions(rows).reward.tolist() == ref_values
            assert buf.shard(slot)["reward"].tolist() == values
        buf.commit([buf.shard(s) for s in range(slots)])
        ref.commit()
        assert (buf.size, buf.pos) == (ref.size, ref.pos)
        held = buf.gather(torch.arange(buf.size))["reward"].tolist()
        assert held == ref.ring[: ref.size]  # the same committed ring, row for row
        assert buf.memory_bytes == replay_bytes(VECTOR, capacity, slots, ref.slot_capacity)


def per_draw(per, buf, slot: int, b: int, beta: float, generator: torch.Generator):
    """One member's stratified draw (a group of one): (storage rows [B], weights [B], tree leaves [B])."""
    rows, weights, leaves = GroupPriorities([per]).sample_rows(
        buf, [slot], [b], torch.tensor([beta], dtype=torch.float64), torch.rand(1, b, generator=generator,
                                                                                dtype=torch.float64))
    return rows[0], weights[0], leaves[0]


def per_learned(per, leaves: list[int], priorities: list[float]) -> None:
    """The priorities a learn step gives `leaves` (alpha 1, eps 0: the errors themselves)."""
    GroupPriorities([per]).update(torch.tensor([leaves]), torch.tensor([priorities]), [len(leaves)])


def test_prioritised_replay_unchanged_without_wrap_and_refreshed_after_it():
    buf = ReplayBuffer(VECTOR, 4)
    buf.extend(_step([0, 1, 2, 3]))
    buf.reserve_staging(2, 4)  # fits: leaf 4 + j is slot 1's row j, as before
    per = MemberPriorities(capacity=4, staging=0, alpha=1.0, eps=0.0)
    per.committed(0, 4)
    buf.add(1, _step([10, 11]))
    rows, _, leaves = per_draw(per, buf, 1, 64, beta=1.0, generator=torch.Generator().manual_seed(0))
    expect = np.where(leaves.numpy() < 4, leaves.numpy(), 4 + 1 * 4 + (leaves.numpy() - 4))
    assert rows.tolist() == expect.tolist() and per.tree.leaves.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert set(buf.transitions(rows).reward.tolist()) == {0, 1, 2, 3, 10, 11}

    buf, per = ReplayBuffer(VECTOR, 4), MemberPriorities(capacity=4, staging=0, alpha=1.0, eps=0.0)
    buf.reserve_staging(2, 16)  # a generation of 16: slots of 4 rows
    _fill(buf, 1, [10, 11, 12, 13, 14, 15], num_envs=2)
    g = torch.Generator().manual_seed(0)
    rows, _, leaves = per_draw(per, buf, 1, 256, beta=1.0, generator=g)
    assert per.staging == 4 and per.tree.leaves.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert set(buf.transitions(rows).reward.tolist()) == {12, 13, 14, 15}  # the slot's newest rows
    per_learned(per, [4, 5, 6, 7], [0.5] * 4)  # learned: lower priorities
    per_learned(per, [4], [3.0])  # max_priority 3
    buf.add(1, _step([16, 17]))  # overwrite slot rows 2 and 3 (the oldest)
    rows, _, leaves = per_draw(per, buf, 1, 256, beta=1.0, generator=g)
    assert per.tree.leaves[4:].tolist() == [3.0, 0.5, 3.0, 3.0]  # the new rows enter at the largest priority
    assert set(buf.transitions(rows).reward.tolist()) <= {14, 15, 16, 17}
    _fill(buf, 1, [18, 19, 20, 21], num_envs=4)  # a whole slot at once: every row is new
    per_draw(per, buf, 1, 8, beta=1.0, generator=g)
    assert per.tree.leaves[4:].tolist() == [3.0, 3.0, 3.0, 3.0]
    per_learned(per, [4, 5, 6, 7], [0.25] * 4)
    buf.add(1, _step([22, 23]))  # 14 written: slot rows 0 and 1
    rows, _, _ = per_draw(per, buf, 1, 256, beta=1.0, generator=g)
    assert per.tree.leaves[4:].tolist() == [3.0, 3.0, 0.25, 0.25]
    assert set(buf.transitions(rows).reward.tolist()) == {20, 21, 22, 23}


# ---- the estimate and the check -----------------------------------------------------------------------
@pytest.mark.parametrize("capacity,slots,slot_capacity", [(100, 0, 0), (100, 4, 30), (100, 4, 100), (100, 3, 1000),
                                                          (7, 2, 1)])
def test_replay_bytes_is_what_the_buffer_allocates(capacity, slots, slot_capacity):
    obs = ObsSpec(spaces.Dict({"img": spaces.Box(0, 255, (3, 8, 8), np.uint8), "v": spaces.Box(-1, 1, (5,))}))
    ma = MultiAgentSpec.from_spaces(["a", "b"], {"a": spaces.Box(-1, 1, (3,)), "b": spaces.Discrete(4)},
                                    {"a": spaces.Discrete(3), "b": spaces.Box(-1, 1, (2,))})
    for fields in (VECTOR, transition_fields(obs, 6, action_spec(spaces.Box(-1, 1, (2,))), n_step=3), multi_agent_fields(ma)):
        buf = ReplayBuffer(fields, capacity)
        if slots:
            buf.reserve_staging(slots, slot_capacity)
        assert buf.memory_bytes == replay_bytes(fields, capacity, slots, slot_capacity)


def test_an_oversize_buffer_is_a_config_error_before_anything_is_allocated(monkeypatch):
    sizes = []
    zeros = torch.zeros

    def recording_zeros(*shape, **kwargs):
        sizes.append(shape)
        return zeros(*shape, **kwargs)

    monkeypatch.setattr(torch, "zeros", recording_zeros)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        ReplayBuffer(FRAMES, 10**7)  # 565 GB of 84x84x4 frames (obs and next_obs)
    assert time.perf_counter() - t0 < 1.0
    assert sizes == []  # not one field was allocated
    text = str(err.value)
    assert "hyperparameters.buffer_size (10,000,000 rows)" in text and "564.64 GB" in text
    assert "56,464 bytes (obs.obs + next_obs.obs: 56,448 bytes of 56,464)" in text
    assert MEMORY_CHECK_ENV in text


def test_the_message_names_the_fields_and_the_largest_buffer_that_fits(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 16 * GB)
    with pytest.raises(ConfigError) as err:  # pong_dqn.yaml on a 16 GB machine
        check_replay_fits(FRAMES, 100_000, 4, 250_000, "cpu", "pong-dqn")
    text = str(err.value)
    fit = largest_buffer_size(FRAMES, 4, 250_000, 0.9 * 16 * GB)
    assert replay_bytes(FRAMES, fit, 4, 250_000) <= 0.9 * 16 * GB < replay_bytes(FRAMES, fit + 1, 4, 250_000)
    assert text.startswith("pong-dqn: the replay buffer needs 28.23 GB but 16.00 GB of host memory")
    assert "population_size (4) x staging rows (100,000" in text and "= 250,000, capped at buffer_size" in text
    assert f"at most {fit:,} rows fit" in text and "evo_steps/num_envs" in text
    assert check_replay_fits(FRAMES, fit, 4, 250_000, "cpu", "pong-dqn") == replay_bytes(FRAMES, fit, 4, 250_000)


def test_reserve_staging_checks_before_growing(monkeypatch):
    buf = ReplayBuffer(FRAMES, 1_000)  # 56 MB
    buf.extend({k: torch.ones((5, *f.shape), dtype=f.dtype) for k, f in FRAMES.items()})
    before = {k: t for k, t in buf._storage.items()}
    monkeypatch.setattr(memory, "available_bytes", lambda device: 200 * 10**6)
    with pytest.raises(ConfigError, match=r"population_size \(4\) x staging rows \(1,000"):
        buf.reserve_staging(4, 250_000)  # 56 MB + 4 x 56 MB: more than 90% of 200 MB + the 56 MB held
    assert all(buf._storage[k] is t for k, t in before.items()) and buf.size == 5 and buf.slot_rows == 0
    buf.reserve_staging(1, 250_000)  # 113 MB, and 28 MB copied one field at a time: fits
    assert buf.memory_bytes == replay_bytes(FRAMES, 1_000, 1, 250_000) and buf.size == 5
    assert buf.committed()["obs.obs"].eq(1).all()


def test_the_environment_variable_turns_the_check_off(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "available_bytes", lambda device: calls.append(device) or 1)
    with pytest.raises(ConfigError):
        ReplayBuffer(VECTOR, 100)
    monkeypatch.setenv(MEMORY_CHECK_ENV, "0")
    calls.clear()
    buf = ReplayBuffer(VECTOR, 100)
    buf.reserve_staging(2, 10)
    assert check_replay_fits(FRAMES, 10**9, 4, 10**6, "cpu", "x") == replay_bytes(FRAMES, 10**9, 4, 10**6)
    assert calls == []  # not even asked


def test_available_bytes_on_the_host(monkeypatch, tmp_path):
    host = available_bytes("cpu")
    assert host > 0
    monkeypatch.setattr(memory, "_CGROUP", tmp_path)  # no cgroup files: the host's figure
    monkeypatch.setitem(sys.modules, "psutil", None)  # no psutil: /proc/meminfo
    meminfo = available_bytes("cpu")
    assert abs(meminfo - host) < 0.2 * host + 2 * GB
    (tmp_path / "memory.max").write_text("max\n")
    assert available_bytes("cpu") > 0.5 * meminfo
    (tmp_path / "memory.max").write_text(f"{3 * GB}\n")  # a container limited to 3 GB, 1 GB of it in use
    (tmp_path / "memory.stat").write_text(f"anon {GB - 4096}\nfile {GB}\nshmem 4096\n")
    if meminfo > 3 * GB:
        assert available_bytes("cpu") == 2 * GB


def test_sum_trees_on_tensors_keep_the_last_write_and_find_by_cumulative_mass():
    """A group's trees as one tensor: updates with repeated leaves (the last value wins) and padding (left out)
    leave every internal node the sum of its children, and a draw lands on the leaf whose cumulative mass holds
    it, as a plain search over the leaves finds."""
    pers = [MemberPriorities(capacity=13, staging=0, alpha=1.0, eps=0.0) for _ in range(3)]
    g = torch.Generator().manual_seed(0)
    for i, per in enumerate(pers):
        per.tree.set_all(torch.rand(13, generator=g, dtype=torch.float64) + i)
    group = GroupPriorities(pers)
    leaves = torch.tensor([[3, 5, 3, 12], [0, 0, 7, 1], [9, 2, 2, 2]])
    errors = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [0.5, 0.25, 9.0, 10.0]])
    before = [p.tree.leaves.clone() for p in pers]
    group.update(leaves, errors, [4, 3, 2])  # member 1's last and member 2's last two are padding
    want = [before[0].clone(), before[1].clone(), before[2].clone()]
    want[0][[5, 3, 12]] = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)  # leaf 3: its last value, 3
    want[1][[0, 7]] = torch.tensor([6.0, 7.0], dtype=torch.float64)
    want[2][[9, 2]] = torch.tensor([0.5, 0.25], dtype=torch.float64)
    for per, w in zip(pers, want, strict=True):
        assert torch.equal(per.tree.leaves, w)
        t, base = per.tree.tree, per.tree.base
        assert torch.equal(t[1:base], t[2: 2 * base: 2] + t[3: 2 * base: 2])  # every node its children's sum
    assert [float(p.max_priority) for p in pers] == [4.0, 7.0, 1.0]
    buf = ReplayBuffer(VECTOR, 13)
    buf.extend(_step(list(range(13))))
    buf.reserve_staging(3, 1)  # (a staging leaf each, empty: no mass)
    u = torch.rand(3, 64, generator=g, dtype=torch.float64)
    rows, weights, drawn = group.sample_rows(buf, [0, 1, 2], [64, 64, 32], torch.ones(3, dtype=torch.float64), u)
    for i, per in enumerate(pers):
        cum = torch.cumsum(per.tree.leaves, 0)
        mass = (torch.arange(64, dtype=torch.float64) + u[i]) * (cum[-1] / (64 if i < 2 else 32))
        expect = torch.searchsorted(cum, mass, right=True).clamp(max=per.tree.size - 1)
        n = 64 if i < 2 else 32
        assert torch.equal(drawn[i, :n], expect[:n]) and torch.equal(rows[i, :n], expect[:n])
        assert (weights[i, n:] == 0).all() and float(weights[i, :n].max()) == 1.0
    group.check()
    empty = MemberPriorities(capacity=4, staging=0, alpha=1.0, eps=0.0)
    lone = GroupPriorities([empty])
    small = ReplayBuffer(VECTOR, 4)
    small.extend(_step([0, 1]))
    small.reserve_staging(1, 1)
    lone.sample_rows(small, [0], [8], torch.ones(1, dtype=torch.float64), torch.rand(1, 8, generator=g,
                                                                                       dtype=torch.float64))
    with pytest.raises(RuntimeError, match="empty prioritised buffer"):
        lone.check()


def test_groups_writing_and_drawing_in_threads_keep_to_their_own_slots():
    """The threads runner trains groups at once on one buffer: each group's cached write rows and draw offsets
    are its own (a single shared cache entry once let one group write a step into another's slot)."""
    import sys
    import threading

    buf = ReplayBuffer(VECTOR, 400)
    buf.extend(_step(list(range(64))))
    buf.reserve_staging(4, 300)  # room for every row written
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible

    def group(slots: list[int]) -> None:
        for t in range(150):
            values = [1000 * s + t for s in slots for _ in range(2)]  # 2 rows per slot per step
            buf.add_group(slots, _step(values))
            buf.sample_rows_group(slots, lambda bound: torch.zeros(len(slots), 4, dtype=torch.int64) +
                                  torch.as_tensor(bound).view(-1, 1) - 1)

    try:
        threads = [threading.Thread(target=group, args=(s,)) for s in ([0, 1], [2, 3])]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(before)
    for s in range(4):
        assert buf.shard(s)["reward"].tolist() == [float(1000 * s + t) for t in range(150) for _ in range(2)]
