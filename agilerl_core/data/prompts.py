"""Prompt sets (prompts with answers, for GRPO's verifiable rewards) and preference sets (prompt, chosen,
rejected, for DPO) as JSONL or Parquet, on local disk or at ``s3://`` (through the content-addressed dataset
cache of :mod:`agilerl_core.data.fetch`).

The train / held-out split is a seeded permutation, fixed by the experiment's seed: fitness is measured on
held-out records only, which no member ever trains on. ``make_arithmetic`` writes the arithmetic sets the
shipped configs use.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from agilerl_core.data.budget import ReadBudget
from agilerl_core.data.fetch import resolve_dataset
from agilerl_core.errors import DatasetError
from agilerl_core.io.files import bounded_lines, open_regular, quote, regular_file
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
    responses: list[str] | None = None  # demonstrations' responses (SFT)
    entries: list[dict[str, Any]] | None = None  # generated records' whole entries (reasoning-gym: for its scorer)

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, index: np.ndarray) -> TextRecords:
        def pick(col):
            return None if col is None else [col[i] for i in index]

        return TextRecords(self.uri, self.sha256, pick(self.prompts), pick(self.answers), pick(self.chosen),
                           pick(self.rejected), pick(self.responses), pick(self.entries))

    def describe(self) -> dict[str, Any]:
        return {"uri": self.uri, "sha256": self.sha256, "records": len(self), "format": "text",
                "has_answers": self.answers is not None, "has_preferences": self.chosen is not None,
                "has_responses": self.responses is not None}


RECORD_OVERHEAD = 64  # bytes a record's field costs in memory beyond its text (the str object, its list slot)
_BATCH = 1024  # Parquet rows decoded at a time
_COLUMNS = ("prompt", "answer", "chosen", "rejected", "response")
_JSONL = (".jsonl", ".json", ".jsonl.gz")


def _budget(uri: str, size: int, fields: int) -> ReadBudget:
    """A set's budget (:class:`~agilerl_core.data.budget.ReadBudget`), each record charged RECORD_OVERHEAD per
    field beyond its text."""
    return ReadBudget(f"dataset {uri}", size, "set", "records", per_record=RECORD_OVERHEAD * max(fields, 1))


class _Columns:
    """The wanted columns of a set, gathered record by record (as str, as the trainers read them)."""

    def __init__(self, uri: str, fields: dict[str, str], need: tuple[str, ...]) -> None:
        self.uri, self.need = uri, need
        self.fields = {c: fields.get(c, c) for c in _COLUMNS}  # a column not named reads its own name
        self.values: dict[str, list[str | None]] = {c: [] for c in _COLUMNS}
        self.present: dict[str, bool] = {c: False for c in _COLUMNS}
        self.first_missing: dict[str, tuple[int, str]] = {}
        self.n = 0

    def missing(self, col: str, index: int, has: str) -> DatasetError:
        return DatasetError(f"dataset {self.uri}: record {index} has no {self.fields[col]!r} field (it has {has}); "
                            f"set dataset.{col}_field to the field that holds it")

    def add(self, row: dict[str, Any]) -> None:
        index = self.n
        for col in _COLUMNS:
            name = self.fields[col]
            value = row.get(name)
            if name in row:
                self.present[col] = True
            if value is None:
                if col in self.need:
                    raise self.missing(col, index, quote(sorted(row)))
                if col not in self.first_missing:
                    self.first_missing[col] = (index, quote(sorted(row)))
                self.values[col].append(None)
            else:
                self.values[col].append(value if type(value) is str else str(value))
        self.n += 1

    def done(self) -> dict[str, list[str] | None]:
        if not self.n:
            raise DatasetError(f"dataset {self.uri}: no records")
        out: dict[str, list[str] | None] = {}
        for col in _COLUMNS:
            if not (self.present[col] or col in self.need):
                out[col] = None
                continue
            if col in self.first_missing:
                raise self.missing(col, *self.first_missing[col])
            out[col] = self.values[col]  # type: ignore[assignment]
        return out


def _suffix(path: Path, uri: str) -> str:
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix not in (*_JSONL, ".parquet"):
        raise DatasetError(f"dataset {uri}: unknown format {suffix or '(no suffix)'!r}; use .jsonl (JSON Lines), "
                           f".jsonl.gz or .parquet")
    return suffix


def _read_jsonl(f: BinaryIO, gz: bool, uri: str, budget: ReadBudget, out: _Columns) -> None:
    """The records of JSON Lines (gzip-compressed when `gz`): each line read with at most limits.record_bytes in
    memory, all lines together (decompressed) bounded by the file's budget, never one unbounded line."""
    lim = budget.lim
    stream = gzip.GzipFile(fileobj=f, mode="rb") if gz else f
    lines = bounded_lines(stream, f"dataset {uri}", DatasetError, lim.record_bytes, "record_bytes",  # type: ignore[arg-type]
                          budget.total, budget.limit_name)
    most, per_record = lim.dataset_records, budget.per_record
    try:
        for n, line in lines:
            if n > most:  # every line counts, blank ones too
                budget.count(n, f"or more (line {n:,}; every line counts)")
            if not line.strip():
                continue
            try:
                row = read_record(line, f"dataset {uri}: line {n}", error=DatasetError)
            except DatasetError as err:
                raise DatasetError(f"dataset {uri}: line {n} is not JSON ({err}); a prompt set is JSON "
                                   f"Lines: one object per line") from None
            if not isinstance(row, dict):
                raise DatasetError(f"dataset {uri}: line {n} is a {type(row).__name__}, not an object")
            budget.used += len(line) + per_record
            if budget.used > budget.total:
                budget.spend(0, f"by line {n:,}")
            out.add(row)
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DatasetError(f"dataset {uri}: not a readable {'gzip' if gz else 'JSON Lines'} file "
                           f"({quote(str(err))})") from None
    finally:
        if gz:
            stream.close()


