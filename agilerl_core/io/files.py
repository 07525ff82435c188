"""One bounded way to open a file that this run did not write (checkpoint files, datasets, prompt and game sets,
model folders, config files).

Every such reader goes through :func:`open_regular` (or :func:`regular_file` where a library insists on opening
the path itself, as h5py does), which

- refuses anything but a regular file: a FIFO would block the reader forever, a device never ends, a socket or a
  folder is no file; the open itself never blocks (``O_NONBLOCK``) and the kind is taken from the opened
  descriptor, so what is checked is what is read;
- refuses a path that, symbolic links resolved, leaves the `root` it is given (a checkpoint's member folder, a
  model folder): a link inside a checkpoint cannot make it read a file elsewhere;
- and :func:`read_bytes` / :func:`bounded_lines` hand the reader a byte budget, checked before anything is
  allocated from a size the file declares.

Every refusal is the caller's error class (``CheckpointError``, ``DatasetError``...) naming the file and the limit.
"""

from __future__ import annotations

import fcntl
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from agilerl_core.errors import AgileRLError, CheckpointError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
QUOTE = 200  # characters of a value an error message quotes at most


def quote(value: object, limit: int = QUOTE) -> str:
    """``repr(value)`` cut to `limit` characters: an error message never costs more than its input. A str or bytes
    is cut before it is repr'd, so even a huge value costs only `limit` characters."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value):,} in all)"
    if isinstance(value, (list, tuple, dict, set)) and len(value) > 50:
        return f"<{type(value).__name__} of {len(value):,} items>"
    try:
        text = repr(value) if not isinstance(value, (list, tuple, dict, set)) else _short_container(value, limit)
    except (RecursionError, ValueError, MemoryError):
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _short_container(value, limit: int) -> str:
    """repr of a (possibly aliased, deeply shared) container without expanding more than about `limit` chars."""
    out: list[str] = []
    size = 0

    def walk(v, depth: int) -> None:
        nonlocal size
        if size > limit:
            return
        if isinstance(v, dict):
            out.append("{")
            size += 1
            for i, (k, x) in enumerate(v.items()):
                if size > limit:
                    break
                if i:
                    out.append(", ")
                out.append(f"{repr(k)[:limit]}: ")
                size += len(out[-1]) + 2
                walk(x, depth + 1)
            out.append("}")
        elif isinstance(v, (list, tuple, set)):
            out.append("[")
            size += 1
            for i, x in enumerate(v):
                if size > limit:
                    break
                if i:
                    out.append(", ")
                walk(x, depth + 1)
            out.append("]")
        else:
            out.append(quote(v, limit) if isinstance(v, (str, bytes)) else repr(v)[:limit])
            size += len(out[-1])

    walk(value, 0)
    return "".join(out)


def _kind(mode: int) -> str | None:
    return next((name for test, name in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def _inside(path: Path, root: str | os.PathLike | None, label: str, error: type[AgileRLError]) -> None:
    if root is None:
        return
    real, root_real = Path(path).resolve(), Path(root).resolve()
    if real != root_real and root_real not in real.parents:
        raise error(f"{label}: a symbolic link leads to {real}, outside {root_real}; a checkpoint, dataset or model "
                    f"folder reads only its own files, so copy the real file in place of the link")


def regular_file(path: str | os.PathLike, label: str | None = None, error: type[AgileRLError] = CheckpointError,
                 root: str | os.PathLike | None = None) -> int:
    """The size of `path` after checking that it is a regular file (inside `root`, links resolved, when given).
    For a library that opens the path itself (h5py); prefer :func:`open_regular`, which checks what it reads."""
    label = label or str(path)
    _inside(Path(path), root, label, error)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{label}: file not found") from None
    except OSError as err:
        raise error(f"{label}: cannot be read ({err.strerror or err})") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise error(f"{label}: is {kind}, not a regular file; replace it with the file itself")
    return st.st_size


def open_regular(path: str | os.PathLike, label: str | None = None, error: type[AgileRLError] = CheckpointError,
                 root: str | os.PathLike | None = None) -> BinaryIO:
    """`path` opened for reading in binary, refused (`error` naming `label`) unless it is a regular file inside
    `root` (when given). Opening never blocks: a FIFO is refused at once, not waited on."""
    label = label or str(path)
    _inside(Path(path), root, label, error)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise error(f"{label}: file not found") from None
    except IsADirectoryError:
        raise error(f"{label}: is a folder, not a regular file; replace it with the file itself") from None
    except OSError as err:
        raise error(f"{label}: cannot be read ({err.strerror or err})") from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise error(f"{label}: is {kind}, not a regular file; replace it with the file itself")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, limit: int, limit_name: str, label: str | None = None,
               error: type[AgileRLError] = CheckpointError, root: str | os.PathLike | None = None) -> bytes:
    """The whole of regular file `path`, refused before reading when it holds more than `limit` bytes (the limit
    table's `limit_name`); a file growing while it is read is cut off at the limit, never read without bound."""
    label = label or str(path)
    with open_regular(path, label, error, root) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(f"{label}: {size:,} bytes is over the limit limits.{limit_name} = {limit:,}; if the file is "
                        f"meant, raise limits.{limit_name} in your own config")
        data = f.read(size + 1)  # read(n) allocates n up front: the declared size, never the limit
        if len(data) > size:
            data += f.read(limit + 1 - len(data)) if len(data) <= limit else b""
            if len(data) > limit:
                raise error(f"{label}: over the limit limits.{limit_name} = {limit:,} bytes (it grew while read)")
    return data


def bounded_lines(stream: BinaryIO | io.BufferedIOBase, label: str, error: type[AgileRLError], line_limit: int,
                  line_limit_name: str, total_limit: int, total_limit_name: str) -> Iterator[tuple[int, bytes]]:
    """(number, bytes) of each line of `stream` (a file or a decompressing reader), each read with at most
    `line_limit` + 1 bytes in memory, refused as soon as one line passes `line_limit` or all lines together pass
    `total_limit` (so a gzip bomb costs the limit, not its expansion)."""
    total = 0
    n = 0
    while True:
        line = stream.readline(line_limit + 1)
        if not line:
            return
        n += 1
        if len(line) > line_limit:
            raise error(f"{label}: line {n} is longer than limits.{line_limit_name} = {line_limit:,} bytes; if such "
                        f"records are meant, raise limits.{line_limit_name} in your own config")
        total += len(line)
        if total > total_limit:
            raise error(f"{label}: more than {total_limit:,} bytes once decompressed by line {n} (limits."
                        f"{total_limit_name}); if the file is genuine, raise limits.{total_limit_name} in your own "
                        f"config")
        yield n, line
