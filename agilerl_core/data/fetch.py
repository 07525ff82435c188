"""Where a dataset URI lives on local disk, and its content hash.

* a local path (or ``file://``): used in place;
* ``minari:DATASET_ID``: the Minari dataset directory under $MINARI_DATASETS_PATH;
* ``s3://BUCKET/KEY``: one object (a flat HDF5 file) or every object under ``KEY/`` (a Minari dataset
  directory), downloaded once into a local cache. The cache entry records each object's ETag, size and
  SHA-256; a later use asks S3 only for the ETags (HEAD), re-hashes the cached files and downloads
  again exactly the objects that changed remotely or whose cached copy is damaged. A download whose
  ETag is a plain MD5 (single-part uploads) is checked against it before it enters the cache.

Entries are locked while they are checked or filled, so Dask workers sharing a cache do not race.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from agilerl_core.data.minari_format import datasets_root
from agilerl_core.errors import DatasetError, StorageError
from agilerl_core.io.digest import sha256_file, tree_digest
from agilerl_core.io.records import read_record
from agilerl_core.io.storage import S3Options, S3Storage, contained, safe_relpath

_MD5 = re.compile(r"^[0-9a-f]{32}$")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class LocalDataset:
    """A dataset resolved to local disk."""

    uri: str  # as given
    path: Path  # the file (flat HDF5) or directory (Minari)
    sha256: str  # content hash: of the file, or of the directory's files and their relative paths
    downloaded: bool  # objects were fetched from S3 by this call (False: local, or served from the cache)


def cache_root(cache_dir: str | None = None) -> Path:
    """dataset.cache_dir, else $AGILERL_DATASET_CACHE, else ~/.cache/agilerl/datasets."""
    return Path(cache_dir or os.environ.get("AGILERL_DATASET_CACHE") or Path.home() / ".cache" / "agilerl" /
                "datasets").expanduser()


def file_digests(path: Path) -> tuple[str, str]:
    """(sha256, md5) hex digests of a file, read once in chunks."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def check_pin(uri: str, sha256: str, pinned: str | None, section: str = "dataset", source: str = "uri") -> None:
    """Refuse data whose content hash differs from the run's pin (`SECTION.sha256`, the data named by
    `SECTION.SOURCE`)."""
    if pinned is not None and sha256 != pinned:
        raise DatasetError(f"{section}.{source} {uri!r}: content hash {sha256} differs from {section}.sha256 {pinned} "
                           f"(the run was started on other data); restore that dataset or start a new run")


def resolve_dataset(uri: str, s3: S3Options | None = None, cache_dir: str | None = None) -> LocalDataset:
    """The local file or directory behind `uri` (downloading s3:// into the cache when needed)."""
    if not uri:
        raise DatasetError("dataset.uri is empty; give a file path, a Minari directory, minari:ID or s3://BUCKET/KEY")
    if uri.startswith("s3://"):
        return _fetch_s3(uri, s3, cache_root(cache_dir))
    if uri.startswith("minari:"):
        name = uri[len("minari:"):]
        try:
            path = contained(datasets_root(), safe_relpath(name, f"dataset.uri {uri!r}"), f"dataset.uri {uri!r}")
        except StorageError as err:
            raise DatasetError(str(err)) from None
        if not path.is_dir():
            raise DatasetError(f"dataset.uri {uri!r}: no Minari dataset at {path} (MINARI_DATASETS_PATH); record "
                               f"one with `agilerl-flow dataset collect --out {uri}` or `minari download ID`")
    elif "://" in uri and not uri.startswith("file://"):
        raise DatasetError(f"dataset.uri {uri!r}: unsupported scheme; use a local path, minari:ID or s3://BUCKET/KEY")
    else:
        path = Path(uri.removeprefix("file://")).expanduser()
        if not path.exists():
            raise DatasetError(f"dataset.uri {uri!r}: {path} does not exist; record a dataset with "
                               f"`agilerl-flow dataset collect --env ID --episodes N --out {uri}`")
    return LocalDataset(uri, path, _local_digest(path), False)


