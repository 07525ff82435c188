"""LoRA members learning offline from recorded Wordle games (``llm_bc``, ``llm_ilql``): the games as the member's
token sequences, ILQL's token-level losses on hand numbers, the heads' soft targets and checkpoints, acting with
``logits + beta (Q' - V)``, and the refusals of bad configs and files."""

from __future__ import annotations

import json
import math
import string

import pytest
import torch

from agilerl_core.errors import ConfigError, DatasetError
from agilerl_core.experiment import build_evolution
from agilerl_core.language.games import describe_games, write_games
from agilerl_core.language.players import parse_mix, play_games
from agilerl_core.language.wordle import word_list
from agilerl_core.llm.ilql import GameTranscripts, ilql_token_terms, own_first
from agilerl_core.llm.sampling import RowBlock, pad_prompts, sample
from tasks.config import validate_config

TINY = {"config": {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 512,
                   "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0},
        "tokenizer_chars": string.ascii_letters + string.digits + " -!>.,;:'\n",
        "lora": {"rank": 4, "alpha": 8, "targets": ["c_attn", "c_proj", "c_fc"]}}
GAME = {"vocabulary": 60, "max_guesses": 3}


def _cfg(algorithm: str = "llm_ilql", games: dict | None = None, **over):
    data = {"name": "wordle-offline", "kind": "llm", "algorithm": algorithm, "population_size": 2, "seed": 0,
            "model": TINY, "dataset": {"source": "wordle", "options": GAME, "held_out": 0.2,
                                       "games": games or {"games": 30}},
            "hyperparameters": {"lr": 0.01, "batch_size": 4, "max_new_tokens": 6},
            "evo_steps": 8, "max_env_steps": 32, "eval_prompts": 3}
    data.update(over)
    return validate_config(data)


# ---- the losses on hand numbers -------------------------------------------------------------------------------------
def test_ilql_token_terms_on_hand_numbers():
    # one game of three member tokens (then padding); two actions
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    action = torch.tensor([[0, 1, 0, 0]])
    reward = torch.tensor([[0.0, -1.0, 0.0, 0.0]])
    v = torch.tensor([[1.0, 2.0, 4.0, 9.0]])
    q = torch.tensor([[[3.0, 0.0], [1.0, 2.0], [0.0, 5.0], [7.0, 7.0]]])
    t1 = torch.tensor([[[2.0, 0.0], [0.0, 3.0], [1.0, 0.0], [0.0, 0.0]]])
    t2 = torch.tensor([[[4.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.0]]])
    out = ilql_token_terms([q], v, [t1, t2], action, reward, mask, gamma=0.5, expectile=0.8)
    # target Q of the data's tokens: min(2, 4) = 2, min(3, 1) = 1, min(1, 2) = 1; minus V: 1, -1, -3
    assert math.isclose(out["v"].item(), 0.8 * 1 + 0.2 * 1 + 0.2 * 9, rel_tol=1e-6)
    # TD targets: 0 + 0.5 V(s1) = 1, -1 + 0.5 V(s2) = 1, terminal 0; Q taken: 3, 2, 0
    assert math.isclose(out["q"].item(), (3 - 1) ** 2 + (2 - 1) ** 2 + 0.0, rel_tol=1e-6)
    lse = [math.log(math.exp(3) + 1), math.log(math.exp(1) + math.exp(2)), math.log(1 + math.exp(5))]
    assert math.isclose(out["cql"].item(), (lse[0] - 3) + (lse[1] - 2) + (lse[2] - 0), rel_tol=1e-6)


def test_own_first_keeps_the_members_tokens_in_order():
    own = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.float32)
    order, mask = own_first(own, 3)
    assert order[0].tolist() == [0, 1, 4] and mask.tolist() == [[1, 1, 1], [1, 0, 0]] and order[1, 0] == 1


