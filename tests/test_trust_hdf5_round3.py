"""Issue 49 (trust, third round) for HDF5 and Minari datasets: one stored array hard-linked from many keys is
refused and all arrays of a file together expand at most limits.dataset_expansion times the file's size (case 2);
a FIFO where a dataset file or its metadata should be is refused at once, never waited on (case 3); file
attributes are read as plain JSON data or refused naming the attribute (case 7); float64 observations and actions
beyond float32's range are refused naming the key and row (case 9)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agilerl_core.data.hdf5 import read_hdf5
from agilerl_core.data.loader import load_dataset
from agilerl_core.data.minari_format import read_minari
from agilerl_core.errors import DatasetError

ROOT = Path(__file__).resolve().parents[1]
N = 5
RSS_MB, WALL_S = 500, 10.0

# the attempt runs in a fresh interpreter: its wall time and peak RSS (imports included) are its own
_PROBE = r"""
import contextlib, io, json, resource, sys, time
t0 = time.perf_counter()
argv = json.loads(sys.argv[1])
err = io.StringIO()
if argv[0] == "cli":
    from flows.cli import main
    with contextlib.redirect_stderr(err):
        rc = main(argv[1:])
else:  # a reader called directly: read_hdf5 / read_minari / a run's build
    from agilerl_core.errors import AgileRLError
    rc = 0
    try:
        if argv[0] == "read_hdf5":
            from agilerl_core.data.hdf5 import read_hdf5
            read_hdf5(argv[1])
        elif argv[0] == "read_minari":
            from agilerl_core.data.minari_format import read_minari
            read_minari(argv[1])
        else:
            from agilerl_core.experiment import build_evolution
            from tests.conftest import tiny_config
            build_evolution(tiny_config(kind="offline", algorithm="cqn", **{"dataset.uri": argv[1]}))
    except AgileRLError as e:
        rc, _ = 1, err.write(f"{type(e).__name__}: {e}")
print(json.dumps({"rc": rc, "err": err.getvalue(), "wall": time.perf_counter() - t0,
                  "rss_mb": int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) / 1024}))
