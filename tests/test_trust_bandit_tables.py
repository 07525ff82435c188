"""Issue 66, items 1-7, the bandit table reader (``load_table``): a CSV, Parquet or NPZ file this run did not write
is read within the limit table's bounds. Everything it becomes in memory is counted against its size times
``limits.dataset_expansion`` before it is allocated (1: an NPZ header declaring 80 MB in a 300-byte file; 6: a
Parquet file of millions of constant rows, or one 1 MiB label repeated); an NPZ member is stored or deflated (2: a
bzip2 or LZMA member is refused before it inflates) and read to its declared bytes only; its dtype is numbers (3);
labels become classes without a fixed-width array of every label (4: one 131,000-character label among 8,000
rows), their distinct values against ``limits.bandit_arms`` (5: 30,000 labels, and the value network's input width
against ``limits.space_elements`` / ``network_params``); a Parquet column of a nested type or with a missing value
is refused naming it (7). Each attack runs in a subprocess that reports its time and peak RSS (VmHWM, reset per
file); a property test garbles valid tables and holds that the reader loads them or raises DatasetError."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agilerl_core import limits
from agilerl_core.data.tables import load_table, write_table
from agilerl_core.errors import ConfigError, DatasetError

MAX_RSS_MB = 500  # peak RSS of the whole attempt (importing agilerl_core alone is about 240 MB)
MAX_SECONDS = 10.0

# Runs each job (a table, or a kind: bandit config built with build_evolution) in this fresh interpreter, its peak
# RSS reset before each (/proc/self/clear_refs); prints one JSON line per job: outcome, message, seconds, peak MB.
_ATTEMPT = """
import json, sys, time
from agilerl_core import limits
from agilerl_core.data.tables import load_table
from agilerl_core.errors import ConfigError, DatasetError
from agilerl_core.experiment import build_evolution
from tasks.config import validate_config
rss = lambda key: int([l for l in open('/proc/self/status') if l.startswith(key)][0].split()[1]) / 1024
for job in json.loads(sys.argv[1]):
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        pass
    base = rss('VmRSS')
    t = time.perf_counter()
    try:
        if 'config' in job:
            build_evolution(validate_config(job['config']))
            out = {'outcome': 'built'}
        else:
            with limits.applied(job.get('limits')):
                table = load_table(job['path'])
            out = {'outcome': 'loaded', 'rows': len(table.labels), 'classes': len(table.classes)}
    except (DatasetError, ConfigError) as err:
        out = {'outcome': type(err).__name__, 'message': str(err)}
    except BaseException as err:
        out = {'outcome': type(err).__name__, 'message': str(err)[:500]}
    out.update(seconds=time.perf_counter() - t, base_mb=base, peak_mb=rss('VmHWM'))
    print(json.dumps(out), flush=True)