def test_a_recorded_game_becomes_the_members_tokens_and_the_envs():
    exp = build_evolution(_cfg())
    data = exp.arena.train_data
    assert isinstance(data, GameTranscripts) and len(data) == 30
    game = exp.arena.train_data
    tok = exp.arena.base.tokenizer
    eos = exp.arena.base.eos_id
    ids, mask, comp, cmask, own, reward = data.batch([0], "cpu")
    seq, mine = comp[0][cmask[0].bool()].tolist(), own[0][cmask[0].bool()].bool().tolist()
    guesses = tok.decode([t for t, m in zip(seq, mine, strict=True) if m and t != eos])
    record = next(iter(play_games(parse_mix("random:0.2,solver:0.3,noisy_solver_0.5:0.5", word_list(60, 0.2)),
                                  word_list(60, 0.2).train, word_list(60, 0.2), 30, 0, 3)))
    assert guesses == "".join(record.guesses)  # the members' tokens are the guesses, each ended by EOS
    assert sum(t == eos for t, m in zip(seq, mine, strict=True) if m) == len(record.guesses)
    assert " -> " in tok.decode([t for t, m in zip(seq, mine, strict=True) if not m])  # the env's answers, context
    ends = [i for i, m in enumerate(mine) if m and seq[i] == eos]
    assert reward[0, ends].tolist() == list(record.rewards) and reward[0].sum().item() == record.total_return
    assert game.prompt_ids[0] == ids[0][mask[0].bool()].tolist()


# ---- members --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["llm_bc", "llm_ilql"])
def test_members_learn_from_games_and_are_judged_by_greedy_games(algorithm):
    exp = build_evolution(_cfg(algorithm))
    arena = exp.arena
    members = arena.build_members([1, 2])
    before = [float(m.trainable()[0].detach().abs().sum()) for m in members]
    results = arena.train_group(members, [0, 1], [5, 6], 8)
    assert all(r.env_steps == 8 and r.learn_steps == 2 and math.isfinite(r.mean_loss) for r in results)
    assert {"bc", "loss", "grad_norm"} <= set(results[0].metrics)
    if algorithm == "llm_ilql":
        assert {"q", "v", "cql"} <= set(results[0].metrics)
    assert [float(m.trainable()[0].detach().abs().sum()) for m in members] != before
    fitness = arena.evaluate_group(members, 0, [0, 1])
    assert all(-3.0 <= f <= 0.0 for f in fitness) and 0 <= members[0].eval_metrics["win_rate"] <= 1


def test_a_member_learns_the_same_alone_or_in_a_group():
    arena = build_evolution(_cfg()).arena
    group = arena.build_members([1, 2])
    arena.train_group(group, [0, 1], [5, 6], 8)
    alone = arena.build_members([1])[0]
    arena.train_group([alone], [0], [5], 8)
    for a, b in zip(alone.trainable(), group[0].trainable(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_ilql_targets_follow_softly_and_travel_with_the_member():
    arena = build_evolution(_cfg(hyperparameters={"lr": 0.01, "batch_size": 4, "max_new_tokens": 6,
                                                  "tau": 0.25})).arena
    member = arena.build_members([3])[0]
    assert {"target.q1.weight", "target.q2.weight", "v.weight"} <= set(member.head)
    assert not any(n.startswith("head.target.") for n in member.trainable_names())  # Adam never steps the targets
    arena.train_group([member], [0], [4], 4)  # one learn step: targets move a quarter of the way from 0
    torch.testing.assert_close(member.head["target.q1.weight"], 0.25 * member.head["q1.weight"].detach())
    tensors, meta = member.state()
    back = type(member).from_state(arena.base, tensors, json.loads(json.dumps(meta)))
    assert all(torch.equal(back.head[k], member.head[k]) for k in member.head)
    twin = member.clone()
    twin.head["target.q1.weight"].data.add_(1.0)
    assert not torch.equal(twin.head["target.q1.weight"], member.head["target.q1.weight"])
    bad = dict(tensors)
    bad.pop("head.target.q2.bias")
    with pytest.raises(Exception, match="head tensors"):
        type(member).from_state(arena.base, bad, meta)


def test_acting_adds_beta_times_q_minus_v_to_the_logits():
    arena = build_evolution(_cfg()).arena
    member = arena.build_members([0])[0]
    base = arena.base
    ids, mask = pad_prompts([base.encode(["Let us play"], False)[0]], base.pad_id)
    with base.bound(member.adapter) as model:
        plain, _ = sample(model, ids, mask, 1, 0.0, base.eos_id, base.pad_id)
        member.hp.beta = 0.0
        assert member.logit_adjust() is None
        member.hp.beta = 100.0
        favoured = int(base.tokenizer.encode("z", add_special_tokens=False)[0])
        emb = base.model.get_output_embeddings().weight.detach()
        with torch.no_grad():  # Q' = E b: b along token z's embedding makes z's Q the largest by far
            for n in ("q1", "q2"):
                member.head[f"target.{n}.bias"].copy_(emb[favoured] / emb[favoured].norm() * 10)
        steered, _ = sample(model, ids, mask, 1, 0.0, base.eos_id, base.pad_id,
                            blocks=[RowBlock(slice(0, 1), 0.0, None, member.logit_adjust())])
    assert steered[0, 0].item() == favoured != plain[0, 0].item()


# ---- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("over, pattern", [
    ({"dataset": {"uri": "x.jsonl"}}, "llm_ilql learns from recorded games; set dataset.source: wordle"),
    ({"algorithm": "grpo", "hyperparameters": {"lr": 0.01}}, "dataset.games: grpo plays its own games"),
    ({"dataset": {"uri": "x.jsonl", "games": {"games": 3}}}, "games: recorded games are Wordle's"),
])
def test_offline_game_config_refusals_name_the_field(over, pattern):
    with pytest.raises((ConfigError, ValueError), match=pattern):
        _cfg(**over)