"""


def _probe(*argv: str, timeout: float = 60) -> dict:
    """Run one attempt in a subprocess (killed after `timeout`: a hang fails the test, it does not hang it)."""
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(argv))], cwd=ROOT, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} still running after {timeout} s (blocked)")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"{argv[0]} {Path(argv[-1]).name}: {out['wall']:.2f} s, peak RSS {out['rss_mb']:.0f} MB")
    assert "Traceback" not in p.stderr and "unexpected" not in out["err"], (p.stderr[-2000:], out["err"])
    return out


def _bounded(out: dict, *patterns: str) -> str:
    """The attempt was refused (nonzero rc) in bounded time and memory, its message holding every pattern."""
    assert out["rc"] != 0, out
    for p in patterns:
        assert p in out["err"], (p, out["err"])
    assert out["wall"] < WALL_S and out["rss_mb"] < RSS_MB, out
    return out["err"]


def _flat(path: Path, **over) -> Path:
    """A small valid flat HDF5 dataset at `path`; `over` replaces (or, with None, drops) keys."""
    arrays = {"observations": np.zeros((N, 4), np.float32), "actions": np.zeros(N, np.int64),
              "rewards": np.ones(N, np.float32), "terminals": np.array([0] * (N - 1) + [1], bool)}
    arrays.update(over)
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            if v is not None:
                f[k] = v
    return path


def _minari_meta(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "data" / "metadata.json").write_text(json.dumps(
        {"data_format": "hdf5", "dataset_id": "x/y-v0", "env_spec": json.dumps({"id": "CartPole-v1"})}))
    return root / "data" / "main_data.hdf5"


def _episode(g, t: int, compress: bool = False, obs=None, actions=None) -> None:
    kw = {"compression": "gzip", "chunks": True} if compress else {}
    g.create_dataset("observations", data=np.zeros((t + 1, 4), np.float32) if obs is None else obs, **kw)
    g.create_dataset("actions", data=np.zeros(t, np.int64) if actions is None else actions, **kw)
    g.create_dataset("rewards", data=np.ones(t, np.float32), **kw)
    g.create_dataset("terminations", data=np.r_[np.zeros(t - 1, bool), [True]], **kw)
    g.create_dataset("truncations", data=np.zeros(t, bool), **kw)


# ---- case 2: one dataset hard-linked from many episodes ------------------------------------------------------------
def _hardlinked_minari(root: Path, episodes: int = 30, t: int = 1_000_000) -> Path:
    """The issue's attack: episode_0's compressed arrays, hard-linked by 29 more episodes (30M transitions)."""
    data = _minari_meta(root)
    with h5py.File(data, "w") as f:
        g = f.create_group("episode_0")
        _episode(g, t, compress=True)
        for i in range(1, episodes):
            h = f.create_group(f"episode_{i}")
            for k in g:
                h[k] = g[k]  # a hard link: the same stored array under another key
    return data


def test_a_dataset_hard_linked_from_many_episodes_is_refused_in_bounded_time_and_memory(tmp_path):
    data = _hardlinked_minari(tmp_path / "hl")
    assert data.stat().st_size < 400_000  # ~190 KB that h5py alone reads as 30M transitions, 4.6 GB
    with h5py.File(data, "r") as f:
        assert f["episode_7/observations"].shape == (1_000_001, 4)
    out = _probe("cli", "dataset", "info", str(tmp_path / "hl"), "--format", "minari")
    msg = _bounded(out, f"dataset {data}", "links a dataset already linked elsewhere in the file",
                   "self-contained copy")
    assert re.search(r"key 'episode_\d+/\w+' links a dataset already linked elsewhere in the file, as "
                     r"'episode_\d+/\w+'", msg), msg
    with pytest.raises(DatasetError, match="links a dataset already linked elsewhere"):
        read_minari(tmp_path / "hl")


def test_a_dataset_hard_linked_under_two_keys_of_a_flat_file_is_refused(tmp_path):
    path = _flat(tmp_path / "alias.hdf5", observations=None)
    with h5py.File(path, "a") as f:
        f.create_dataset("observations", data=np.zeros((N, 4), np.float32))
        f["next_observations"] = f["observations"]  # two keys, one stored array
    out = _probe("cli", "dataset", "info", str(path))
    _bounded(out, f"dataset {path}", "links a dataset already linked elsewhere in the file")
    with pytest.raises(DatasetError, match=r"key '(next_)?observations' links a dataset already linked"):
        read_hdf5(path)


def test_all_arrays_of_one_file_together_expand_at_most_dataset_expansion_times_its_size(tmp_path):
    """No alias: 120 episodes of small never-written arrays (each under the per-array allowance for small arrays)
    still count against one total for the file, checked before any array is read."""
    data = _minari_meta(tmp_path / "many")
    t = 1500
    with h5py.File(data, "w") as f:
        for i in range(120):
            g = f.create_group(f"episode_{i}")
            g.create_dataset("observations", shape=(t + 1, 4), dtype=np.float32)  # fill values: nothing stored
            for k, dt in (("actions", np.int64), ("rewards", np.float32), ("terminations", bool),
                          ("truncations", bool)):
                g.create_dataset(k, shape=(t,), dtype=dt)
    size = data.stat().st_size
    declared = 120 * ((t + 1) * 16 + t * (8 + 4 + 1 + 1))
    assert declared > 10 * size
    with pytest.raises(DatasetError) as err:
        load_dataset(str(tmp_path / "many"), limits={"dataset_expansion": 10})
    msg = str(err.value)
    assert str(data) in msg and "key 'episode_" in msg and "limits.dataset_expansion = 10 times the file's" in msg
    assert len(load_dataset(str(tmp_path / "many")).transitions) == 120 * t  # the default: within 1,000 x


# ---- case 3: a FIFO where a dataset file should be -----------------------------------------------------------------
def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def test_a_fifo_as_minari_main_data_is_refused_at_once(tmp_path):
    root = tmp_path / "m"
    (root / "data").mkdir(parents=True)
    (root / "data" / "metadata.json").write_text('{"data_format":"hdf5"}')
    data = _fifo(root / "data" / "main_data.hdf5")
    _bounded(_probe("cli", "dataset", "info", str(root), "--format", "minari"), f"dataset {data}",
             "is a FIFO (named pipe), not a regular file")
    _bounded(_probe("read_minari", str(root)), f"dataset {data}", "is a FIFO")
    # through a run's dataset.uri: refused while the run is built, before any member trains
    _bounded(_probe("run", str(root)), f"dataset {data}", "is a FIFO")


def test_a_fifo_as_a_flat_hdf5_file_or_as_minari_metadata_is_refused_at_once(tmp_path):
    flat = _fifo(tmp_path / "flat.hdf5")
    _bounded(_probe("cli", "dataset", "info", str(flat)), str(flat), "is a FIFO (named pipe)")
    _bounded(_probe("read_hdf5", str(flat)), f"dataset {flat}", "is a FIFO (named pipe)")
    _bounded(_probe("run", str(flat)), str(flat), "is a FIFO")
    root = tmp_path / "meta"
    meta = _fifo(root / "data" / "metadata.json")
    with h5py.File(root / "data" / "main_data.hdf5", "w") as f:  # a genuine data file beside it
        _episode(f.create_group("episode_0"), N)
    _bounded(_probe("cli", "dataset", "info", str(root), "--format", "minari"), str(meta), "is a FIFO")
    _bounded(_probe("read_minari", str(root)), str(meta), "is a FIFO")


# ---- case 7: attributes that are not plain data --------------------------------------------------------------------
def _info(path: Path, capsys) -> tuple[int, str, str]:
    from flows.cli import main

    capsys.readouterr()
    rc = main(["dataset", "info", str(path)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("kind", ["reference", "region", "complex", "compound", "opaque"])
def test_an_attribute_that_is_not_plain_data_is_refused_naming_file_and_attribute(tmp_path, capsys, kind):
    path = _flat(tmp_path / f"{kind}.hdf5")
    with h5py.File(path, "a") as f:
        f.attrs["env_id"] = {"reference": lambda: f["rewards"].ref,
                             "region": lambda: f["rewards"].regionref[1:3],
                             "complex": lambda: np.complex128(1 + 2j),
                             "compound": lambda: np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
                             "opaque": lambda: np.void(b"\x00\x01")}[kind]()
    rc, out, err = _info(path, capsys)
    assert rc != 0 and out == "" and "unexpected" not in err and "Traceback" not in err, err
    assert f"dataset {path}: attribute 'env_id'" in err and "not plain data" in err, err
    with pytest.raises(DatasetError, match=r"attribute 'env_id' .*not plain data"):
        read_hdf5(path)


def test_attributes_of_every_plain_kind_read_as_json_data(tmp_path, capsys):
    path = _flat(tmp_path / "plain.hdf5")
    with h5py.File(path, "a") as f:
        f.attrs["env_id"] = "CartPole-v1"
        f.attrs["nan"] = np.nan
        f.attrs["inf"] = np.array([1.0, np.inf, -np.inf], np.float32)
        f.attrs["big"] = np.uint64(2**64 - 1)
        f.attrs["ld"] = np.longdouble(1.5)
        f.attrs["bytes"] = np.bytes_(b"caf\xc3\xa9 \xff")
        f.attrs["tags"] = ["a", "b"]  # a variable-length string array
        f.attrs["vlen"] = np.array([np.array([1, 2]), np.array([3])], dtype=h5py.vlen_dtype(np.int64))
        f.attrs["empty"] = h5py.Empty("f8")
        f.attrs["none"] = np.zeros((0, 3))
        f.attrs["flag"] = True
    _, attrs = read_hdf5(path)
    assert attrs == {"env_id": "CartPole-v1", "nan": "nan", "inf": [1.0, "inf", "-inf"], "big": 2**64 - 1,
                     "ld": 1.5, "bytes": "café \ufffd", "tags": ["a", "b"], "vlen": [[1, 2], [3]], "empty": None,
                     "none": [], "flag": True}
    json.dumps(attrs, allow_nan=False)
    rc, out, _ = _info(path, capsys)
    assert rc == 0 and json.loads(out)["env_id"] == "CartPole-v1"


def test_attributes_too_large_to_be_informational_are_refused_before_they_are_read(tmp_path):
    path = _flat(tmp_path / "large.hdf5")
    with h5py.File(path, "a") as f:
        f.attrs.create("env_id", data=["x"] * 300, dtype=h5py.string_dtype())
    with pytest.raises(DatasetError, match=r"attribute 'env_id': declares 300 variable-length elements, more than 256"):
        read_hdf5(path)
    with h5py.File(path, "a") as f:
        del f.attrs["env_id"]
        f.attrs["env_id"] = "x" * (2**20 + 1)
    with pytest.raises(DatasetError, match=r"attribute 'env_id': holds more than .* characters"):
        read_hdf5(path)


def _narrow(x):
    """A float as a numpy scalar of the chosen width (overflowing to ±inf when it does not fit)."""
    with np.errstate(over="ignore"):
        return x[1](x[0])


_FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)
_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
_KINDS = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(2**63, 2**64 - 1).map(np.uint64),  # huge: beyond int64
    st.tuples(_FLOATS, st.sampled_from([np.float16, np.float32, np.float64, np.longdouble])).map(_narrow),
    _TEXT,
    st.binary(max_size=40).map(lambda b: np.bytes_(b) if b.rstrip(b"\0") == b else np.void(b or b"\0")),
    st.lists(_FLOATS, max_size=6).map(lambda v: np.array(v, np.float64)),
    st.lists(st.integers(-5, 5), max_size=6).map(lambda v: np.array(v, np.int32).reshape(len(v), 1)),
    st.just(np.zeros((0, 2), np.float32)),
    st.tuples(_FLOATS, _FLOATS).map(lambda c: np.complex128(complex(*c))),
    st.lists(st.lists(st.integers(-9, 9), max_size=4), min_size=1, max_size=4).map(
        lambda v: ("vlen", v)),
    st.lists(_TEXT, min_size=1, max_size=4),
    st.sampled_from(["empty", "reference", "bool"]),
)


def _write_attr(f, name: str, value) -> None:
    if isinstance(value, tuple) and value[0] == "vlen":
        arr = np.empty(len(value[1]), dtype=object)
        arr[:] = [np.array(v, np.int64) for v in value[1]]
        f.attrs.create(name, arr, dtype=h5py.vlen_dtype(np.int64))
    elif isinstance(value, str) and value in ("empty", "reference", "bool"):
        f.attrs[name] = {"empty": h5py.Empty("f8"), "reference": f["rewards"].ref, "bool": np.bool_(True)}[value]
    else:
        f.attrs[name] = value


def test_any_attribute_reads_as_json_data_or_a_dataset_error():
    """Property: whatever attributes a small valid dataset holds, `dataset info`'s reading gives JSON-serialisable
    output (no NaN either) or raises DatasetError naming the file and the attribute; never another exception."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "attrs.hdf5"

        @settings(max_examples=200, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(_KINDS, min_size=1, max_size=3))
        def check(values):
            _flat(path)
            with h5py.File(path, "a") as f:
                for i, v in enumerate(values):
                    with contextlib.suppress(TypeError, ValueError):  # a value h5py cannot write at all
                        _write_attr(f, ("env_id", "source", "x")[i], v)
            try:
                _, attrs = read_hdf5(path)
                desc = load_dataset(str(path)).describe()
            except DatasetError as err:
                assert f"dataset {path}: attribute '" in str(err), err
                return
            json.dumps(attrs, allow_nan=False)
            json.dumps(desc, allow_nan=False)

        check()


