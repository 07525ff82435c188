"""A run's committed generations in a :class:`Storage`.

Layout under ``<storage uri>/<run id>/``::

    run.json                                  format tag, the config (secrets redacted), creation time
    LEASE.json                                the writer's lease: owner (host, pid), heartbeat time, TTL
    generations/000007/population/...         every member as evaluated in generation 7, the evolution
                                              RNG, lineage, history (a population checkpoint)
    generations/000007/shards/<slot>.safetensors   each member's fresh transitions of generation 7
    generations/000007/MANIFEST.json          written LAST: every file above with its SHA-256, the shard
                                              row counts, the buffer ring state and the elite slot
    elite/                                    the final elite (a member checkpoint)

A generation without a manifest did not happen: readers only ever look at generations that have one,
and a resumed run deletes whatever a crash left behind after the last manifest. The replay buffer is
not stored as a whole: it is rebuilt from the newest shards (they are exactly the last ``capacity``
committed transitions), so retention keeps the shards that still reach into the buffer, the member
checkpoints of the last K generations, and the elite of every generation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors_bytes
from safetensors.torch import save as save_tensors_bytes

from agilerl_core.buffers.replay import ReplayBuffer, Shard, shard_rows
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.errors import CheckpointError, ConfigError, LeaseError
from agilerl_core.hpo.population import Member, Population
from agilerl_core.io.checkpoint import (
    POPULATION_FORMAT,
    Algorithms,
    Rebuild,
    lineage_events,
    load_member,
    load_population,
    save_member,
    save_population,
)
from agilerl_core.io.digest import sha256_file
from agilerl_core.io.files import quote
from agilerl_core.io.records import check_type, field, read_format, sized
from agilerl_core.io.storage import Storage, contained, safe_relpath

RUN_FORMAT = "agilerl-flow/run"
MANIFEST_FORMAT = "agilerl-flow/generation"
LEASE_FORMAT = "agilerl-flow/lease"
VERSION = 1
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id or ""):
        raise ConfigError(f"run id {run_id!r}: use 1-128 letters, digits, '.', '_' or '-' (starting with a letter "
                          f"or digit)")
    return run_id


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ShardRef:
    """Where one member's fresh transitions of a generation are stored."""

    key: str
    sha256: str
    rows: int


def ring_after(size: int, pos: int, capacity: int, rows: int) -> tuple[int, int]:
    """(size, pos) of a ring buffer after appending `rows` transitions."""
    return min(size + rows, capacity), (pos + rows) % capacity


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


