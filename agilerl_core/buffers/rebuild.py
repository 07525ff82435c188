"""A replay buffer rebuilt from a run's committed shards.

The buffer is not stored as a whole: after each generation its manifest records the ring state (size, pos,
capacity) and the shards of fresh transitions, and the newest shards are exactly the last ``capacity``
committed transitions. The run's storage sits above this layer (``agilerl_core.io``), so it is handed in: any
object with the :class:`CommittedShards` methods (:class:`agilerl_core.io.run_store.RunStore` is one).
"""

from __future__ import annotations

from typing import Any, Protocol

from agilerl_core.buffers.replay import ReplayBuffer, Shard
from agilerl_core.errors import CheckpointError


class CommittedShards(Protocol):
    """What a rebuild reads of a run's committed generations. A shard ref is whatever :meth:`shard_refs` and
    :meth:`buffer_window` hand out and :meth:`get_shard` takes."""

    @property
    def uri(self) -> str: ...

    def manifest(self, generation: int) -> dict[str, Any]: ...

    def manifest_url(self, generation: int) -> str: ...

    def shard_refs(self, generation: int) -> list[Any]: ...

    def buffer_window(self, generation: int) -> list[tuple[int, Any]]: ...

    def get_shard(self, ref: Any) -> Shard: ...


def ring_after(size: int, pos: int, capacity: int, rows: int) -> tuple[int, int]:
    """(size, pos) of a ring buffer after appending `rows` transitions."""
    return min(size + rows, capacity), (pos + rows) % capacity


def rebuild_from_shards(store: CommittedShards, generation: int, buffer: ReplayBuffer) -> None:
    """Fill `buffer` with its committed contents after `generation`, ring layout included."""
    state = store.manifest(generation)["buffer"]
    if int(state["capacity"]) != buffer.capacity:
        raise CheckpointError(f"{store.manifest_url(generation)}: field buffer.capacity: the run's buffer capacity was "
                              f"{state['capacity']}, not {buffer.capacity}")
    parts = [store.get_shard(ref) for _, ref in store.buffer_window(generation)]
    size = int(state["size"])
    if not parts:
        buffer.size, buffer.pos = 0, 0
        return
    missing = sorted({k for p in parts for k in buffer.missing_fields(p)})
    if missing:
        raise CheckpointError(f"{store.uri}: the stored experience lacks field(s) {', '.join(missing)} that this "
                              f"version's buffer keeps (written by an older version); start a new run (or "
                              f"resume it with the version that wrote it)")
    try:
        buffer.load_shards(parts, size, int(state["pos"]))
    except (ValueError, RuntimeError, TypeError, IndexError) as err:
        raise CheckpointError(f"{store.manifest_url(generation)}: the buffer state (field buffer) does not fit the "
                              f"stored shards ({err})") from None


def extend_from_shards(store: CommittedShards, generation: int, buffer: ReplayBuffer) -> None:
    """Append generation `generation`'s shards to `buffer` (a worker catching up by one generation)."""
    for ref in store.shard_refs(generation):
        buffer.extend(store.get_shard(ref))
