"""A run's writer lease: one process writes a run at a time.

``<run>/LEASE.json`` names the writer (host, pid and a random tag), when it took the lease and its last
heartbeat, and a TTL: a lease whose heartbeat is older than its TTL, or whose process on this host is gone, is
stale and another writer may take it over. :class:`LeaseRecord` holds
:class:`agilerl_core.io.run_store.RunStore`'s lease methods; :class:`LeaseKeeper` holds the lease for as long as a
writer works, refreshing its heartbeat from a background thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from agilerl_core.errors import CheckpointError, LeaseError
from agilerl_core.io.manifest import VERSION
from agilerl_core.io.records import field

if TYPE_CHECKING:
    from agilerl_core.io.run_store import RunStore

LEASE_FORMAT = "agilerl-flow/lease"
LEASE_TTL_S = 60.0  # a lease whose heartbeat is older than this is stale: another writer may take it over


def new_lease_owner() -> str:
    """This process's lease owner name: host, pid and a random tag (one per writer)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _owner_dead(owner: str) -> bool:
    """Whether `owner` names a process on this host that no longer runs (its lease is stale at once)."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class LeaseRecord:
    """The writer's lease methods of :class:`agilerl_core.io.run_store.RunStore` (a mixin: they read and write
    ``LEASE.json`` through the store's `storage`, `run_id`, `uri`, `key` and JSON helpers)."""

    def lease(self) -> dict[str, Any] | None:
        """The lease as stored (None when the run has none)."""
        if not self.storage.exists(self.key("LEASE.json")):
            return None
        data = self._get_json("LEASE.json", LEASE_FORMAT)
        url = self.storage.url(self.key("LEASE.json"))
        field(data, "owner", str, url)
        for name in ("heartbeat", "ttl_s", "acquired"):
            if name in data and not math.isfinite(field(data, name, float, url)):
                raise CheckpointError(f"{url}: field {name} is not a finite number")
        return data

    def acquire_lease(self, owner: str, ttl_s: float = LEASE_TTL_S) -> None:
        """Become the run's one writer: refuse, naming the owner, while another writer's lease is live (its
        heartbeat younger than its TTL and its process, when on this host, alive); take over a stale one.
        Object stores have no compare-and-swap here, so the lease is written, then read back after a pause:
        of two writers racing for it, the one whose write landed last keeps it and the other is refused."""
        held = self.lease()
        now = time.time()
        if held is not None and held.get("owner") != owner:
            age = now - float(held.get("heartbeat", 0.0))
            if age < float(held.get("ttl_s", ttl_s)) and not _owner_dead(str(held.get("owner"))):
                raise LeaseError(
                    f"run {self.run_id!r} at {self.uri} is being written by {held.get('owner')} (its last heartbeat "
                    f"{age:.0f} s ago); a second writer would discard its uncommitted work. Wait for it to finish or "
                    f"stop it; once its heartbeat is {held.get('ttl_s', ttl_s):.0f} s old, `agilerl-flow resume "
                    f"{self.run_id}` takes the run over")
        self._put_json("LEASE.json", {"format": LEASE_FORMAT, "version": VERSION, "owner": owner,
                                      "acquired": now, "heartbeat": now, "ttl_s": float(ttl_s)})
        time.sleep(0.2)
        mine = self.lease()
        if mine is None or mine.get("owner") != owner:
            raise LeaseError(f"run {self.run_id!r} at {self.uri}: {None if mine is None else mine.get('owner')} took "
                             f"the writer's lease at the same moment; only one writer may run it")

    def heartbeat(self, owner: str) -> None:
        """Refresh the lease; a LeaseError when another writer has taken it over (this one must stop)."""
        held = self.lease()
        if held is None or held.get("owner") != owner:
            raise LeaseError(f"run {self.run_id!r} at {self.uri}: the writer's lease was taken over by "
                             f"{None if held is None else held.get('owner')}; this writer stops")
        self._put_json("LEASE.json", {**held, "heartbeat": time.time()})

    def release_lease(self, owner: str) -> None:
        """Give the lease up (only if it is still this owner's)."""
        held = self.lease()
        if held is not None and held.get("owner") == owner:
            self.storage.delete([self.key("LEASE.json")])


class LeaseKeeper:
    """Holds a run's writer lease for as long as a writer works: takes it, refreshes its heartbeat from a
    background thread every TTL/4, gives it up at the end (:meth:`start`, then :meth:`stop`). A heartbeat
    that finds the lease taken over is remembered; :meth:`check` raises it before the next commit."""

    def __init__(self, store: RunStore, ttl_s: float = LEASE_TTL_S, owner: str | None = None) -> None:
        self.store, self.ttl_s = store, float(ttl_s)
        self.owner = owner or new_lease_owner()
        self._stop = threading.Event()
        self._lost: LeaseError | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> LeaseKeeper:
        self.store.acquire_lease(self.owner, self.ttl_s)
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.store.run_id}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.store.heartbeat(self.owner)
            except LeaseError as err:
                self._lost = err
                return
            except Exception:  # a storage hiccup: the next beat tries again (the TTL leaves room for three)
                continue

    def check(self) -> None:
        """Raise the LeaseError a heartbeat found (the lease was taken over: stop writing)."""
        if self._lost is not None:
            raise self._lost

    def stop(self) -> None:
        """Stop the heartbeat and give the lease up."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self.store.release_lease(self.owner)