class RunStore:
    """Read and write one run's generations."""

    def __init__(self, storage: Storage, run_id: str) -> None:
        self.storage = storage
        self.run_id = check_run_id(run_id)
        self._settled: set[int] = set()  # generations pruned for good (members and shards): never read again

    def key(self, *parts: str) -> str:
        return "/".join([self.run_id, *parts])

    @property
    def uri(self) -> str:
        return self.storage.url(self.run_id)

    @staticmethod
    def gen_dir(generation: int) -> str:
        return f"generations/{generation:06d}"

    # ---- run info --------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.storage.exists(self.key("run.json"))

    def init_run(self, config: dict[str, Any], grouping: dict[str, Any] | None = None) -> bool:
        """Record the run's config and `grouping` (what decides which members train together: pinned, since
        the runner may change on resume); True for a new run. An existing run must have the same config."""
        if self.exists():
            info = self.run_info()
            if _comparable(info["config"]) != _comparable(config):
                diff = sorted(k for k in set(info["config"]) | set(config)
                              if info["config"].get(k) != config.get(k))
                raise ConfigError(f"run {self.run_id!r} at {self.uri} was started with a different config "
                                  f"(differs in: {', '.join(diff)}); resume it with `agilerl-flow resume "
                                  f"{self.run_id}` or choose a new run id")
            return False
        self._put_json("run.json", {"format": RUN_FORMAT, "version": VERSION, "run_id": self.run_id,
                                    "created": time.time(), "config": config,
                                    **({"grouping": grouping} if grouping is not None else {})})
        return True

    def pinned_grouping(self) -> dict[str, Any] | None:
        """The grouping the run was started with (None for a run recorded before grouping was pinned)."""
        grouping = self.run_info().get("grouping")
        return grouping if isinstance(grouping, dict) else None

    def run_info(self) -> dict[str, Any]:
        data = self._get_json("run.json", RUN_FORMAT)
        url = self.storage.url(self.key("run.json"))
        field(data, "config", dict, url)
        field(data, "grouping", (dict, None), url, None)
        return data

    # ---- the writer's lease ----------------------------------------------------------------------------
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

    # ---- shards ----------------------------------------------------------------------------------------
    def put_shard(self, generation: int, slot: int, shard: Shard) -> ShardRef:
        data = save_tensors_bytes({k: v.detach().cpu().contiguous() for k, v in shard.items()},
                                  metadata={"format": "agilerl-flow/shard"})
        key = self.key(self.gen_dir(generation), "shards", f"{slot}.safetensors")
        self.storage.put_bytes(key, data)
        rows = shard_rows(shard)
        return ShardRef(key, _sha(data), rows)

    def shard_ref(self, generation: int, slot: int) -> ShardRef:
        """The ref of a shard already written (what :meth:`put_shard` returned for it)."""
        key = self.key(self.gen_dir(generation), "shards", f"{slot}.safetensors")
        data = self.storage.get_bytes(key)
        shard = load_tensors_bytes(data)
        return ShardRef(key, _sha(data), shard_rows(shard))

    def get_shard(self, ref: ShardRef) -> Shard:
        data = self.storage.get_bytes(ref.key)
        if _sha(data) != ref.sha256:
            raise CheckpointError(f"{self.storage.url(ref.key)}: checksum mismatch; the shard was truncated or "
                                  f"modified after it was written")
        try:
            return load_tensors_bytes(data)
        except (SafetensorError, ValueError) as err:
            raise CheckpointError(f"{self.storage.url(ref.key)}: not a readable safetensors file ({err})") from None

    # ---- members handed to and from another process (deployment runs) ----------------------------------
    def _dispatch_key(self, generation: int, slot: int, side: str, ext: str) -> str:
        return self.key(self.gen_dir(generation), "dispatch", f"{slot}.{side}.{ext}")

    def put_member_state(self, generation: int, slot: int, side: str, tensors: dict[str, torch.Tensor],
                         meta: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        """Member `slot`'s state as data in this generation's (uncommitted) folder: `side` "in" before its
        training elsewhere, "out" after it (with `extra`: what the training and evaluation reported)."""
        data = save_tensors_bytes({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                                  metadata={"format": "agilerl-flow/member-state"})
        self.storage.put_bytes(self._dispatch_key(generation, slot, side, "safetensors"), data)
        doc = {"format": "agilerl-flow/member-state", "version": VERSION, "sha256": _sha(data), "meta": meta,
               "extra": extra or {}}
        self.storage.put_bytes(self._dispatch_key(generation, slot, side, "json"), json.dumps(doc).encode())

    def get_member_state(self, generation: int, slot: int, side: str
                         ) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
        """(tensors, meta, extra) as :meth:`put_member_state` wrote them, checksum verified."""
        rel = self._dispatch_key(generation, slot, side, "json")[len(self.run_id) + 1:]
        doc = self._get_json(rel, "agilerl-flow/member-state")
        url = self.storage.url(self.key(rel))
        field(doc, "sha256", str, url), field(doc, "meta", dict, url), field(doc, "extra", dict, url)
        key = self._dispatch_key(generation, slot, side, "safetensors")
        data = self.storage.get_bytes(key)
        if _sha(data) != doc["sha256"]:
            raise CheckpointError(f"{self.storage.url(key)}: checksum mismatch; the member state was truncated or "
                                  f"modified after it was written")
        return load_tensors_bytes(data), doc["meta"], doc["extra"]

    # ---- commit ----------------------------------------------------------------------------------------
    def commit_generation(self, population: Population, env: dict[str, Any], shards: list[ShardRef],
                          extra: dict[str, Any], buffer_state: dict[str, int], elite_slot: int) -> None:
        """Write the evaluated population of `population.generation`, then its manifest (last)."""
        g = population.generation
        gdir = self.gen_dir(g)
        files: dict[str, str] = {}
        with tempfile.TemporaryDirectory(prefix="agilerl-commit-") as tmp:
            local = save_population(Path(tmp) / "population", population, env, None, extra)
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                data = path.read_bytes()
                key = self.key(gdir, "population", path.relative_to(local).as_posix())
                self.storage.put_bytes(key, data)
                files[key] = _sha(data)
        manifest = {"format": MANIFEST_FORMAT, "version": VERSION, "generation": g, "committed": time.time(),
                    "files": files, "shards": [asdict(s) for s in shards], "buffer": dict(buffer_state),
                    "elite_slot": int(elite_slot), "pruned": False}
        self._put_manifest(g, manifest)
        self.storage.delete_prefix(self.key(gdir, "dispatch"))  # members handed to workers: committed now

    def committed_generations(self) -> list[int]:
        gens = []
        for key in self.storage.list(self.key("generations") + "/"):
            m = re.fullmatch(re.escape(self.key("generations")) + r"/(\d{6})/MANIFEST\.json", key)
            if m:
                gens.append(int(m.group(1)))
        return sorted(gens)

    def latest_generation(self) -> int | None:
        gens = self.committed_generations()
        return gens[-1] if gens else None

    def manifest(self, generation: int) -> dict[str, Any]:
        """Generation `generation`'s manifest, every field checked (a CheckpointError naming the file and field),
        its keys as this run's storage keys. The file stores them relative to the run (``generations/...``), so
        a run moved, copied or synced under another name or prefix still verifies; a manifest written before
        that names its run's folder first (``RUN/generations/...``), which is read as this run's, whatever it
        was called then."""
        rel = f"{self.gen_dir(generation)}/MANIFEST.json"
        data = self._get_json(rel, MANIFEST_FORMAT)
        check_manifest(data, self.storage.url(self.key(rel)))
        return {**data, "files": {self.key(run_relative(k)): v for k, v in data["files"].items()},
                "shards": [{**sh, "key": self.key(run_relative(sh["key"]))} for sh in data["shards"]]}

    def _put_manifest(self, generation: int, manifest: dict[str, Any]) -> None:
        """Write a manifest with its keys relative to the run (see :meth:`manifest`)."""
        own = self.run_id + "/"
        rel = {**manifest, "files": {k.removeprefix(own): v for k, v in manifest["files"].items()},
               "shards": [{**sh, "key": sh["key"].removeprefix(own)} for sh in manifest["shards"]]}
        self._put_json(f"{self.gen_dir(generation)}/MANIFEST.json", rel)

    def population_record(self, generation: int) -> dict[str, Any]:
        """Committed generation `generation`'s population.json, verified against its manifest's checksum (the one
        reader `lineage`, `resume` and `load` share: an edited file is refused, naming the mismatch)."""
        manifest = self.manifest(generation)
        rel = f"{self.gen_dir(generation)}/population/population.json"
        sha = manifest["files"].get(self.key(rel))
        if sha is None:
            raise CheckpointError(f"{self.storage.url(self.key(rel))}: not listed in generation {generation}'s "
                                  f"manifest; the run's storage is damaged")
        return self._get_json(rel, POPULATION_FORMAT, expected_sha=sha)

    def discard_uncommitted(self) -> list[int]:
        """Delete generation folders a crash left without a manifest; returns their numbers."""
        committed = set(self.committed_generations())
        found = set()
        for key in self.storage.list(self.key("generations") + "/"):
            m = re.match(re.escape(self.key("generations")) + r"/(\d{6})/", key)
            if m and int(m.group(1)) not in committed:
                found.add(int(m.group(1)))
        for g in sorted(found):
            self.storage.delete_prefix(self.key(self.gen_dir(g)))
        return sorted(found)

    # ---- load ------------------------------------------------------------------------------------------
    def load_generation(self, generation: int, obs_spec: ObsSpec | None = None, device: str = "cpu",
                        rebuild: Rebuild | None = None, *,
                        algorithms: Algorithms | None = None) -> tuple[Population, dict[str, Any]]:
        """The evaluated population of a committed generation and its population.json metadata. Errors name
        the file by its storage URL (not the local copy it was verified in)."""
        manifest = self.manifest(generation)
        if manifest.get("pruned"):
            raise CheckpointError(f"{self.storage.url(self.key(self.gen_dir(generation), 'MANIFEST.json'))}: generation "
                                  f"{generation} was pruned by retention (field pruned); only its elite is kept")
        prefix = self.key(self.gen_dir(generation), "population")
        with tempfile.TemporaryDirectory(prefix="agilerl-load-") as tmp, self._named_in_storage(tmp, prefix):
            self._download_verified(manifest, prefix, Path(tmp))
            return load_population(Path(tmp), obs_spec, None, device, rebuild, algorithms=algorithms)

    def load_elite(self, generation: int, obs_spec: ObsSpec | None = None, device: str = "cpu",
                   rebuild: Rebuild | None = None, *, algorithms: Algorithms | None = None) -> Member:
        manifest = self.manifest(generation)
        prefix = self.key(self.gen_dir(generation), "population", "members", str(manifest["elite_slot"]))
        with tempfile.TemporaryDirectory(prefix="agilerl-load-") as tmp, self._named_in_storage(tmp, prefix):
            self._download_verified(manifest, prefix, Path(tmp))
            return load_member(Path(tmp), obs_spec, device, rebuild, algorithms=algorithms)[0]

    @contextlib.contextmanager
    def _named_in_storage(self, local: str, prefix: str):
        """A CheckpointError about a file of the local copy `local` names the file in storage instead."""
        try:
            yield
        except CheckpointError as err:
            raise CheckpointError(str(err).replace(str(Path(local)), self.storage.url(prefix))) from None

    def _download_verified(self, manifest: dict, prefix: str, local: Path) -> None:
        keys = [k for k in manifest["files"] if k.startswith(prefix + "/")]
        if not keys:
            raise CheckpointError(f"{self.storage.url(prefix)}: the manifest lists no files there")
        rels = [safe_relpath(key[len(prefix) + 1:], self.storage.url(key)) for key in keys]  # all, before reading
        for key, rel in zip(keys, rels, strict=True):
            data = self.storage.get_bytes(key)
            if _sha(data) != manifest["files"][key]:
                raise CheckpointError(f"{self.storage.url(key)}: checksum mismatch with the generation manifest; "
                                      f"the file was truncated or modified after the commit")
            dest = contained(local, rel, self.storage.url(key))
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)

    def lineage(self, generation: int) -> list[dict[str, Any]]:
        """The lineage recorded with committed generation `generation` (a CheckpointError naming the file in
        storage when it is damaged)."""
        rel = f"{self.gen_dir(generation)}/population/population.json"
        data = self.population_record(generation)  # checksum verified against the manifest first
        url = self.storage.url(self.key(rel))
        events = lineage_events(field(data, "lineage", list, url), url)
        size = self.run_info()["config"].get("population_size") if self.exists() else None
        if isinstance(size, int) and not isinstance(size, bool):
            for i, e in enumerate(events):  # a slot the run never had: drawing it would allocate for nothing
                if e.slot >= size:
                    raise CheckpointError(f"{url}: field lineage.{i}.slot is {e.slot:,}, but the run's population has "
                                          f"{size} slots (run.json: population_size)")
        return [e.to_dict() for e in events]

    def buffer_window(self, generation: int) -> list[tuple[int, ShardRef]]:
        """The shards (oldest first) whose rows make up the committed buffer after `generation`."""
        need = int(self.manifest(generation)["buffer"]["size"])
        picked: list[tuple[int, ShardRef]] = []
        rows = 0
        g = generation
        while rows < need and g >= 0:
            for s in reversed(self.manifest(g)["shards"]):
                ref = ShardRef(**s)
                if ref.rows:
                    picked.append((g, ref))
                    rows += ref.rows
                if rows >= need:
                    break
            g -= 1
        if rows < need:
            raise CheckpointError(f"{self.uri}: the shards of generations <= {generation} hold {rows} transitions, "
                                  f"fewer than the {need} the buffer had (MANIFEST.json field buffer.size); the run's "
                                  f"storage is incomplete")
        return list(reversed(picked))

    def rebuild_buffer(self, generation: int, buffer: ReplayBuffer) -> None:
        """Fill `buffer` with its committed contents after `generation`, ring layout included."""
        state = self.manifest(generation)["buffer"]
        if int(state["capacity"]) != buffer.capacity:
            raise CheckpointError(f"{self.storage.url(self.key(self.gen_dir(generation), 'MANIFEST.json'))}: field "
                                  f"buffer.capacity: the run's buffer capacity was {state['capacity']}, not "
                                  f"{buffer.capacity}")
        parts = [self.get_shard(ref) for _, ref in self.buffer_window(generation)]
        size = int(state["size"])
        if not parts:
            buffer.size, buffer.pos = 0, 0
            return
        missing = sorted({k for p in parts for k in buffer.missing_fields(p)})
        if missing:
            raise CheckpointError(f"{self.uri}: the stored experience lacks field(s) {', '.join(missing)} that this "
                                  f"version's buffer keeps (written by an older version); start a new run (or "
                                  f"resume it with the version that wrote it)")
        try:
            buffer.load_shards(parts, size, int(state["pos"]))
        except (ValueError, RuntimeError, TypeError, IndexError) as err:
            raise CheckpointError(f"{self.storage.url(self.key(self.gen_dir(generation), 'MANIFEST.json'))}: the "
                                  f"buffer state (field buffer) does not fit the stored shards ({err})") from None

    def extend_buffer(self, generation: int, buffer: ReplayBuffer) -> None:
        """Append generation `generation`'s shards to `buffer` (a worker catching up by one generation)."""
        for s in self.manifest(generation)["shards"]:
            buffer.extend(self.get_shard(ShardRef(**s)))

    # ---- retention -------------------------------------------------------------------------------------
    def prune(self, keep: int) -> list[int]:
        """Keep the member checkpoints of the last `keep` generations and every generation's elite, and the
        shards that still reach into the buffer; delete the rest. Returns the generations pruned now."""
        gens = self.committed_generations()
        if not gens:
            return []
        latest = gens[-1]
        window = {g for g, _ in self.buffer_window(latest)}
        pruned = []
        for g in gens:
            if g > latest - keep or g in self._settled:
                continue
            manifest = self.manifest(g)
            shards_needed = bool(window) and g >= min(window)
            if manifest.get("pruned") and (shards_needed or not manifest["shards"]):
                if not manifest["shards"]:
                    self._settled.add(g)
                continue
            elite = self.key(self.gen_dir(g), "population", "members", str(manifest["elite_slot"])) + "/"
            pop_json = self.key(self.gen_dir(g), "population", "population.json")
            drop = [k for k in manifest["files"] if not k.startswith(elite) and k != pop_json]
            kept = {k: v for k, v in manifest["files"].items() if k not in drop}
            drop_shards = [] if shards_needed else [s["key"] for s in manifest["shards"]]
            new = {**manifest, "files": kept, "pruned": True,
                   "shards": manifest["shards"] if shards_needed else []}
            self._put_manifest(g, new)  # the manifest first: it never lists a
            self.storage.delete(drop + drop_shards)                  # file that is gone
            if not new["shards"]:
                self._settled.add(g)
            pruned.append(g)
        return pruned

    def save_elite(self, member: Member, env: dict[str, Any]) -> str:
        """Store the final elite at ``<run>/elite/``; returns its URI. Never torn: the new weights go beside the
        old under a name of their own (``weights-<sha>.safetensors``), then member.json (one object, written
        atomically) switches to them, and only then are the old weights deleted; a crash at any point leaves
        a loadable elite, the old one or the new."""
        prefix = self.key("elite")
        with tempfile.TemporaryDirectory(prefix="agilerl-elite-") as tmp:
            local = save_member(Path(tmp) / "elite", member, env)
            meta = json.loads((local / "member.json").read_text())
            sha = meta["files"].pop("weights.safetensors")
            weights = f"weights-{sha[:16]}.safetensors"
            meta["files"][weights] = sha
            old = set(self.storage.list(prefix + "/"))
            self.storage.put_bytes(f"{prefix}/{weights}", (local / "weights.safetensors").read_bytes())
            self.storage.put_bytes(f"{prefix}/member.json", json.dumps(meta, indent=1, sort_keys=True).encode())
        self.storage.delete(sorted(old - {f"{prefix}/{weights}", f"{prefix}/member.json"}))
        return self.storage.url(prefix)

    # ---- JSON helpers ----------------------------------------------------------------------------------
    def _put_json(self, rel: str, data: dict) -> None:
        self.storage.put_bytes(self.key(rel), json.dumps(data, indent=1, sort_keys=True).encode())

    def _get_json(self, rel: str, fmt: str, expected_sha: str | None = None) -> dict:
        """A stored record through the one safe parser (size, depth, digits, duplicate keys; NaN only in
        records that may hold it: run.json's config, member states); with `expected_sha`, the bytes must
        match the generation manifest's checksum first."""
        url = self.storage.url(self.key(rel))
        raw = self.storage.get_bytes(self.key(rel))
        if expected_sha is not None and _sha(raw) != expected_sha:
            raise CheckpointError(f"{url}: checksum mismatch with the generation manifest; the file was truncated "
                                  f"or modified after the commit")
        return read_format(raw, fmt, VERSION, url, allow_nan=fmt not in (MANIFEST_FORMAT, LEASE_FORMAT))


_GEN_DIR = re.compile(r"^\d{6}$")
# an older manifest's key names its run's folder first; dropped on reading, whatever the folder was called then
_RUN_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}/(?=generations/)")
_OWN_FILE = re.compile(r"generations/\d{6}/population/[^\0\\]+")
_OWN_SHARD = re.compile(r"generations/\d{6}/shards/\d{1,9}\.safetensors")


