"""How each table file a bandit reads is decoded within budget (CSV, Parquet, NPZ; see
:mod:`agilerl_core.data.tables`): everything a file becomes in memory counted against its size times
``limits.dataset_expansion`` (capped by ``limits.dataset_bytes``) before it is allocated, one row's text against
``limits.record_bytes``, its rows against ``limits.dataset_records``, its classes against ``limits.bandit_arms``;
NPZ members stored or deflated only, numbers only (labels: numbers or text), no pickled object arrays."""

from __future__ import annotations

import csv
import io
import math
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

from agilerl_core import limits as _limits
from agilerl_core.data.budget import ReadBudget
from agilerl_core.errors import DatasetError
from agilerl_core.io.files import quote

RECORD_OVERHEAD = 64  # bytes a CSV field costs in memory beyond its text (its Python object, its list slot)
_BATCH_VALUES = 1 << 20  # Parquet values decoded at a time (a batch's rows: this over the columns read)
_BATCH_ROWS = 65_536  # Parquet rows decoded at a time, at most
_NPZ_COMPRESSION = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what np.savez and np.savez_compressed write
_FEATURE_KINDS = "biuf"  # bool, int, uint, float
_TEXT_KINDS = "US"  # unicode, bytes


class _Classes:
    """Distinct label values by first appearance, counted against ``limits.bandit_arms`` as they appear (one arm
    per class): labels become class indices without a fixed-width array of every label, where one wide label
    would make every row as wide."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.most = _limits.current().bandit_arms
        self.ids: dict[Any, int] = {}

    def id(self, value: Any) -> int:
        i = self.ids.get(value)
        if i is None:
            i = len(self.ids)
            if i >= self.most:
                raise _too_many_arms(self.source, f"{i + 1:,} distinct labels or more", self.most)
            self.ids[value] = i
        return i

    def done(self, first_seen: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
        """(class index per row, class names) from each row's first-seen id: the classes are the sorted distinct
        values, named and ordered as ``np.unique`` names and orders them (numbers by value, text by code point)."""
        keys = list(self.ids)
        if all(type(k) is float for k in keys):
            values = np.asarray(keys, dtype=np.float64)
            order = np.argsort(values, kind="stable")
            names = tuple(str(v) for v in values[order])
        else:
            texts = [k if isinstance(k, (str, bytes)) else str(k) for k in keys]
            order = np.asarray(sorted(range(len(keys)), key=texts.__getitem__), dtype=np.int64)
            names = tuple(str(texts[i]) for i in order)
        rank = np.empty(len(keys), dtype=np.int64)
        rank[order] = np.arange(len(keys), dtype=np.int64)
        return rank[first_seen], names


def _too_many_arms(source: str, what: str, most: int) -> DatasetError:
    return DatasetError(f"data.source {source}: {what}, over the limit limits.bandit_arms = {most:,} (each class is "
                        f"an arm, and a member scores every arm for every context); if the table is meant, raise "
                        f"limits.bandit_arms in your own config")


def unique_classes(y: np.ndarray, source: str, budget: ReadBudget | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Class indices and names of a label array of numbers or fixed-width text (its sorted distinct values)."""
    if y.ndim != 1:
        raise DatasetError(f"data.label: the labels of {source} have shape {y.shape}; give one label per row (a "
                           f"1-D array)")
    if y.dtype.kind == "f" and bool(np.isnan(y).any()):
        row = int(np.flatnonzero(np.isnan(y))[0])
        raise DatasetError(f"data.label: the label of row {row} of {source} is nan; give every row a label (fill or "
                           f"drop missing values)")
    if budget is not None:  # np.unique sorts a copy of the labels and keeps an index per row
        budget.spend(2 * y.nbytes + 16 * len(y), "sorting its labels into classes")
    values, labels = np.unique(y, return_inverse=True)
    most = _limits.current().bandit_arms
    if len(values) > most:
        raise _too_many_arms(source, f"{len(values):,} distinct labels", most)
    return labels.reshape(-1).astype(np.int64), tuple(str(v) for v in values)


def _feature_names(columns: list[str], source: str, label: str, features: list[str] | None) -> list[str]:
    """The feature columns of a table whose columns are `columns` (every one but the label unless `features`)."""
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
    return names


def _not_numbers(name: str, source: str) -> DatasetError:
    return DatasetError(f"data.features: column {quote(name)} of {source} holds values that are not numbers; "
                        f"encode it or leave it out of data.features")