def _text_bytes(arr: Any, column: str, uri: str) -> np.ndarray:
    """Bytes of each value of Parquet column `arr` once it is Python text (numbers: a fixed 32), computed
    without decoding a dictionary; a nested column is refused."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = arr.type.value_type if pa.types.is_dictionary(arr.type) else arr.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or \
            pa.types.is_large_binary(kind):
        if pa.types.is_dictionary(arr.type):
            sizes = pc.take(pc.binary_length(arr.dictionary).fill_null(0), arr.indices)
        else:
            sizes = pc.binary_length(arr)
        return np.asarray(sizes.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    if pa.types.is_null(kind) or pa.types.is_boolean(kind) or pa.types.is_integer(kind) or \
            pa.types.is_floating(kind) or pa.types.is_decimal(kind) or pa.types.is_temporal(kind):
        return np.full(len(arr), 32, dtype=np.int64)
    raise DatasetError(f"dataset {uri}: column {column!r} is of type {quote(str(arr.type))}, not text or a number; "
                       f"a prompt set's fields are text")


def _python_values(arr: Any) -> list[Any]:
    """`arr` as Python values; a dictionary column shares one str per distinct value."""
    import pyarrow as pa

    if pa.types.is_dictionary(arr.type):
        words = arr.dictionary.to_pylist()
        return [None if i is None else words[i] for i in arr.indices.to_pylist()]
    return arr.to_pylist()


def _read_parquet(f: BinaryIO, uri: str, size: int, fields: dict[str, str], need: tuple[str, ...],
                  out: _Columns) -> None:
    """The records of a Parquet file: its row count (metadata) checked against limits.dataset_records and its
    budget before anything is decoded, then only the wanted columns read in batches of rows, text columns kept
    dictionary-encoded until each batch's decoded bytes are accounted against the budget."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(f).metadata
        schema = meta.schema.to_arrow_schema()
        names = list(schema.names)
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
        rows = max(meta.num_rows, sum(g.num_rows for g in groups))
        # the row groups' uncompressed data, every column's (an upper bound for the columns read): pyarrow 25's
        # row_group(i).column(j) aborts the interpreter on some damaged files, where no except can catch it
        unpacked = sum(g.total_byte_size for g in groups)
    except DatasetError:
        raise
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise DatasetError(f"dataset {uri}: not a readable Parquet file ({quote(str(err))})") from None
    columns = []
    for col in _COLUMNS:
        name = out.fields[col]
        if names.count(name) > 1:
            raise DatasetError(f"dataset {uri}: column {quote(name)} appears {names.count(name)} times")
        if name in names and name not in columns:
            columns.append(name)
        elif col in need and name not in names:
            raise out.missing(col, 0, quote(sorted(names)))
    budget = _budget(uri, size, len(columns))
    budget.count(rows, "declared by its metadata")
    budget.spend(rows * budget.per_record, f"for the {rows:,} rows its metadata declares, before reading")
    budget.spend(unpacked, "with its column pages uncompressed, as its metadata declares them")
    budget.used = rows * budget.per_record  # the pages are transient: what stays is the records' text
    text = [name for name in columns if pa.types.is_string(schema.field(name).type) or
            pa.types.is_large_string(schema.field(name).type) or pa.types.is_binary(schema.field(name).type) or
            pa.types.is_large_binary(schema.field(name).type)]
    seen = 0
    try:
        reader = pq.ParquetFile(f, metadata=meta, read_dictionary=text)
        for batch in reader.iter_batches(batch_size=_BATCH, columns=columns, use_threads=False):
            n = batch.num_rows
            seen += n
            budget.count(seen, "or more read")
            sizes = np.zeros(n, dtype=np.int64)
            for name in columns:
                sizes += _text_bytes(batch.column(name), name, uri)
            if n and int(sizes.max()) > budget.lim.record_bytes:
                budget.text(int(sizes.max()), f"record {seen - n + int(sizes.argmax())}")
            if seen > rows:  # more rows than declared: their overhead was not counted up front
                budget.spend((seen - max(rows, seen - n)) * budget.per_record, f"by record {seen - 1:,}")
            budget.spend(int(sizes.sum()), f"by record {seen - 1:,}")
            values = {name: _python_values(batch.column(name)) for name in columns}
            for i in range(n):
                out.add({name: values[name][i] for name in columns})
    except DatasetError:
        raise
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise DatasetError(f"dataset {uri}: not a readable Parquet file ({quote(str(err))})") from None


