"""Issue 49, prompt, preference and game sets: a file this run did not write is read within the limit table's
bounds. A Parquet file's row count is checked before it is read and its rows are decoded in batches whose bytes
are accounted against its size times ``limits.dataset_expansion``; a JSON Lines file (plain or gzip) is read one
bounded line at a time; a FIFO or folder is refused at once. Each attack runs in a subprocess that reports its
own time and peak RSS (``ru_maxrss``); a property test garbles valid sets and holds that the readers either load
them or raise DatasetError, never another exception."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agilerl_core.data.prompts import check_dataset_uri, load_text_records, make_arithmetic, write_jsonl
from agilerl_core.errors import DatasetError
from agilerl_core.language.games import describe_games, load_games, write_games
from agilerl_core.language.players import parse_mix, play_games
from agilerl_core.language.wordle import word_list

FIELDS = {"prompt": "prompt", "answer": "answer", "chosen": "chosen", "rejected": "rejected"}
MAX_RSS_MB = 500  # peak RSS of the whole attempt (importing agilerl_core alone is about 240 MB)
MAX_SECONDS = 10.0

# Runs one load in a fresh interpreter; prints one JSON line: the outcome, the message, seconds, peak RSS (MB)
# after the imports and after the attempt.
_ATTEMPT = """
import json, resource, sys, time
from agilerl_core.data.prompts import load_text_records
from agilerl_core.errors import DatasetError
rss = lambda: int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) / 1024
base = rss()
t = time.perf_counter()
try:
    r = load_text_records(sys.argv[1], json.loads(sys.argv[2]), ("prompt",))
    out = {"outcome": "loaded", "records": len(r)}
except DatasetError as err:
    out = {"outcome": "DatasetError", "message": str(err)}
except BaseException as err:
    out = {"outcome": type(err).__name__, "message": str(err)[:500]}
