"""Issue 38, cases 3, 5 and 8 for datasets: a dataset file reads only its own bytes (external raw storage,
external links, virtual datasets, soft links and link loops are refused before any array is read), declared
shapes are checked against the limit table and the bytes the file stores before anything is allocated, and
non-finite values are refused at load naming the file, key and first bad row."""

from __future__ import annotations

import json
import time
import tracemalloc

import h5py
import numpy as np
import pytest

from agilerl_core.data.hdf5 import read_hdf5
from agilerl_core.data.loader import load_dataset
from agilerl_core.data.minari_format import read_minari
from agilerl_core.data.transitions import Transitions
from agilerl_core.errors import DatasetError

N = 5
SECRET = np.full(N, 4242.5, np.float32)  # what an outside file holds: must never appear in a statistic


def _others(f, n=N, skip=()):
    """Every required key but `skip`, as plain in-file datasets."""
    arrays = {"observations": np.zeros((n, 4), np.float32), "actions": np.zeros(n, np.int64),
              "rewards": np.ones(n, np.float32), "terminals": np.array([0] * (n - 1) + [1], bool)}
    for k, v in arrays.items():
        if k not in skip:
            f[k] = v


@pytest.fixture
def secret(tmp_path):
    """An outside HDF5 file and a raw file holding SECRET."""
    raw = tmp_path / "secret.bin"
    raw.write_bytes(SECRET.tobytes())
    with h5py.File(tmp_path / "secret.h5", "w") as f:
        f["rewards"] = SECRET
    return tmp_path


def _refused(path, *patterns):
    """load_dataset(path) raises a DatasetError matching every pattern; nothing of SECRET leaks into it."""
    with pytest.raises(DatasetError) as err:
        load_dataset(str(path)).describe()
    msg = str(err.value)
    for p in patterns:
        assert p in msg, (p, msg)
    assert str(path) in msg and "4242" not in msg
    return msg


# ---- case 3: external storage, external links, virtual datasets, links that loop -----------------------
def test_external_raw_storage_on_proc_self_environ_is_refused(tmp_path):
    path = tmp_path / "environ.hdf5"
    with open("/proc/self/environ", "rb") as fh:
        environ = fh.read()
    with h5py.File(path, "w") as f:
        _others(f, skip=("rewards",))
        # the attack as the issue writes it (no data= : that would write into the outside file)
        f.create_dataset("rewards", shape=(N,), dtype=np.uint8, external=[("/proc/self/environ", 0, N)])
    with h5py.File(path, "r") as f:  # the file really does read the process environment without the check
        assert bytes(f["rewards"][()]) == environ[:N]
    msg = _refused(path, "key 'rewards'", "external file(s) ['/proc/self/environ']", "self-contained copy")
    assert environ.split(b"\0")[0].decode(errors="replace") not in msg  # no environment entry in the message
    with pytest.raises(DatasetError, match="external file"):
        read_hdf5(path)


def test_external_raw_storage_on_an_outside_file_never_reaches_a_statistic(secret):
    path = secret / "ext.hdf5"
    with h5py.File(path, "w") as f:
        _others(f, skip=("rewards",))
        f.create_dataset("rewards", shape=(N,), dtype=np.float32, external=[(str(secret / "secret.bin"), 0, 4 * N)])
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["rewards"][()], SECRET)  # h5py alone reads the outside file
    _refused(path, "key 'rewards'", "external file(s)", "secret.bin")


def test_external_link_is_refused_before_it_is_followed(secret):
    path = secret / "link.hdf5"
    with h5py.File(path, "w") as f:
        _others(f, skip=("rewards",))
        f["rewards"] = h5py.ExternalLink(str(secret / "secret.h5"), "/rewards")
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["rewards"][()], SECRET)
    _refused(path, "key 'rewards' is an external link to", "secret.h5", "self-contained copy")
    # a link nested in a group the reader never asks for is refused too (every link is walked)
    nested = secret / "nested.hdf5"
    with h5py.File(nested, "w") as f:
        _others(f)
        f.create_group("extra/deep")["x"] = h5py.ExternalLink(str(secret / "secret.h5"), "/rewards")
    _refused(nested, "key 'extra/deep/x' is an external link")


def test_virtual_dataset_is_refused(secret):
    path = secret / "vds.hdf5"
    layout = h5py.VirtualLayout(shape=(N,), dtype=np.float32)
    layout[:] = h5py.VirtualSource(str(secret / "secret.h5"), "rewards", shape=(N,))
    with h5py.File(path, "w") as f:
        _others(f, skip=("rewards",))
        f.create_virtual_dataset("rewards", layout)
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["rewards"][()], SECRET)
    _refused(path, "key 'rewards' is a virtual dataset")