# ---- case 9: float64 values beyond float32's range ------------------------------------------------------------------
@pytest.mark.parametrize("key", ["observations", "next_observations", "actions"])
def test_float64_beyond_float32s_range_is_refused_naming_key_and_row(tmp_path, capsys, key):
    obs, act = np.zeros((N, 4)), np.zeros((N, 2))
    arrays = {"observations": obs.copy(), "next_observations": obs.copy(), "actions": act}
    arrays[key][3, 1] = -1e300  # finite in float64, -inf once training casts it to float32
    path = _flat(tmp_path / f"{key}.hdf5", rewards=np.ones(N), **arrays)
    with pytest.raises(DatasetError, match=rf"dataset {path}: key '{key}' holds 1 non-finite value\(s\) \(NaN, ±Inf "
                                           rf"or beyond float32's range .*\), the first at row 3 \(index \(3, 1\): "
                                           rf"-1e\+300\)"):
        load_dataset(str(path))
    rc, out, err = _info(path, capsys)
    assert rc != 0 and out == "" and f"key '{key}'" in err and "first at row 3" in err
    ok = _flat(tmp_path / "ok.hdf5", rewards=np.ones(N), observations=np.full((N, 4), 3e38),
               actions=np.full((N, 2), -3e38))
    assert load_dataset(str(ok)).transitions.observations.dtype == np.float64  # within range: loads as it is


@pytest.mark.parametrize("key", ["observations", "actions"])
def test_minari_float64_beyond_float32s_range_is_refused_naming_episode_key_and_row(tmp_path, key):
    data = _minari_meta(tmp_path / key)
    with h5py.File(data, "w") as f:
        _episode(f.create_group("episode_0"), N, obs=np.zeros((N + 1, 4)), actions=np.zeros((N, 2)))
        obs, act = np.zeros((N + 1, 4)), np.zeros((N, 2))
        (obs if key == "observations" else act)[2, 0] = 1e39
        _episode(f.create_group("episode_1"), N, obs=obs, actions=act)
    with pytest.raises(DatasetError, match=rf"main_data.hdf5: key 'episode_1/{key}' holds 1 non-finite value\(s\) "
                                           rf".*beyond float32's range.*first at row 2 \(index \(2, 0\): 1e\+39\)"):
        load_dataset(str(tmp_path / key))