"""


def _attempt(*jobs: dict, timeout: float = 180) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", _ATTEMPT, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert len(got) == len(jobs), proc.stderr[-2000:]
    for job, g in zip(jobs, got, strict=True):
        name = Path(job.get("path") or job["config"]["data"]["source"]).name
        print(f"{name}: {g['outcome']} in {g['seconds']:.3f} s, peak RSS {g['peak_mb']:.0f} MB "
              f"({g['peak_mb'] - g['base_mb']:+.0f} MB over the imports)")
    return got


def _bounded(got: dict) -> None:
    assert got["seconds"] < MAX_SECONDS and got["peak_mb"] < MAX_RSS_MB, got


def _refused(got: dict, path: Path, limit: str | None, error: str = "DatasetError") -> None:
    assert got["outcome"] == error, got
    assert str(path) in got["message"], got["message"]
    if limit is not None:
        assert f"limits.{limit}" in got["message"] and f"raise limits.{limit}" in got["message"], got["message"]
    _bounded(got)


def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    out = io.BytesIO()  # numpy 2 writes the magic string with the header
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": False, "shape": shape})
    return out.getvalue()


def _npz(path: Path, features: bytes, compression: int = zipfile.ZIP_DEFLATED, label: bytes | None = None) -> Path:
    """An NPZ of member ``features.npy`` (header and data as given) and a small genuine ``label.npy``."""
    if label is None:
        buf = io.BytesIO()
        np.save(buf, np.array([0, 1]))
        label = buf.getvalue()
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("features.npy", features)
        z.writestr("label.npy", label, compress_type=zipfile.ZIP_STORED)
    return path


# ---- 1: an NPZ header that declares far more than its file holds -----------------------------------------------
@pytest.mark.parametrize("rows", [5_000_000, 200_000_000])
def test_an_npz_header_declaring_far_more_than_its_file_is_refused_by_the_expansion_budget(tmp_path, rows):
    """80 MB (or 3.2 GB) of float32 declared in a few hundred bytes: refused from the header, before its data is
    read or allocated (the file's size times limits.dataset_expansion)."""
    path = _npz(tmp_path / "declares.npz", _npy_header("<f4", (rows, 4)) + b"\0" * 64)
    assert path.stat().st_size < 1_000
    got, = _attempt({"path": str(path)})
    _refused(got, path, "dataset_expansion")
    assert f"for array features.npy (<f4 of shape ({rows}, 4), as its header declares)" in got["message"]


# ---- 2: bzip2 / LZMA members inflate whole on the first read ----------------------------------------------------
@pytest.fixture(scope="module")
def zeros_64mib() -> bytes:
    return b"\0" * (64 * 2**20)


@pytest.mark.parametrize("compression", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA, zipfile.ZIP_DEFLATED],
                         ids=["bzip2", "lzma", "deflate"])
def test_an_npz_member_with_megabytes_past_its_header_is_refused_without_inflating_them(tmp_path, compression,
                                                                                         zeros_64mib):
    """A member whose header declares 32 bytes followed by 64 MiB of zeros: a bzip2 or LZMA member (which zipfile
    inflates whole on the first read) is refused by its compression before a byte is read; a deflated one after
    reading the 32 declared bytes and a one-byte probe. Memory hardly grows either way."""
    path = _npz(tmp_path / "trailing.npz", _npy_header("<f4", (8,)) + zeros_64mib, compression)
    assert path.stat().st_size < 200_000
    got, = _attempt({"path": str(path)})
    _refused(got, path, None)
    want = "holds more than the 32 bytes its header declares" if compression == zipfile.ZIP_DEFLATED else \
        "np.savez and np.savez_compressed"
    assert "features.npy" in got["message"] and want in got["message"], got["message"]
    assert got["peak_mb"] - got["base_mb"] < 30, got  # the 64 MiB never came into memory


# ---- 3: an NPZ array whose dtype is not numbers -----------------------------------------------------------------
def test_an_npz_array_of_a_non_numeric_dtype_is_refused_naming_the_array(tmp_path):
    path = _npz(tmp_path / "s0.npz", _npy_header("|S0", (4, 2)))  # itemsize 0: a raw ValueError before
    got, = _attempt({"path": str(path)})
    _refused(got, path, None)
    assert "array features.npy: dtype '|S0' is not read; data.features is an array of numbers" in got["message"]
    cases = {"complex": np.ones((2, 2), np.complex64), "text": np.array([["a"], ["b"]]),
             "datetime": np.array([[1], [2]], "datetime64[s]"), "void": np.zeros((2, 2), "V4")}
    for name, features in cases.items():
        np.savez(tmp_path / f"{name}.npz", features=features, label=np.array([0, 1]))
        with pytest.raises(DatasetError, match=r"array features\.npy: dtype .* is not read; data\.features is an "
                                               r"array of numbers"):
            load_table(str(tmp_path / f"{name}.npz"))
    np.savez(tmp_path / "label.npz", features=np.ones((2, 2)), label=np.ones(2, np.complex128))
    with pytest.raises(DatasetError, match=r"array label\.npy: dtype '<c16' is not read; data\.label .* or text"):
        load_table(str(tmp_path / "label.npz"))
    _npz(tmp_path / "u0.npz", _npy_header("<f4", (2, 1)) + b"\0" * 8, label=_npy_header("<U0", (2,)))
    with pytest.raises(DatasetError, match=r"array label\.npy: dtype '<U0' is not read"):
        load_table(str(tmp_path / "u0.npz"))
    np.savez(tmp_path / "wide.npz", features=np.ones((2, 1)), label=np.array(["a" * 300, "b"]))
    with limits.applied({"record_bytes": 1000}), pytest.raises(DatasetError, match=r"raise limits\.record_bytes"):
        load_table(str(tmp_path / "wide.npz"))  # 300 characters of UTF-32: 1,200 bytes a label