def _read_columns(path: Path, uri: str, fields: dict[str, str], need: tuple[str, ...]) -> dict[str, list[str] | None]:
    """The prompt/answer/chosen/rejected columns of the set at local `path` (a regular file only: a FIFO or a
    folder is refused at once), read within the limit table's bounds (see :class:`~agilerl_core.data.budget.ReadBudget`)."""
    suffix = _suffix(path, uri)
    out = _Columns(uri, fields, need)
    with open_regular(path, f"dataset {uri}", DatasetError) as f:
        size = os.fstat(f.fileno()).st_size
        if suffix == ".parquet":
            _read_parquet(f, uri, size, fields, need, out)
        else:
            _read_jsonl(f, suffix.endswith(".gz"), uri, _budget(uri, size, len(set(out.fields.values()))), out)
    return out.done()


def check_dataset_uri(uri: str) -> None:
    """A DatasetError when a local prompt set does not exist or is not a regular file (a FIFO, a folder, a
    device: refused at once, never waited on); s3:// sets are checked when fetched."""
    if uri.startswith("s3://"):
        return
    path = Path(uri.removeprefix("file://")).expanduser()
    if not path.exists() and not path.is_symlink():
        raise DatasetError(f"dataset.uri {uri!r}: no such file; write one with `agilerl-flow dataset "
                           f"make-arithmetic --out {uri}` or point at your JSONL/Parquet prompt set")
    regular_file(path, f"dataset.uri {uri!r}", DatasetError)


def load_text_records(uri: str, fields: dict[str, str], need: tuple[str, ...], s3: S3Options | None = None,
                      cache_dir: str | None = None) -> TextRecords:
    """Read a JSONL/Parquet set. `fields` maps prompt/answer/chosen/rejected/response to the records' field names;
    `need` lists the columns that must be present (a DatasetError naming the field otherwise). The file is read
    within the limits in force (``limits.dataset_records``, ``record_bytes``, ``dataset_expansion``,
    ``dataset_bytes``)."""
    check_dataset_uri(uri)
    local = resolve_dataset(uri, s3, cache_dir)
    cols = _read_columns(local.path, uri, fields, need)
    return TextRecords(uri, local.sha256, cols["prompt"], cols["answer"], cols["chosen"], cols["rejected"],
                       cols["response"])


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
