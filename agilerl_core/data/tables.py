"""Tabular classification data for contextual bandits: features and a class label per row, from scikit-learn's
bundled datasets (``sklearn:iris``, ``sklearn:digits``, ``sklearn:wine``, ``sklearn:breast_cancer``: installed with
scikit-learn, never downloaded) or from a CSV, Parquet or NPZ file on local disk or at ``s3://`` (through the
content-addressed dataset cache of :mod:`agilerl_core.data.fetch`).

Files are data: read through the bounded opener, every size (bytes, rows, an NPZ array's declared shape, a Parquet
file's declared rows and a text label's measured bytes) counted against the file's size times
``limits.dataset_expansion`` (capped by ``limits.dataset_bytes``) before anything is allocated, one row's text
against ``limits.record_bytes``; NPZ members stored or deflated only (as np.savez and np.savez_compressed write
them), numbers only (labels: numbers or text), no pickled object arrays; features finite. Labels may be numbers or
text; the classes are their sorted distinct values (class i is arm i), at most ``limits.bandit_arms`` of them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agilerl_core import limits as _limits
from agilerl_core.data.budget import ReadBudget
from agilerl_core.data.fetch import resolve_dataset
from agilerl_core.data.table_formats import read_csv, read_npz, read_parquet, unique_classes
from agilerl_core.errors import DatasetError
from agilerl_core.io.files import quote, read_bytes
from agilerl_core.io.storage import S3Options

BUNDLED = ("iris", "digits", "wine", "breast_cancer")
SUFFIXES = (".csv", ".parquet", ".npz")
STD_FLOOR = 1e-8  # a feature's std at most this is a constant column (scaled by 1); a member's ctx_std is checked


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
        std = np.where(std > STD_FLOOR, std, 1.0)  # a constant column stays 0
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
    every other column). Everything the file becomes in memory is counted against its size times
    ``limits.dataset_expansion`` (capped by ``limits.dataset_bytes``) before it is allocated, one row's text
    against ``limits.record_bytes``, its rows against ``limits.dataset_records`` and its classes against
    ``limits.bandit_arms``. A DatasetError names the source, the field and the fix."""
    why = check_table_source(source)
    if why is not None:
        raise DatasetError(f"data.source: {why}")
    if source.startswith("sklearn:"):
        return _bundled(source)
    local = resolve_dataset(source, s3, cache_dir)
    lim = _limits.current()
    raw = read_bytes(local.path, lim.dataset_bytes, "dataset_bytes", f"data.source {source}", DatasetError)
    budget = ReadBudget(f"data.source {source}", len(raw), "table", "rows")
    suffix = source.lower().rsplit(".", 1)[-1]
    if suffix == "npz":
        x, y = read_npz(raw, source, label, features, budget)
        labels, classes = unique_classes(y, source, budget)
    elif suffix == "csv":
        x, labels, classes = read_csv(raw, source, label, features, budget)
    else:
        x, labels, classes = read_parquet(raw, source, label, features, budget)
    return _table(x, labels, classes, source, local.sha256, budget)


def _bundled(source: str) -> Table:
    from sklearn import datasets

    data = getattr(datasets, f"load_{source.removeprefix('sklearn:')}")()
    x, y = np.asarray(data.data), np.asarray(data.target)
    labels, classes = unique_classes(y, source, None)
    return _table(x, labels, classes, source, None, None)


def _table(x: np.ndarray, labels: np.ndarray, classes: tuple[str, ...], source: str, sha256: str | None,
           budget: ReadBudget | None) -> Table:
    """Checked features (2-D, numeric, finite, at least 2 rows) and class indices with their names."""
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise DatasetError(f"data.source {source}: features must be a table of at least 2 rows and 1 column, got "
                           f"shape {x.shape}")
    if labels.shape != (x.shape[0],):
        raise DatasetError(f"data.source {source}: {labels.shape} labels for {x.shape[0]} rows; give one label per "
                           f"row")
    if budget is not None:  # the float32 features (a copy unless they are float32 already) and the finite check
        budget.spend(x.size * (1 if x.dtype == np.float32 else 5), "as float32 features")
    try:
        x = x if x.dtype == np.float32 and x.flags.writeable else x.astype(np.float32)
    except (TypeError, ValueError):
        raise DatasetError(f"data.source {source}: features must be numbers; drop or encode the text "
                           f"columns") from None
    bad = ~np.isfinite(x)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise DatasetError(f"data.source {source}: feature {col} of row {row} is {x[row, col]}; give finite "
                           f"features (fill or drop missing values)")
    if len(classes) < 2:
        raise DatasetError(f"data.source {source}: one class only ({quote(classes[0] if classes else '')}); a "
                           f"bandit needs at least two arms")
    _limits.check("discrete_n", len(classes), f"data.source {source}: classes", DatasetError)
    return Table(x, labels, classes, source, sha256)


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
