"""A run's generation manifests: the record that makes a generation committed, how it is read and checked.

``generations/NNNNNN/MANIFEST.json`` is written last, after every file it lists: each file of the generation's
population checkpoint with its SHA-256, the shards of fresh transitions (:class:`ShardRef`), the buffer's ring
state and the elite slot. A generation without one did not happen. Its keys are stored relative to the run
(``generations/...``), so a run moved or copied under another name still verifies.

:class:`Manifests` holds :class:`agilerl_core.io.run_store.RunStore`'s manifest readers; :func:`verify_committed`
checks a local folder inside a run's generation against its manifest.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agilerl_core.errors import CheckpointError
from agilerl_core.io.checkpoint import POPULATION_FORMAT
from agilerl_core.io.digest import sha256_file
from agilerl_core.io.files import quote
from agilerl_core.io.records import check_type, field, read_format, sized

MANIFEST_FORMAT = "agilerl-flow/generation"
VERSION = 1  # the version of every record a run stores (run.json, manifests, the lease, member states)

_GEN_DIR = re.compile(r"^\d{6}$")
# an older manifest's key names its run's folder first; dropped on reading, whatever the folder was called then
_RUN_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}/(?=generations/)")
_OWN_FILE = re.compile(r"generations/\d{6}/population/[^\0\\]+")
_OWN_SHARD = re.compile(r"generations/\d{6}/shards/\d{1,9}\.safetensors")


@dataclass(frozen=True)
class ShardRef:
    """Where one member's fresh transitions of a generation are stored."""

    key: str
    sha256: str
    rows: int


def run_relative(key: str) -> str:
    """A manifest key relative to its run (``generations/...``), from either form a manifest stores."""
    return _RUN_PREFIX.sub("", key, count=1)


class Manifests:
    """The manifest readers of :class:`agilerl_core.io.run_store.RunStore` (a mixin: they read and write through
    the store's `storage`, `run_id`, `uri`, `key`, `gen_dir` and JSON helpers)."""

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

    def manifest_url(self, generation: int) -> str:
        """Where generation `generation`'s manifest is (for an error naming it)."""
        return self.storage.url(self.key(self.gen_dir(generation), "MANIFEST.json"))

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

    def shard_refs(self, generation: int) -> list[ShardRef]:
        """Generation `generation`'s shards, in slot order, as its manifest lists them."""
        return [ShardRef(**s) for s in self.manifest(generation)["shards"]]

    def buffer_window(self, generation: int) -> list[tuple[int, ShardRef]]:
        """The shards (oldest first) whose rows make up the committed buffer after `generation`."""
        need = int(self.manifest(generation)["buffer"]["size"])
        picked: list[tuple[int, ShardRef]] = []
        rows = 0
        g = generation
        while rows < need and g >= 0:
            for ref in reversed(self.shard_refs(g)):
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