# ---- 4: one wide label among many rows --------------------------------------------------------------------------
def _wide_label_csv(path: Path, rows: int, width: int = 131_000) -> Path:
    lines = ["a,b,label"] + [f"{i % 7},{i % 3},{i % 2}" for i in range(rows - 1)] + [f"1,2,{'x' * width}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_csv_label_of_131000_characters_costs_its_own_bytes_not_every_rows(tmp_path):
    """numpy made every row's label as wide as the widest ('<U131000': 3.9 GiB for 8,000 rows of a 163 KB file);
    the labels become classes through a dict of distinct values, each row's bytes counted against the budget and
    each line's against limits.record_bytes (lowered here to refuse it)."""
    small, large = _wide_label_csv(tmp_path / "w500.csv", 500), _wide_label_csv(tmp_path / "w8000.csv", 8_000)
    assert large.stat().st_size < 200_000
    for got in _attempt({"path": str(small)}, {"path": str(large)}):
        assert got["outcome"] == "loaded" and got["classes"] == 3, got
        _bounded(got)
    got, = _attempt({"path": str(large), "limits": {"record_bytes": 100_000}})
    _refused(got, large, "record_bytes")
    assert "line 8,001 holds 131,002 bytes" in got["message"], got["message"]
    table = load_table(str(small))
    assert table.classes == ("0.0", "1.0", "x" * 131_000) and table.labels[-1] == 2


# ---- 5: thousands of classes, and the value network's input width -----------------------------------------------
def _bandit(source: str, **over) -> dict:
    cfg = {"kind": "bandit", "name": "arms", "algorithm": "neural_ucb", "data": {"source": source},
           "population_size": 2, "num_envs": 4, "evo_steps": 100, "max_env_steps": 200,
           "hyperparameters": {"batch_size": 8, "learning_delay": 8}, "network": {"hidden_sizes": [8], "min_nodes": 2}}
    cfg.update(over)
    return cfg


def test_a_table_of_30000_classes_is_refused_before_any_arm_is_built(tmp_path):
    """30,000 distinct labels (319 KB): torch.eye(arms) alone asked for 3.6 GB; limits.bandit_arms refuses the
    table as it is read, through kind: bandit's build_evolution."""
    path = tmp_path / "arms.csv"
    path.write_text("a,label\n" + "".join(f"{i % 5},arm{i}\n" for i in range(30_000)))
    assert path.stat().st_size < 400_000
    got, = _attempt({"config": _bandit(str(path))})
    _refused(got, path, "bandit_arms")
    assert got["message"].startswith(f"data.source {path}: 1,025 distinct labels or more"), got["message"]
    with limits.applied({"bandit_arms": 40_000}):
        assert load_table(str(path)).arms == 30_000  # a limit raised in one's own config lets it through


def _classes_csv(path: Path, arms: int, features: int) -> Path:
    rng = np.random.default_rng(0)
    return write_table(path, rng.standard_normal((2 * arms, features)), np.arange(2 * arms) % arms)


@pytest.mark.parametrize("layout, over, limit", [
    ("block", {"space_elements": 1_000}, "space_elements"),  # 40 arms x 30 features = 1,200 inputs
    ("one_hot", {"network_params": 500}, "network_params"),  # (30 + 40) x 8 + 8 + 8 + 1 = 577 parameters
])
def test_the_value_networks_input_width_is_checked_before_anything_is_built(tmp_path, layout, over, limit):
    from agilerl_core.experiment import build_evolution
    from tasks.config import validate_config

    path = _classes_csv(tmp_path / "t.csv", 40, 30)
    cfg = validate_config(_bandit(str(path), hyperparameters={"arm_features": layout}, limits=over))
    with pytest.raises(ConfigError, match=rf"^hyperparameters\.arm_features: {layout} for data\.source {path}.*"
                                          rf"over the limit limits\.{limit}.*raise limits\.{limit}"):
        build_evolution(cfg)
    build_evolution(validate_config(_bandit(str(path), hyperparameters={"arm_features": layout})))


class ManyArms(gym.Env):
    """A bandit env of one's own with 5,000 arms."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(5_000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_an_env_bandit_of_more_arms_than_the_limit_is_refused_naming_it():
    from agilerl_core.experiment import build_evolution
    from tasks.config import validate_config

    cfg = validate_config(_bandit("", data=None, env_id="ManyArms-v0", eval_max_steps=10,
                                  env_entry_point="tests.test_trust_bandit_tables:ManyArms"))
    with pytest.raises(ConfigError, match=r"^env_id ManyArms-v0: arms .* 5,000 is over the limit "
                                          r"limits\.bandit_arms = 1,024"):
        build_evolution(cfg)


# ---- 6: Parquet files that decode to gigabytes ------------------------------------------------------------------
def _constant_parquet(path: Path, rows: int, columns: int = 20) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk = min(rows, 1_000_000)
    part = pa.table({f"c{j}": pa.array(np.zeros(chunk, np.int64)) for j in range(columns - 1)} |
                    {"label": pa.array(np.arange(chunk) % 2)})
    with pq.ParquetWriter(path, part.schema, compression="zstd") as w:
        for _ in range(rows // chunk):
            w.write_table(part)
    return path


def _wide_label_parquet(path: Path, rows: int, noise: bool = False, width: int = 2**20) -> Path:
    """`rows` rows whose labels alternate between a 1 MiB string and "b" (dictionary-encoded: stored once); one
    feature of zeros, or of random float64 (`noise`: a file large enough that its pages pass the budget)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    label = pa.DictionaryArray.from_arrays(pa.array(np.arange(rows) % 2, pa.int32()), pa.array(["a" * width, "b"]))
    f = np.random.default_rng(0).standard_normal(rows) if noise else np.zeros(rows, np.float32)
    pq.write_table(pa.table({"f": f, "label": label}), path, compression="zstd")
    return path


def test_parquet_files_that_decode_to_gigabytes_are_refused_before_they_are_decoded(tmp_path):
    """2M and 9M rows of 20 constant int64 columns (hundreds of KB; 1.28 GB and a failed malloc before), and a
    dictionary-encoded 1 MiB label on 2,000 rows (a 7.81 GiB MemoryError before): refused from the metadata's row
    count, or the label's measured bytes, against the file's size times limits.dataset_expansion."""
    paths = [_constant_parquet(tmp_path / "rows2m.parquet", 2_000_000),
             _constant_parquet(tmp_path / "rows9m.parquet", 9_000_000),
             _wide_label_parquet(tmp_path / "label.parquet", 2_000),
             _wide_label_parquet(tmp_path / "noise.parquet", 150_000, noise=True)]
    assert all(p.stat().st_size < 1_000_000 for p in paths[:3])
    got = _attempt(*({"path": str(p)} for p in paths))
    for g, p in zip(got, paths, strict=True):
        _refused(g, p, "dataset_expansion")
    assert all("rows its metadata declares" in g["message"] for g in got[:2]), got
    assert "with its column pages uncompressed" in got[2]["message"], got[2]["message"]  # the 1 MiB page itself
    assert "(its labels as text)" in got[3]["message"], got[3]["message"]  # measured, not decoded, row by row
    with limits.applied({"dataset_expansion": 10**7}):
        table = load_table(str(_wide_label_parquet(tmp_path / "ok.parquet", 8)))  # a limit raised: it loads
    assert table.classes == ("a" * 2**20, "b") and table.labels.tolist() == [0, 1] * 4


# ---- 7: nested or missing Parquet values ------------------------------------------------------------------------
def _parquet_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = pa.array([1.0, 2.0, 3.0])
    cases = {
        "label list": ({"f": f, "label": pa.array([[1], [2], [3]])}, r"data\.label: column 'label' of .* is of type "
                                                                    r"'list<"),
        "label struct": ({"f": f, "label": pa.array([{"a": 1}, {"a": 2}, {"a": 1}])},
                         r"data\.label: column 'label' of .* is of type 'struct<"),
        "label null": ({"f": f, "label": pa.array(["x", None, "y"])}, r"data\.label: column 'label' of .* has no "
                                                                      r"value in row 1; a label column holds numbers "
                                                                      r"or text with no missing values"),
        "label number null": ({"f": f, "label": pa.array([1, 2, None])}, r"column 'label' .* no value in row 2"),
        "feature list": ({"f": pa.array([[1.0], [2.0], [3.0]]), "label": pa.array([0, 1, 0])},
                         r"data\.features: column 'f' of .* is of type 'list<.*features are numbers"),
        "feature null": ({"f": pa.array([1.0, None, 3.0]), "label": pa.array([0, 1, 0])},
                         r"data\.features: column 'f' of .* has no value in row 1"),
        "feature text": ({"f": pa.array(["1", "2", "3"]), "label": pa.array([0, 1, 0])},
                         r"data\.features: column 'f' of .* holds values that are not numbers"),
    }
    out = {}
    for i, (name, (columns, match)) in enumerate(cases.items()):
        path = tmp_path / f"case{i}.parquet"
        pq.write_table(pa.table(columns), path)
        out[name] = (path, match)
    return out


def test_a_nested_or_missing_parquet_value_is_refused_naming_the_column(tmp_path):
    cases = _parquet_cases(tmp_path)
    for path, match in cases.values():
        with pytest.raises(DatasetError, match=match):
            load_table(str(path))
    got = _attempt(*({"path": str(p)} for p, _ in cases.values()))
    for g, (p, _) in zip(got, cases.values(), strict=True):
        _refused(g, p, None)


# ---- genuine tables load as before ------------------------------------------------------------------------------
def test_genuine_tables_load_with_their_classes_in_sorted_order(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.array([2, 0, 2, 1, 1, 0])
    np.savez(tmp_path / "a.npz", features=x, label=y)
    np.savez_compressed(tmp_path / "b.npz", features=x.astype(np.float64), label=np.array(list("cacbba")))
    write_table(tmp_path / "c.csv", x, y)
    (tmp_path / "d.csv").write_text("a,b,label\n" + "".join(f"{r[0]},{r[1]},{v}\n" for r, v in
                                                         zip(x.tolist(), ["dog", "1.5", "dog", "cat", "cat", "1.5"],
                                                             strict=True)))
    pq.write_table(pa.table({"a": x[:, 0].astype(np.int64), "b": x[:, 1], "label": pa.array(
        ["c", "a", "c", "b", "b", "a"]).dictionary_encode()}), tmp_path / "e.parquet")
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1], "label": pa.array([1, 0.25, 1, 0.5, 0.5, 0.25],
                                                                           pa.float32())}), tmp_path / "f.parquet")
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1], "label": [True, False, True, False, True, False]}),
                   tmp_path / "g.parquet")
    want = {"a.npz": ("0", "1", "2"), "b.npz": ("a", "b", "c"), "c.csv": ("0.0", "1.0", "2.0"),
            "d.csv": ("1.5", "cat", "dog"), "e.parquet": ("a", "b", "c"), "f.parquet": ("0.25", "0.5", "1.0"),
            "g.parquet": ("False", "True")}
    for name, classes in want.items():
        t = load_table(str(tmp_path / name))
        assert np.array_equal(t.features, x) and t.features.dtype == np.float32, name
        assert t.classes == classes, (name, t.classes)
        assert t.labels.dtype == np.int64 and t.labels.tolist() == (
            [1, 0, 1, 0, 1, 0] if name == "g.parquet" else [2, 0, 2, 1, 1, 0]), name
    iris = load_table("sklearn:iris")
    assert iris.features.shape == (150, 4) and iris.classes == ("0", "1", "2") and iris.labels[-1] == 2