out.update(seconds=time.perf_counter() - t, base_mb=base, peak_mb=rss())
print(json.dumps(out))
"""


def _attempt(path: Path, timeout: float = 120) -> dict:
    proc = subprocess.run([sys.executable, "-c", _ATTEMPT, str(path), json.dumps(FIELDS)], capture_output=True,
                          text=True, timeout=timeout, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{path.name}: {got['outcome']} in {got['seconds']:.3f} s, peak RSS {got['peak_mb']:.0f} MB "
          f"({got['peak_mb'] - got['base_mb']:+.0f} MB over the imports)")
    return got


def _refused(got: dict, path: Path, limit: str) -> None:
    assert got["outcome"] == "DatasetError", got
    assert str(path) in got["message"] and f"limits.{limit}" in got["message"], got["message"]
    assert f"raise limits.{limit}" in got["message"], got["message"]
    assert got["seconds"] < MAX_SECONDS and got["peak_mb"] < MAX_RSS_MB, got


# ---- attack 1: a Parquet decompression bomb ------------------------------------------------------------------
def _parquet_bomb(path: Path, rows: int, prompt: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    zeros = pa.array(np.zeros(rows, np.int32))
    table = pa.table({"prompt": pa.DictionaryArray.from_arrays(zeros, pa.array([prompt])),
                      "answer": pa.DictionaryArray.from_arrays(zeros, pa.array(["2"]))})
    pq.write_table(table, path, compression="zstd")
    return path


@pytest.mark.parametrize(("rows", "prompt"), [
    (5_000_000, "q"),  # 5M one-letter rows: refused from the metadata's row count, before a row is decoded
    (200_000, "q" * 4000),  # fewer, wider rows: refused by the decoded bytes of the first batches
], ids=["many-rows", "wide-rows"])
def test_a_parquet_dictionary_bomb_is_refused_in_bounded_time_and_memory(tmp_path, rows, prompt):
    path = _parquet_bomb(tmp_path / "bomb.parquet", rows, prompt)
    assert path.stat().st_size < 100_000  # tens of KB that decode to gigabytes
    _refused(_attempt(path), path, "dataset_expansion")


def test_parquet_rows_are_counted_against_dataset_records_before_reading(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agilerl_core.limits import applied

    rows = make_arithmetic(30, 2, seed=1)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "s.parquet")
    with applied({"dataset_records": 20}), pytest.raises(DatasetError, match=r"30 records declared by its "
                                                                             r"metadata.*limits\.dataset_records"):
        load_text_records(str(tmp_path / "s.parquet"), FIELDS, ("prompt",))
    with applied({"record_bytes": 20}), pytest.raises(DatasetError, match=r"record 0 holds \d+ bytes of text.*"
                                                                          r"limits\.record_bytes"):
        load_text_records(str(tmp_path / "s.parquet"), FIELDS, ("prompt",))
    pq.write_table(pa.table({"prompt": pa.array([[1, 2]] * 3)}), tmp_path / "nested.parquet")
    with pytest.raises(DatasetError, match="column 'prompt' is of type 'list<"):
        load_text_records(str(tmp_path / "nested.parquet"), FIELDS, ("prompt",))


# ---- attack 2: one huge line in a small .jsonl.gz --------------------------------------------------------------
def _gzip_member(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # a gzip member; members concatenated are one gzip stream
    return z.compress(data) + z.flush()


def test_a_gzip_line_of_600_mb_is_refused_in_bounded_time_and_memory(tmp_path):
    path = tmp_path / "line.jsonl.gz"
    chunk = _gzip_member(b"a" * 10_000_000)
    path.write_bytes(_gzip_member(b'{"prompt": "') + chunk * 60 + _gzip_member(b'"}\n'))
    assert path.stat().st_size < 1_000_000
    _refused(_attempt(path), path, "record_bytes")


def test_a_gzip_of_many_short_lines_is_refused_by_its_expansion(tmp_path):
    path = tmp_path / "lines.jsonl.gz"
    chunk = _gzip_member(b'{"prompt": "q"}\n' * 1_000_000)  # 16 MB of records per ~31 KB member
    path.write_bytes(chunk * 2)  # 2M records, which would cost over 64 bytes of memory for each byte of the file
    _refused(_attempt(path), path, "dataset_expansion")


def test_jsonl_records_and_lines_are_bounded(tmp_path):
    from agilerl_core.limits import applied

    path = write_jsonl(tmp_path / "s.jsonl", make_arithmetic(30, 2, seed=1))
    with applied({"dataset_records": 20}), pytest.raises(DatasetError, match=r"line 21.*limits\.dataset_records"):
        load_text_records(str(path), FIELDS, ("prompt",))
    with applied({"record_bytes": 20}), pytest.raises(DatasetError, match=r"line 1 is longer.*limits\.record_bytes"):
        load_text_records(str(path), FIELDS, ("prompt",))


# ---- genuine small sets still load --------------------------------------------------------------------------
def test_genuine_jsonl_gzip_and_parquet_sets_load_alike(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = make_arithmetic(40, 2, seed=2, preferences=True)
    write_jsonl(tmp_path / "s.jsonl", rows)
    with gzip.open(tmp_path / "s.jsonl.gz", "wb") as g:
        g.write((tmp_path / "s.jsonl").read_bytes())
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "s.parquet", compression="zstd")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet", use_dictionary=True, compression="snappy")
    got = [load_text_records(str(tmp_path / n), FIELDS, ("prompt", "chosen"))
           for n in ("s.jsonl", "s.jsonl.gz", "s.parquet", "d.parquet")]
    for r in got:
        assert r.prompts == [x["prompt"] for x in rows] and r.answers == [x["answer"] for x in rows]
        assert r.chosen == [x["chosen"] for x in rows] and r.rejected == [x["rejected"] for x in rows]
    no_answers = load_text_records(str(tmp_path / "s.parquet"), {**FIELDS, "answer": "missing"}, ("prompt",))
    assert no_answers.answers is None


# ---- a FIFO or a folder at the dataset path ------------------------------------------------------------------
_FIFO = """
import sys
from agilerl_core.data.prompts import load_text_records
from agilerl_core.errors import DatasetError
from agilerl_core.language.games import read_games
from pathlib import Path
fields = {"prompt": "prompt", "answer": "answer", "chosen": "chosen", "rejected": "rejected"}
for name, call in [("prompts", lambda: load_text_records(sys.argv[1], fields, ("prompt",))),
                   ("games", lambda: read_games(Path(sys.argv[1]), sys.argv[1]))]:
    try:
        call()
        print(name, "loaded")
    except DatasetError as err:
        print(name, "DatasetError", err)
