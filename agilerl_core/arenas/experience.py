"""What an arena does with its members' experience between generations.

:class:`SharedReplay`: one replay buffer shared by the population (every off-policy arena, Gymnasium or
multi-agent). During generation g a member samples from the buffer as committed at the end of g-1 plus its
own staging slot; at the commit the slots' shards are appended in member order.
:class:`OwnExperience`: members learn only from what they collect themselves (on-policy arenas), so a
generation commits no experience."""

from __future__ import annotations

from typing import Any

from agilerl_core.buffers.replay import ReplayBuffer, Shard, shard_rows


class SharedReplay:
    """Mixin of an arena holding `buffer` (a ReplayBuffer) and `slot_capacity` (fresh transitions per slot
    per generation)."""

    shares_experience = True
    buffer: ReplayBuffer
    slot_capacity: int

    def begin_generation(self, slots: int) -> None:
        self.buffer.reserve_staging(slots, self.slot_capacity)

    def shard(self, slot: int) -> Shard:
        return self.buffer.shard(slot)

    def commit_experience(self, shards: list[Shard], members: list[Any]) -> None:
        first = self.buffer.pos
        self.buffer.commit(shards)
        count = sum(shard_rows(sh) for sh in shards)
        dead = self.buffer.dead_committed_rows()
        for m in members:  # e.g. prioritised replay: the new rows enter every member's priorities
            m.committed(first, count, dead)

    def experience_state(self) -> dict[str, int]:
        b = self.buffer
        return {"size": b.size, "pos": b.pos, "capacity": b.capacity}

    def restore_experience(self, store: Any, generation: int) -> None:
        store.rebuild_buffer(generation, self.buffer)

    def sync_experience(self, store: Any, synced: int, target: int) -> None:
        """A worker process's shared experience from the commit of generation `synced` to that of `target`."""
        if synced == target:
            return
        if synced == target - 1 and target >= 0:
            store.extend_buffer(target, self.buffer)
        elif target >= 0:
            store.rebuild_buffer(target, self.buffer)
        else:
            self.buffer.size, self.buffer.pos = 0, 0


class OwnExperience:
    """Mixin of an arena whose members share no experience: nothing to stage, commit or restore."""

    shares_experience = False
    buffer = None

    def begin_generation(self, slots: int) -> None:
        return None

    def shard(self, slot: int) -> None:
        return None

    def commit_experience(self, shards: list[Any], members: list[Any]) -> None:
        return None

    def experience_state(self) -> dict[str, int]:
        return {"size": 0, "pos": 0, "capacity": 0}

    def restore_experience(self, store: Any, generation: int) -> None:
        return None

    def sync_experience(self, store: Any, synced: int, target: int) -> None:
        return None