def run_relative(key: str) -> str:
    """A manifest key relative to its run (``generations/...``), from either form a manifest stores."""
    return _RUN_PREFIX.sub("", key, count=1)


def verify_committed(path: str | Path) -> bool:
    """When local directory `path` lies inside a committed generation of a run's storage
    (``<root>/<run>/generations/<NNNNNN>/population/...``), verify every file under it against that generation's
    manifest (the check ``resume`` and ``lineage`` make), a CheckpointError naming a mismatch; True when it did,
    False when `path` is not inside a generation folder (a member saved elsewhere: its member.json checksums hold).

    The generation is found on the path as given, before any symbolic link is resolved, so a link cannot skip the
    manifest; and every file must resolve inside the run's folder, so a link to a forged copy elsewhere (a
    member, a generation, one file) is refused. The manifest's keys are relative to the run: a run moved or copied
    under another name verifies."""
    path = Path(os.path.abspath(path))  # '..' folded, links kept: the path as the caller named it
    parts = path.parts
    for i in range(len(parts) - 3, 0, -1):
        if parts[i] == "generations" and _GEN_DIR.match(parts[i + 1]) and parts[i + 2] == "population":
            break
    else:
        return False
    run_dir, gen_dir = Path(*parts[:i]), Path(*parts[:i + 2])
    man = gen_dir / "MANIFEST.json"
    if not man.exists() and not man.is_symlink():
        raise CheckpointError(f"{path}: generation folder {gen_dir} has no MANIFEST.json: the generation was never "
                              f"committed (a crash left it); load a committed generation or the run's elite/")
    data = read_format(man, MANIFEST_FORMAT, VERSION, str(man), root=run_dir)
    check_manifest(data, str(man))
    prefix = Path(*parts[i:]).as_posix()  # generations/NNNNNN/population/...
    listed = {run_relative(k): v for k, v in data["files"].items()}
    listed = {k: v for k, v in listed.items() if k == prefix or k.startswith(prefix + "/")}
    files = [path] if not path.is_dir() else [p for p in path.rglob("*") if not p.is_dir()]
    on_disk = {p.relative_to(run_dir).as_posix(): p for p in files}
    for key in sorted(set(listed) | set(on_disk)):
        if key not in listed:
            raise CheckpointError(f"{on_disk[key]}: not listed in the generation manifest {man}; a file was added "
                                  f"after the commit")
        if key not in on_disk:
            raise CheckpointError(f"{run_dir / key}: missing, though the generation manifest lists it")
        if sha256_file(on_disk[key], CheckpointError, run_dir) != listed[key]:
            raise CheckpointError(f"{on_disk[key]}: checksum mismatch with the generation manifest; the file was "
                                  f"truncated or modified after the commit")
    return True