def test_a_games_file_of_another_game_or_tampered_is_refused(tmp_path):
    words = word_list(60, 0.2)
    records = play_games(parse_mix("solver:1", words), words.train, words, 6, 0, 3)
    other = tmp_path / "other.jsonl"
    write_games(other, records, describe_games(words, 60, 0.2, 4, 0, "solver:1", records))
    with pytest.raises(DatasetError, match=r"max_guesses 4.*dataset.options.max_guesses is 3"):
        build_evolution(_cfg(games={"uri": str(other)}))
    good = tmp_path / "good.jsonl"
    write_games(good, records, describe_games(words, 60, 0.2, 3, 0, "solver:1", records))
    exp = build_evolution(_cfg(games={"uri": str(good)}))
    assert exp.arena.env_desc["dataset"]["games"]["games"] == 6
    lines = good.read_text().splitlines()
    row = json.loads(lines[1])
    row["feedbacks"][0] = "GGGGG" if row["feedbacks"][0] != "GGGGG" else "-----"
    (tmp_path / "bad.jsonl").write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    with pytest.raises(DatasetError, match="line 2"):
        build_evolution(_cfg(games={"uri": str(tmp_path / "bad.jsonl")}))
    with pytest.raises(DatasetError, match="sha256|content hash|expected"):
        build_evolution(_cfg(games={"uri": str(good), "sha256": "0" * 64}))


def test_one_q_head_members_clone_reload_and_change_rank():
    arena = build_evolution(_cfg(hyperparameters={"lr": 0.01, "batch_size": 4, "max_new_tokens": 6,
                                                  "two_q": False})).arena
    member = arena.build_members([3])[0]
    assert not any(n.startswith("head.q2") for n in member.trainable_names())  # kept for the checkpoint's shape
    arena.train_group([member], [0], [4], 4)
    twin = member.clone()
    tensors, meta = member.state()
    back = type(member).from_state(arena.base, tensors, json.loads(json.dumps(meta)))
    assert all(torch.equal(a, b) for a, b in zip(back.trainable(), member.trainable(), strict=True))
    twin.set_rank(8, 0)
    assert twin.adapter.rank == 8
    arena.train_group([twin], [0], [5], 4)


def test_damaged_head_tensors_are_refused():
    from agilerl_core.errors import CheckpointError

    arena = build_evolution(_cfg()).arena
    member = arena.build_members([3])[0]
    tensors, meta = member.state()
    for bad in (torch.full_like(tensors["head.v.bias"], float("nan")), tensors["head.v.bias"].long()):
        with pytest.raises(CheckpointError, match="head.v.bias"):
            type(member).from_state(arena.base, {**tensors, "head.v.bias": bad}, meta)


def test_a_games_file_with_another_split_names_dataset_held_out(tmp_path):
    words = word_list(60, 0.3)
    records = play_games(parse_mix("solver:1", words), words.train, words, 4, 0, 3)
    path = tmp_path / "split.jsonl"
    write_games(path, records, describe_games(words, 60, 0.3, 3, 0, "solver:1", records))
    with pytest.raises(DatasetError, match=r"this config's dataset.held_out is 0.2; set dataset.held_out: 0.3"):
        build_evolution(_cfg(games={"uri": str(path)}))
