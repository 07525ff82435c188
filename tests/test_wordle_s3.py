"""Wordle games datasets through real S3 (the stack's SeaweedFS, credentials enforced): save_games / load_games
round trip with the content hash of the local file, the CLI's `dataset collect --env wordle --out s3://...`,
tampered objects and hash pins refused, and bad s3:// outs refused before anything is written."""

from __future__ import annotations

import json

import pytest

from agilerl_core.data.fetch import check_pin
from agilerl_core.errors import ConfigError, DatasetError
from agilerl_core.io.digest import sha256_file
from agilerl_core.io.storage import S3Options, S3Storage
from agilerl_core.language.games import describe_games, load_games, save_games, write_games
from agilerl_core.language.players import parse_mix, play_games
from agilerl_core.language.wordle import word_list

pytestmark = pytest.mark.integration

VOCABULARY, HELD_OUT, MAX_GUESSES, SEED, GAMES = 50, 0.2, 6, 7, 20
MIX = "random:0.2,solver:0.3,noisy_solver_0.5:0.5"
BUCKET = "agilerl"  # the stack's storage bucket


@pytest.fixture(scope="module")
def opts(s3):
    c = s3.credentials()
    return S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"])


@pytest.fixture(scope="module")
def games():
    """(records, description) of 20 small games on the train secrets."""
    words = word_list(VOCABULARY, HELD_OUT)
    records = play_games(parse_mix(MIX, words), words.train, words, GAMES, SEED, MAX_GUESSES)
    return records, describe_games(words, VOCABULARY, HELD_OUT, MAX_GUESSES, SEED, MIX, records)


@pytest.fixture
def s3_env(s3, monkeypatch, tmp_path):
    """The environment a CLI user has: the stack's S3 endpoint and credentials, a private dataset cache."""
    c = s3.credentials()
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    for k, v in {"AWS_ENDPOINT_URL": s3.s3_url, "AWS_ACCESS_KEY_ID": c["access_key_id"],
                 "AWS_SECRET_ACCESS_KEY": c["secret_access_key"], "AWS_REGION": "us-east-1",
                 "AGILERL_DATASET_CACHE": str(tmp_path / "env-cache")}.items():
        monkeypatch.setenv(k, v)
    return S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"])


def _fields(records):
    return [(g.secret, g.guesses, g.feedbacks, g.rewards, g.player) for g in records]


def test_save_then_load_round_trips_games_and_hashes_the_local_file(opts, games, tmp_path):
    records, description = games
    uri = f"s3://{BUCKET}/wordle/round-trip/games.jsonl"
    assert save_games(uri, records, description, s3=opts) == uri
    got = load_games(uri, s3=opts, cache_dir=str(tmp_path / "cache"))
    assert got.uri == uri and len(got) == GAMES
    assert _fields(got.games) == _fields(records) and got.games == list(records)
    assert got.description == description
    local = write_games(tmp_path / "local.jsonl", records, description)
    assert got.sha256 == sha256_file(local)
    # the object is byte-for-byte the local file
    assert S3Storage(f"s3://{BUCKET}", opts).get_bytes("wordle/round-trip/games.jsonl") == local.read_bytes()
    check_pin(uri, got.sha256, sha256_file(local))  # the pin of the local file accepts the S3 copy
    again = load_games(uri, s3=opts, cache_dir=str(tmp_path / "cache"))  # served from the verified cache
    assert again.sha256 == got.sha256 and again.games == got.games
    assert got.describe()["games"] == GAMES and got.describe()["secret_split"] == "train"