def read_csv(raw: bytes, source: str, label: str, features: list[str] | None, budget: ReadBudget
         ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """A CSV's features and class indices: rows counted against limits.dataset_records as they are read, each
    row's text against limits.record_bytes, and every field (its text and what it costs as a Python value)
    against the budget; labels mapped to classes as they come (:class:`_Classes`)."""
    try:
        reader = csv.reader(io.StringIO(raw.decode("utf-8-sig")))
        header = next(reader, None)
    except (UnicodeDecodeError, csv.Error) as err:
        raise DatasetError(f"data.source {source}: not a readable UTF-8 CSV ({err})") from None
    if not header:
        raise DatasetError(f"data.source {source}: empty; the first line names the columns")
    if len(set(header)) != len(header):
        raise DatasetError(f"data.source {source}: a column name appears twice in the header {quote(header)}")
    names = _feature_names(header, source, label, features)
    at = [header.index(n) for n in names]
    at_label = header.index(label)
    cols: list[list[float]] = [[] for _ in names]
    first_seen: list[int] = []
    classes = _Classes(source)
    per_row = RECORD_OVERHEAD * len(header)
    try:
        for n, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DatasetError(f"data.source {source}: line {n} has {len(row)} fields, the header {len(header)}")
            budget.count(len(first_seen) + 1, f"or more (line {n:,})")
            size = sum(len(v) for v in row)
            budget.text(size, f"line {n:,}")
            budget.spend(size + per_row, f"by line {n:,}")
            for values, i in zip(cols, at, strict=True):
                v = _number(row[i])
                if type(v) is str:
                    raise _not_numbers(header[i], source)
                values.append(v)
            y = _number(row[at_label])
            if type(y) is float and math.isnan(y):
                raise DatasetError(f"data.label: the label of row {len(first_seen)} of {source} (line {n:,}) is nan; "
                                   f"give every row a label (fill or drop missing values)")
            first_seen.append(classes.id(y))
    except csv.Error as err:
        raise DatasetError(f"data.source {source}: malformed CSV ({err})") from None
    rows = len(first_seen)
    budget.spend(rows * (4 * len(names) + 16), "as arrays of features and labels")
    x = np.empty((rows, len(names)), dtype=np.float32)
    for j, values in enumerate(cols):
        x[:, j] = values
        values.clear()
    labels, names_of = classes.done(np.asarray(first_seen, dtype=np.int64))
    return x, labels, names_of


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


# ---- Parquet --------------------------------------------------------------------------------------------------
def _arrow_kind(t: Any) -> str:
    """'number', 'text' or 'other' for a Parquet column's Arrow type (a dictionary's by its values)."""
    import pyarrow as pa

    t = t.value_type if pa.types.is_dictionary(t) else t
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "text"
    return "other"


def _value_bytes(t: Any) -> int:
    """Bytes one value of Arrow type `t` takes decoded (text: its dictionary index; its text is counted read)."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _value_bytes(t.index_type)
    if pa.types.is_boolean(t):
        return 1
    if pa.types.is_decimal(t):
        return t.byte_width + 8  # the float64 it is cast to as well
    return max(getattr(t, "bit_width", 32) // 8, 4) if _arrow_kind(t) == "number" else 4


def _label_fix(source: str, label: str, problem: str) -> DatasetError:
    return DatasetError(f"data.label: column {quote(label)} of {source} {problem}; a label column holds numbers or "
                        f"text with no missing values (fill or drop those rows, or name another column as "
                        f"data.label)")


def _missing_feature(name: str, source: str, row: int) -> DatasetError:
    return DatasetError(f"data.features: column {quote(name)} of {source} has no value in row {row:,}; features "
                        f"are numbers with no missing values (fill or drop those rows, or leave the column out of "
                        f"data.features)")


def read_parquet(raw: bytes, source: str, label: str, features: list[str] | None, budget: ReadBudget
             ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """A Parquet file's features and class indices: its columns' types checked and its declared rows (metadata)
    counted against limits.dataset_records and the budget before anything is decoded; then only the wanted
    columns read in batches, numbers straight into a preallocated float32 array, a text label kept
    dictionary-encoded and measured (each row's against limits.record_bytes, all of them against the budget)
    before its distinct values are decoded."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(io.BytesIO(raw)).metadata
        schema = meta.schema.to_arrow_schema()
        columns = list(schema.names)
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
        rows = max(meta.num_rows, sum(g.num_rows for g in groups))
        # the row groups' uncompressed column data (every column's: pyarrow 25's row_group(i).column(j) aborts the
        # process, uncatchable, on a damaged chunk's level histograms, where reading the chunk raises OSError)
        unpacked = sum(g.total_byte_size for g in groups)
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise DatasetError(f"data.source {source}: not a readable Parquet file ({quote(str(err))})") from None
    names = _feature_names(columns, source, label, features)
    for name in (*names, label):
        if columns.count(name) > 1:
            raise DatasetError(f"data.source {source}: column {quote(name)} appears {columns.count(name)} times")
    label_type = schema.field(label).type
    text = _arrow_kind(label_type) == "text"
    if _arrow_kind(label_type) == "other":
        raise _label_fix(source, label, f"is of type {quote(str(label_type))}")
    for name in names:
        t = schema.field(name).type
        if _arrow_kind(t) == "text":
            raise _not_numbers(name, source)
        if _arrow_kind(t) == "other":
            raise DatasetError(f"data.features: column {quote(name)} of {source} is of type {quote(str(t))}, not "
                               f"numbers; features are numbers (encode it or leave it out of data.features)")
    budget.count(rows, "declared by its metadata")
    budget.peek(unpacked, "with its column pages uncompressed, as its metadata declares them")
    per_row = sum(_value_bytes(schema.field(n).type) for n in names) + _value_bytes(label_type) + 4 * len(names) + 16
    budget.spend(rows * per_row, f"for the {rows:,} rows its metadata declares, decoded, before reading")
    x = np.empty((rows, len(names)), dtype=np.float32)
    if text:
        ids, classes = np.empty(rows, dtype=np.int64), _Classes(source)
    else:
        kind = label_type.value_type if pa.types.is_dictionary(label_type) else label_type
        ids = np.empty(rows, dtype=bool if pa.types.is_boolean(kind) else np.float64 if (
            pa.types.is_floating(kind) or pa.types.is_decimal(kind)) else
            np.uint64 if pa.types.is_unsigned_integer(kind) and kind.bit_width == 64 else np.int64)
    seen = 0
    try:
        reader = pq.ParquetFile(io.BytesIO(raw), metadata=meta, read_dictionary=[label] if text else None)
        size = max(1, min(_BATCH_ROWS, _BATCH_VALUES // (len(names) + 1)))
        for batch in reader.iter_batches(batch_size=size, columns=[*names, label], use_threads=False):
            n = batch.num_rows
            if seen + n > rows:
                raise DatasetError(f"data.source {source}: holds more rows than the {rows:,} its metadata declares; "
                                   f"the file is damaged")
            for j, name in enumerate(names):
                arr = _plain(batch.column(name))
                if arr.null_count:
                    raise _missing_feature(name, source, seen + _first_null(arr))
                x[seen: seen + n, j] = _numbers(arr, pa, pc)
            arr = batch.column(label)
            if text:
                ids[seen: seen + n] = _text_labels(arr, seen, source, label, budget, classes, pa, pc)
            else:
                arr = _plain(arr)
                if arr.null_count:
                    raise _label_fix(source, label, f"has no value in row {seen + _first_null(arr):,}")
                ids[seen: seen + n] = _numbers(arr, pa, pc)
            seen += n
    except DatasetError:
        raise
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise DatasetError(f"data.source {source}: not a readable Parquet file ({quote(str(err))})") from None
    x, ids = x[:seen], ids[:seen]
    if text:
        labels, names_of = classes.done(ids)
        return x, labels, names_of
    labels, names_of = unique_classes(ids, source, budget)
    return x, labels, names_of


def _plain(arr: Any) -> Any:
    """A numeric Arrow array with any dictionary encoding undone (one batch: bounded)."""
    import pyarrow as pa

    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _first_null(arr: Any) -> int:
    return int(np.flatnonzero(~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False)))[0])


def _numbers(arr: Any, pa: Any, pc: Any) -> np.ndarray:
    """A numeric Arrow array (no nulls) as numpy; decimals as float64."""
    if pa.types.is_decimal(arr.type):
        arr = pc.cast(arr, pa.float64())
    return arr.to_numpy(zero_copy_only=False)


def _text_labels(arr: Any, start: int, source: str, label: str, budget: ReadBudget, classes: _Classes, pa: Any,
                 pc: Any) -> np.ndarray:
    """First-seen class ids of one batch of a text label column, each row's text measured from its dictionary
    (against limits.record_bytes, and all of them against the budget) before a distinct value used is decoded."""
    if not pa.types.is_dictionary(arr.type):
        lengths = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        if len(lengths) and int(lengths.max()) > budget.lim.record_bytes:
            budget.text(int(lengths.max()), f"the label of row {start + int(lengths.argmax()):,}")
        budget.peek(int(lengths.sum()), f"by row {start + len(arr) - 1:,} (its labels as text)")
        arr = pc.dictionary_encode(arr)
    if arr.null_count:
        raise _label_fix(source, label, f"has no value in row {start + _first_null(arr):,}")
    words = arr.dictionary
    lengths = np.asarray(pc.binary_length(words).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    index = np.asarray(arr.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    used = np.unique(index)
    if len(used) and int(lengths[used].max()) > budget.lim.record_bytes:
        row = int(np.flatnonzero(index == used[int(lengths[used].argmax())])[0])
        budget.text(int(lengths[used].max()), f"the label of row {start + row:,}")
    budget.spend(int(lengths[index].sum()), f"by row {start + len(index) - 1:,} (its labels as text)")
    values = words.take(pa.array(used)).to_pylist()
    if any(v is None for v in values):
        row = int(np.flatnonzero(index == used[values.index(None)])[0])
        raise _label_fix(source, label, f"has no value in row {start + row:,}")
    local = np.zeros(len(words), dtype=np.int64)
    local[used] = [classes.id(v) for v in values]
    return local[index]


# ---- NPZ ------------------------------------------------------------------------------------------------------
def read_npz(raw: bytes, source: str, label: str, features: list[str] | None, budget: ReadBudget
         ) -> tuple[np.ndarray, np.ndarray]:
    """The feature and label arrays of an NPZ file: each a stored or deflated member (what np.savez and
    np.savez_compressed write), its header (dtype, shape) read and its declared bytes counted against the budget
    before its data is; object arrays (pickles) and dtypes other than numbers (labels: numbers or text) refused."""
    names = features or ["features"]
    if len(names) != 1:
        raise DatasetError("data.features: an NPZ file's features are one 2-D array; name that array alone")
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
        members = {n.removesuffix(".npy"): n for n in archive.namelist()}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, NotImplementedError,
            struct.error) as err:
        raise DatasetError(f"data.source {source}: not a readable NPZ file ({quote(str(err))})") from None
    out = []
    for field, name, kinds in (("data.features", names[0], _FEATURE_KINDS),
                               ("data.label", label, _FEATURE_KINDS + _TEXT_KINDS)):
        if name not in members:
            raise DatasetError(f"{field}: {quote(name)} is not an array of {source}; its arrays are "
                               f"{quote(sorted(members))}")
        out.append(_npy(archive, members[name], source, field, kinds, budget))
    return out[0], out[1]


def _npy(archive: zipfile.ZipFile, member: str, source: str, field: str, kinds: str, budget: ReadBudget) -> np.ndarray:
    where = f"data.source {source}: array {member}"
    info = archive.getinfo(member)
    if info.compress_type not in _NPZ_COMPRESSION:
        raise DatasetError(f"{where}: is compressed with method {info.compress_type} (zip's code); an NPZ file's "
                           f"arrays are stored or deflated, as np.savez and np.savez_compressed write them: save it "
                           f"with one of those")
    if info.flag_bits & 0x1:
        raise DatasetError(f"{where}: is encrypted; save the arrays with np.savez or np.savez_compressed")
    try:
        with archive.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise DatasetError(f"{where}: .npy format version {version} is not read; save it with numpy's "
                                   f"np.savez (format 1.0)")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)  # the header only: no data read yet
            if dtype.hasobject:
                raise DatasetError(f"{where}: holds Python objects (a pickle); save numbers, not objects")
            _check_dtype(dtype, where, field, kinds, budget)
            nbytes = math.prod(shape) * dtype.itemsize
            budget.spend(nbytes, f"for array {member} ({dtype.str} of shape {tuple(shape)}, as its header declares)")
            data = f.read(nbytes)  # the declared bytes, then a one-byte probe: never more
            more = f.read(1)
    except DatasetError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, RuntimeError, NotImplementedError, zlib.error,
            struct.error) as err:
        raise DatasetError(f"{where}: not a readable .npy array ({quote(str(err))})") from None
    if len(data) != nbytes:
        raise DatasetError(f"{where}: holds {len(data):,} bytes where its header declares {nbytes:,}")
    if more:
        raise DatasetError(f"{where}: holds more than the {nbytes:,} bytes its header declares")
    arr = np.frombuffer(data, dtype=dtype)
    return arr.reshape(shape, order="F" if fortran else "C")


def _check_dtype(dtype: np.dtype, where: str, field: str, kinds: str, budget: ReadBudget) -> None:
    """A DatasetError naming the array unless its dtype is one of `kinds` (features: numbers; labels: numbers or
    text of at most limits.record_bytes per value)."""
    if dtype.kind not in kinds or dtype.itemsize == 0 or dtype.names is not None or dtype.subdtype is not None:
        what = "numbers (bool, int, uint or float)" if kinds == _FEATURE_KINDS else \
            "numbers (bool, int, uint or float) or text (unicode or bytes)"
        raise DatasetError(f"{where}: dtype {quote(dtype.str)} is not read; {field} is an array of {what}: save it "
                           f"as such")
    if dtype.kind in _TEXT_KINDS:
        budget.text(dtype.itemsize, "one label of its text")
