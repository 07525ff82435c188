"""Issue 38, cases 5-7: every stored JSON record goes through one parser with size, depth and number limits;
sizes read from records and configs are checked against the limit table before anything is allocated; every
reader of a committed generation verifies its manifest; a tampered value loads as data or raises the project's
error naming the file and field (a property-based test mutates every leaf of each record kind)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agilerl_core
from agilerl_core import limits as limits_mod
from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.algorithms.saved import load_member, load_population
from agilerl_core.errors import AgileRLError, CheckpointError, ConfigError
from agilerl_core.experiment import build_evolution
from agilerl_core.io import lease as lease_mod
from agilerl_core.io import run_store as run_store_mod
from agilerl_core.io.checkpoint import save_member
from agilerl_core.io.records import field, read_record
from agilerl_core.io.run_store import RunStore
from agilerl_core.io.storage import LocalStorage
from tests.conftest import commit_generations, tiny_config

GEN0 = "r/generations/000000"


# ---- fixtures: one committed run and one saved member, made once ------------------------------------------------
@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A run `r` with generation 0 committed (manifest, population.json, members, shards) and a lease."""
    root = tmp_path_factory.mktemp("store")
    store = RunStore(LocalStorage(root), "r")
    exp = build_evolution(tiny_config())
    commit_generations(exp, store)
    store._put_json("LEASE.json", {"format": lease_mod.LEASE_FORMAT, "version": 1, "owner": "elsewhere:1:ab",
                                   "acquired": 1.0, "heartbeat": 1.0, "ttl_s": 60.0})
    save_member(root / "member", exp.population.members[0], exp.arena.env_desc)
    return root, store


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rehash(root: Path, rel: str) -> None:
    """Put the checksum of `rel` (edited) into generation 0's manifest, so the field checks are what is tested."""
    man = root / GEN0 / "MANIFEST.json"
    data = json.loads(man.read_text())
    data["files"][rel.split("/", 1)[1]] = _sha(root / rel)  # keys are relative to the run
    man.write_text(json.dumps(data))


@contextlib.contextmanager
def _restored(*paths: Path):
    saved = {p: p.read_bytes() for p in paths}
    try:
        yield
    finally:
        for p, b in saved.items():
            p.write_bytes(b)