def test_soft_links_and_link_loops_are_refused(tmp_path):
    loop = tmp_path / "loop.hdf5"
    with h5py.File(loop, "w") as f:
        _others(f)
        f["a"] = h5py.SoftLink("/b")
        f["b"] = h5py.SoftLink("/a")
    _refused(loop, "key 'a' is a soft link to '/b'")
    alias = tmp_path / "alias.hdf5"
    with h5py.File(alias, "w") as f:
        _others(f, skip=("rewards",))
        f["rewards"] = h5py.SoftLink("/terminals")
    _refused(alias, "key 'rewards' is a soft link to '/terminals'")
    hard = tmp_path / "hard.hdf5"
    with h5py.File(hard, "w") as f:
        _others(f)
        f.create_group("g")["up"] = f["/"]  # a hard link back to the root: a loop a naive walk never leaves
    _refused(hard, "key 'g/up' links a group already linked", "link loop")


def test_a_filter_hdf5_would_load_as_a_plugin_is_refused(tmp_path):
    path = tmp_path / "plugin.hdf5"
    with h5py.File(path, "w") as f:
        _others(f, skip=("rewards",))
        f.create_dataset("rewards", shape=(N,), dtype=np.float32, chunks=(N,), compression=307,
                         allow_unknown_filter=True)  # bzip2: HDF5 would search HDF5_PLUGIN_PATH for it
    _refused(path, "key 'rewards' is encoded with HDF5 filter 307", "plugin")


def test_self_contained_compressed_datasets_still_load(tmp_path):
    path = tmp_path / "gzip.hdf5"
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(400, 4)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("observations", data=obs, compression="gzip", shuffle=True, fletcher32=True)
        f.create_dataset("actions", data=rng.integers(0, 2, 400), compression="lzf")
        f.create_dataset("rewards", data=np.ones(400, np.float32), compression="gzip")
        f.create_dataset("terminals", data=np.arange(400) % 20 == 19)
        f.attrs["env_id"] = "CartPole-v1"
        f.attrs["tags"] = np.array([1, 2, 3])  # an array attribute: data, not an error
    t, attrs = read_hdf5(path)
    assert np.array_equal(t.observations[:5], obs[:5]) and attrs == {"env_id": "CartPole-v1", "tags": [1, 2, 3]}
    assert load_dataset(str(path)).describe()["episodes"] == 20


# ---- case 5: a small file never causes a large allocation ----------------------------------------------
def test_a_tiny_file_declaring_gigabytes_is_refused_before_allocating(tmp_path):
    path = tmp_path / "bomb.hdf5"
    with h5py.File(path, "w") as f:
        _others(f, skip=("observations",))
        f.create_dataset("observations", shape=(10**9, 4), dtype=np.float32, chunks=(4096, 4), compression="gzip")
    assert path.stat().st_size < 10_000  # never written: every chunk is the fill value
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        msg = _refused(path, "key 'observations'", "16,000,000,000 bytes", "stores 0 bytes",
                       "limits.dataset_expansion = 1,000")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 5 and peak < 50 * 2**20, (peak, msg)


def test_declared_sizes_are_checked_against_the_limit_table(tmp_path):
    path = tmp_path / "wide.hdf5"
    with h5py.File(path, "w") as f:
        _others(f, skip=("observations",))
        f.create_dataset("observations", shape=(N, 5_000_000), dtype=np.uint8, chunks=(1, 65536),
                         compression="gzip")
    _refused(path, "key 'observations': elements of one row (shape (5000000,))", "limits.space_elements = 4,194,304")
    ok = tmp_path / "ok.hdf5"
    with h5py.File(ok, "w") as f:
        _others(f)
    with pytest.raises(DatasetError, match=r"key 'observations': declared bytes \(shape \(5, 4\) of float32\): 80 is "
                                           r"over the limit limits.dataset_bytes = 64"):
        load_dataset(str(ok), limits={"dataset_bytes": 64})
    assert len(load_dataset(str(ok), limits={"dataset_bytes": 80}).transitions) == N