"""


def test_a_fifo_or_folder_at_the_dataset_path_is_refused_at_once(tmp_path):
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-c", _FIFO, str(fifo)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])  # a reader that waited on it would hang here
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 2, proc.stderr[-2000:]
    assert all("DatasetError" in line and str(fifo) in line and "FIFO" in line for line in lines), lines
    with pytest.raises(DatasetError, match=r"is a FIFO \(named pipe\), not a regular file"):
        check_dataset_uri(str(fifo))
    folder = tmp_path / "set.jsonl"
    folder.mkdir()
    with pytest.raises(DatasetError, match=r"is a folder, not a regular file"):
        check_dataset_uri(str(folder))
    with pytest.raises(DatasetError, match="no such file.*make-arithmetic"):
        check_dataset_uri(str(tmp_path / "absent.jsonl"))


# ---- property: garbled prompt and game sets load or raise DatasetError ----------------------------------------
def _mutate(data: bytes, kind: int, at: float, length: int, junk: bytes) -> bytes:
    """One of several garblings of `data` at relative position `at`."""
    i = min(int(at * len(data)), len(data))
    lines = data.split(b"\n")
    k = min(int(at * len(lines)), len(lines) - 1)
    if kind == 0:  # cut the file short
        return data[:i]
    if kind == 1:  # drop a run of bytes
        return data[:i] + data[i + length:]
    if kind == 2:  # insert bytes
        return data[:i] + junk + data[i:]
    if kind == 3:  # overwrite bytes
        return data[:i] + junk + data[i + len(junk):]
    if kind == 4:  # replace one line
        lines[k] = junk
        return b"\n".join(lines)
    if kind == 5:  # repeat one line
        lines.insert(k, lines[k])
        return b"\n".join(lines)
    if kind == 6:  # swap two lines
        j = min(int((1 - at) * len(lines)), len(lines) - 1)
        lines[k], lines[j] = lines[j], lines[k]
        return b"\n".join(lines)
    # flip one bit
    if not data:
        return data
    i = min(i, len(data) - 1)
    return data[:i] + bytes([data[i] ^ (1 << (length % 8))]) + data[i + 1:]


_JUNK = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"{}", b"[]", b"null", b'{"prompt": null}', b'{"prompt": [1, 2]}', b'{"prompt": {"a": 1}}',
                     b'{"prompt": 1e999}', b'{"prompt": NaN}', b'{"prompt": "x", "prompt": "y"}', b"[" * 100,
                     b'{"prompt": "\\ud800"}', b'"\xff\xfe"', b'{"prompt": 123456789012345678901234567890}',
                     b'{"secret": "crane"}', b'{"wordle_games": 1, "description": {}}', b"\r\n\r", b"\x00"]),
    st.text(max_size=20).map(lambda t: json.dumps({"prompt": t, "answer": t}).encode()),
)
_MUTATION = (st.integers(0, 7), st.floats(0, 1), st.integers(0, 64), _JUNK)


@pytest.fixture(scope="module")
def prompt_set_bytes() -> bytes:
    rows = make_arithmetic(8, 2, seed=4, preferences=True)
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_garbled_prompt_sets_load_or_raise_dataset_error(prompt_set_bytes, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"set{suffix}"

        @settings(max_examples=150, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(*_MUTATION, st.booleans())
        def check(kind, at, length, junk, after_gzip):
            data = _mutate(prompt_set_bytes, kind, at, length, junk)
            if suffix.endswith(".gz"):
                data = _mutate(gzip.compress(prompt_set_bytes), kind, at, length, junk) if after_gzip else \
                    gzip.compress(data)
            path.write_bytes(data)
            try:
                got = load_text_records(str(path), FIELDS, ("prompt",))
            except DatasetError as err:
                assert str(path) in str(err)
                return
            assert len(got.prompts) >= 1 and all(isinstance(p, str) for p in got.prompts)

        check()


def test_garbled_parquet_prompt_sets_load_or_raise_dataset_error():
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "set.parquet"
        pq.write_table(pa.Table.from_pylist(make_arithmetic(8, 2, seed=4)), path)
        good = path.read_bytes()

        @settings(max_examples=100, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.sampled_from([0, 1, 3, 7]), st.floats(0, 1), st.integers(0, 64), st.binary(min_size=1, max_size=8))
        def check(kind, at, length, junk):
            path.write_bytes(_mutate(good, kind, at, length, junk))
            try:
                load_text_records(str(path), FIELDS, ("prompt",))
            except DatasetError as err:
                assert str(path) in str(err)

        check()


@pytest.fixture(scope="module")
def games_bytes(tmp_path_factory) -> bytes:
    words = word_list(60)
    records = play_games(parse_mix("random:0.3,solver:0.7", words), words.train, words, 6, 0)
    path = write_games(tmp_path_factory.mktemp("games") / "games.jsonl", records,
                       describe_games(words, 60, 0.2, 6, 0, "random:0.3,solver:0.7", records))
    assert load_games(str(path)).games == records
    return path.read_bytes()


def test_garbled_game_sets_load_or_raise_dataset_error(games_bytes):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "games.jsonl"

        @settings(max_examples=150, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(*_MUTATION)
        def check(kind, at, length, junk):
            path.write_bytes(_mutate(games_bytes, kind, at, length, junk))
            try:
                got = load_games(str(path))
            except DatasetError as err:
                assert str(path) in str(err)
                return
            assert len(got.games) == got.description["games"]

        check()
