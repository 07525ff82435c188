"""SHA-256 digests of files and of sets of files: checkpoint checksums, dataset and base-model identities."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 8 << 20  # bytes read at a time


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(files: dict[str, str]) -> str:
    """One hash for several files: SHA-256 over their sorted (relative path, sha256) lines."""
    return hashlib.sha256("".join(f"{k}\t{v}\n" for k, v in sorted(files.items())).encode()).hexdigest()