# ---- case 8: non-finite values stop the load ------------------------------------------------------------
def test_nan_rewards_and_inf_observations_are_refused_naming_key_and_row(tmp_path):
    rewards = np.ones(N, np.float32)
    rewards[2] = np.nan
    path = tmp_path / "nan.hdf5"
    with h5py.File(path, "w") as f:
        _others(f, skip=("rewards",))
        f["rewards"] = rewards
    _refused(path, "key 'rewards' holds 1 non-finite value(s)", "first at row 2", "nan")
    obs = np.zeros((N, 4), np.float32)
    obs[3, 1] = -np.inf
    inf = tmp_path / "inf.hdf5"
    with h5py.File(inf, "w") as f:
        _others(f, skip=("observations",))
        f["observations"] = obs
    _refused(inf, "key 'observations'", "first at row 3 (index (3, 1): -inf)")
    big = tmp_path / "big.hdf5"  # finite in float64, infinite once read as float32 rewards
    with h5py.File(big, "w") as f:
        _others(f, skip=("rewards",))
        f["rewards"] = np.array([0, 0, 0, 0, 1e300])
    _refused(big, "key 'rewards'", "first at row 4")
    # through a config: the offline run stops before any member trains
    from agilerl_core.experiment import build_evolution
    from tests.conftest import tiny_config

    with pytest.raises(DatasetError, match=r"key 'rewards' holds 1 non-finite value\(s\).*first at row 2"):
        build_evolution(tiny_config(kind="offline", algorithm="cqn", **{"dataset.uri": str(path)}))


# ---- Minari datasets are read with the same checks -----------------------------------------------------
def _minari(root, build):
    (root / "data").mkdir(parents=True)
    (root / "data" / "metadata.json").write_text(json.dumps(
        {"data_format": "hdf5", "dataset_id": "x/y-v0", "env_spec": json.dumps({"id": "CartPole-v1"})}))
    with h5py.File(root / "data" / "main_data.hdf5", "w") as f:
        for i in range(2):
            g = f.create_group(f"episode_{i}")
            g["observations"] = np.zeros((N + 1, 4), np.float32)
            g["actions"] = np.zeros(N, np.int64)
            g["terminations"] = np.array([0] * (N - 1) + [1], bool)
            g["truncations"] = np.zeros(N, bool)
            if i == 0 or build is None:
                g["rewards"] = np.ones(N, np.float32)
            else:
                build(f, g)
    return root


def test_minari_datasets_read_only_their_own_bytes(secret):
    t, info = read_minari(_minari(secret / "good", None))
    assert isinstance(t, Transitions) and len(t) == 2 * N and info["env_id"] == "CartPole-v1"

    def environ(f, g):
        g.create_dataset("rewards", shape=(N,), dtype=np.uint8, external=[("/proc/self/environ", 0, N)])

    def link(f, g):
        g["rewards"] = h5py.ExternalLink(str(secret / "secret.h5"), "/rewards")

    def nan(f, g):
        g["rewards"] = np.array([1, 1, 1, np.nan, 1], np.float32)

    def bomb(f, g):
        g.create_dataset("rewards", shape=(10**9,), dtype=np.float64, chunks=(8192,), compression="gzip")

    for name, build, want in (("environ", environ, "key 'episode_1/rewards' keeps its raw data in external file"),
                              ("link", link, "key 'episode_1/rewards' is an external link"),
                              ("nan", nan, "key 'episode_1/rewards' holds 1 non-finite value(s) (NaN or ±Inf), "
                                       "the first at row 3"),
                              ("bomb", bomb, "limits.dataset_expansion")):
        root = _minari(secret / name, build)
        with pytest.raises(DatasetError) as err:
            load_dataset(str(root)).describe()
        assert want in str(err.value) and "main_data.hdf5" in str(err.value) and "4242" not in str(err.value), name


def test_minari_names_and_metadata_that_are_not_what_minari_writes_are_refused(tmp_path):
    root = _minari(tmp_path / "long", None)
    with h5py.File(root / "data" / "main_data.hdf5", "a") as f:
        f.create_group("episode_" + "9" * 5000)  # int() of it raises ValueError (4300 digits)
        f.create_group("episode_x")
    with pytest.raises(DatasetError, match="are not named episode_<number>"):
        read_minari(root)
    meta = _minari(tmp_path / "meta", None) / "data" / "metadata.json"
    for text, want in (("[1, 2]", "metadata is a JSON list"), ('{"env_spec": "{nope"}', "field env_spec: not valid JSON")):
        meta.write_text(text)
        with pytest.raises(DatasetError, match=want):
            read_minari(meta.parent.parent)
