"""Issue 66, trust round four, item 14: a Wordle games file of many distinct players is described by
``agilerl-flow dataset info`` in bounded time and memory (the players' report is one pass over the games, not
one pass per player). Run in a fresh interpreter that reports its own time and peak RSS."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agilerl_core.language.games import describe_games, load_games, write_games
from agilerl_core.language.players import mix_report, parse_mix, play_games
from agilerl_core.language.wordle import word_list

ROOT = Path(__file__).resolve().parents[1]
MAX_SECONDS, MAX_RSS_MB = 10.0, 500

# `agilerl-flow dataset info PATH` in-process; prints one JSON line: its summary's size, seconds and peak RSS (MB)
_INFO = """
import contextlib, io, json, sys, time
from flows.cli import main
rss = lambda: int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) / 1024
t = time.perf_counter()
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["dataset", "info", sys.argv[1]])
summary = json.loads(out.getvalue().strip().splitlines()[-1])
print(json.dumps({"rc": rc, "players": len(summary["mix_report"]["players"]), "games": summary["games"],
                  "seconds": time.perf_counter() - t, "peak_mb": rss()}))
"""


def _many_players(path: Path, games: int) -> Path:
    """`games` real solver games, each credited to a player of its own (a header whose report is small)."""
    words = word_list(100, 0.2)
    played = play_games(parse_mix("solver:1", words), words.train, words, 50, seed=0)
    records = [dataclasses.replace(played[i % len(played)], player=f"p{i}") for i in range(games)]
    description = describe_games(words, 100, 0.2, 6, 0, "solver:1", played) | {"games": games}
    return write_games(path, records, description)


def test_dataset_info_on_games_of_many_distinct_players_is_bounded(tmp_path):
    path = _many_players(tmp_path / "players.jsonl", 40_000)
    proc = subprocess.run([sys.executable, "-c", _INFO, str(path)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"dataset info on 40,000 players: {got['seconds']:.2f} s, peak RSS {got['peak_mb']:.0f} MB")
    assert got["rc"] == 0 and got["games"] == got["players"] == 40_000, got
    assert got["seconds"] < MAX_SECONDS and got["peak_mb"] < MAX_RSS_MB, got


def test_the_players_report_is_each_players_own_games(tmp_path):
    """The one-pass report gives every player the statistics of exactly their games (checked by hand)."""
    games = load_games(str(_many_players(tmp_path / "g.jsonl", 30))).games
    games = [dataclasses.replace(g, player=("a", "b", "c")[i % 3]) for i, g in enumerate(games)]
    report = mix_report(games)
    for name in ("a", "b", "c"):
        mine = [g for g in games if g.player == name]
        assert report["players"][name] == pytest.approx({
            "games": len(mine), "mean_return": sum(g.total_return for g in mine) / len(mine),
            "win_rate": sum(g.solved for g in mine) / len(mine),
            "mean_guesses": sum(len(g.guesses) for g in mine) / len(mine)})
    assert report["overall"]["games"] == 30 and list(report["players"]) == ["a", "b", "c"]
    assert mix_report([]) == {"overall": {"games": 0, "mean_return": None, "win_rate": None, "mean_guesses": None},
                              "players": {}}
