"""Checkpoints: round trips act and train identically; bad files give errors naming the file."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from agilerl_core.algorithms.saved import load_member, load_population
from agilerl_core.buffers.replay import Transition
from agilerl_core.errors import CheckpointError
from agilerl_core.experiment import build_evolution
from agilerl_core.hpo.population import Member
from agilerl_core.io import save_member
from tests.conftest import greedy, learn_alone, tiny_config
from tests.test_dqn import SPEC, make_dqn

ENV = {"env_id": "CartPole-v1", "env_kwargs": {}, "channels_last": None}


def _trained_member():
    agent = make_dqn(seed=3, lr=1e-2)
    from agilerl_core.buffers.replay import Transition

    obs = {"obs": torch.randn(16, 3)}
    b = Transition(obs, torch.randint(0, 2, (16,)), torch.randn(16), obs, torch.zeros(16))
    for _ in range(4):
        learn_alone(agent, b)
    type(agent).group([agent]).explore_group(obs, None)  # exploring moves the member's generator
    return Member(7, agent, 3, "hp:lr=0.01", 2, [1.0, 2.5]), b


def test_member_round_trip_acts_and_trains_identically(tmp_path):
    member, b = _trained_member()
    save_member(tmp_path / "m", member, ENV)
    loaded, env = load_member(tmp_path / "m", SPEC)
    assert env == ENV and loaded.member_id == 7 and loaded.parent_id == 3 and loaded.fitness_history == [1.0, 2.5]
    a, c = member.agent, loaded.agent
    obs = {"obs": torch.randn(64, 3)}
    explore = [type(x).group([x]).explore_group(obs, None) for x in (a, c)]
    assert torch.equal(*explore)  # same weights and the same exploration draws
    for _ in range(3):
        torch.testing.assert_close(learn_alone(a, b), learn_alone(c, b), rtol=0, atol=0)
    for p, q in zip(a.networks["q"].parameters(), c.networks["q"].parameters(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(torch.randint(0, 10**6, (5,), generator=a.torch_gen),
                       torch.randint(0, 10**6, (5,), generator=c.torch_gen))


def test_checkpoint_files_are_data_only(tmp_path):
    member, _ = _trained_member()
    save_member(tmp_path / "m", member, ENV)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["member.json", "weights.safetensors"]
    json.loads((tmp_path / "m" / "member.json").read_text())


def test_truncated_weights_are_refused(tmp_path):
    member, _ = _trained_member()
    path = save_member(tmp_path / "m", member, ENV)
    w = path / "weights.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"weights\.safetensors.*(checksum|truncated)"):
        load_member(path, SPEC)


def test_tampered_weights_are_refused(tmp_path):
    member, _ = _trained_member()
    path = save_member(tmp_path / "m", member, ENV)
    w = path / "weights.safetensors"
    data = bytearray(w.read_bytes())
    data[-5] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"weights\.safetensors: checksum mismatch"):
        load_member(path, SPEC)


def test_foreign_files_are_refused(tmp_path):
    member, _ = _trained_member()
    path = save_member(tmp_path / "m", member, ENV)
    (path / "member.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CheckpointError, match=r"member\.json: not a agilerl-flow/member file"):
        load_member(path, SPEC)
    (path / "member.json").write_bytes(pickle.dumps({"format": "agilerl-flow/member"}))
    with pytest.raises(CheckpointError, match=r"member\.json: not valid JSON"):
        load_member(path, SPEC)
    with pytest.raises(CheckpointError, match=r"nowhere.*member\.json: file not found"):
        load_member(tmp_path / "nowhere", SPEC)


def test_weights_replaced_by_a_pickle_are_refused(tmp_path):
    member, _ = _trained_member()
    path = save_member(tmp_path / "m", member, ENV)
    blob = pickle.dumps({"w": torch.zeros(3)})
    (path / "weights.safetensors").write_bytes(blob)
    meta = json.loads((path / "member.json").read_text())
    import hashlib

    meta["files"]["weights.safetensors"] = hashlib.sha256(blob).hexdigest()  # even with a matching checksum
    (path / "member.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"weights\.safetensors: not a readable safetensors file"):
        load_member(path, SPEC)


def test_population_round_trip_continues_identically(tmp_path):
    cfg = tiny_config(max_env_steps=10_000)
    a = build_evolution(cfg)
    a.run_generation()
    a.save(tmp_path / "pop")
    b = build_evolution(cfg)
    b.restore(tmp_path / "pop")
    ba, bb = a.arena.buffer, b.arena.buffer
    assert bb.size == ba.size and torch.equal(bb.committed()["reward"], ba.committed()["reward"])
    for exp in (a, b):
        exp.evolve()
        exp.run_generation()
    assert [h.fitnesses for h in a.history] == [h.fitnesses for h in b.history]
    assert [e.to_dict() for e in a.population.lineage] == [e.to_dict() for e in b.population.lineage]
    for ma, mb in zip(a.population.members, b.population.members, strict=True):
        for p, q in zip(ma.agent.networks["q"].parameters(), mb.agent.networks["q"].parameters(), strict=True):
            assert torch.equal(p, q)


def test_population_file_errors_name_the_file(tmp_path):
    cfg = tiny_config()
    exp = build_evolution(cfg)
    exp.run_generation()
    path = exp.save(tmp_path / "pop")
    buf = path / "buffer.safetensors"
    buf.write_bytes(buf.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=r"buffer\.safetensors: checksum mismatch"):
        load_population(path, exp.arena.obs_spec, exp.arena.buffer)
    (path / "population.json").write_text("{ truncated")
    with pytest.raises(CheckpointError, match=r"population\.json: not valid JSON"):
        load_population(path, exp.arena.obs_spec)


OLD = Path(__file__).parent / "golden" / "checkpoints-1f282c8"  # written by make.py under commit 1f282c8


@pytest.mark.parametrize("name", ["dqn", "rainbow", "cqn", "td3", "sac", "cql", "ppo"])
def test_checkpoints_written_before_population_first_algorithms_load(name):
    """Members saved by the previous main (one implementation per algorithm came after it) load, act exactly as
    they acted then, keep their records and optimiser state, and learn on."""
    import numpy as np
    from gymnasium import spaces

    from agilerl_core.envs.spaces import ObsSpec

    expected = json.loads((OLD / "expected.json").read_text())
    member, _ = load_member(OLD / name, ObsSpec(spaces.Box(-1, 1, (3,), np.float32)))
    agent = member.agent
    assert (member.member_id, member.parent_id, member.born, member.fitness_history) == (7, 3, 2, [1.5])
    obs = {"obs": torch.tensor(expected["obs"])}
    np.testing.assert_allclose(greedy(agent, obs), np.asarray(expected[name]), rtol=1e-6, atol=1e-6)
    if name == "ppo":
        return
    assert agent.learn_steps == 3 and all(bool((o.beta1_pow < 1.0).all()) for o in agent.optimizers.values())
    before = {n: o.flat.clone() for n, o in agent.optimizers.items()}
    g = torch.Generator().manual_seed(1)
    action = torch.randint(0, 2, (8,), generator=g) if agent.action_spec.discrete else torch.rand(8, 2, generator=g)
    loss = learn_alone(agent, Transition({"obs": torch.rand(8, 3, generator=g)}, action, torch.randn(8, generator=g),
                                  {"obs": torch.rand(8, 3, generator=g)}, torch.zeros(8)))
    assert torch.isfinite(loss) and agent.learn_steps == 4
    assert any(not torch.equal(before[n], o.flat) for n, o in agent.optimizers.items())
