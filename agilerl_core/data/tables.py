"""Tabular classification data for contextual bandits: features and a class label per row, from scikit-learn's
bundled datasets (``sklearn:iris``, ``sklearn:digits``, ``sklearn:wine``, ``sklearn:breast_cancer``: installed with
scikit-learn, never downloaded) or from a CSV, Parquet or NPZ file on local disk or at ``s3://`` (through the
content-addressed dataset cache of :mod:`agilerl_core.data.fetch`).

Files are data: read through the bounded opener, every size (bytes, rows, an NPZ array's declared shape) checked
against the limit table before anything is allocated, no pickled object arrays, features finite. Labels may be
numbers or text; the classes are their sorted distinct values (class i is arm i).
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agilerl_core import limits as _limits
from agilerl_core.data.fetch import resolve_dataset
from agilerl_core.errors import DatasetError
from agilerl_core.io.files import quote, read_bytes
from agilerl_core.io.storage import S3Options

BUNDLED = ("iris", "digits", "wine", "breast_cancer")
SUFFIXES = (".csv", ".parquet", ".npz")


@dataclass(frozen=True)
class Table:
    """A classification table: features [N, D] float32, labels [N] int64 in [0, classes), and where it came from."""

    features: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]  # the label values, class i's at i
    source: str
    sha256: str | None  # the file's content hash (None: a bundled dataset, pinned by scikit-learn's version)

    @property
    def arms(self) -> int:
        return len(self.classes)


@dataclass(frozen=True)
class BanditSplit:
    """A table split into training and held-out rows (a seeded permutation), with the training rows' feature mean
    and std: the members standardise their contexts with them (carried in their checkpoints, so a deployed policy
    takes raw features)."""

    train_x: np.ndarray
    train_y: np.ndarray
    held_x: np.ndarray
    held_y: np.ndarray
    arms: int
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def of(cls, table: Table, held_out: float, seed: int, standardize: bool = True) -> BanditSplit:
        n = len(table.labels)
        held = round(n * held_out)
        if held < 1 or held >= n:
            raise DatasetError(f"data.held_out: {held_out} of {n} rows leaves {held} held-out and {n - held} training "
                               f"rows; both need at least one")
        order = np.random.default_rng(seed).permutation(n)
        train, out = order[held:], order[:held]
        x = table.features
        mean = x[train].mean(0) if standardize else np.zeros(x.shape[1], np.float32)
        std = x[train].std(0) if standardize else np.ones(x.shape[1], np.float32)
        std = np.where(std > 1e-8, std, 1.0)  # a constant column stays 0
        return cls(x[train], table.labels[train], x[out], table.labels[out], table.arms, mean.astype(np.float32),
                   std.astype(np.float32))

    def describe(self) -> dict[str, Any]:
        """The split's sizes and scaling as checkpoint JSON (information: the members carry the scaling)."""
        return {"arms": self.arms, "train_rows": len(self.train_y), "held_out_rows": len(self.held_y),
                "feature_mean": [float(v) for v in self.mean], "feature_std": [float(v) for v in self.std]}


def check_table_source(source: str) -> str | None:
    """Why `source` cannot name a table (None when its form is fine): what the config checks before any read."""
    if source.startswith("sklearn:"):
        name = source.removeprefix("sklearn:")
        return None if name in BUNDLED else \
            f"{quote(source)} is not a bundled scikit-learn dataset; use one of " + \
            ", ".join(f"sklearn:{n}" for n in BUNDLED)
    if not source.lower().endswith(SUFFIXES):
        return f"{quote(source)}: give a .csv, .parquet or .npz file (local or s3://), or sklearn:NAME"
    return None


