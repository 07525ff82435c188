"""One URI for everything a run persists: a local directory or ``s3://bucket/prefix``.

Keys are ``/``-separated paths relative to the URI. Writes of single objects are atomic (a local
temp file moved into place; an S3 PUT), so a reader never sees half an object. S3 access goes
through boto3: the endpoint comes from the config or the standard ``AWS_ENDPOINT_URL(_S3)``
variables and the credentials from the config or the standard AWS chain, so SeaweedFS, MinIO and
AWS all work. :meth:`Storage.check` proves read/write access before any work starts.
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from agilerl_core.errors import StorageError
from agilerl_core.io.files import open_regular


@dataclass(frozen=True)
class S3Options:
    """Connection settings for s3:// URIs; None fields fall back to the standard AWS environment."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    max_attempts: int | None = None  # per request, botocore's standard retry mode; None: $AWS_MAX_ATTEMPTS, else 10


S3_MAX_ATTEMPTS = 10  # transient errors (connection refused, throttling, 5xx) retried with backoff for about a minute


class Storage(ABC):
    """Key/value store of bytes under one URI."""

    uri: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write the object atomically (replacing any previous one)."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The object's bytes; raises StorageError naming the key when it does not exist."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored at `key`."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key under `prefix` (recursively), sorted."""

    @abstractmethod
    def delete(self, keys: list[str]) -> None:
        """Delete these objects (missing ones are ignored)."""

    def check(self) -> None:
        """Write, read and delete a probe object: fails early on bad URIs and credentials."""
        key = ".agilerl-probe"
        self.put_bytes(key, b"ok")
        if self.get_bytes(key) != b"ok":
            raise StorageError(f"{self.uri}: a probe object read back different bytes; the store is not consistent")
        self.delete([key])

    def url(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    def upload_dir(self, local: Path, prefix: str) -> list[str]:
        """Copy every file under `local` to `prefix/<relative path>`; returns the keys written."""
        keys = []
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(local).as_posix()}"
            self.put_bytes(key, path.read_bytes())
            keys.append(key)
        return keys

    def download_dir(self, prefix: str, local: Path) -> Path:
        """Copy every object under `prefix/` into `local` (mirroring the relative paths)."""
        local = Path(local)
        keys = self.list(prefix + "/")
        if not keys:
            raise StorageError(f"{self.url(prefix)}: nothing stored there")
        rels = [safe_relpath(key[len(prefix) + 1:], self.url(key)) for key in keys]  # all checked first
        for key, rel in zip(keys, rels, strict=True):
            dest = contained(local, rel, self.url(key))  # no symbolic link leads it out of `local`
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.unlink(missing_ok=True)  # replace a link itself, never write through it
            dest.write_bytes(self.get_bytes(key))
        return local

    def delete_prefix(self, prefix: str) -> None:
        self.delete(self.list(prefix.rstrip("/") + "/"))


