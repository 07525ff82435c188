"""Language agents on Wordle: the game tensors, the BC and ILQL losses on hand numbers, the members as evolvable
data (clone, mutate, checkpoint), learning written once for a group, and the arena's refusals of bad data."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agilerl_core.algorithms.hyperparameters.language import BCLMHyperparameters, ILQLHyperparameters
from agilerl_core.config import validate_config
from agilerl_core.errors import CheckpointError, ConfigError, DatasetError
from agilerl_core.experiment import build_evolution
from agilerl_core.hpo.evolvable import MutationSettings
from agilerl_core.language.agent import train_group
from agilerl_core.language.bc_lm import BCLM, bc_loss
from agilerl_core.language.games import describe_games, write_games
from agilerl_core.language.ilql import ILQL, expectile_loss, ilql_terms
from agilerl_core.language.players import GameRecord, parse_mix, play_games
from agilerl_core.language.tensors import GameTensors, game_tensors, sequence_length
from agilerl_core.language.wordle import CHARS, word_list
from agilerl_core.limits import applied
from agilerl_core.networks.gpt import GPTBounds, GPTSpec

SPEC = GPTSpec(len(CHARS), sequence_length(6), 1, 16, 2, 8, 32)
WORDS = word_list(60)


def _games(n: int = 40, seed: int = 0) -> list[GameRecord]:
    return play_games(parse_mix("random:0.3,solver:0.7", WORDS), WORDS.train, WORDS, n, seed)


def _batch(**fields) -> GameTensors:
    """A hand-built batch: one member, one game, three state positions, two actions."""
    base = {"ids": torch.zeros(1, 1, 3, dtype=torch.long), "act": torch.tensor([[[True, True, False]]]),
            "action": torch.tensor([[[0, 1, 0]]]), "reward": torch.tensor([[[0.0, -1.0, 0.0]]]),
            "next_state": torch.tensor([[[1, 1, 2]]]), "done": torch.tensor([[[False, True, False]]])}
    base.update(fields)
    return GameTensors(**base)


# ---- the tensors -----------------------------------------------------------------------------------------------
def test_game_tensors_place_actions_rewards_and_next_states():
    game = GameRecord("crane", ("slate", "crane"), ("---G-", "GGGGG"), (-1.0, 0.0), "hand")
    t = game_tensors([game], sequence_length(6))
    assert t.act[0].nonzero().view(-1).tolist() == [0, 1, 2, 3, 4, 12, 13, 14, 15, 16]
    letters = "abcdefghijklmnopqrstuvwxyz"
    assert [letters[a] for a in t.action[0][t.act[0]].tolist()] == list("slatecrane")
    assert t.reward[0, 4] == -1.0 and t.reward[0, 16] == 0.0 and t.reward[0].abs().sum() == 1.0
    assert t.next_state[0, :5].tolist() == [1, 2, 3, 4, 12]  # the guess's last letter leads to the next guess
    assert t.done[0].nonzero().view(-1).tolist() == [16]
    assert t.ids[0, 0] == 1 and t.ids[0, 25] == 0  # <bos> first, padding after the 24 characters


def test_game_tensors_refuse_a_game_longer_than_the_context():
    game = GameRecord("crane", ("slate",) * 6, ("---G-",) * 6, (-1.0,) * 6, "hand")
    with pytest.raises(ValueError, match="game 0: its 6 turns take 73 positions, more than the model's 40"):
        game_tensors([game], 40)


# ---- losses on hand numbers ----------------------------------------------------------------------------------------
def test_expectile_loss_weights_each_side():
    out = expectile_loss(torch.tensor([2.0, -2.0]), 0.7)
    assert out.tolist() == pytest.approx([0.7 * 4, 0.3 * 4])


def test_ilql_terms_known_answers():
    q1 = torch.tensor([[[[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]]]])
    q2 = torch.tensor([[[[2.0, 1.0], [5.0, 0.0], [0.0, 0.0]]]])
    v = torch.tensor([[[0.5, 1.0, 0.0]]])
    terms = ilql_terms([q1, q2], v, [q1, q2], _batch(), 0.99, 0.7)
    # target Q of the taken actions: min(1, 2) = 1 at t=0, min(4, 0) = 0 at t=1
    assert terms["v"].item() == pytest.approx((0.7 * 0.5**2 + 0.3 * 1.0**2) / 2)
    # TD targets: 0 + 0.99 * V(t=1) = 0.99 at t=0; the game ends after t=1: -1
    q_loss = ((1 - 0.99) ** 2 + (4 + 1) ** 2) / 2 + ((2 - 0.99) ** 2 + (0 + 1) ** 2) / 2
    assert terms["q"].item() == pytest.approx(q_loss)

    def lse(a, b):
        return math.log(math.exp(a) + math.exp(b))

    cql = ((lse(1, 2) - 1) + (lse(3, 4) - 4)) / 2 + ((lse(2, 1) - 2) + (lse(5, 0) - 0)) / 2
    assert terms["cql"].item() == pytest.approx(cql, rel=1e-6)


def test_ilql_td_target_uses_the_next_state_and_discount():
    q = torch.zeros(1, 1, 3, 2)
    v = torch.tensor([[[0.0, 0.0, 2.0]]])
    batch = _batch(act=torch.tensor([[[True, False, False]]]), next_state=torch.tensor([[[2, 1, 2]]]),
                   reward=torch.tensor([[[0.5, 0.0, 0.0]]]), done=torch.zeros(1, 1, 3, dtype=torch.bool))
    terms = ilql_terms([q], v, [q], batch, 0.9, 0.5)
    assert terms["q"].item() == pytest.approx((0.5 + 0.9 * 2.0) ** 2)


def test_bc_loss_is_the_cross_entropy_of_the_guess_letters_only():
    lm = torch.tensor([[[[0.0, math.log(3.0)], [0.0, 0.0], [9.0, -9.0]]]])
    assert bc_loss(lm, _batch()).item() == pytest.approx((math.log(4.0) + math.log(2.0)) / 2)


def test_ilql_policy_perturbs_the_language_model_by_beta_times_the_advantage():
    out = {"lm": torch.tensor([[[[1.0, 0.0]]]]), "v": torch.tensor([[[[0.5]]]])}
    target = {"q1": torch.tensor([[[[1.0, 3.0]]]]), "q2": torch.tensor([[[[2.0, 2.5]]]])}
    hp = ILQLHyperparameters(beta=2.0)
    logits = ILQL.policy_logits(out, target, [hp])
    assert logits.view(-1).tolist() == pytest.approx([1.0 + 2 * (1.0 - 0.5), 0.0 + 2 * (2.5 - 0.5)])


# ---- members -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls, hp", [(BCLM, BCLMHyperparameters()), (ILQL, ILQLHyperparameters())])
def test_state_round_trip_and_clone(cls, hp):
    a = cls.create(SPEC, hp, seed=3)
    train_group([a], game_tensors(_games(), SPEC.block_size), 2, [0])
    b = cls.from_state(*a.state())
    ta, tb = a.state()[0], b.state()[0]
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    c = a.clone()
    with torch.no_grad():
        next(c.net.parameters()).add_(1.0)
    assert not torch.equal(next(a.net.parameters()), next(c.net.parameters()))


def test_from_state_refuses_tampered_data():
    tensors, meta = ILQL.create(SPEC, ILQLHyperparameters(), seed=0).state()
    bad = dict(tensors)
    bad["net.heads.v.2.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match=r"net.heads.v.2.weight: shape \(3, 3\)"):
        ILQL.from_state(bad, meta)
    bad = dict(tensors)
    bad["net.gpt.wte.weight"] = torch.full_like(tensors["net.gpt.wte.weight"], float("nan"))
    with pytest.raises(CheckpointError, match="NaN or inf"):
        ILQL.from_state(bad, meta)
    with pytest.raises(CheckpointError, match="unexpected"):
        ILQL.from_state({**tensors, "evil": torch.zeros(1)}, meta)
    huge = {**meta, "arch": {**meta["arch"], "n_layer": 10_000, "mlp_hidden": 100_000}}
    with applied({"network_params": 10_000_000}), pytest.raises(CheckpointError, match="arch"):
        ILQL.from_state(tensors, huge)


def test_a_trained_member_mutated_then_saved_reloads_with_fresh_state_for_grown_tensors():
    a = BCLM.create(SPEC, BCLMHyperparameters(batch_size=8), seed=0)
    data = game_tensors(_games(), SPEC.block_size)
    train_group([a], data, 2, [0])
    bounds = GPTBounds(1, 3, 1, 4, 32, 128, 32)
    child = a.clone()
    what = ""
    for seed in range(10):
        what = child.mutate("architecture", np.random.default_rng(seed), MutationSettings(0.2, 0.1, bounds))
        if "grow_mlp" in what or "add_head" in what:
            break
    again = child.clone()  # what a process runner ships: state() -> from_state()
    ta, tb = child.state()[0], again.state()[0]
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), what
    assert any(k.startswith("adam.step.") for k in ta) and len([k for k in ta if k.startswith("adam.step.")]) < \
        len([k for k in ta if k.startswith("net.")])  # the grown tensors start fresh
    train_group([again], data, 1, [1])


def test_ilql_with_one_q_head_trains_and_acts():
    m = ILQL.create(SPEC, ILQLHyperparameters(two_q=False, batch_size=8), seed=0)
    assert set(m.net.heads) == {"q1", "v"} and set(m.targets) == {"q1"}
    train_group([m], game_tensors(_games(), SPEC.block_size), 2, [0])
    from agilerl_core.arenas.language import next_guesses

    assert all(len(g) == 5 for g in next_guesses(m, ["", "crane -G-Y-\n"]))
    with pytest.raises(ValueError, match="not whole turns"):
        next_guesses(m, ["crane"])


def test_from_state_refuses_bad_optimiser_state_and_counts_the_heads():
    m = ILQL.create(SPEC, ILQLHyperparameters(batch_size=8), seed=0)
    train_group([m], game_tensors(_games(), SPEC.block_size), 1, [0])
    tensors, meta = m.state()
    name = next(k for k in tensors if k.startswith("adam.exp_avg_sq."))
    with pytest.raises(CheckpointError, match="negative second moments"):
        ILQL.from_state({**tensors, name: -tensors[name] - 1.0}, meta)
    step = name.replace("exp_avg_sq", "step")
    with pytest.raises(CheckpointError, match="not a whole number of steps"):
        ILQL.from_state({**tensors, step: torch.tensor(0.5)}, meta)
    gpt_only = SPEC.param_count()
    with applied({"network_params": gpt_only + 10}), pytest.raises(CheckpointError, match="its 3 heads"):
        ILQL.from_state(tensors, meta)  # the GPT fits the limit, its heads do not


def test_growth_keeps_the_policy_and_adam_moments_of_unchanged_tensors():
    a = ILQL.create(SPEC, ILQLHyperparameters(), seed=1)
    data = game_tensors(_games(), SPEC.block_size)
    train_group([a], data, 3, [0])
    ids = data.ids[:4, :30]
    before = a.net(ids)["lm"]
    kept = a.optimizer.state[a.net.gpt.wte.weight]["exp_avg"].clone()
    bounds = GPTBounds(1, 3, 1, 4, 32, 128, 32)
    for seed in range(6):  # grow until a growth happened
        what = a.mutate("architecture", np.random.default_rng(seed), MutationSettings(0.2, 0.1, bounds))
        if any(w in what for w in ("add_layer", "add_head", "grow_mlp")):
            break
    assert torch.allclose(a.net(ids)["lm"], before, atol=1e-5), what
    assert torch.equal(a.optimizer.state[a.net.gpt.wte.weight]["exp_avg"], kept)
    train_group([a], data, 1, [1])  # the rebuilt member trains on


def test_a_member_learns_the_same_alone_or_in_a_group():
    data = game_tensors(_games(), SPEC.block_size)
    alone = [ILQL.create(SPEC, ILQLHyperparameters(lr=3e-3), seed=s) for s in (0, 1)]
    grouped = [m.clone() for m in alone]
    grouped[1].set_hyperparameter("lr", 1e-3)
    alone[1].set_hyperparameter("lr", 1e-3)
    for m, seed in zip(alone, (5, 6), strict=True):
        train_group([m], data, 4, [seed])
    train_group(grouped, data, 4, [5, 6])
    for a, b in zip(alone, grouped, strict=True):
        for (n, p), q in zip(a.net.named_parameters(), b.net.parameters(), strict=True):
            assert torch.equal(p, q), n  # exactly: each member's forward is its own


def test_bc_learns_the_data():
    data = game_tensors(_games(200), SPEC.block_size)
    m = BCLM.create(SPEC, BCLMHyperparameters(lr=3e-3, batch_size=32), seed=0)
    first = train_group([m], data, 5, [0])[0]["bc"]
    train_group([m], data, 250, [1])
    last = train_group([m], data, 50, [2])[0]["bc"]
    assert last < 0.7 * first


# ---- the arena -----------------------------------------------------------------------------------------------------
def _cfg(**over):
    data = {"kind": "language", "algorithm": "ilql", "env": {"vocabulary": 60}, "population_size": 2,
            "evo_steps": 3, "max_env_steps": 12, "eval_games": 4, "dataset": {"games": 30},
            "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "head_dim": 8, "mlp_hidden": 32, "max_mlp_hidden": 64},
            "hyperparameters": {"batch_size": 8}}
    if "dataset.uri" in over:
        del data["dataset"]["games"]  # a file's games, not played here
    for key, value in over.items():
        section, _, field = key.partition(".")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[key] = value
    return validate_config(data)


def test_an_evolution_trains_evaluates_and_reports_games():
    evo = build_evolution(_cfg())
    stats = evo.run_generation()
    assert len(stats.fitnesses) == 2 and all(-6.0 <= f <= 0.0 for f in stats.fitnesses)
    member = evo.population.members[0].agent
    assert set(member.eval_metrics) == {"win_rate", "mean_guesses", "invalid_guesses"}
    assert len(member.samples) == 3 and member.samples[0]["game"].count("\n") == len(member.samples[0]["game"]) // 12
    assert stats.train_metrics[0].keys() >= {"loss", "q", "v", "cql", "bc"}


def _file(tmp_path, records, vocabulary=60, name="games.jsonl"):
    d = describe_games(word_list(vocabulary), vocabulary, 0.2, 6, 0, "hand", records)
    return str(write_games(tmp_path / name, records, d))


def test_the_arena_reads_a_games_file_and_pins_its_hash(tmp_path):
    uri = _file(tmp_path, _games(30))
    evo = build_evolution(_cfg(**{"dataset.uri": uri}))
    sha = evo.arena.env_desc["dataset"]["sha256"]
    with pytest.raises(DatasetError, match="sha256|hash"):
        build_evolution(_cfg(**{"dataset.uri": uri, "dataset.sha256": "0" * 64}))
    build_evolution(_cfg(**{"dataset.uri": uri, "dataset.sha256": sha}))


def test_the_arena_refuses_games_on_held_out_secrets(tmp_path):
    secret = WORDS.held_out[0]
    game = GameRecord(secret, (secret,), ("GGGGG",), (0.0,), "cheat")
    with pytest.raises(DatasetError, match=f"secret '{secret}' is a held-out secret"):
        build_evolution(_cfg(**{"dataset.uri": _file(tmp_path, [*_games(5), game])}))


def test_the_arena_refuses_games_of_another_game(tmp_path):
    with pytest.raises(DatasetError, match="vocabulary 80, this config's env.vocabulary is 60"):
        w = word_list(80)
        records = play_games(parse_mix("solver:1", w), w.train, w, 5, 0)
        build_evolution(_cfg(**{"dataset.uri": _file(tmp_path, records, vocabulary=80)}))


def test_min_return_keeps_the_better_games_and_names_an_empty_choice():
    evo = build_evolution(_cfg(**{"dataset.min_return": -2.0}))
    assert all(g.total_return >= -2.0 for g in evo.arena.games)
    with pytest.raises(DatasetError, match="no game has a return of at least dataset.min_return 1.0"):
        build_evolution(_cfg(**{"dataset.min_return": 1.0}))


@pytest.mark.parametrize("over, pattern", [
    ({"mutation.activation": 0.5}, r"mutation.activation: a GPT member's activation"),
    ({"model.n_layer": 9}, r"n_layer: 9 lies outside \[min_layers, max_layers\]"),
    ({"env.max_guesses": 30}, r"env.max_guesses: .*less than or equal to 20"),
    ({"algorithm": "dqn"}, r"algorithm: dqn does not train in language experiments"),
    ({"dataset.uri": "g.jsonl", "dataset.seed": 10}, r"seed: only for games played here, but uri reads a file"),
    ({"dataset.cache_dir": "/tmp/c"}, r"cache_dir: only for an s3:// uri"),
    ({"device": "cuda"}, r"device: cuda: language agents train and play on the CPU"),
])
def test_config_refusals_name_the_field(over, pattern):
    with pytest.raises(ConfigError, match=pattern):
        _cfg(**over)


def test_eval_games_beyond_the_held_out_secrets_is_refused():
    with pytest.raises(ConfigError, match=r"eval_games: 500, but this game holds out \d+ secrets"):
        build_evolution(_cfg(eval_games=500))


def test_a_games_file_with_an_overlong_line_is_refused(tmp_path):
    uri = _file(tmp_path, _games(3))
    with open(uri, "a") as f:
        f.write('{"secret": "' + "a" * 70_000 + '"}\n')
    with pytest.raises(DatasetError, match="line 5 is longer than 65,536 bytes"):
        build_evolution(_cfg(**{"dataset.uri": uri}))


def test_bad_players_are_named():
    with pytest.raises(ConfigError, match="dataset.players"):
        build_evolution(_cfg(**{"dataset.players": "oracle:1"}))


# ---- through the flow ------------------------------------------------------------------------------------------
def test_a_language_run_through_the_cli_tracks_its_games(tmp_path, cli):
    """Through the CLI and the flow on the embedded default: MLflow has every member's win rate and mean guesses,
    a table of sample games per generation, and the champion answers transcripts with guesses. (Resuming is
    proven in process for every kind: tests/test_tasks.py.)"""
    import json
    from pathlib import Path

    import yaml

    from tests.conftest import cli_summary

    cfg = tmp_path / "wordle.yaml"
    data = _cfg(**{"name": "wordle-flow", "max_env_steps": 60, "evo_steps": 6}).model_dump(mode="json")
    cfg.write_text(yaml.safe_dump(data))
    straight = cli_summary(cli.run("run", cfg, "--run-id", "straight", "--storage", tmp_path / "store",
                                   "--no-progress", "--set", f"output_dir={tmp_path / 'out'}"))
    assert straight["generations"] == 5

    import mlflow
    import pandas as pd
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("wordle-flow").experiment_id
    children = client.search_runs([exp], filter_string=f"tags.`agilerl.parent` = '{straight['mlflow_run_id']}'")
    assert len(children) == 2
    for child in children:
        assert {"fitness", "eval.win_rate", "eval.mean_guesses", "train.q", "train.v", "train.cql", "train.bc",
                "hp.lr", "hp.expectile", "hp.beta"} <= set(child.data.metrics)
    parent = client.get_run(straight["mlflow_run_id"])
    assert parent.data.tags["agilerl.game"] == "wordle"
    tables = [a.path for a in client.list_artifacts(parent.info.run_id, "samples")]
    assert len(tables) == 5
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, tables[-1], str(tmp_path))).read_text())
    assert {"secret", "game", "return", "slot", "generation"} <= set(table["columns"])
    mlflow.set_tracking_uri(uri)
    champion = mlflow.pyfunc.load_model(straight["champion_uri"])
    out = champion.predict(pd.DataFrame({"transcript": ["", "crane -G-Y-\n"]}))
    assert len(out["guess"]) == 2 and all(len(g) == 5 and g.isalpha() for g in out["guess"])


def test_evolve_returns_a_policy_that_answers_transcripts_and_round_trips(tmp_path):
    import agilerl_core as ac

    res = ac.evolve(_cfg().model_dump(), overrides={"output_dir": str(tmp_path)}, progress=False)
    best = res.best
    assert best.kind == "language" and best.algorithm == "ilql" and best.observation_space is None
    guess = best.predict("")
    assert len(guess) == 5 and guess.isalpha() and best.predict(["", "crane -G-Y-\n"])[0] == guess
    again = ac.load(best.save(tmp_path / "saved"))
    assert again.predict(["", "crane -G-Y-\n"]) == best.predict(["", "crane -G-Y-\n"])