def load_table(source: str, label: str = "label", features: list[str] | None = None, s3: S3Options | None = None,
               cache_dir: str | None = None) -> Table:
    """The table `source` names (see the module); `label`: the label column (CSV, Parquet) or array (NPZ, whose
    features are the array ``features`` unless `features` names one); `features`: the feature columns (None:
    every other column). A DatasetError names the source, the field and the fix."""
    why = check_table_source(source)
    if why is not None:
        raise DatasetError(f"data.source: {why}")
    if source.startswith("sklearn:"):
        return _bundled(source)
    local = resolve_dataset(source, s3, cache_dir)
    lim = _limits.current()
    raw = read_bytes(local.path, lim.dataset_bytes, "dataset_bytes", f"data.source {source}", DatasetError)
    suffix = source.lower().rsplit(".", 1)[-1]
    if suffix == "npz":
        x, y = _npz(raw, source, label, features)
    else:
        columns = _csv(raw, source) if suffix == "csv" else _parquet(raw, source)
        x, y = _columns(columns, source, label, features)
    return _table(x, y, source, local.sha256)


def _bundled(source: str) -> Table:
    from sklearn import datasets

    data = getattr(datasets, f"load_{source.removeprefix('sklearn:')}")()
    return _table(np.asarray(data.data), np.asarray(data.target), source, None)


def _table(x: np.ndarray, y: np.ndarray, source: str, sha256: str | None) -> Table:
    """Checked features (2-D, numeric, finite, at least 2 rows) and labels mapped to class indices."""
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise DatasetError(f"data.source {source}: features must be a table of at least 2 rows and 1 column, got "
                           f"shape {x.shape}")
    if y.shape != (x.shape[0],):
        raise DatasetError(f"data.source {source}: {y.shape} labels for {x.shape[0]} rows; give one label per row")
    try:
        x = x.astype(np.float32)
    except (TypeError, ValueError):
        raise DatasetError(f"data.source {source}: features must be numbers; drop or encode the text "
                           f"columns") from None
    bad = ~np.isfinite(x)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise DatasetError(f"data.source {source}: feature {col} of row {row} is {x[row, col]}; give finite "
                           f"features (fill or drop missing values)")
    values, labels = np.unique(y, return_inverse=True)
    if len(values) < 2:
        raise DatasetError(f"data.source {source}: one class only ({quote(str(values[0]))}); a bandit needs at least "
                           f"two arms")
    _limits.check("discrete_n", len(values), f"data.source {source}: classes", DatasetError)
    return Table(x, labels.astype(np.int64), tuple(str(v) for v in values), source, sha256)


def _columns(columns: dict[str, list], source: str, label: str, features: list[str] | None
             ) -> tuple[np.ndarray, np.ndarray]:
    if label not in columns:
        raise DatasetError(f"data.label: {quote(label)} is not a column of {source}; its columns are "
                           f"{quote(sorted(columns))}")
    names = features if features is not None else [c for c in columns if c != label]
    missing = [n for n in names if n not in columns]
    if missing:
        raise DatasetError(f"data.features: {quote(missing)} not among the columns of {source} "
                           f"({quote(sorted(columns))})")
    if label in names:
        raise DatasetError(f"data.features: the label column {quote(label)} cannot be a feature too")
    x = np.empty((len(columns[label]), len(names)), dtype=np.float32)
    for j, n in enumerate(names):
        try:
            x[:, j] = np.asarray(columns[n], dtype=np.float32)
        except (TypeError, ValueError):
            raise DatasetError(f"data.features: column {quote(n)} of {source} holds values that are not numbers; "
                               f"encode it or leave it out of data.features") from None
    return x, np.asarray(columns[label])