def _edit(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


# ---- the one parser ----------------------------------------------------------------------------------------------
def test_the_parser_refuses_depth_digits_constants_duplicates_and_size(tmp_path):
    cases = {
        "deep.json": (b"[" * 200_000 + b"]" * 200_000, "nested 200000 deep, over the limit limits.json_depth = 64"),
        "digits.json": (b'{"n": ' + b"9" * 5000 + b"}", "5,000 digits is over the limit limits.json_digits"),
        "float.json": (b'{"n": 1e400}', "overflows a float"),
        "nan.json": (b'{"n": NaN}', "NaN is not a number this record may hold"),
        "inf.json": (b'{"n": -Infinity}', "-Infinity is not a number"),
        "dup.json": (b'{"a": 1, "a": 2}', "key 'a' appears twice"),
        "bytes.json": (b'{"a": "\xff"}', "not valid JSON"),
    }
    for name, (raw, message) in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(CheckpointError, match=message) as err:
            read_record(tmp_path / name)
        assert str(tmp_path / name) in str(err.value)
    assert read_record(b'{"n": NaN}', "x", allow_nan=True)["n"] != 0  # NaN where a record kind allows it
    with limits_mod.applied({"json_bytes": 100}):  # the size is checked before the file is read
        (tmp_path / "big.json").write_bytes(b"[" + b"1," * 1000 + b"1]")
        with pytest.raises(CheckpointError, match="big.json: 2,003 bytes is over the limit limits.json_bytes = 100"):
            read_record(tmp_path / "big.json")
    data = read_record(b'{"record": null}', "m.json")
    with pytest.raises(CheckpointError, match=r"m.json: field record is None, not an object holding 'member_id'"):
        field(data, "record.member_id", int, "m.json")
    with pytest.raises(CheckpointError, match=r"m.json: field a is 1.5, expected a whole number"):
        field({"a": 1.5}, "a", int, "m.json")


# ---- case 5: small inputs, large allocations ---------------------------------------------------------------------
def _refused_fast(fn, match: str, error=CheckpointError) -> None:
    """`fn` raises `error` matching `match` within 2 s, its Python allocations peaking under 20 MB."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(error, match=match):
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 2.0
    assert peak < 20 * 2**20, f"peak {peak / 2**20:.0f} MB"


def test_member_json_with_huge_hidden_sizes_is_refused_before_allocating(committed, tmp_path):
    root, _ = committed
    member = tmp_path / "m"
    shutil.copytree(root / "member", member)
    _edit(member / "member.json", lambda d: d["agent"]["arch"]["mlp"].update(hidden=[12000, 12000]))
    _refused_fast(lambda: load_member(member),
                  r"member.json: field agent.arch.mlp.hidden\[0\]: 12,000 is over the limit limits.layer_width = 8,192")
    with limits_mod.applied({"layer_width": 20000}):  # raised width: the parameter count still refuses it
        _refused_fast(lambda: load_member(member), r"agent.arch.*\(parameters counted from the arch\): 144,\d+,\d+ is "
                                                   r"over the limit limits.network_params = 100,000,000")
    _edit(member / "member.json", lambda d: d["agent"]["arch"]["mlp"].update(hidden=[32] * 1000))
    _refused_fast(lambda: load_member(member), r"agent.arch.mlp.hidden \(layers\): 1,000 is over the limit "
                                               r"limits.layer_count")
    _edit(member / "member.json", lambda d: d["agent"]["arch"]["mlp"].update(hidden=[float("inf")]))
    with pytest.raises(CheckpointError, match=r"agent.arch.mlp.hidden\[0\]: inf is not a whole number"):
        load_member(member)


def test_recorded_spaces_are_sized_before_allocating(committed, tmp_path):
    root, _ = committed
    member = tmp_path / "m"
    shutil.copytree(root / "member", member)

    def box_without_low_inf(d):
        d["spec"]["observation_space"] = {"type": "Box", "shape": [450_000_000], "dtype": "float32",
                                          "low": [0.0], "high": [1.0]}
    _edit(member / "member.json", box_without_low_inf)
    _refused_fast(lambda: load_member(member), r"member.json: field spec.observation_space.shape\[0\]: 450,000,000 is "
                                               r"over the limit limits.space_elements")
    _edit(member / "member.json", lambda d: d["spec"]["observation_space"].update(shape=[4000, 4000]))
    _refused_fast(lambda: load_member(member), r"spec.observation_space.shape \(elements\): 16,000,000 is over the "
                                               r"limit limits.space_elements")

    def nested(d):  # a Dict of Boxes each under the limit, over it together
        box = {"type": "Box", "shape": [2048, 1024], "dtype": "uint8", "low": [0], "high": [1]}
        d["spec"]["observation_space"] = {"type": "Dict", "spaces": {"a": box, "b": box, "c": box}}
    _edit(member / "member.json", nested)
    _refused_fast(lambda: load_member(member), r"spec.observation_space \(elements of all its sub-spaces\): 6,291,456 "
                                               r"is over the limit limits.space_elements")
    _edit(member / "member.json", lambda d: d["spec"].update(observation_space={"type": "Discrete", "n": 10**12}))
    _refused_fast(lambda: load_member(member), r"spec.observation_space.n: 1,000,000,000,000 is over the limit "
                                               r"limits.discrete_n")


def test_a_lineage_slot_of_a_million_is_refused(committed):
    root, store = committed
    rel = f"{GEN0}/population/population.json"
    with _restored(root / rel, root / GEN0 / "MANIFEST.json"):
        _edit(root / rel, lambda d: d["lineage"][0].update(slot=10**6))
        _rehash(root, rel)
        _refused_fast(lambda: store.lineage(0), r"population.json: field lineage.0.slot: 1,000,000 is over the limit "
                                                r"limits.population_size = 65,536")
        with limits_mod.applied({"population_size": 10**7}):  # a raised limit: the run's own size still bounds it
            store._put_json("run.json", {"format": run_store_mod.RUN_FORMAT, "version": 1, "run_id": "r",
                                         "config": {"population_size": 3}})
            try:
                with pytest.raises(CheckpointError, match=r"lineage.0.slot is 1,000,000, but the run's population has 3"):
                    store.lineage(0)
            finally:
                (root / "r/run.json").unlink()
        with pytest.raises(CheckpointError, match=r"lineage.0.slot: 1,000,000 is over the limit"):
            store.load_generation(0, algorithms=get_algorithm)  # resume's reader checks the same record the same way


@pytest.mark.parametrize(("field_name", "value"), [("population_size", 10**7), ("num_envs", 10**6),
                                                   ("hyperparameters.buffer_size", 10**12),
                                                   ("network.hidden_sizes", [12000, 12000])])
def test_config_sizes_are_refused_at_validation_naming_the_field(field_name, value):
    t0 = time.perf_counter()
    limit = {"population_size": "population_size", "num_envs": "num_envs", "hyperparameters.buffer_size": "buffer_size",
             "network.hidden_sizes": "layer_width"}[field_name]
    over = {"network.hidden_sizes": {"network.max_nodes": 16384}}.get(field_name, {})
    with pytest.raises(ConfigError, match=rf"{field_name.replace('.', '[.]')}.*over the limit limits.{limit}"):
        tiny_config(**{field_name: value}, **over)
    assert time.perf_counter() - t0 < 2.0
    raised = {"population_size": 2 * 10**7, "num_envs": 2 * 10**6, "buffer_size": 10**13, "layer_width": 16384}[limit]
    cfg = tiny_config(**{field_name: value, "limits": {limit: raised}}, **over)  # the user's own config raises it
    assert cfg.limits.model_dump()[limit] == raised


# ---- case 6: every reader of a committed generation verifies the manifest -----------------------------------------
def test_lineage_refuses_an_edited_population_json_as_resume_does(committed, tmp_path, capsys):
    from flows.cli import main

    root, store = committed
    rel = f"{GEN0}/population/population.json"
    out = tmp_path / "tree.png"
    with _restored(root / rel):
        _edit(root / rel, lambda d: d["lineage"][0].update(fitness=1e9))  # a better-looking history, checksum kept
        with pytest.raises(CheckpointError, match="population.json: checksum mismatch with the generation manifest"):
            store.lineage(0)
        with pytest.raises(CheckpointError, match="population.json: checksum mismatch with the generation manifest"):
            store.load_generation(0, algorithms=get_algorithm)
        capsys.readouterr()
        rc = main(["lineage", "r", "--out", str(out), "--storage", str(root)])
        err = capsys.readouterr().err
        assert rc == 1 and not out.exists()
        assert "checkpoint error:" in err and "population.json: checksum mismatch with the generation manifest" in err
    assert len(store.lineage(0)) == 3  # the committed record reads again once restored


def test_load_of_a_member_inside_a_committed_generation_verifies_the_manifest(committed):
    root, _ = committed
    member = root / GEN0 / "population" / "members" / "0"
    assert agilerl_core.load(member).member_id == 0
    with _restored(member / "member.json"):
        _edit(member / "member.json", lambda d: d["record"].update(fitness_history=[1e9]))
        with pytest.raises(CheckpointError, match="members/0/member.json: checksum mismatch with the generation manifest"):
            agilerl_core.load(member)


# ---- case 7: a tampered value loads as data or raises the project's error naming file and field ------------------
_HUGE = "1" + "0" * 5000
REPLACEMENTS = ["null", '"x"', _HUGE, "1e400", "Infinity", "-Infinity", "NaN", "-1", "0", "1.5", "12000",
                "[" * 100 + "]" * 100, "[" * 30 + "1" + "]" * 30, "[]", "{}", '{"a": [1, 2]}', "true", "DELETE"]
_MARK = "__mutated_leaf__"


def _leaves(data, path=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(data, list) and data:
        for i, v in enumerate(data):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _mutated(original: dict, path: tuple, replacement: str) -> bytes:
    data = json.loads(json.dumps(original))
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    if replacement == "DELETE":
        del parent[path[-1]]
        return json.dumps(data).encode()
    parent[path[-1]] = _MARK
    return json.dumps(data).replace(f'"{_MARK}"', replacement).encode()


class _Kind:
    """One record kind: its file, the (subtree of) leaves to mutate, the checksum to recompute, the reader."""

    def __init__(self, rel: str, load, under: tuple = (), rehash: bool = False) -> None:
        self.rel, self.load, self.under, self.rehash = rel, load, under, rehash


def _kinds(root: Path, store: RunStore) -> dict[str, _Kind]:
    evo = build_evolution(tiny_config())  # one evolution resumed again and again (resume replaces its state)
    return {
        "member": _Kind("member/member.json", lambda: load_member(root / "member")),
        "population": _Kind(f"{GEN0}/population/population.json",
                            lambda: evo.resume(store, 0), rehash=True),
        "manifest": _Kind(f"{GEN0}/MANIFEST.json",
                          lambda: (evo.resume(store, 0), store.buffer_window(0))),
        "lineage": _Kind(f"{GEN0}/population/population.json", lambda: store.lineage(0), ("lineage",), rehash=True),
        "lease": _Kind("r/LEASE.json", lambda: (store.lease(), store.acquire_lease("me:2:cd", 60.0))),
    }


def _attempt(root: Path, kind: _Kind, path: tuple, replacement: str) -> None:
    file = root / kind.rel
    original = json.loads(file.read_text())
    with _restored(file, root / GEN0 / "MANIFEST.json", root / "r/LEASE.json"):
        file.write_bytes(_mutated(original, path, replacement))
        if kind.rehash:
            _rehash(root, kind.rel)
        try:
            kind.load()
        except AgileRLError as err:
            assert kind.rel.rsplit("/", 1)[-1] in str(err) or "MANIFEST" in str(err) or "r/" in str(err), str(err)
        except Exception as err:  # the point of the test: nothing but our errors
            raise AssertionError(f"{kind.rel} with {'.'.join(map(str, path))} = {replacement[:20]}: "
                                 f"{type(err).__name__}: {err}") from err


@pytest.fixture()
def no_lease_pause(monkeypatch):
    class _Time:
        time = staticmethod(time.time)

        @staticmethod
        def sleep(_s):
            return None
    monkeypatch.setattr(lease_mod, "time", _Time)


@pytest.mark.parametrize("kind_name", ["member", "population", "manifest", "lineage", "lease"])
def test_every_leaf_of_every_record_kind_loads_or_names_the_field(committed, kind_name, no_lease_pause):
    """Every field once (the replacement rotating through the list), then hypothesis' picks of any leaf."""
    root, store = committed
    kind = _kinds(root, store)[kind_name]
    original = json.loads((root / kind.rel).read_text())
    sub = original
    for p in kind.under:
        sub = sub[p]
    leaves = [(*kind.under, *p) for p in _leaves(sub, ())]
    assert len(leaves) >= 3
    fields = {}  # every distinct field once (list items of one shape: the first), e.g. lineage.#.slot
    for path in leaves:
        fields.setdefault(tuple("#" if isinstance(p, int) and p > 0 else p for p in path), path)
    for i, path in enumerate(fields.values()):
        _attempt(root, kind, path, REPLACEMENTS[i % len(REPLACEMENTS)])

    @settings(max_examples=40, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, len(leaves) - 1), st.sampled_from(REPLACEMENTS))
    def check(index, replacement):
        _attempt(root, kind, leaves[index], replacement)

    check()


