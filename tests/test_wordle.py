"""Wordle as a language game: the feedback rule, the fixed word-list split, the game's rewards and transcript,
the seeded data players, and datasets of games read as hostile files (and the CLI that writes them)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from agilerl_core.data.fetch import check_pin
from agilerl_core.errors import DatasetError
from agilerl_core.io.digest import sha256_file
from agilerl_core.language import games as games_mod
from agilerl_core.language.games import describe_games, load_games, write_games
from agilerl_core.language.players import (
    DEFAULT_MIX,
    GameRecord,
    NoisySolver,
    RandomPlayer,
    SolverPlayer,
    mix_report,
    parse_mix,
    play_games,
)
from agilerl_core.language.wordle import (
    BOS,
    CHARS,
    CODES,
    EOS,
    PAD,
    InvalidGuess,
    WordleGame,
    decode,
    encode,
    feedback,
    feedback_codes,
    letters_of,
    word_list,
)

SMALL = 300  # vocabulary of the small games


@pytest.fixture(scope="module")
def small():
    return word_list(SMALL)


# ---- feedback ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("guess", "secret", "want"), [
    ("crane", "crane", "GGGGG"),
    ("crane", "moist", "-----"),
    ("speed", "abide", "--Y-Y"),  # double e in the guess, one in the secret: only the first is yellow
    ("eerie", "ether", "GYY--"),  # e green, the second e takes the secret's other e, the third gets none
    ("llama", "hello", "YY---"),  # double l in both, neither in place: both yellow
    ("plant", "llama", "-GG--"),  # double l and a in the secret, one of each in the guess
    ("abbey", "babes", "YYGG-"),  # the green b is matched first; the other b of the secret makes the first b yellow
    ("lolly", "hello", "-YGG-"),  # both secret l's are used by greens, so the first l is absent (not yellow)
    ("geese", "eerie", "-GY-G"),  # greens at 1 and 4 leave one e for the yellow at 2
])
def test_feedback_known_answers(guess, secret, want):
    assert feedback(guess, secret) == want


def test_vectorised_feedback_agrees_with_the_rule_on_every_pair_of_a_small_alphabet():
    words = ["".join(p) for p in itertools.product("abe", repeat=5)]  # 243 words, full of repeats
    letters = letters_of(words)
    for guess in words[::5]:
        codes = feedback_codes(guess, letters)
        got = ["".join(CODES[c] for c in codes[:, j]) for j in range(len(words))]
        assert got == [feedback(guess, s) for s in words]


@pytest.mark.parametrize(("guess", "secret"), [("cran", "crane"), ("Crane", "crane"), ("crane", "cr4ne")])
def test_feedback_refuses_words_that_are_not_five_letters(guess, secret):
    with pytest.raises(ValueError, match="not five lower-case letters"):
        feedback(guess, secret)


# ---- word list ----------------------------------------------------------------------------------------------------
def test_word_list_is_web2_split_by_a_fixed_hash_rule(small):
    full = word_list()
    assert len(full.words) == 9979 and "web2" in full.source
    assert set(full.train) | set(full.held_out) == set(full.words) and not set(full.train) & set(full.held_out)
    assert 0.18 < len(full.held_out) / len(full.words) < 0.22
    assert len(small.words) == SMALL and list(small.words) == sorted(small.words)
    assert set(small.held_out) <= set(full.held_out) and set(small.train) <= set(full.train)  # vocabulary-free
    assert set(word_list(100).words) <= set(small.words)  # a smaller game is a prefix in hash order


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"vocabulary": 1}, "vocabulary"), ({"vocabulary": 10**6}, "vocabulary"), ({"vocabulary": 2.5}, "vocabulary"),
    ({"held_out": 0.0}, "held_out"), ({"held_out": 1.0}, "held_out"),
    ({"vocabulary": 2, "held_out": 0.001}, "held_out"),
])
def test_word_list_refuses_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        word_list(**kwargs)


# ---- characters ---------------------------------------------------------------------------------------------------
def test_encode_decode_round_trip_and_refusals():
    text = "crane -G-Y-\nxyzzy !!!!!\n"
    ids = encode(text)
    assert (PAD, BOS, EOS) == (0, 1, 2) and min(ids) > EOS and decode(ids) == text
    assert decode([BOS, *ids, EOS, PAD]) == text and len(CHARS) == 35
    with pytest.raises(ValueError, match="'Q'"):
        encode("Quick")
    with pytest.raises(ValueError, match="id 99"):
        decode([3, 99])


# ---- the game -----------------------------------------------------------------------------------------------------
def test_a_game_solved_on_guess_three_returns_minus_two(small):
    secret, a, b = small.words[:3]
    game = WordleGame(secret, small)
    turns = [game.guess(a), game.guess(b), game.guess(secret)]
    assert [t.reward for t in turns] == [-1.0, -1.0, 0.0] and [t.done for t in turns] == [False, False, True]
    assert game.solved and turns[-1].solved and game.total_return == -2.0
    assert game.transcript == f"{a} {feedback(a, secret)}\n{b} {feedback(b, secret)}\n{secret} GGGGG\n"
    with pytest.raises(ValueError, match="over"):
        game.guess(a)


def test_an_unsolved_game_returns_minus_max_guesses(small):
    game = WordleGame(small.words[0], small, max_guesses=4)
    for _ in range(4):
        game.guess(small.words[1])
    assert game.done and not game.solved and game.total_return == -4.0 and len(game.turns) == 4


def test_invalid_guesses_are_penalised_or_refused(small):
    game = WordleGame(small.words[0], small)
    turn = game.guess("zzzzz")
    assert turn.feedback == "!!!!!" and turn.reward == -1.0 and game.transcript == "zzzzz !!!!!\n"
    game.guess("no way")  # malformed: shown as !!!!! so the transcript stays in CHARS
    assert game.transcript.splitlines()[1] == "!!!!! !!!!!"
    strict = WordleGame(small.words[0], small, invalid="refuse")
    with pytest.raises(InvalidGuess, match="zzzzz"):
        strict.guess("zzzzz")
    assert strict.turns == () and isinstance(InvalidGuess("x"), ValueError)


@pytest.mark.parametrize(("secret", "kwargs", "name"), [
    ("CRANE", {}, "secret"), ("zzzzz", {}, "secret"), (None, {"max_guesses": 0}, "max_guesses"),
    (None, {"invalid": "ignore"}, "invalid"),
])
def test_a_game_refuses_bad_arguments(small, secret, kwargs, name):
    with pytest.raises(ValueError, match=name):
        WordleGame(secret or small.words[0], small, **kwargs)


# ---- players ------------------------------------------------------------------------------------------------------
def test_the_solver_only_guesses_words_consistent_with_the_feedback(small):
    solver, rng = SolverPlayer(small), np.random.default_rng(0)
    for secret in small.train[:20]:
        game = WordleGame(secret, small)
        while not game.done:
            guess = solver.choose(game.turns, rng)
            assert all(feedback(t.guess, guess) == t.feedback for t in game.turns)
            game.guess(guess)
        assert game.solved  # on 300 words the consistent-guess solver always finishes in six


def test_parse_mix_names_and_normalises_and_refuses_bad_pieces(small):
    mix = parse_mix(DEFAULT_MIX, small)
    assert [p.name for p, _ in mix] == ["random", "solver", "noisy_solver_0.5"]
    assert [w for _, w in mix] == pytest.approx([0.2, 0.3, 0.5])
    assert isinstance(mix[0][0], RandomPlayer) and isinstance(mix[2][0], NoisySolver) and mix[2][0].eps == 0.5
    assert [w for _, w in parse_mix("random:1,solver:3", small)] == [0.25, 0.75]
    for spec, piece in [("random:0.5,oracle:0.5", "oracle:0.5"), ("solver", "solver"), ("random:-1", "random:-1"),
                        ("noisy_solver_2:1", "noisy_solver_2:1"), ("random:1,random:2", "random:2")]:
        with pytest.raises(ValueError, match=piece) as err:
            parse_mix(spec, small)
        assert "noisy_solver_EPS" in str(err.value)


def test_play_games_is_a_function_of_seed_and_index(small):
    mix = parse_mix(DEFAULT_MIX, small)
    ten = play_games(mix, small.train, small, 10, seed=7)
    twenty = play_games(mix, small.train, small, 20, seed=7)
    assert twenty[:10] == ten and play_games(mix, small.train, small, 10, seed=7) == ten
    assert play_games(mix, small.train, small, 10, seed=8) != ten
    for r in twenty:
        assert r.secret in small.train and r.feedbacks == tuple(feedback(g, r.secret) for g in r.guesses)
        assert r.total_return == -(len(r.guesses) - 1 if r.solved else 6)
    with pytest.raises(ValueError, match="secrets"):
        play_games(mix, ["zzzzz"], small, 1, seed=0)


def test_mix_report_orders_the_players_by_skill(small):
    records = play_games(parse_mix(DEFAULT_MIX, small), small.train, small, 300, seed=0)
    report = mix_report(records)
    players = report["players"]
    assert report["overall"]["games"] == 300 == sum(p["games"] for p in players.values())
    assert players["solver"]["win_rate"] > 0.95 and players["random"]["win_rate"] < 0.2
    assert players["solver"]["mean_return"] > players["noisy_solver_0.5"]["mean_return"] > \
        players["random"]["mean_return"]
    r = GameRecord("crane", ("moist", "crane"), ("-----", "GGGGG"), (-1.0, 0.0), "solver")
    assert mix_report([r])["overall"] == {"games": 1, "mean_return": -1.0, "win_rate": 1.0, "mean_guesses": 2.0}


# ---- datasets of games --------------------------------------------------------------------------------------------
def _write(tmp_path: Path, small, n: int = 12) -> tuple[Path, list[GameRecord]]:
    records = play_games(parse_mix("solver:1,random:1", small), small.train, small, n, seed=0)
    desc = describe_games(small, SMALL, 0.2, 6, 0, "solver:1,random:1", records)
    return write_games(tmp_path / "games.jsonl", records, desc), records


def test_games_round_trip_with_a_content_hash_to_pin(tmp_path, small):
    path, records = _write(tmp_path, small)
    gs = load_games(str(path))
    assert gs.games == records and gs.sha256 == sha256_file(path) and len(gs) == 12
    info = gs.describe()
    assert info["games"] == 12 and info["vocabulary"] == SMALL and info["mix_report"] == mix_report(records)
    check_pin(str(path), gs.sha256, sha256_file(path))
    with pytest.raises(DatasetError, match="content hash"):
        check_pin(str(path), gs.sha256, "0" * 64)


def _game_line(lines: list[str], want) -> int:
    """The index of the first game line whose record satisfies `want`."""
    return next(i for i in range(1, len(lines)) if want(json.loads(lines[i])))


def _tamper_game(field, value=None, pick=lambda g: True, edit=None):
    def tamper(lines):
        i = _game_line(lines, pick)
        row = json.loads(lines[i])
        if edit:
            edit(row)
        else:
            row[field] = value
        lines[i] = json.dumps(row)
        return lines, i + 1
    return tamper


def _tamper_header(edit):
    def tamper(lines):
        head = json.loads(lines[0])
        edit(head)
        lines[0] = json.dumps(head)
        return lines, 1
    return tamper


def _solved(g):
    return g["feedbacks"][-1] == "GGGGG"


def _append_after_solved(g):
    g["guesses"].append(g["guesses"][0])
    g["feedbacks"].append(g["feedbacks"][0])
    g["rewards"].append(-1.0)


@pytest.mark.parametrize(("tamper", "field"), [
    (lambda lines: (["{not json", *lines[1:]], 1), "not JSON"),
    (lambda lines: (lines[1:], 1), "no header"),
    (lambda lines: ([*lines, lines[0]], len(lines) + 1), "second header"),
    (lambda lines: ([*lines, "[1, 2]"], len(lines) + 1), "not an object"),
    (_tamper_header(lambda h: h["description"].update(max_guesses="6")), "description.max_guesses"),
    (_tamper_header(lambda h: h["description"].update(max_guesses=21)), "description.max_guesses"),
    (_tamper_header(lambda h: h["description"].pop("seed")), "description"),
    (_tamper_header(lambda h: h["description"].update(games=5)), "description.games"),
    (_tamper_game("extra", 1), "fields"),
    (_tamper_game("secret", "CRANE"), "secret"),
    (_tamper_game("player", 3), "player"),
    (_tamper_game("guesses", "crane"), "guesses"),
    (_tamper_game("rewards", [0.0]), "rewards"),
    (_tamper_game(None, edit=lambda g: g["guesses"].__setitem__(0, "crané")), r"guesses\[0\]"),
    (_tamper_game(None, edit=lambda g: g.update({k: g[k] * 2 for k in ("guesses", "feedbacks", "rewards")}),
                  pick=lambda g: not _solved(g)), "guesses: 12 guesses"),
    (_tamper_game(None, edit=lambda g: g["feedbacks"].__setitem__(0, "GGGGG"), pick=lambda g: len(g["guesses"]) > 1),
     r"feedbacks\[0\]"),
    (_tamper_game(None, edit=lambda g: g["rewards"].__setitem__(-1, -1.0), pick=_solved), r"rewards\[\d\]"),
    (_tamper_game(None, edit=lambda g: g["rewards"].__setitem__(0, True)), r"rewards\[0\]"),
    (_tamper_game(None, edit=_append_after_solved, pick=lambda g: _solved(g) and len(g["guesses"]) < 6),
     "continues after it was solved"),
    (_tamper_game(None, edit=lambda g: [g[k].pop() for k in ("guesses", "feedbacks", "rewards")],
                  pick=lambda g: not _solved(g)), "unsolved after 5"),
])
def test_a_tampered_games_file_is_refused_naming_line_and_field(tmp_path, small, tamper, field):
    path, _ = _write(tmp_path, small)
    lines, line = tamper(path.read_text().splitlines())
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=field) as err:
        load_games(str(path))
    assert str(path) in str(err.value) and f"line {line}" in str(err.value)


def test_empty_oversized_and_overlong_files_are_refused(tmp_path, small, monkeypatch):
    path, _ = _write(tmp_path, small)
    with pytest.raises(DatasetError, match="json_bytes"):
        load_games(str(path), limits={"json_bytes": 1000})
    monkeypatch.setattr(games_mod, "MAX_GAMES", 5)
    with pytest.raises(DatasetError, match="line 7: more than 5 games.*MAX_GAMES"):
        load_games(str(path))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetError, match="empty"):
        load_games(str(empty))
    head = tmp_path / "head.jsonl"
    head.write_text(path.read_text().splitlines()[0] + "\n")
    with pytest.raises(DatasetError, match="no games"):
        load_games(str(head))


# ---- the CLI ------------------------------------------------------------------------------------------------------
def test_cli_collects_wordle_games_on_train_secrets_and_describes_them(tmp_path, small, capsys):
    from flows.cli import main

    out = tmp_path / "wordle.jsonl"
    assert main(["dataset", "collect", "--env", "wordle", "--episodes", "40", "--vocabulary", str(SMALL),
                 "--seed", "3", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["games"] == 40 and summary["sha256"] == sha256_file(out) and summary["mix"] == DEFAULT_MIX
    assert summary["mix_report"]["overall"]["games"] == 40 and summary["secret_split"] == "train"
    gs = load_games(str(out))
    assert {g.secret for g in gs.games} <= set(small.train)
    assert gs.games == play_games(parse_mix(DEFAULT_MIX, small), small.train, small, 40, seed=3)
    assert main(["dataset", "info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info == {k: v for k, v in summary.items() if k != "out"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--env", "CartPole-v1", "--vocabulary", "100"], "only for --env wordle"),
    (["--env", "wordle", "--policy", "oracle:1"], "oracle"),
    (["--env", "wordle", "--held-out", "1.5"], "held_out"),
])
def test_cli_refuses_bad_wordle_arguments(tmp_path, capsys, argv, message):
    from flows.cli import main

    assert main(["dataset", "collect", "--episodes", "2", "--out", str(tmp_path / "w.jsonl"), *argv]) == 2
    assert message in capsys.readouterr().err