def _csv(raw: bytes, source: str) -> dict[str, list]:
    """A CSV's columns by header name; rows counted against limits.dataset_records as they are read."""
    lim = _limits.current()
    try:
        reader = csv.reader(io.StringIO(raw.decode("utf-8-sig")))
        header = next(reader, None)
    except (UnicodeDecodeError, csv.Error) as err:
        raise DatasetError(f"data.source {source}: not a readable UTF-8 CSV ({err})") from None
    if not header:
        raise DatasetError(f"data.source {source}: empty; the first line names the columns")
    if len(set(header)) != len(header):
        raise DatasetError(f"data.source {source}: a column name appears twice in the header {quote(header)}")
    cols: dict[str, list] = {h: [] for h in header}
    try:
        for n, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DatasetError(f"data.source {source}: line {n} has {len(row)} fields, the header {len(header)}")
            if n - 1 > lim.dataset_records:
                raise DatasetError(f"data.source {source}: over limits.dataset_records = {lim.dataset_records:,} "
                                   f"rows; raise it in your config if the file is meant")
            for h, v in zip(header, row, strict=True):
                cols[h].append(_number(v))
    except csv.Error as err:
        raise DatasetError(f"data.source {source}: malformed CSV ({err})") from None
    return cols


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _parquet(raw: bytes, source: str) -> dict[str, list]:
    """A Parquet file's columns; its declared rows and uncompressed size checked before any column is decoded."""
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(io.BytesIO(raw))
        meta = f.metadata
        unpacked = sum(meta.row_group(i).column(j).total_uncompressed_size for i in range(meta.num_row_groups)
                       for j in range(meta.num_columns))
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise DatasetError(f"data.source {source}: not a readable Parquet file ({quote(str(err))})") from None
    _limits.check("dataset_records", meta.num_rows, f"data.source {source}: rows", DatasetError)
    _limits.check("dataset_bytes", unpacked, f"data.source {source}: uncompressed bytes", DatasetError)
    try:
        table = f.read(use_threads=False)
    except Exception as err:
        raise DatasetError(f"data.source {source}: not a readable Parquet file ({quote(str(err))})") from None
    _limits.check("dataset_records", table.num_rows, f"data.source {source}: rows read", DatasetError)
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _npz(raw: bytes, source: str, label: str, features: list[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """The feature and label arrays of an NPZ file: each array's header (dtype, shape) read and its size checked
    against limits.dataset_bytes before its data is; object arrays (pickles) refused."""
    names = features or ["features"]
    if len(names) != 1:
        raise DatasetError("data.features: an NPZ file's features are one 2-D array; name that array alone")
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
        members = {n.removesuffix(".npy"): n for n in archive.namelist()}
    except zipfile.BadZipFile as err:
        raise DatasetError(f"data.source {source}: not a readable NPZ file ({err})") from None
    out = []
    for field, name in (("data.features", names[0]), ("data.label", label)):
        if name not in members:
            raise DatasetError(f"{field}: {quote(name)} is not an array of {source}; its arrays are "
                               f"{quote(sorted(members))}")
        out.append(_npy(archive, members[name], source))
    return out[0], out[1]


def _npy(archive: zipfile.ZipFile, member: str, source: str) -> np.ndarray:
    where = f"data.source {source}: array {member}"
    try:
        with archive.open(member) as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise DatasetError(f"{where}: .npy format version {version} is not read; save it with numpy's "
                                   f"np.savez (format 1.0)")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)  # the header only: no data read yet
            if dtype.hasobject:
                raise DatasetError(f"{where}: holds Python objects (a pickle); save numbers, not objects")
            nbytes = math.prod(shape) * dtype.itemsize
            _limits.check("dataset_bytes", nbytes, f"{where}: declared bytes", DatasetError)
            data = f.read(nbytes + 1)
    except DatasetError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise DatasetError(f"{where}: not a readable .npy array ({err})") from None
    if len(data) != nbytes:
        raise DatasetError(f"{where}: holds {len(data):,} bytes where its header declares {nbytes:,}")
    arr = np.frombuffer(data, dtype=dtype)
    return arr.reshape(shape, order="F" if fortran else "C")


def write_table(path: str | Path, features: np.ndarray, labels: np.ndarray, names: list[str] | None = None) -> Path:
    """Write a table as CSV (columns f0..fD-1 or `names`, then ``label``) or NPZ (arrays ``features`` and
    ``label``), by the path's suffix: what tests and examples use to make a file."""
    path = Path(path)
    if path.suffix == ".npz":
        np.savez(path, features=features, label=labels)
        return path
    names = names or [f"f{j}" for j in range(features.shape[1])]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*names, "label"])
        for row, y in zip(features.tolist(), labels.tolist(), strict=True):
            w.writerow([*row, y])
    return path
