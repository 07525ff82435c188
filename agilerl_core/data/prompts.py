"""Prompt sets (prompts with answers, for GRPO's verifiable rewards) and preference sets (prompt, chosen,
rejected, for DPO) as JSONL or Parquet, on local disk or at ``s3://`` (through the content-addressed dataset
cache of :mod:`agilerl_core.data.fetch`).

The train / held-out split is a seeded permutation, fixed by the experiment's seed: fitness is measured on
held-out records only, which no member ever trains on. ``make_arithmetic`` writes the arithmetic sets the
shipped configs use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agilerl_core.data.fetch import resolve_dataset
from agilerl_core.errors import DatasetError
from agilerl_core.io.records import read_record
from agilerl_core.io.storage import S3Options

SPLIT_SEED = 0x5917  # derive_seed(seed, SPLIT_SEED) orders a set's records before the split


@dataclass
class TextRecords:
    """Records of a prompt or preference set (columns as lists; absent columns are None)."""

    uri: str
    sha256: str
    prompts: list[str]
    answers: list[str | None] | None = None
    chosen: list[str] | None = None
    rejected: list[str] | None = None
    entries: list[dict[str, Any]] | None = None  # generated records' whole entries (reasoning-gym: for its scorer)

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, index: np.ndarray) -> TextRecords:
        def pick(col):
            return None if col is None else [col[i] for i in index]

        return TextRecords(self.uri, self.sha256, pick(self.prompts), pick(self.answers), pick(self.chosen),
                           pick(self.rejected), pick(self.entries))

    def describe(self) -> dict[str, Any]:
        return {"uri": self.uri, "sha256": self.sha256, "records": len(self), "format": "text",
                "has_answers": self.answers is not None, "has_preferences": self.chosen is not None}


def _read_rows(path: Path, uri: str) -> list[dict[str, Any]]:
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix in (".jsonl", ".json", ".jsonl.gz"):
        import gzip

        opener = gzip.open if suffix.endswith(".gz") else open
        rows = []
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = read_record(line.encode(), f"dataset {uri}: line {n}", error=DatasetError)
                except DatasetError as err:
                    raise DatasetError(f"dataset {uri}: line {n} is not JSON ({err}); a prompt set is JSON "
                                       f"Lines: one object per line") from None
                if not isinstance(row, dict):
                    raise DatasetError(f"dataset {uri}: line {n} is a {type(row).__name__}, not an object")
                rows.append(row)
        return rows
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises several types for a damaged file
            raise DatasetError(f"dataset {uri}: not a readable Parquet file ({err})") from None
    raise DatasetError(f"dataset {uri}: unknown format {suffix or '(no suffix)'!r}; use .jsonl (JSON Lines) or "
                       f".parquet")


def _column(rows: list[dict[str, Any]], field: str, uri: str, setting: str) -> list[str]:
    out = []
    for i, row in enumerate(rows):
        if field not in row or row[field] is None:
            raise DatasetError(f"dataset {uri}: record {i} has no {field!r} field (it has {sorted(row)}); set "
                               f"dataset.{setting} to the field that holds it")
        out.append(str(row[field]))
    return out


def check_dataset_uri(uri: str) -> None:
    """A DatasetError when a local prompt set does not exist (s3:// sets are checked when fetched)."""
    if not uri.startswith("s3://") and not Path(uri.removeprefix("file://")).expanduser().is_file():
        raise DatasetError(f"dataset.uri {uri!r}: no such file; write one with `agilerl-flow dataset "
                           f"make-arithmetic --out {uri}` or point at your JSONL/Parquet prompt set")


def load_text_records(uri: str, fields: dict[str, str], need: tuple[str, ...], s3: S3Options | None = None,
                      cache_dir: str | None = None) -> TextRecords:
    """Read a JSONL/Parquet set. `fields` maps prompt/answer/chosen/rejected to the records' field names;
    `need` lists the columns that must be present (a DatasetError naming the field otherwise)."""
    check_dataset_uri(uri)
    local = resolve_dataset(uri, s3, cache_dir)
    rows = _read_rows(local.path, uri)
    if not rows:
        raise DatasetError(f"dataset {uri}: no records")
    cols: dict[str, list[str] | None] = {}
    for col in ("prompt", "answer", "chosen", "rejected"):
        name = fields[col]
        present = any(name in r for r in rows)
        cols[col] = _column(rows, name, uri, f"{col}_field") if col in need or present else None
    return TextRecords(uri, local.sha256, cols["prompt"], cols["answer"], cols["chosen"], cols["rejected"])


def split_indices(n: int, held_out: float | int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) indices of `n` records: a seeded permutation, the first `held_out` records (a count,
    or a fraction of n when < 1) held out."""
    k = round(held_out * n) if held_out < 1 else int(held_out)
    if not 1 <= k < n:
        raise DatasetError(f"dataset.held_out: {held_out} leaves {n - k} of {n} records to train on and {k} to "
                           f"evaluate; both need at least one")
    order = np.random.default_rng(np.random.SeedSequence([seed, SPLIT_SEED])).permutation(n)
    return np.sort(order[k:]), np.sort(order[:k])


# ---- generated arithmetic ---------------------------------------------------------------------------------
ARITHMETIC_PROMPT = "What is {a} + {b}? Answer with the number only."


def make_arithmetic(count: int, digits: int = 2, seed: int = 0, preferences: bool = False,
                    template: str = ARITHMETIC_PROMPT) -> list[dict[str, Any]]:
    """`count` distinct additions of two `digits`-digit numbers. With `preferences`, each record also has
    ``chosen`` (the correct sum) and ``rejected`` (a wrong sum off by 1-10, or by ten in one digit)."""
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10 ** digits
    if count > (hi - lo) ** 2:
        raise ValueError(f"only {(hi - lo) ** 2} distinct {digits}-digit additions exist; ask for fewer")
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, int]] = set()
    rows = []
    while len(rows) < count:
        a, b = (int(x) for x in rng.integers(lo, hi, size=2))
        if (a, b) in seen:
            continue
        seen.add((a, b))
        row: dict[str, Any] = {"prompt": template.format(a=a, b=b), "answer": str(a + b)}
        if preferences:
            off = int(rng.integers(1, 11)) * (1 if rng.random() < 0.5 else -1)
            wrong = a + b + off if a + b + off >= 0 else a + b + abs(off)
            row.update(chosen=str(a + b), rejected=str(wrong))
        rows.append(row)
    return rows


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
    return path