def test_cli_collects_wordle_games_to_s3(s3_env, tmp_path, capsys):
    from flows.cli import main

    uri = f"s3://{BUCKET}/wordle/cli/games.jsonl"
    rc = main(["dataset", "collect", "--env", "wordle", "--episodes", str(GAMES), "--vocabulary", str(VOCABULARY),
               "--seed", str(SEED), "--policy", MIX, "--out", uri, "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-3000:]
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["out"] == uri and summary["uri"] == uri and summary["games"] == GAMES
    assert summary["mix"] == MIX and summary["vocabulary"] == VOCABULARY and summary["secret_split"] == "train"
    got = load_games(uri, s3=s3_env, cache_dir=str(tmp_path / "cache"))
    assert got.sha256 == summary["sha256"] and got.describe() == {k: v for k, v in summary.items() if k != "out"}
    words = word_list(VOCABULARY, HELD_OUT)
    assert got.games == play_games(parse_mix(MIX, words), words.train, words, GAMES, SEED, MAX_GUESSES)
    assert {g.secret for g in got.games} <= set(words.train)


def test_a_tampered_object_is_refused_naming_the_line_and_a_pin_mismatch_raises(opts, games, tmp_path):
    records, description = games
    store = S3Storage(f"s3://{BUCKET}", opts)
    uri = f"s3://{BUCKET}/wordle/tamper/games.jsonl"
    save_games(uri, records, description, s3=opts)
    cache = str(tmp_path / "cache")
    good = load_games(uri, s3=opts, cache_dir=cache)
    lines = store.get_bytes("wordle/tamper/games.jsonl").decode().splitlines()
    row = json.loads(lines[4])  # line 5: the 4th game
    first = row["feedbacks"][0]
    row["feedbacks"][0] = "GGGGG" if first != "GGGGG" else "-----"  # a wrong feedback, well-formed
    lines[4] = json.dumps(row)
    tampered = ("\n".join(lines) + "\n").encode()
    store.put_bytes("wordle/tamper/copy.jsonl", tampered)
    with pytest.raises(DatasetError, match=r"tamper/copy\.jsonl: line 5: field feedbacks\[0\].*altered"):
        load_games(f"s3://{BUCKET}/wordle/tamper/copy.jsonl", s3=opts, cache_dir=cache)
    # the same object replaced remotely: the verified cache fetches it again and refuses it too
    store.put_bytes("wordle/tamper/games.jsonl", tampered)
    with pytest.raises(DatasetError, match=r"line 5: field feedbacks\[0\]"):
        load_games(uri, s3=opts, cache_dir=cache)
    # a pinned hash that is not the data's
    with pytest.raises(DatasetError, match="differs from dataset.sha256"):
        check_pin(uri, good.sha256, "0" * 64)
    check_pin(uri, good.sha256, good.sha256)
    check_pin(uri, good.sha256, None)


@pytest.mark.parametrize("out", ["s3://bucketonly", "s3://bucketonly/", "s3:///games.jsonl", "s3://"])
def test_save_games_refuses_an_out_without_bucket_and_key(opts, games, out, monkeypatch):
    from agilerl_core.language import games as games_mod

    def no_write(*a, **k):
        raise AssertionError("write_games called for a bad out")

    monkeypatch.setattr(games_mod, "write_games", no_write)
    records, description = games
    with pytest.raises(ConfigError, match="expected s3://BUCKET/KEY"):
        save_games(out, records, description, s3=opts)


@pytest.mark.parametrize(("out", "message"), [
    ("s3://bucketonly", "must be a .jsonl file"),
    ("s3://games.jsonl", "expected s3://BUCKET/KEY"),  # the bucket alone, named like a file
    ("s3:///games.jsonl", "expected s3://BUCKET/KEY"),  # no bucket
])
def test_cli_refuses_a_bad_s3_out(s3_env, out, message, capsys, monkeypatch):
    import agilerl_core.language.players as players
    from flows.cli import main

    def no_play(*args, **kwargs):
        raise AssertionError("games were played before the --out was checked")

    monkeypatch.setattr(players, "play_games", no_play)
    before = S3Storage(f"s3://{BUCKET}", s3_env).list("")
    rc = main(["dataset", "collect", "--env", "wordle", "--episodes", "3", "--vocabulary", str(VOCABULARY),
               "--out", out, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "configuration error" in err and message in err, err[-2000:]
    assert S3Storage(f"s3://{BUCKET}", s3_env).list("") == before  # nothing written
