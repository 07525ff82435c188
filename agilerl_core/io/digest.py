"""SHA-256 digests of files and of sets of files: checkpoint checksums, dataset and base-model identities."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from agilerl_core.errors import AgileRLError, CheckpointError
from agilerl_core.io.files import open_regular

CHUNK = 8 << 20  # bytes read at a time


def sha256_file(path: str | Path, error: type[AgileRLError] = CheckpointError,
                root: str | os.PathLike | None = None, label: str | None = None) -> str:
    """Hex SHA-256 of a regular file's bytes (inside `root` when given), read in chunks; anything else (a FIFO,
    a device, a folder, a link out of `root`) is refused with `error` naming the file."""
    h = hashlib.sha256()
    with open_regular(path, label or str(path), error, root) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(files: dict[str, str]) -> str:
    """One hash for several files: SHA-256 over their sorted (relative path, sha256) lines."""
    return hashlib.sha256("".join(f"{k}\t{v}\n" for k, v in sorted(files.items())).encode()).hexdigest()