def test_the_cli_names_file_and_field_instead_of_unexpected(committed, tmp_path, capsys):
    from flows.cli import main

    root, _ = committed
    rel = f"{GEN0}/population/population.json"
    with _restored(root / rel, root / GEN0 / "MANIFEST.json"):
        (root / rel).write_text((root / rel).read_text().replace('"slot": 0', '"slot": Infinity', 1))
        _rehash(root, rel)
        capsys.readouterr()
        rc = main(["lineage", "r", "--out", str(tmp_path / "t.png"), "--storage", str(root)])
        err = capsys.readouterr().err
    assert rc == 1 and "unexpected" not in err
    assert "checkpoint error:" in err and "population.json: field lineage.0.slot is inf, expected a whole number" in err


@pytest.mark.parametrize("key", ["x", "generations/000000/shards/../../../../etc/passwd",
                                 "r/generations/000000/shards/../../../../etc/passwd", "r/run.json", "run.json",
                                 "/generations/000000/shards/0.safetensors"])
def test_a_manifest_shard_key_names_only_this_runs_own_shard_files(committed, key):
    """Found by the property test: a shard key edited to any other key of the store was followed (a StorageError
    about that key, or another run's experience read as this run's). Now the manifest field is named."""
    root, store = committed
    man = root / GEN0 / "MANIFEST.json"
    data = json.loads(man.read_text())
    assert data["shards"], "the fixture commits shards"
    data["shards"][0]["key"] = key
    with _restored(man):
        man.write_text(json.dumps(data))
        with pytest.raises(CheckpointError, match=r"MANIFEST\.json: field shards\.0\.key .* is not one of this run's "
                                                  r"shard files"):
            store.manifest(0)