def safe_relpath(rel: str, where: str) -> str:
    """`rel` (a key's remainder below a prefix, a name from a listing) as a relative POSIX path that stays
    below its root: no absolute path, no ``..`` or ``.`` part, no empty part (``prefix//etc``), no NUL or
    backslash. A StorageError naming `where` otherwise."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\0" in rel or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"{where}: the key's path {rel!r} would leave its directory (absolute, empty, '.' or "
                           f"'..' parts); refusing it before anything is written. Remove or rename that object")
    return rel


def contained(root: Path, rel: str, where: str) -> Path:
    """``root / rel`` after checking that, symlinks resolved, it stays inside `root`."""
    root_real = Path(root).resolve()
    dest = Path(root) / rel
    real = dest.resolve()
    if real != root_real and root_real not in real.parents:
        raise StorageError(f"{where}: {rel!r} resolves to {real}, outside {root_real} (a symbolic link?); refusing it")
    return dest


def fsync_path(path: Path) -> None:
    """Flush a file's bytes, or a directory's entries (a rename or a new file in it), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStorage(Storage):
    """A directory on local disk."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StorageError(f"storage.uri {str(root)!r}: cannot create the directory ({err.strerror}); "
                               f"choose a writable path") from None

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if path != self.root and self.root not in path.parents:
            raise StorageError(f"key {key!r} escapes the storage root {self.root}")
        return path

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_path(path.parent)  # ... and the name itself survives a power loss

    def get_bytes(self, key: str) -> bytes:
        with open_regular(self._path(key), self.url(key), StorageError, self.root) as f:  # never blocks on a FIFO
            return f.read()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        keys = [p.relative_to(self.root).as_posix() for p in base.rglob("*")
                if p.is_file() and not p.name.startswith(".")]
        return sorted(k for k in keys if k.startswith(prefix))

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        for key in keys:  # drop directories left empty
            parent = self._path(key).parent
            while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent

_S3_HINTS = {
    "InvalidAccessKeyId": "the access key id is unknown to the store; check AWS_ACCESS_KEY_ID or "
                          "storage.access_key_id",
    "SignatureDoesNotMatch": "the secret key is wrong; check AWS_SECRET_ACCESS_KEY or storage.secret_access_key",
    "AccessDenied": "these credentials may not access the bucket; use credentials with read/write access",
    "NoSuchBucket": "the bucket does not exist; create it first (e.g. `aws s3 mb`) or fix the bucket name",
    "403": "access refused; check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)",
    "404": "not found; check the bucket name",
}


class S3Storage(Storage):
    """``s3://bucket/prefix`` on any S3-compatible store."""

    def __init__(self, uri: str, options: S3Options | None = None) -> None:
        import boto3
        from botocore.config import Config

        rest = uri[len("s3://"):]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise StorageError(f"storage.uri {uri!r}: no bucket; use s3://BUCKET/PREFIX")
        self.uri = uri.rstrip("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        opts = options or S3Options()
        self.max_attempts = opts.max_attempts or int(os.environ.get("AWS_MAX_ATTEMPTS") or S3_MAX_ATTEMPTS)
        endpoint = opts.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.endpoint = endpoint
        kwargs = {"endpoint_url": endpoint, "region_name": opts.region or os.environ.get("AWS_REGION")
                  or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
                  # botocore's standard mode: exponential backoff with jitter (capped at 20 s) on connection
                  # errors, throttling and 5xx, so a store that restarts within about a minute loses nothing
                  "config": Config(retries={"max_attempts": self.max_attempts, "mode": "standard"}, connect_timeout=5,
                                   read_timeout=60, s3={"addressing_style": "path"})}
        if opts.access_key_id or opts.secret_access_key:
            kwargs["aws_access_key_id"] = opts.access_key_id
            kwargs["aws_secret_access_key"] = opts.secret_access_key
        elif os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
            # read now: boto3's default session resolves the environment's credentials once per process and keeps
            # them, so a store opened after the variables changed would sign with the old ones (403)
            kwargs["aws_access_key_id"] = os.environ["AWS_ACCESS_KEY_ID"]
            kwargs["aws_secret_access_key"] = os.environ["AWS_SECRET_ACCESS_KEY"]
            if os.environ.get("AWS_SESSION_TOKEN"):
                kwargs["aws_session_token"] = os.environ["AWS_SESSION_TOKEN"]
        self.client = boto3.client("s3", **kwargs)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _error(self, err: Exception, key: str) -> StorageError:
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        where = self.url(key)
        if isinstance(err, NoCredentialsError):
            return StorageError(f"{where}: no S3 credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                                f"(or storage.access_key_id / storage.secret_access_key)")
        if isinstance(err, EndpointConnectionError):
            return StorageError(f"{where}: cannot reach the S3 endpoint {self.endpoint or 'AWS'}; "
                                f"check AWS_ENDPOINT_URL or storage.endpoint_url and that the store is running")
        if isinstance(err, ClientError):
            code = str(err.response.get("Error", {}).get("Code", ""))
            hint = _S3_HINTS.get(code, "see the S3 error code")
            return StorageError(f"{where}: S3 refused the request ({code or 'error'}): {hint}")
        return StorageError(f"{where}: S3 request failed ({type(err).__name__}: {err})")

    def _call(self, key: str, fn, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kwargs)
        except (ClientError, BotoCoreError) as err:
            raise self._error(err, key) from None

    def check(self) -> None:
        """The bucket must exist (stores that create buckets on first write would hide a typo), then the
        generic write/read/delete probe."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise StorageError(f"{self.uri}: bucket {self.bucket!r} does not exist; create it first or fix the "
                                   f"bucket name in storage.uri") from None
            if code not in ("403", "AccessDenied"):  # 403: let the probe say which credential is wrong
                raise self._error(err, "") from None
        except BotoCoreError as err:
            raise self._error(err, "") from None
        super().check()

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(key, self.client.put_object, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise StorageError(f"{self.url(key)}: not found") from None
            raise self._error(err, key) from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise self._error(err, key) from None

    def head(self, key: str) -> tuple[str, int]:
        """(ETag without quotes, size in bytes) of the object at `key`."""
        from botocore.exceptions import ClientError

        try:
            h = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise StorageError(f"{self.url(key)}: not found") from None
            raise self._error(err, key) from None
        return str(h["ETag"]).strip('"'), int(h["ContentLength"])

    def download(self, key: str, dest: Path) -> None:
        """Stream the object at `key` into the local file `dest` (chunked: no whole copy in memory)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.download_file(self.bucket, self._key(key), str(dest))
        except (ClientError, BotoCoreError) as err:
            raise self._error(err, key) from None

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        keys, token = [], None
        strip = len(self.prefix) + 1 if self.prefix else 0
        while True:
            kwargs = {"Prefix": full, **({"ContinuationToken": token} if token else {})}
            page = self._call(prefix, self.client.list_objects_v2, **kwargs)
            keys += [o["Key"][strip:] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(keys)
            token = page["NextContinuationToken"]

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = keys[i: i + 1000]
            if chunk:
                self._call(chunk[0], self.client.delete_objects,
                           Delete={"Objects": [{"Key": self._key(k)} for k in chunk], "Quiet": True})


def open_storage(uri: str, s3: S3Options | None = None) -> Storage:
    """The store behind `uri`: ``s3://bucket/prefix``, ``file:///path`` or a plain local path."""
    if not uri:
        raise StorageError("storage.uri is empty; give a local directory or s3://BUCKET/PREFIX")
    if uri.startswith("s3://"):
        return S3Storage(uri, s3)
    if uri.startswith("file://"):
        return LocalStorage(uri[len("file://"):])
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise StorageError(f"storage.uri {uri!r}: unsupported scheme {scheme!r}; use a local path or s3://BUCKET/PREFIX")
    return LocalStorage(uri)


def storage_uri(cfg) -> str:
    """The storage URI of an ExperimentConfig: storage.uri, else $AGILERL_STORAGE_URI, else output_dir."""
    return cfg.storage.uri or os.environ.get("AGILERL_STORAGE_URI") or cfg.output_dir


def s3_options(cfg) -> S3Options:
    """The S3 connection settings of an ExperimentConfig's storage section (secrets read from SecretStr
    fields, never logged); s3:// datasets are read with the same settings."""
    st = cfg.storage

    def secret(v):
        return v.get_secret_value() if v is not None else None

    return S3Options(st.endpoint_url, st.region, secret(st.access_key_id), secret(st.secret_access_key),
                     st.max_attempts)


def storage_from_config(cfg, uri: str | None = None) -> Storage:
    """Open the store an ExperimentConfig names."""
    return open_storage(uri or storage_uri(cfg), s3_options(cfg))