# ---- property: garbled tables load or raise DatasetError --------------------------------------------------------
def _mutate(data: bytes, kind: int, at: float, length: int, junk: bytes) -> bytes:
    i = min(int(at * len(data)), len(data))
    if kind == 0:  # cut short
        return data[:i]
    if kind == 1:  # drop a run of bytes
        return data[:i] + data[i + length:]
    if kind == 2:  # insert bytes
        return data[:i] + junk + data[i:]
    if kind == 3:  # overwrite bytes
        return data[:i] + junk + data[i + len(junk):]
    if not data:
        return data
    i = min(i, len(data) - 1)  # flip one bit
    return data[:i] + bytes([data[i] ^ (1 << (length % 8))]) + data[i + 1:]


def _good_tables(tmp: Path) -> dict[str, bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 9, (12, 3)).astype(np.float32), rng.integers(0, 3, 12)
    write_table(tmp / "t.csv", x, y)
    np.savez(tmp / "t.npz", features=x, label=y)
    np.savez_compressed(tmp / "c.npz", features=x, label=np.array(list("abcabcabcabc")))
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1], "label": [str(v) for v in y]}), tmp / "t.parquet")
    return {name: (tmp / name).read_bytes() for name in ("t.csv", "t.npz", "c.npz", "t.parquet")}


