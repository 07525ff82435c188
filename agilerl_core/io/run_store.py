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

:class:`RunStore` is put together from rooms of its own: the manifests (:mod:`agilerl_core.io.manifest`), the
writer's lease (:mod:`agilerl_core.io.lease`), retention (:mod:`agilerl_core.io.retention`); the buffer's rebuild
from the shards is :mod:`agilerl_core.buffers.rebuild`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors_bytes
from safetensors.torch import save as save_tensors_bytes

from agilerl_core.buffers.rebuild import extend_from_shards, rebuild_from_shards
from agilerl_core.buffers.replay import ReplayBuffer, Shard, shard_rows
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.errors import CheckpointError, ConfigError
from agilerl_core.hpo.population import Member, Population
from agilerl_core.io.checkpoint import (
    Algorithms,
    Rebuild,
    check_tensors,
    lineage_events,
    load_member,
    load_population,
    save_member,
    save_population,
)
from agilerl_core.io.files import quote
from agilerl_core.io.lease import LEASE_FORMAT, LeaseRecord
from agilerl_core.io.manifest import MANIFEST_FORMAT, VERSION, Manifests, ShardRef
from agilerl_core.io.records import field, read_format
from agilerl_core.io.retention import Retention
from agilerl_core.io.storage import Storage, contained, safe_relpath

RUN_FORMAT = "agilerl-flow/run"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id or ""):
        raise ConfigError(f"run id {run_id!r}: use 1-128 letters, digits, '.', '_' or '-' (starting with a letter "
                          f"or digit)")
    return run_id


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RunStore(Manifests, LeaseRecord, Retention):
    """Read and write one run's generations (the manifest readers, the writer's lease and retention come from
    :class:`Manifests`, :class:`LeaseRecord` and :class:`Retention`)."""

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
        shard = _read_tensors(data, self.storage.url(key))
        return ShardRef(key, _sha(data), shard_rows(shard))

    def get_shard(self, ref: ShardRef) -> Shard:
        data = self.storage.get_bytes(ref.key)
        if _sha(data) != ref.sha256:
            raise CheckpointError(f"{self.storage.url(ref.key)}: checksum mismatch; the shard was truncated or "
                                  f"modified after it was written")
        return _read_tensors(data, self.storage.url(ref.key))

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
        return _read_tensors(data, self.storage.url(key)), doc["meta"], doc["extra"]

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

    # ---- load ------------------------------------------------------------------------------------------
    def load_generation(self, generation: int, obs_spec: ObsSpec | None = None, device: str = "cpu",
                        rebuild: Rebuild | None = None, *,
                        algorithms: Algorithms | None = None) -> tuple[Population, dict[str, Any]]:
        """The evaluated population of a committed generation and its population.json metadata. Errors name
        the file by its storage URL (not the local copy it was verified in)."""
        manifest = self.manifest(generation)
        if manifest.get("pruned"):
            raise CheckpointError(f"{self.manifest_url(generation)}: generation "
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

    # ---- the replay buffer, rebuilt from the committed shards (agilerl_core.buffers.rebuild) ----------------
    def rebuild_buffer(self, generation: int, buffer: ReplayBuffer) -> None:
        """Fill `buffer` with its committed contents after `generation`, ring layout included."""
        rebuild_from_shards(self, generation, buffer)

    def extend_buffer(self, generation: int, buffer: ReplayBuffer) -> None:
        """Append generation `generation`'s shards to `buffer` (a worker catching up by one generation)."""
        extend_from_shards(self, generation, buffer)

    # ---- the final elite -------------------------------------------------------------------------------
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


_VOLATILE = ("storage", "tracking", "runner")  # where a run is stored/tracked/executed may change on resume


def _comparable(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in _VOLATILE}


def _read_tensors(data: bytes, url: str) -> dict[str, torch.Tensor]:
    """The tensors of safetensors bytes read from `url` (a shard, a dispatched member's state), checked as a
    checkpoint's are: readable, every floating tensor finite as stored and in float32."""
    try:
        tensors = load_tensors_bytes(data)
    except (SafetensorError, ValueError) as err:
        raise CheckpointError(f"{url}: not a readable safetensors file ({quote(str(err))})") from None
    check_tensors(tensors, url)
    return tensors