def test_a_manifest_key_naming_another_runs_folder_reads_this_runs_own_file(committed):
    """Keys are relative to the run (so a copied or renamed run verifies); an older manifest's key names a run
    folder first, and whatever folder it names, the key is read as this run's own: never another run's shard."""
    root, store = committed
    man = root / GEN0 / "MANIFEST.json"
    data = json.loads(man.read_text())
    assert all(k.startswith("generations/") for k in data["files"]), "keys are written relative to the run"
    assert all(s["key"].startswith("generations/") for s in data["shards"])
    data["shards"][0]["key"] = "other-run/" + data["shards"][0]["key"]
    with _restored(man):
        man.write_text(json.dumps(data))
        assert store.manifest(0)["shards"][0]["key"] == store.key("generations/000000/shards/0.safetensors")


def test_a_run_rebuilds_its_members_under_its_own_configs_limits(tmp_path):
    """A limit raised in the user's config holds for the whole run (members rebuilt from their state on
    restore, resume and in worker processes), not only for the config's validation: a 9,000-unit layer is over
    the default layer_width (8,192) and within the config's 10,000."""
    cfg = tiny_config(population_size=2, network={"hidden_sizes": [9000], "min_nodes": 8, "max_nodes": 9000},
                      limits={"layer_width": 10_000})
    evo = build_evolution(cfg)
    evo.population.record_fitness([1.0, 2.0])
    path = evo.save(tmp_path / "pop")
    with pytest.raises(CheckpointError, match=r"9,000 is over the limit limits\.layer_width = 8,192"):
        load_population(path)  # outside the run: the defaults
    evo.restore(path)  # the run: its config's limits
    tensors, meta = evo.population.members[0].agent.state()
    evo.load_member_state(1, tensors, meta)
    elite = evo.save_elite(tmp_path / "elite")
    with pytest.raises(CheckpointError, match=r"limits\.layer_width = 8,192; if this size is meant, raise"):
        agilerl_core.load(elite)
    assert agilerl_core.load(elite, limits={"layer_width": 10_000}).predict(np.zeros(4, np.float32)) in (0, 1)
    with pytest.raises(ConfigError, match=r"network\.hidden_sizes\[0\]: 9,000 is over the limit limits\.layer_width"):
        tiny_config(network={"hidden_sizes": [9000], "min_nodes": 8, "max_nodes": 9000})