@pytest.mark.parametrize("name", ["t.csv", "t.npz", "c.npz", "t.parquet"])
def test_garbled_tables_load_or_raise_dataset_error(name):
    with tempfile.TemporaryDirectory() as tmp:
        good = _good_tables(Path(tmp))[name]
        path = Path(tmp) / f"garbled.{name.rsplit('.', 1)[1]}"

        @settings(max_examples=120, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.integers(0, 4), st.floats(0, 1), st.integers(0, 64), st.binary(min_size=1, max_size=12))
        def check(kind, at, length, junk):
            path.write_bytes(_mutate(good, kind, at, length, junk))
            try:
                t = load_table(str(path))
            except DatasetError as err:
                assert str(path) in str(err) or str(err).startswith("data."), str(err)
                return
            assert t.features.dtype == np.float32 and bool(np.isfinite(t.features).all())
            assert t.labels.min() >= 0 and t.labels.max() < t.arms and len(t.labels) == len(t.features)

        check()


def test_bzip2_of_a_genuine_npz_is_refused_naming_the_fix(tmp_path):
    """A genuine array in a bzip2 member: refused (not inflated), naming what to save it with."""
    buf = io.BytesIO()
    np.save(buf, np.ones((3, 2), np.float32))
    path = _npz(tmp_path / "bz.npz", buf.getvalue(), zipfile.ZIP_BZIP2)
    with pytest.raises(DatasetError, match=r"features\.npy: is compressed with method 12 .* np\.savez"):
        load_table(str(path))
