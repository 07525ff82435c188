"""Flat HDF5 datasets (the D4RL layout): one array per field, one row per transition.

Required keys: ``observations`` [N, ...], ``actions`` [N] or [N, ...], ``rewards`` [N], ``terminals`` [N].
Optional: ``timeouts`` [N] (an episode cut by a time limit) and ``next_observations`` [N, ...].

Without ``next_observations`` the next observation of row i is row i+1 of the same episode: a terminal
row needs none (it does not bootstrap), and rows whose successor is unknown (a timeout, the last row)
are dropped, as D4RL's loaders do. File attributes ``env_id`` and ``source`` are informational.

A dataset file reads only its own bytes (see docs/security.md): :func:`own_bytes` walks every link of the file
without following one and refuses external links, soft links, link loops, a dataset linked under two keys,
virtual datasets, external raw storage and filters HDF5 would load as plugins; :func:`check_array` checks an
array's declared size against the limit table, against the bytes the file stores for it and (through a
:class:`FileBudget`) all arrays read from one file together against the file's size times
``limits.dataset_expansion``, before anything is read or allocated. A file is opened only once
:func:`~agilerl_core.io.files.regular_file` has found it a regular file (h5py would block forever on a FIFO), and
its attributes are read as plain JSON data (:func:`read_attrs`) or refused naming the attribute.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from agilerl_core import limits
from agilerl_core.data.transitions import Transitions, check_finite
from agilerl_core.errors import DatasetError
from agilerl_core.io.files import quote, regular_file

REQUIRED = ("observations", "actions", "rewards", "terminals")
# filters HDF5 builds in (deflate, shuffle, fletcher32, szip, nbit, scaleoffset) and h5py's own LZF; any other
# filter id makes HDF5 load a plugin library from HDF5_PLUGIN_PATH when the array is read
KNOWN_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset", 32000: "lzf"}
# an array this small is read even when the file stores less of it (fill values): no allocation worth refusing
SMALL_ARRAY_BYTES = 64 * 2**10
# keys whose rows are observations or actions: one row's elements are checked against limits.space_elements
ROW_SPACES = ("observations", "next_observations", "actions")
# an attribute is informational (env_id, source...): read as plain JSON data, at most this many elements (numbers,
# strings) and characters; a variable-length attribute at most ATTR_VLEN elements before it is read (each may
# point at any object of the file's heap, so reading it may cost that many times the file's own size)
ATTR_ELEMENTS = 2**20
ATTR_CHARS = 2**20
ATTR_VLEN = 256


def own_bytes(f, path: Path | str) -> None:
    """Refuse (DatasetError naming the file and key) anything in the open HDF5 file `f` that reads bytes from
    elsewhere or can loop or repeat: external links, soft links, user-defined links, a group linked twice (a link
    loop), a dataset linked twice (one stored array read as many: 30 episodes hard-linking the same compressed
    arrays), virtual datasets, external raw storage, unknown filters. Walks link names only: nothing is followed
    or read."""
    import h5py

    fix = "the file must hold its own data, so write a self-contained copy (h5py: one plain dataset per key)"
    seen: dict[int, str] = {h5py.h5o.get_info(f.id).addr: "/"}
    stack = [("", f)]
    while stack:
        prefix, group = stack.pop()
        for name in group:  # link names (H5Literate): no link is followed
            key = f"{prefix}{name}"
            where = f"dataset {path}: key {quote(key)}"
            try:
                link = group.get(name, getlink=True)
            except (OSError, KeyError, ValueError, TypeError) as err:
                raise DatasetError(f"{where}: its link cannot be read ({err}); the file is corrupt, so download or "
                                   f"record it again") from None
            if isinstance(link, h5py.ExternalLink):
                raise DatasetError(f"{where} is an external link to {quote(link.filename)}:{quote(link.path)}, "
                                   f"which would read another file; {fix}")
            if isinstance(link, h5py.SoftLink):
                raise DatasetError(f"{where} is a soft link to {quote(link.path)} (a soft link can loop or alias "
                                   f"another key); {fix}")
            if not isinstance(link, h5py.HardLink):
                raise DatasetError(f"{where} is a {type(link).__name__} link; {fix}")
            try:
                obj = group.get(name)
                addr = h5py.h5o.get_info(obj.id).addr
            except (OSError, KeyError, ValueError, TypeError) as err:
                raise DatasetError(f"{where} cannot be opened ({err}); the file is truncated or corrupt, so "
                                   f"download or record it again") from None
            if addr in seen:
                what = "group" if isinstance(obj, h5py.Group) else "dataset"
                raise DatasetError(f"{where} links a {what} already linked elsewhere in the file, as "
                                   f"{quote(seen[addr])} (a link loop or alias: one stored {what} would be read, and "
                                   f"counted, as many); {fix}")
            seen[addr] = key
            if isinstance(obj, h5py.Group):
                stack.append((f"{key}/", obj))
            elif isinstance(obj, h5py.Dataset):
                _own_storage(obj, where, fix)


def _own_storage(dset, where: str, fix: str) -> None:
    """Refuse a dataset whose bytes live outside the file or need a plugin to decode."""
    dcpl = dset.id.get_create_plist()
    if dset.is_virtual:
        raise DatasetError(f"{where} is a virtual dataset (it maps other datasets, possibly in other files); {fix}")
    if dcpl.get_external_count():
        raise DatasetError(f"{where} keeps its raw data in external file(s) {[e[0] for e in dset.external or []]} "
                           f"instead of the dataset file; {fix}")
    for i in range(dcpl.get_nfilters()):
        code = dcpl.get_filter(i)[0]
        if code not in KNOWN_FILTERS:
            raise DatasetError(f"{where} is encoded with HDF5 filter {code}, which HDF5 would load as a plugin "
                               f"library; accepted filters: {sorted(KNOWN_FILTERS.values())}, so re-write the key "
                               f"with gzip (deflate) or no compression")


class FileBudget:
    """What all arrays read from one HDF5 file may expand to together: the file's size times
    limits.dataset_expansion (the per-array check alone would let one file hold many arrays that each stay
    within it); the stored bytes of every array together must fit in the file. Charged by :func:`check_array`
    before anything is read."""

    def __init__(self, path: Path | str, file_size: int):
        self.path, self.file_size = path, file_size
        self.expansion = limits.current().dataset_expansion
        self.limit = max(file_size * self.expansion, SMALL_ARRAY_BYTES)
        self.declared = 0
        self.stored = 0

    def charge(self, key: str, nbytes: int, stored: int) -> None:
        where = f"dataset {self.path}: key {quote(key)}"
        self.declared += nbytes
        self.stored += stored
        if self.stored > self.file_size:
            raise DatasetError(f"{where}: the arrays up to this one claim {self.stored:,} stored bytes but the file "
                               f"has {self.file_size:,}; the file is truncated or corrupt, so download or record it "
                               f"again")
        if self.declared > self.limit:
            raise DatasetError(f"{where}: the arrays of the file up to this one declare {self.declared:,} bytes, more "
                               f"than limits.dataset_expansion = {self.expansion:,} times the file's "
                               f"{self.file_size:,} bytes (compression, never-written fill values or arrays read "
                               f"more than once); if the file is genuine, raise limits.dataset_expansion in your own "
                               f"config, otherwise download or record it again")


def check_array(dset, key: str, path: Path | str, file_size: int | None = None,
                budget: FileBudget | None = None) -> int:
    """The declared bytes of `dset` (key `key` of file `path`, already passed through :func:`own_bytes`) after
    checking, without reading it, that it is a plain numeric array whose declared size fits limits.dataset_bytes,
    limits.space_elements (one row of observations or actions), limits.dataset_expansion times the bytes the file
    stores for it and what is left of `budget` (the file's own total)."""
    where = f"dataset {path}: key {quote(key)}"
    lim = limits.current()
    dtype = dset.dtype
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
        raise DatasetError(f"{where} has dtype {quote(str(dtype))}; dataset arrays are plain numbers (bool, int, "
                           f"uint, float)")
    shape = tuple(int(d) for d in (dset.shape or ()))
    nbytes = math.prod(shape) * dtype.itemsize
    limits.check("dataset_bytes", nbytes, f"{where}: declared bytes (shape {shape} of {dtype})",
                 DatasetError, lim)
    if key.rsplit("/", 1)[-1] in ROW_SPACES and len(shape) > 1:
        limits.check("space_elements", math.prod(shape[1:]), f"{where}: elements of one row (shape "
                     f"{shape[1:]})", DatasetError, lim)
    try:
        stored = int(dset.id.get_storage_size())
    except (OSError, ValueError) as err:
        raise DatasetError(f"{where}: its storage cannot be read ({err}); the file is corrupt, so download or record "
                           f"it again") from None
    file_size = budget.file_size if file_size is None and budget is not None else file_size
    if file_size is not None and stored > file_size:
        raise DatasetError(f"{where} claims {stored:,} stored bytes but the file has {file_size:,}; the file is "
                           f"truncated or corrupt, so download or record it again")
    if nbytes > max(stored * lim.dataset_expansion, SMALL_ARRAY_BYTES):
        raise DatasetError(f"{where}: shape {shape} of {dtype} declares {nbytes:,} bytes but the file stores "
                           f"{stored:,} bytes of it, more than limits.dataset_expansion = {lim.dataset_expansion:,} "
                           f"times larger (compression or never-written fill values); if the file is genuine, raise "
                           f"limits.dataset_expansion in your own config, otherwise download or record it again")
    if budget is not None:
        budget.charge(key, nbytes, stored)
    return nbytes


def load_array(dset, key: str, path: Path | str, nbytes: int) -> np.ndarray:
    """The whole of `dset`, once :func:`check_array` has passed it (`nbytes`: its declared bytes)."""
    where = f"dataset {path}: key {quote(key)}"
    try:
        return dset[()]
    except (OSError, ValueError, TypeError) as err:
        raise DatasetError(f"{where} cannot be read ({err}); the file is truncated or corrupt, so download or "
                           f"record it again") from None
    except MemoryError:
        raise DatasetError(f"{where}: {nbytes:,} bytes do not fit in memory; lower limits.dataset_bytes or use a "
                           f"machine with more memory") from None


def open_hdf5(path: Path | str, label: str | None = None):
    """(h5py.File, size) of `path` opened for reading, once it is found to be a regular file: h5py would block
    forever opening a FIFO, read a device without end. A DatasetError names the file otherwise."""
    import h5py

    label = label or f"dataset {path}"
    size = regular_file(path, label, DatasetError)
    try:
        return h5py.File(path, "r"), size
    except FileNotFoundError:
        raise DatasetError(f"{label}: file not found; record one with `agilerl-flow dataset collect` or fix "
                           f"dataset.uri") from None
    except OSError as err:
        raise DatasetError(f"{label}: not a readable HDF5 file ({err}); it may be truncated or corrupt, so download "
                           f"or record it again") from None


class _AttrCount:
    """Elements and characters of one attribute read so far (see ATTR_ELEMENTS, ATTR_CHARS)."""

    def __init__(self, where: str):
        self.where, self.elements, self.chars = where, 0, 0

    def add(self, elements: int = 1, chars: int = 0) -> None:
        self.elements += elements
        self.chars += chars
        if self.elements > ATTR_ELEMENTS or self.chars > ATTR_CHARS:
            raise DatasetError(f"{self.where}: holds more than {ATTR_ELEMENTS:,} elements or {ATTR_CHARS:,} "
                               f"characters; an informational attribute is a short number, string or array of "
                               f"them, so remove it or store the data as a dataset")


def _refuse(where: str, what: str) -> DatasetError:
    return DatasetError(f"{where} is {what}, which is not plain data; an attribute must be a number, a string or an "
                        f"array of them, so remove it or write it as one")


def _attr(value, where: str, count: _AttrCount | None = None, depth: int = 0):
    """A file attribute as plain JSON-able data: None, bool, int, float (non-finite ones as the strings 'nan',
    'inf', '-inf'), str (bytes decoded as UTF-8, bad bytes replaced), or lists of them. Anything else (an object
    reference, a complex number, a compound record, opaque bytes) is refused naming `where`. Informational:
    never code, never a path that is opened."""
    import h5py

    count = count or _AttrCount(where)
    if depth > 64:
        raise _refuse(where, "nested more than 64 deep")
    if value is None or isinstance(value, h5py.Empty):
        return None
    if isinstance(value, (bytes, np.bytes_)):
        count.add(1, len(value))
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        count.add(1, len(value))
        return str(value)
    if isinstance(value, (bool, np.bool_)):
        count.add()
        return bool(value)
    if isinstance(value, (int, np.integer)):
        count.add()
        return int(value)
    if isinstance(value, (float, np.floating)):
        count.add()
        x = float(value)  # a longdouble beyond float64 becomes inf, then 'inf'
        return x if math.isfinite(x) else str(x)
    if isinstance(value, np.ndarray):
        dtype = value.dtype
        if dtype.fields is not None or dtype.kind not in "biufSO":
            raise _refuse(where, f"an array of {quote(str(dtype))}")
        if dtype.kind in "biu":
            count.add(value.size)
            return value.tolist()  # bool, int (uint64 too): plain Python numbers in nested lists
        items = value.tolist()  # floats, bytes, str or (variable-length) arrays, in nested lists
        return _nested(items, where, count, depth + 1) if isinstance(items, list) else _attr(items, where, count,
                                                                                            depth + 1)
    if isinstance(value, (list, tuple)):
        return _nested(list(value), where, count, depth + 1)
    raise _refuse(where, f"a {quote(type(value).__name__)}")


def _nested(items: list, where: str, count: _AttrCount, depth: int) -> list:
    """`items` (a list from ndarray.tolist(): nested lists, floats, bytes, str or vlen arrays) as plain data."""
    out = []
    for item in items:
        if isinstance(item, list):
            if depth > 64:
                raise _refuse(where, "nested more than 64 deep")
            out.append(_nested(item, where, count, depth + 1))
        else:
            out.append(_attr(item, where, count, depth))
    return out


def read_attrs(obj, path: Path | str) -> dict:
    """The attributes of `obj` (a file or group) as plain JSON-able data (see :func:`_attr`); a DatasetError names
    one that cannot be read or is not plain data. Sizes are checked before an attribute is read: declared bytes
    against limits.json_bytes, elements against ATTR_ELEMENTS, variable-length elements against ATTR_VLEN."""
    import h5py

    out = {}
    for name in obj.attrs:
        where = f"dataset {path}: attribute {quote(name)}"
        try:
            aid = obj.attrs.get_id(name)
            shape, dtype = aid.shape, aid.dtype
            n = math.prod(shape or ())
            limits.check("json_bytes", n * dtype.itemsize, f"{where}: declared bytes", DatasetError)
            if h5py.check_ref_dtype(dtype) is not None:
                raise _refuse(where, "an HDF5 object or region reference")
            if dtype.kind == "c" or dtype.fields is not None or dtype.kind == "V":
                raise _refuse(where, f"of type {quote(str(dtype))}")
            base = dtype.subdtype[0] if dtype.subdtype is not None else dtype
            n *= math.prod(dtype.shape or ())
            if n > ATTR_ELEMENTS:
                raise DatasetError(f"{where}: declares {n:,} elements, more than {ATTR_ELEMENTS:,}; an informational "
                                   f"attribute is a short number, string or array of them, so remove it or store "
                                   f"the data as a dataset")
            if base.kind == "O" and n > ATTR_VLEN:
                raise DatasetError(f"{where}: declares {n:,} variable-length elements, more than {ATTR_VLEN}; "
                                   f"remove it or store the data as a dataset")
            out[name] = _attr(obj.attrs[name], where)
        except DatasetError:
            raise
        except Exception as err:  # h5py raises OSError, TypeError or ValueError for unreadable attribute types
            raise DatasetError(f"{where} cannot be read ({type(err).__name__}: {quote(str(err))}); remove it or "
                               f"write it as a number or string") from None
    return out


def read_hdf5(path: str | Path) -> tuple[Transitions, dict]:
    """(transitions, file attributes) of a flat HDF5 dataset; a DatasetError names any bad key."""
    import h5py

    path = Path(path)
    f, size = open_hdf5(path)
    with f:
        own_bytes(f, path)  # before any key is looked up: `in` and f[key] would follow links
        missing = [k for k in REQUIRED if k not in f or not isinstance(f[k], h5py.Dataset)]
        if missing:
            raise DatasetError(f"dataset {path}: missing key(s) {missing}; a flat HDF5 dataset needs "
                               f"{list(REQUIRED)} (optional: timeouts, next_observations); found "
                               f"{quote(sorted(f.keys()))}")
        keys = [*REQUIRED, *(k for k in ("timeouts", "next_observations") if k in f)]
        if not all(isinstance(f[k], h5py.Dataset) for k in keys):
            raise DatasetError(f"dataset {path}: key(s) {[k for k in keys if not isinstance(f[k], h5py.Dataset)]} "
                               f"are groups; a flat HDF5 dataset holds one array per key")
        budget = FileBudget(path, size)
        sizes = {k: check_array(f[k], k, path, size, budget) for k in keys}  # every array before any is read
        attrs = read_attrs(f, path)
        data = {k: load_array(f[k], k, path, n) for k, n in sizes.items()}
    return from_arrays(data, str(path)), attrs


def from_arrays(data: dict[str, np.ndarray], where: str) -> Transitions:
    """Check the D4RL-style arrays (names as in the file) and build transitions."""
    obs = data["observations"]
    n = obs.shape[0] if obs.ndim else 0
    if obs.ndim == 0:
        raise DatasetError(f"dataset {where}: key 'observations' has shape {obs.shape}; expected [N, ...]")
    if n == 0:
        raise DatasetError(f"dataset {where}: key 'observations' holds no rows; the dataset is empty")
    for key in ("actions", "rewards", "terminals", "timeouts", "next_observations"):
        if key in data and (data[key].ndim == 0 or data[key].shape[0] != n):
            raise DatasetError(f"dataset {where}: key {key!r} has {data[key].shape[0] if data[key].ndim else 0} "
                               f"rows but 'observations' has {n}; every key needs one row per transition")
    for key in ("rewards", "terminals", "timeouts"):
        if key in data and data[key].ndim != 1:
            raise DatasetError(f"dataset {where}: key {key!r} has shape {data[key].shape}; expected [N]")
    if "next_observations" in data and data["next_observations"].shape != obs.shape:
        raise DatasetError(f"dataset {where}: key 'next_observations' has shape {data['next_observations'].shape}, "
                           f"'observations' has {obs.shape}; they must match")
    for key in ("observations", "next_observations", "actions", "rewards"):
        if key in data:
            check_finite(data[key], key, f"dataset {where}")
    with np.errstate(over="ignore"):  # refused just below, with the key and row
        rewards = data["rewards"].astype(np.float32, copy=False)
    check_finite(rewards, "rewards", f"dataset {where}")  # finite float64 beyond float32's range
    terminals = data["terminals"].astype(bool, copy=False)
    timeouts = data["timeouts"].astype(bool, copy=False) if "timeouts" in data else np.zeros(n, bool)
    timeouts = timeouts & ~terminals
    if "next_observations" in data:
        return Transitions(obs, data["actions"], rewards, data["next_observations"], terminals, timeouts)
    nxt = np.empty_like(obs)
    nxt[:-1] = obs[1:]
    nxt[terminals] = obs[terminals]  # never bootstrapped from
    keep = terminals.copy()
    keep[:-1] |= ~timeouts[:-1]  # a timeout's successor is the next episode's first observation
    if keep.all():
        return Transitions(obs, data["actions"], rewards, nxt, terminals, timeouts)
    # the row before a dropped timeout ends its episode for return statistics: mark it as cut
    cut = np.zeros(n, bool)
    cut[:-1] = timeouts[1:] & ~keep[1:]
    timeouts = (timeouts | cut)[keep]
    return Transitions(obs[keep], data["actions"][keep], rewards[keep], nxt[keep], terminals[keep], timeouts)


def write_hdf5(path: str | Path, t: Transitions, attrs: dict | None = None) -> Path:
    """Write `t` as a flat HDF5 dataset (contiguous, uncompressed: reading is a copy) atomically."""
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with h5py.File(tmp, "w") as f:
        for key, value in (("observations", t.observations), ("actions", t.actions), ("rewards", t.rewards),
                           ("next_observations", t.next_observations), ("terminals", t.terminals),
                           ("timeouts", t.timeouts)):
            f.create_dataset(key, data=value)
        for k, v in (attrs or {}).items():
            f.attrs[k] = v
    tmp.replace(path)
    return path
