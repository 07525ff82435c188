"""Multi-turn games for LLM members: whole games of Wordle played by a LoRA-adapted model (one completion per guess,
the env's feedback appended), learnt from by GRPO, REINFORCE and LLM-PPO with the loss on the model's own tokens."""

from __future__ import annotations

import string

import numpy as np
import pytest
import torch

from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution
from agilerl_core.llm.games import compacted_gae, env_text, parse_guess
from agilerl_core.llm.ppo import token_gae
from tasks.config import validate_config

TINY = {"config": {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 512,
                   "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0},
        "tokenizer_chars": string.ascii_letters + string.digits + " -!>.,;:'\n",
        "lora": {"rank": 4, "alpha": 8, "targets": ["c_attn", "c_proj", "c_fc", "lm_head"]}}


def _cfg(algorithm: str = "grpo", **over):
    data = {"name": "wordle-llm", "kind": "llm", "algorithm": algorithm, "population_size": 2, "seed": 0,
            "model": TINY, "dataset": {"source": "wordle", "options": {"vocabulary": 60, "max_guesses": 3},
                                       "held_out": 0.2},
            "hyperparameters": {"lr": 0.01, "batch_size": 2, "group_size": 3, "max_new_tokens": 6,
                                "temperature": 1.0},
            "evo_steps": 6, "max_env_steps": 24, "eval_prompts": 4}
    if algorithm == "llm_ppo":
        data["hyperparameters"].pop("group_size")
    data.update(over)
    return validate_config(data)


def test_parse_guess_takes_the_first_five_letter_run():
    assert parse_guess(" Crane!\n") == "crane"
    assert parse_guess("my guess: slate, then") == "guess"
    assert parse_guess("abc") == "abc"


def test_compacted_gae_skips_the_env_tokens():
    own = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, -1.0, 0.0, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 9.0, 9.0, 1.0, 9.0]])
    adv, ret = compacted_gae(rewards, values, own, 0.9, 0.8)
    want_adv, want_ret = token_gae(torch.tensor([[0.0, -1.0, 0.0]]), torch.tensor([[0.5, 0.25, 1.0]]),
                                   torch.ones(1, 3), 0.9, 0.8)
    assert adv[0, [0, 1, 4]].tolist() == pytest.approx(want_adv[0].tolist())
    assert ret[0, [0, 1, 4]].tolist() == pytest.approx(want_ret[0].tolist())
    assert adv[0, [2, 3, 5]].tolist() == [0.0, 0.0, 0.0]
    # by hand: the chain runs 0 -> 1 -> 4 (the env's tokens 2, 3 are not steps)
    d2 = 0.0 - 1.0
    d1 = -1.0 + 0.9 * 1.0 - 0.25
    d0 = 0.0 + 0.9 * 0.25 - 0.5
    a1 = d1 + 0.9 * 0.8 * d2
    assert adv[0, 4].item() == pytest.approx(d2) and adv[0, 1].item() == pytest.approx(a1)
    assert adv[0, 0].item() == pytest.approx(d0 + 0.9 * 0.8 * a1)


def test_a_learn_step_plays_whole_games_and_masks_the_env_tokens():
    evo = build_evolution(_cfg())
    arena = evo.arena
    member = evo.population.members[0].agent
    base = member.base
    data = arena.train_data
    with base.bound_many([member.adapter]) as model:
        roll = data.rollout(model, [member], [[0, 1]], None, [torch.Generator().manual_seed(0)])
    ids, attn = roll.comps[0]
    own = roll.fmask[0]
    assert ids.shape[0] == 6 and len(roll.rewards[0]) == 6  # two secrets, three games each
    for row in range(6):
        game = roll.games[0][row]
        text = base.tokenizer.decode(ids[row][attn[row].bool()].tolist())
        for turn in game.turns:  # the env's answer to every guess is in the context, in order
            assert env_text(turn.feedback) in text
        env_only = base.tokenizer.decode(ids[row][(attn[row] == 1) & (own[row] == 0)].tolist())
        assert env_only == "".join(env_text(t.feedback) for t in game.turns)  # the env's tokens: never a target
        assert roll.rewards[0][row] == game.total_return and -3 <= game.total_return <= 0
        assert [r for _, r in roll.turn_ends[0][row]] == [t.reward for t in game.turns]


