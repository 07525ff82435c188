"""Committed generations: manifest last, verified loads, exact buffer rebuild, retention, resume."""

from __future__ import annotations

import json

import pytest
import torch

from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.buffers.rebuild import ring_after
from agilerl_core.errors import CheckpointError, ConfigError
from agilerl_core.experiment import build_evolution
from agilerl_core.io.run_store import RunStore, check_run_id
from agilerl_core.io.storage import LocalStorage
from tests.conftest import commit_generations, tiny_config

_run = commit_generations  # as other test files import it


def _weights(exp):
    return [m.agent.state()[0] for m in exp.population.members]


def test_run_ids_are_checked():
    assert check_run_id("cartpole-s0_1.x") == "cartpole-s0_1.x"
    for bad in ("", "../x", "a/b", "-x", "a b"):
        with pytest.raises(ConfigError, match="run id"):
            check_run_id(bad)


def test_ring_arithmetic_matches_the_buffer():
    exp = build_evolution(tiny_config(**{"hyperparameters.buffer_size": 700}))
    size, pos = 0, 0
    for _ in range(3):
        exp.run_generation()
        size, pos = ring_after(size, pos, 700, 3 * 200)
        assert (exp.arena.buffer.size, exp.arena.buffer.pos) == (size, pos)


def test_generation_without_manifest_did_not_happen(tmp_path):
    store = RunStore(LocalStorage(tmp_path), "r")
    exp = build_evolution(tiny_config())
    _run(exp, store, 2)
    assert store.committed_generations() == [0, 1]
    # a crash mid-commit of generation 2: members written, no manifest
    store.storage.put_bytes("r/generations/000002/population/population.json", b"{half")
    store.storage.put_bytes("r/generations/000002/shards/0.safetensors", b"junk")
    assert store.latest_generation() == 1
    assert store.discard_uncommitted() == [2]
    assert store.storage.list("r/generations/000002/") == []


@pytest.mark.parametrize("selection", [{}, {"population_size": 4, "selection.method": "multi_frequency",
                                             "selection.periods": [1, 3]}], ids=["tournament", "multi_frequency"])
def test_resume_from_store_continues_bit_identically(tmp_path, selection):
    # a small ring so that it wraps: the rebuilt buffer must keep the ring layout, not just the rows; a slow
    # subpopulation's rhythm (evolving after generation 2 only) must carry over the resume
    cfg = tiny_config(**{"hyperparameters.buffer_size": 1000, **selection})
    ref = build_evolution(cfg)
    _run(ref, RunStore(LocalStorage(tmp_path / "a"), "r"), 4)

    store = RunStore(LocalStorage(tmp_path / "b"), "r")
    first = build_evolution(cfg)
    _run(first, store, 2)
    resumed = build_evolution(cfg)
    resumed.resume(store, store.latest_generation())
    assert (resumed.arena.buffer.size, resumed.arena.buffer.pos) == (first.arena.buffer.size, first.arena.buffer.pos)
    for k in first.arena.buffer.fields:
        torch.testing.assert_close(resumed.arena.buffer._storage[k][:1000], first.arena.buffer._storage[k][:1000], rtol=0, atol=0)
    _run(resumed, store, 2)
    assert [h.fitnesses for h in resumed.history] == [h.fitnesses for h in ref.history]
    assert [e.to_dict() for e in resumed.population.lineage] == [e.to_dict() for e in ref.population.lineage]
    for wa, wb in zip(_weights(resumed), _weights(ref), strict=True):
        for k in wa:
            assert torch.equal(wa[k], wb[k]), k


def test_tampered_committed_files_are_refused(tmp_path):
    store = RunStore(LocalStorage(tmp_path), "r")
    _run(build_evolution(tiny_config()), store, 1)
    path = tmp_path / "r/generations/000000/population/population.json"
    data = json.loads(path.read_text())
    data["generation"] = 5
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="population.json: checksum mismatch with the generation manifest"):
        store.load_generation(0, algorithms=get_algorithm)
    shard = tmp_path / "r/generations/000000/shards/1.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    exp = build_evolution(tiny_config())
    with pytest.raises(CheckpointError, match="shards/1.safetensors: checksum mismatch"):
        store.rebuild_buffer(0, exp.arena.buffer)


def test_retention_keeps_last_k_every_elite_and_the_buffer_window(tmp_path):
    # 3 members x 200 steps = 600 rows per generation; a 1000-row buffer needs the last 2 generations' shards
    cfg = tiny_config(**{"hyperparameters.buffer_size": 1000, "max_env_steps": 10_000})
    store = RunStore(LocalStorage(tmp_path), "r")
    exp = build_evolution(cfg)
    _run(exp, store, 5)
    assert store.prune(keep=2) == [0, 1, 2]
    for g in range(5):
        m = store.manifest(g)
        members = {k.split("/members/")[1].split("/")[0] for k in m["files"] if "/members/" in k}
        if g < 3:
            assert m["pruned"] and members == {str(m["elite_slot"])}  # only the elite survives
            with pytest.raises(CheckpointError, match="pruned"):
                store.load_generation(g, algorithms=get_algorithm)
            store.load_elite(g, algorithms=get_algorithm)  # ... and it loads
        else:
            assert not m["pruned"] and members == {"0", "1", "2"}
        on_disk = set(store.storage.list(f"r/generations/{g:06d}/"))
        assert set(m["files"]) <= on_disk
        assert bool(m["shards"]) == (g >= 3)
    # the buffer can still be rebuilt after pruning
    fresh = build_evolution(cfg)
    fresh.resume(store, 4)
    assert fresh.arena.buffer.size == exp.arena.buffer.size and fresh.arena.buffer.pos == exp.arena.buffer.pos
    assert store.prune(keep=2) == []  # idempotent


def test_a_run_keeps_its_config(tmp_path):
    store = RunStore(LocalStorage(tmp_path), "r")
    cfg = tiny_config().model_dump(mode="json")
    assert store.init_run(cfg) is True
    assert store.init_run({**cfg, "storage": {"uri": "elsewhere"}}) is False  # where it is stored may change
    with pytest.raises(ConfigError, match="different config .differs in: seed"):
        store.init_run({**cfg, "seed": 7})