def check_manifest(data: dict[str, Any], url: str) -> None:
    """A manifest's fields checked before any is used: file keys are files of one of the run's generations and
    their checksums strings, shards name a key (one of the run's own shard files:
    ``generations/NNNNNN/shards/SLOT.safetensors``, never another run's or any other key), a checksum and a row
    count, the buffer state and elite slot are counters within the limit table."""
    sized(data, "generation", "member_id", url)
    for k, v in field(data, "files", dict, url).items():
        if not _OWN_FILE.fullmatch(run_relative(k)) or any(p in ("", ".", "..") for p in k.split("/")):
            raise CheckpointError(f"{url}: field files: key {quote(k)} is not a file of one of this run's "
                                  f"generations (generations/NNNNNN/population/...); the manifest was modified")
        check_type(v, str, f"files.{k}", url)
    for i, shard in enumerate(field(data, "shards", list, url)):
        if not isinstance(shard, dict) or set(shard) != {"key", "sha256", "rows"}:
            raise CheckpointError(f"{url}: field shards.{i} must be an object with key, sha256 and rows")
        key = field(data, f"shards.{i}.key", str, url)
        field(data, f"shards.{i}.sha256", str, url)
        if not _OWN_SHARD.fullmatch(run_relative(key)):
            raise CheckpointError(f"{url}: field shards.{i}.key {quote(key)} is not one of this run's shard files "
                                  f"(generations/NNNNNN/shards/SLOT.safetensors); the manifest was modified")
        sized(data, f"shards.{i}.rows", "buffer_size", url)
    field(data, "buffer", dict, url)
    for name in ("size", "pos", "capacity"):
        sized(data, f"buffer.{name}", "buffer_size", url)
    sized(data, "elite_slot", "population_size", url)
    field(data, "pruned", bool, url, False)


_VOLATILE = ("storage", "tracking", "runner")  # where a run is stored/tracked/executed may change on resume


def _comparable(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in _VOLATILE}


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
