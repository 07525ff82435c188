"""Issue 66, items 8-10: what an attacker who writes a checkpoint or a run's files (not the program) could still get
through, now refused through the public entry points in bounded time, naming the file and the tensor or field.

8. A float64 value beyond float32's range (1e300) in a DQN weight, a bandit member's weight, ``extra/ctx_mean`` or
   ``extra/sq_grads`` was finite as stored and inf once cast to the float32 members compute in: the member then
   predicted from NaN scores. Every tensor a checkpoint file brings is checked finite as float32 too.
9. A bandit member's ``extra/ctx_std`` of 1.4e-45 (positive, finite) made every score and width NaN: a scale must
   be at least the floor a table's split gives a feature's std (``agilerl_core.data.tables.STD_FLOOR``).
10. ``population.json`` with ``history[0].best_fitness: "high"`` (the manifest re-hashed so it verifies) resumed,
    trained and committed another generation, then stopped on "unexpected TypeError". Every field of every
    generation's stats (and the evolution RNG's state) is checked when the record is read, before any training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import agilerl_core
from agilerl_core.algorithms.neural_bandit import NeuralUCB
from agilerl_core.data.tables import STD_FLOOR, BanditSplit, Table
from agilerl_core.errors import CheckpointError
from agilerl_core.experiment import build_evolution
from agilerl_core.finite import check_weights
from agilerl_core.io.checkpoint import save_member
from agilerl_core.io.history import _STAT_CHECKS
from agilerl_core.io.run_store import RunStore
from agilerl_core.io.storage import LocalStorage
from agilerl_core.results import GenerationStats
from tasks.config import validate_config
from tests.conftest import commit_generations, tiny_config

GEN0 = "r/generations/000000"
POP = f"{GEN0}/population/population.json"


def _bandit_config():
    return validate_config({"kind": "bandit", "name": "bandit-r4", "algorithm": "neural_ucb",
                            "data": {"source": "sklearn:iris"}, "population_size": 2, "num_envs": 4, "evo_steps": 64,
                            "max_env_steps": 128, "hyperparameters": {"batch_size": 16, "learning_delay": 16},
                            "network": {"hidden_sizes": [8], "min_nodes": 2}})


# ---- fixtures: a saved DQN member, a saved bandit member, a committed run; made once ----------------------------
@pytest.fixture(scope="module")
def members(tmp_path_factory):
    """Member directories as a run saves them: ``dqn`` (CartPole) and ``bandit`` (NeuralUCB on sklearn:iris, its
    context scaling from the table's split)."""
    root = tmp_path_factory.mktemp("members")
    dqn = build_evolution(tiny_config(population_size=1, num_envs=2))
    bandit = build_evolution(_bandit_config())
    return {"dqn": save_member(root / "dqn", dqn.population.members[0], dqn.arena.env_desc),
            "bandit": save_member(root / "bandit", bandit.population.members[0], bandit.arena.env_desc)}


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A run `r` with generation 0 trained, evaluated and committed (manifest, population.json, members, shards),
    and an evolution of the same config to resume it with."""
    root = tmp_path_factory.mktemp("store")
    store = RunStore(LocalStorage(root), "r")
    cfg = tiny_config(population_size=2, num_envs=2, evo_steps=64, max_env_steps=256,
                      **{"hyperparameters.learning_delay": 16})
    commit_generations(build_evolution(cfg), store)
    return root, store, build_evolution(cfg)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refused_fast(fn, match: str, error: type[Exception] = CheckpointError) -> str:
    """`fn` raises `error` matching `match` within 2 s; returns the message."""
    t0 = time.perf_counter()
    with pytest.raises(error, match=match) as err:
        fn()
    assert time.perf_counter() - t0 < 2.0
    return str(err.value)


def _forged(member: Path, dest: Path, edit) -> Path:
    """A copy of member directory `member` whose weights are `edit(tensors)`, its checksum recorded again in
    member.json (so the checksum passes and the tensor checks are what is tested)."""
    dest.mkdir()
    tensors = load_file(str(member / "weights.safetensors"))
    save_file(edit(dict(tensors)), str(dest / "weights.safetensors"))
    meta = json.loads((member / "member.json").read_text())
    meta["files"]["weights.safetensors"] = _sha(dest / "weights.safetensors")
    (dest / "member.json").write_text(json.dumps(meta))
    return dest


def _with(name: str, value: torch.Tensor):
    return lambda tensors: {**tensors, name: value}


def _weight(tensors: dict[str, torch.Tensor]) -> str:
    return next(k for k in sorted(tensors) if k.startswith("net/") and k.endswith(".weight"))


# ---- item 8: float64 beyond float32's range -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dqn", "bandit"])
@pytest.mark.parametrize("value", [1e300, -1e39])
def test_a_float64_weight_beyond_float32s_range_is_refused_naming_file_tensor_and_dtype(members, tmp_path, kind,
                                                                                        value):
    tensors = load_file(str(members[kind] / "weights.safetensors"))
    name = _weight(tensors)
    bad = tensors[name].double()
    bad.view(-1)[0] = value  # finite as float64, inf as float32
    forged = _forged(members[kind], tmp_path / "m", _with(name, bad))
    message = _refused_fast(lambda: agilerl_core.load(forged), "beyond float32's range")
    assert f"{forged / 'weights.safetensors'}: tensor {name!r} is float64" in message
    assert f"{abs(value):.3g}" in message and "load an earlier generation" in message


def test_a_float64_weight_within_float32s_range_loads_as_data(members, tmp_path):
    tensors = load_file(str(members["dqn"] / "weights.safetensors"))
    name = _weight(tensors)
    policy = agilerl_core.load(_forged(members["dqn"], tmp_path / "m", _with(name, tensors[name].double() * 2)))
    check_weights(policy.agent, 0)  # finite as the float32 it computes in
    assert policy.predict(np.zeros(4, np.float32)) in (0, 1)


@pytest.mark.parametrize("extra", ["extra/ctx_mean", "extra/sq_grads"])
def test_a_bandit_members_float64_extras_beyond_float32s_range_are_refused(members, tmp_path, extra):
    tensors = load_file(str(members["bandit"] / "weights.safetensors"))
    bad = tensors[extra].double()
    bad[0] = 1e300
    forged = _forged(members["bandit"], tmp_path / "m", _with(extra, bad))
    message = _refused_fast(lambda: agilerl_core.load(forged), "beyond float32's range")
    assert f"tensor {extra!r} is float64" in message and str(forged / "weights.safetensors") in message
    # the member's own check holds where state arrives without a file (a process runner's member state)
    agent = agilerl_core.load(members["bandit"]).agent
    state, meta = agent.state()
    with pytest.raises(ValueError, match=f"{extra}: .*float32"):
        NeuralUCB.from_state(agent.obs_spec, {**state, extra: bad}, meta)


def test_a_buffer_file_goes_through_the_same_check(committed, tmp_path):
    """Every loader of a checkpoint's tensors shares one check: a saved population's replay buffer with a float64
    1e300 value is refused naming buffer.safetensors and the tensor."""
    _, store, evo = committed
    evo.resume(store, 0)  # the committed experience in the buffer
    path = evo.save(tmp_path / "pop")
    data = load_file(str(path / "buffer.safetensors"))
    name = next(k for k in sorted(data) if data[k].is_floating_point())
    bad = data[name].double()
    bad.view(-1)[0] = 1e300
    save_file({**data, name: bad}, str(path / "buffer.safetensors"))
    meta = json.loads((path / "population.json").read_text())
    meta["files"]["buffer.safetensors"] = _sha(path / "buffer.safetensors")
    (path / "population.json").write_text(json.dumps(meta))
    _refused_fast(lambda: evo.restore(path), rf"buffer\.safetensors: tensor {name!r} is float64 .*beyond float32's "
                                             rf"range")


def test_a_committed_shard_goes_through_the_same_check(committed):
    """The run's experience shards (read on resume and by every worker) too: a committed shard with a float64 1e300
    reward, its hash recorded again in the manifest, is refused naming the shard and the tensor."""
    root, store, evo = committed
    shard, man = root / GEN0 / "shards" / "0.safetensors", root / GEN0 / "MANIFEST.json"
    saved = {p: p.read_bytes() for p in (shard, man)}
    try:
        data = load_file(str(shard))
        name = next(k for k in sorted(data) if data[k].is_floating_point())
        bad = data[name].double()
        bad.view(-1)[0] = 1e300
        save_file({**data, name: bad}, str(shard))
        text = man.read_text()
        for old in {hashlib.sha256(saved[shard]).hexdigest()}:  # wherever the manifest names the shard's hash
            text = text.replace(old, _sha(shard))
        man.write_text(text)
        _refused_fast(lambda: evo.resume(store, 0), rf"0\.safetensors: tensor {name!r} is float64 .*beyond float32's "
                                                    rf"range")
    finally:
        for p, b in saved.items():
            p.write_bytes(b)


# ---- item 9: a context scale below the split's floor ----------------------------------------------------------
@pytest.mark.parametrize("scale", [1.4e-45, 1e-9, 0.0])
def test_a_ctx_std_below_the_splits_floor_is_refused_naming_the_tensor(members, tmp_path, scale):
    tensors = load_file(str(members["bandit"] / "weights.safetensors"))
    std = tensors["extra/ctx_std"].clone()
    std[1] = scale
    forged = _forged(members["bandit"], tmp_path / "m", _with("extra/ctx_std", std))
    message = _refused_fast(lambda: agilerl_core.load(forged), rf"extra/ctx_std: every scale must be at least "
                                                               rf"{STD_FLOOR:g}")
    assert str(forged / "weights.safetensors") in message


def test_the_floor_is_the_splits_own_and_a_scale_at_it_loads(members, tmp_path):
    """BanditSplit.of scales a column whose std is at most STD_FLOOR by 1; a std just above it is kept, and a member
    carrying it (as float32) loads and pulls finite scores."""
    x = np.stack([np.array([0.0, 1.0] * 10), np.array([0.0, STD_FLOOR * 6] * 10), np.array([0.0, STD_FLOOR] * 10)],
                 axis=1).astype(np.float32)
    split = BanditSplit.of(Table(x, np.zeros(20, np.int64), ("a", "b"), "test", None), 0.25, 0)
    assert split.std[2] == 1.0 and STD_FLOOR < split.std[1] < 1e-6  # at most the floor: scaled by 1; above: kept
    tensors = load_file(str(members["bandit"] / "weights.safetensors"))
    std = tensors["extra/ctx_std"].clone()
    std[:] = torch.tensor(STD_FLOOR, dtype=torch.float32)
    policy = agilerl_core.load(_forged(members["bandit"], tmp_path / "m", _with("extra/ctx_std", std)))
    assert torch.equal(policy.agent.ctx_std, std)


def test_a_ctx_mean_that_overflows_over_its_scale_is_refused(members, tmp_path):
    tensors = load_file(str(members["bandit"] / "weights.safetensors"))
    mean, std = tensors["extra/ctx_mean"].clone(), tensors["extra/ctx_std"].clone()
    mean[0], std[0] = 3e38, 1e-6  # each finite, their ratio inf as float32
    forged = _forged(members["bandit"], tmp_path / "m", lambda t: {**t, "extra/ctx_mean": mean, "extra/ctx_std": std})
    _refused_fast(lambda: agilerl_core.load(forged), "extra/ctx_mean, extra/ctx_std: a mean over its scale overflows")


# ---- item 10: every field of population.json's history and RNG ------------------------------------------------
def _resume_with(committed, edit) -> None:
    """Resume generation 0 from a population.json edited by `edit(record)`, the manifest re-hashed; the original
    files are put back afterwards."""
    root, store, evo = committed
    pop, man = root / POP, root / GEN0 / "MANIFEST.json"
    saved = {p: p.read_bytes() for p in (pop, man)}
    try:
        record = json.loads(pop.read_text())
        edit(record)
        pop.write_text(json.dumps(record))
        manifest = json.loads(man.read_text())
        manifest["files"][POP.split("/", 1)[1]] = _sha(pop)
        man.write_text(json.dumps(manifest))
        evo.resume(store, 0)
    finally:
        for p, b in saved.items():
            p.write_bytes(b)


def _set(path: tuple, value):
    def edit(record):
        node = record["extra"]["history"][0]
        for p in path[:-1]:
            node = node[p]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return edit


_DELETE = object()
_WRONG = ["high", None, True, {"a": 1}, [["x"]]]  # wrong-typed for every field of a generation's stats
_FIELDS = [f.name for f in dataclasses.fields(GenerationStats)]


def test_best_fitness_high_is_refused_on_resume_naming_file_and_field(committed):
    root, store, evo = committed
    before = (evo.population, evo.history)
    _refused_fast(lambda: _resume_with(committed, _set(("best_fitness",), "high")),
                  r"population\.json: field extra\.history\.0\.best_fitness is 'high', not a number")
    assert evo.population is before[0] and evo.history is before[1]  # the evolution stays as it was: nothing ran
    evo.resume(store, 0)  # the untampered record resumes, its history exactly as committed
    stored = json.loads((root / POP).read_text())["extra"]["history"]
    assert [dataclasses.asdict(h) for h in evo.history] == stored
    evo.evolve()
    assert evo.run_generation().generation == 1 and np.isfinite(evo.best_fitness())


def test_every_field_of_a_generations_stats_has_a_check():
    assert set(_STAT_CHECKS) == set(_FIELDS)


@pytest.mark.parametrize("name", _FIELDS)
def test_every_field_of_history_wrong_typed_is_refused_on_resume(committed, name):
    """Property: each field of history[0] set to each value of a wrong type, to a wrong-typed first item (lists),
    or out of range; loading raises CheckpointError naming population.json and the field, never another error."""
    record = json.loads((committed[0] / POP).read_text())["extra"]["history"][0]
    cases = [((name,), v) for v in _WRONG]
    if isinstance(record.get(name), list):
        cases += [((name, 0), v) for v in (None, True, 1.5 if name in ("hyperparameters", "train_metrics") else
                                           {"a": 1})]
        if name in ("fitnesses", "train_returns", "mutations", "hyperparameters"):
            cases.append(((name,), record[name] + record[name][:1]))  # one entry more than the population's slots
    cases += {"generation": [((name,), -1), ((name,), 1.5)], "global_steps": [((name,), 2**60)],
              "wall_s": [((name,), -1.0), ((name,), float("inf"))],
              "train_metrics": [((name, 0, "loss"), "x")], "groups": [((name, 0, 0), 99), ((name, 0), [0, 0])],
              "train_metric_points": [((name, 0), [[1, {"q": "x"}]]), ((name, 0), [["1", {}]])]}.get(name, [])
    if name in ("generation", "global_steps", "fitnesses", "best_fitness", "mean_fitness", "train_returns",
                "mutations", "hyperparameters", "wall_s"):
        cases.append(((name,), _DELETE))  # a field every record holds
    for path, value in cases:
        try:
            _resume_with(committed, _set(path, value))
        except CheckpointError as err:
            assert "population.json: field extra.history.0" in str(err), (path, value, str(err))
            assert f"extra.history.0.{name}" in str(err) or "missing" in str(err), (path, value, str(err))
        else:
            raise AssertionError(f"history[0].{'.'.join(map(str, path))} = {value!r} resumed")


def test_an_unknown_or_absent_later_field_of_history(committed):
    _refused_fast(lambda: _resume_with(committed, _set(("surprise",), 1)),
                  r"field extra\.history\.0 has unknown keys 'surprise'")
    _resume_with(committed, _set(("train_metric_points",), _DELETE))  # written before the field existed: loads
    assert committed[2].history[0].train_metric_points == []


@pytest.mark.parametrize(("path", "value"), [(("extra", "global_steps"), "high"), (("extra", "history"), {}),
                                             (("rng", "state", "state"), 1.5), (("rng", "has_uint32"), 2),
                                             (("rng", "uinteger"), -1), (("rng", "bit_generator"), "MT19937")])
def test_the_run_counters_and_rng_state_are_checked_on_resume(committed, path, value):
    def edit(record):
        node = record
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    where = ".".join(path[:2]) if path[0] == "extra" else "rng"
    _refused_fast(lambda: _resume_with(committed, edit), rf"population\.json: field {where}")