def _local_digest(path: Path) -> str:
    if not path.is_dir():  # a file, or something that is refused naming its kind (a FIFO would block)
        return sha256_file(path, DatasetError, label=f"dataset {path}")
    # every entry but folders and hidden files is hashed: a FIFO or device in the folder, or a link out of it, is
    # refused by name
    files = {p.relative_to(path).as_posix(): sha256_file(p, DatasetError, path, f"dataset {p}")
             for p in sorted(path.rglob("*")) if not p.is_dir() and not p.name.startswith(".")}
    if not files:
        raise DatasetError(f"dataset {path}: the directory is empty")
    return tree_digest(files)


@contextlib.contextmanager
def _locked(entry: Path):
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fetch_s3(uri: str, s3: S3Options | None, root: Path) -> LocalDataset:
    bucket, _, key = uri[len("s3://"):].partition("/")
    key = key.strip("/")
    if not bucket or not key:
        raise DatasetError(f"dataset.uri {uri!r}: expected s3://BUCKET/KEY (a file or a Minari dataset prefix)")
    store = S3Storage(f"s3://{bucket}", s3)
    try:
        if store.exists(key):  # one object: a flat file
            objects = {key.rsplit("/", 1)[-1]: key}
            single = True
        else:
            objects = {k[len(key) + 1:]: k for k in store.list(key + "/")}
            single = False
        if not objects:
            raise DatasetError(f"dataset.uri {uri!r}: nothing stored there; upload the dataset or fix the key")
        for rel, k in objects.items():  # every key checked before anything is written or deleted
            safe_relpath(rel, f"dataset.uri {uri!r}: object {k!r}")
        remote = {rel: store.head(k) for rel, k in objects.items()}
    except StorageError as err:
        raise DatasetError(f"dataset.uri {uri!r}: {err}") from None
    entry = root / hashlib.sha256(uri.encode()).hexdigest()[:24]
    content = entry / "content"
    with _locked(entry):
        manifest_file = entry / "manifest.json"
        try:
            cached = read_record(manifest_file, error=DatasetError)["objects"] if manifest_file.is_file() else {}
        except (DatasetError, KeyError, TypeError):
            cached = {}  # a damaged manifest: everything is checked and fetched again
        manifest, downloaded = {}, False
        cached = {rel: m for rel, m in cached.items() if _is_safe(rel)} if isinstance(cached, dict) else {}
        for rel, (etag, size) in sorted(remote.items()):
            dest = contained(content, rel, f"dataset.uri {uri!r}: object {objects[rel]!r}")
            known = cached.get(rel)
            if known and known.get("etag") == etag and known.get("size") == size and dest.is_file() \
                    and dest.stat().st_size == size and sha256_file(dest) == known.get("sha256"):
                manifest[rel] = known
                continue
            manifest[rel] = {"etag": etag, "size": size, "sha256": _download(store, objects[rel], dest, etag, size,
                                                                             uri)}
            downloaded = True
        for stale in set(cached) - set(manifest):
            with contextlib.suppress(StorageError):
                contained(content, stale, "cache").unlink(missing_ok=True)
        tmp = entry / ".manifest.json.tmp"
        tmp.write_text(json.dumps({"uri": uri, "objects": manifest}, indent=1))
        tmp.replace(manifest_file)
    path = content / next(iter(objects)) if single else content
    digest = manifest[next(iter(objects))]["sha256"] if single else \
        tree_digest({rel: m["sha256"] for rel, m in manifest.items()})
    return LocalDataset(uri, path, digest, downloaded)


def _is_safe(rel: object) -> bool:
    """Whether a cache manifest's entry is a path below the cache (a damaged or edited manifest is not obeyed)."""
    try:
        return isinstance(rel, str) and bool(safe_relpath(rel, "cache manifest"))
    except StorageError:
        return False


def _download(store: S3Storage, key: str, dest: Path, etag: str, size: int, uri: str) -> str:
    """Fetch one object to `dest` (through a temp file), check its size and MD5 ETag; returns its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        store.download(key, tmp)
    except StorageError as err:
        tmp.unlink(missing_ok=True)
        raise DatasetError(f"dataset.uri {uri!r}: {err}") from None
    sha, md5 = file_digests(tmp)
    got = tmp.stat().st_size
    if got != size or (_MD5.match(etag) and md5 != etag):
        tmp.unlink(missing_ok=True)
        raise DatasetError(f"dataset.uri {uri!r}: object {key!r} arrived damaged ({got} of {size} bytes, md5 {md5} "
                           f"vs ETag {etag}); try again")
    tmp.replace(dest)
    return sha