def test_a_shaped_reward_adds_each_guess_marks_in_training_and_fitness_stays_the_plain_return():
    """With dataset.options.shaping w, each guess's training reward is its plain reward plus w times (greens +
    yellows / 2) / 5 of its marks (0 for an invalid guess): games that all lose (the plain rewards all equal, every
    GRPO advantage 0) rank by how close their guesses came. The same games' fitness is the plain return."""
    from agilerl_core.language.wordle import marks_score
    from agilerl_core.llm.games import play
    from agilerl_core.llm.grpo import group_advantages

    assert marks_score("GGY--") == pytest.approx(0.5) and marks_score("!!!!!") == 0.0 and marks_score("GGGGG") == 1
    wordle = {"source": "wordle", "options": {"vocabulary": 60, "max_guesses": 3}, "held_out": 0.2}
    plain = build_evolution(_cfg(dataset=wordle))
    shaped = build_evolution(_cfg(dataset={**wordle, "options": {**wordle["options"], "shaping": 0.5}}))
    assert shaped.arena.env_desc["dataset"]["shaping"] == 0.5 and shaped.arena.train_data.shaping == 0.5
    member = plain.population.members[0].agent
    base, data = member.base, shaped.arena.train_data
    word = data.words.words[0]
    spelled = [*base.tokenizer.encode(word, add_special_tokens=False), base.eos_id]
    steps = iter(range(10 ** 6))

    def spell(logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:  # a player that always guesses `word`
        forced = torch.full_like(logits, -1e9)
        forced[:, spelled[next(steps) % len(spelled)]] = 0.0
        return forced

    secrets = list(data.answers[:6])
    runs = []
    for games in (plain.arena.train_data, data):
        with base.bound_many([member.adapter]) as model:
            runs.append(play(model, base, [data.ids[0]] * 6, secrets, games, len(spelled),
                             [(6, 1.0, torch.Generator().manual_seed(0), spell)], 8))
    a, b = runs
    assert all(t.guess == word for g in b.games for t in g.turns)
    assert any(0 < marks_score(t.feedback) < 1 for g in b.games for t in g.turns)  # letters in place or elsewhere
    for row, game in enumerate(b.games):
        assert [r for _, r in a.turn_ends[row]] == [t.reward for t in game.turns]
        want = [t.reward + 0.5 * marks_score(t.feedback) for t in game.turns]
        assert [r for _, r in b.turn_ends[row]] == pytest.approx(want)
    # fitness: greedy games scored by their plain return whatever the shaping
    assert plain.arena.evaluate(member, 0) == shaped.arena.evaluate(member, 0)
    # the point of it: games that all lost tie (every GRPO advantage 0) unless their marks rank them
    lost = [sum(r for _, r in a.turn_ends[row]) for row in range(6)]
    ranked = [sum(r for _, r in b.turn_ends[row]) for row in range(6)]
    losers = [i for i, g in enumerate(b.games) if not g.solved]
    assert len(losers) >= 3 and len({lost[i] for i in losers}) == 1 and len({ranked[i] for i in losers}) > 1
    assert not group_advantages(torch.tensor([lost[i] for i in losers]), len(losers)).any()
    assert group_advantages(torch.tensor([ranked[i] for i in losers]), len(losers)).any()


@pytest.mark.parametrize("shaping", [1.0, -0.1, "a lot", True])
def test_a_bad_shaping_weight_is_refused(shaping):
    with pytest.raises(ConfigError, match="dataset.options.shaping"):
        build_evolution(_cfg(dataset={"source": "wordle", "options": {"vocabulary": 60, "shaping": shaping}}))
    with pytest.raises(ConfigError, match="dataset.options.shaping: shaping adds to the rewards of games"):
        _cfg("llm_bc", dataset={"source": "wordle", "options": {"vocabulary": 60, "shaping": 0.5}},
             hyperparameters={"lr": 0.01})


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce", "llm_ppo", "gspo", "cispo"])
def test_members_train_on_games_and_are_judged_by_greedy_games(algorithm):
    evo = build_evolution(_cfg(algorithm))
    stats = evo.run_generation()
    member = evo.population.members[0].agent
    assert member.learn_steps >= 1 and stats.train_metrics[0]["completion_length"] > 0  # whole games' own tokens
    assert all(-3.0 <= f <= 0.0 for f in stats.fitnesses)
    assert set(member.eval_metrics) == {"win_rate", "mean_guesses"}
    assert np.isfinite(stats.train_metrics[0]["loss"]) and -3.0 <= stats.train_metrics[0]["reward"] <= 0.0


def test_a_member_plays_the_same_games_alone_or_in_a_group():
    evo = build_evolution(_cfg())
    members = [m.agent for m in evo.population.members]
    base, data = members[0].base, evo.arena.train_data
    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    with base.bound_many([m.adapter for m in members]) as model:
        together = data.rollout(model, members, [[0], [1, 2]], None, gens)
    alone = []
    for m, idx, seed in zip(members, ([0], [1, 2]), (3, 4), strict=True):
        with base.bound_many([m.adapter]) as model:
            alone.append(data.rollout(model, [m], [idx], None, [torch.Generator().manual_seed(seed)]))
    for i, solo in enumerate(alone):
        assert [g.transcript for g in together.games[i]] == [g.transcript for g in solo.games[0]]


@pytest.mark.parametrize("over, pattern", [
    ({"algorithm": "dpo", "hyperparameters": {"beta": 0.1}}, "dpo cannot learn from"),
    ({"rewards": [{"kind": "regex", "pattern": "a"}]}, "rewards: a wordle game scores itself"),
    ({"dataset": {"source": "wordle", "options": {"colours": 3}}}, r"options: \['colours'\] are not Wordle options"),
    ({"dataset": {"source": "wordle", "held_out": 5}}, "held_out: a wordle source holds out a share"),
])
def test_wordle_llm_config_refusals_name_the_field(over, pattern):
    with pytest.raises(ConfigError, match=pattern):
        _cfg(**over)


def test_a_dumped_wordle_config_validates_again():
    cfg = _cfg()
    assert validate_config(cfg.model_dump(mode="json")).dataset.source == "wordle"


def test_a_game_longer_than_the_context_is_refused_before_training():
    model = {**TINY, "config": {**TINY["config"], "n_positions": 64}}
    from agilerl_core.errors import DatasetError

    with pytest.raises(DatasetError, match="a whole game can take"):
        build_evolution(_cfg(model=model))
