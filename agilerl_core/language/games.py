"""Datasets of Wordle games as JSON Lines, on local disk or at ``s3://`` (through the content-addressed dataset
cache of :mod:`agilerl_core.data.fetch`, so :attr:`GameSet.sha256` is the file's content hash, to pin with
:func:`agilerl_core.data.fetch.check_pin`).

Line 1 is the header, ``{"wordle_games": 1, "description": {...}}`` (the word list, vocabulary, held_out,
max_guesses, seed, mix and its report); then one game per line, ``{"secret": ..., "guesses": [...],
"feedbacks": [...], "rewards": [...], "player": ...}``.

A file is read as hostile: it must be a regular file (a FIFO or folder is refused at once), its size is
checked (``limits.json_bytes``) before it is read, each line is read with at most ``MAX_LINE_BYTES`` in memory
and the lines are counted against ``limits.dataset_records``, every line is parsed
by :func:`agilerl_core.io.records.read_record`, every field's type is checked, and each game's feedbacks and
rewards are recomputed from its secret and guesses, so a tampered game is refused, never learnt from. Every
refusal is a DatasetError naming the uri, the line and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agilerl_core import limits as _limits
from agilerl_core.data.fetch import resolve_dataset
from agilerl_core.errors import ConfigError, DatasetError
from agilerl_core.io.files import open_regular
from agilerl_core.io.records import read_record
from agilerl_core.io.storage import S3Options
from agilerl_core.language.players import GameRecord, mix_report, parse_mix, play_games
from agilerl_core.language.wordle import MAX_GUESSES, SOLVED, WordList, feedback, is_word
from agilerl_core.limits import Limits

FORMAT = 1  # the header's "wordle_games" version
MAX_GAMES = 2_000_000  # games one file may hold (about 2 GB of records in memory)
MAX_LINE_BYTES = 64 * 2**10  # a game of 20 guesses is under 1 KB, a header a few KB
_GAME_FIELDS = ("secret", "guesses", "feedbacks", "rewards", "player")
_MAX_NAME = 100  # characters of a player's name


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# description field -> (check, what it must be)
_DESCRIPTION: dict[str, tuple[Any, str]] = {
    "source": (lambda v: isinstance(v, str), "a string"),
    "vocabulary": (lambda v: v is None or (_whole(v) and v >= 2), "null or a whole number of at least 2"),
    "held_out": (lambda v: _number(v) and 0 < v < 1, "a fraction between 0 and 1"),
    "max_guesses": (lambda v: _whole(v) and 1 <= v <= MAX_GUESSES, f"a whole number from 1 to {MAX_GUESSES}"),
    "seed": (lambda v: _whole(v) and v >= 0, "a non-negative whole number"),
    "mix": (lambda v: isinstance(v, str), "a string (the players' mix)"),
    "secrets": (lambda v: v in ("train", "held_out", "all"), "'train', 'held_out' or 'all'"),
    "games": (lambda v: _whole(v) and v >= 0, "a whole number"),
    "mix_report": (lambda v: isinstance(v, dict), "an object"),
}


def describe_games(words: WordList, vocabulary: int | None, held_out: float, max_guesses: int, seed: int, mix: str,
                   records: Sequence[GameRecord], secrets: str = "train") -> dict[str, Any]:
    """The header's description of games played on `words` (built by ``word_list(vocabulary, held_out)``)."""
    return {"source": words.source, "vocabulary": vocabulary, "held_out": held_out, "max_guesses": max_guesses,
            "seed": seed, "mix": mix, "secrets": secrets, "games": len(records), "mix_report": mix_report(records)}


def _game_row(r: GameRecord) -> dict[str, Any]:
    return {"secret": r.secret, "guesses": list(r.guesses), "feedbacks": list(r.feedbacks),
            "rewards": list(r.rewards), "player": r.player}


def write_games(path: str | Path, records: Sequence[GameRecord], description: dict[str, Any]) -> Path:
    """Write a header and one line per game to `path` (through a temp file)."""
    _check_description(description, str(path), 1)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    lines = [json.dumps({"wordle_games": FORMAT, "description": description}, sort_keys=True)]
    lines += [json.dumps(_game_row(r)) for r in records]
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def s3_target(out: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://BUCKET/KEY`` out; a ConfigError when either is missing."""
    bucket, _, key = out[len("s3://"):].partition("/")
    key = key.strip("/")
    if not bucket or not key:
        raise ConfigError(f"--out {out!r}: expected s3://BUCKET/KEY")
    return bucket, key


def save_games(out: str, records: Sequence[GameRecord], description: dict[str, Any],
               s3: S3Options | None = None) -> str:
    """Write games to `out`: a local path, or s3://BUCKET/KEY (written locally, then uploaded); returns `out`."""
    if not out.startswith("s3://"):
        return str(write_games(out, records, description).resolve())
    from agilerl_core.io.storage import S3Storage

    bucket, key = s3_target(out)
    with tempfile.TemporaryDirectory(prefix="agilerl-wordle-") as tmp:
        local = write_games(Path(tmp) / "games.jsonl", records, description)
        S3Storage(f"s3://{bucket}", s3).put_bytes(key, local.read_bytes())
    return out


@dataclass
class GameSet:
    """Games read from a dataset file, with its content hash and the header's description."""

    uri: str
    sha256: str
    description: dict[str, Any]
    games: list[GameRecord]

    def __len__(self) -> int:
        return len(self.games)

    def describe(self) -> dict[str, Any]:
        """Size, provenance and the players' results (JSON-able)."""
        d = self.description
        return {"uri": self.uri, "format": "wordle-games", "sha256": self.sha256, "games": len(self.games),
                "secrets": len({g.secret for g in self.games}), "source": d["source"],
                "vocabulary": d["vocabulary"], "held_out": d["held_out"], "max_guesses": d["max_guesses"],
                "seed": d["seed"], "mix": d["mix"], "secret_split": d["secrets"], "mix_report": mix_report(self.games)}


def _check_description(d: object, uri: str, n: int) -> dict[str, Any]:
    where = f"dataset {uri}: line {n}: field description"
    if not isinstance(d, dict):
        raise DatasetError(f"{where} is a {type(d).__name__}, not an object")
    missing, extra = sorted(set(_DESCRIPTION) - set(d)), sorted(set(d) - set(_DESCRIPTION))
    if missing or extra:
        raise DatasetError(f"{where}: missing fields {missing}, unknown fields {extra}; a Wordle games file has "
                           f"{sorted(_DESCRIPTION)}")
    for name, (ok, what) in _DESCRIPTION.items():
        if not ok(d[name]):
            raise DatasetError(f"{where}.{name}: {str(d[name])[:80]!r} is not {what}")
    return d


def _check_game(row: dict[str, Any], uri: str, n: int, max_guesses: int) -> GameRecord:
    where = f"dataset {uri}: line {n}: field"
    if "wordle_games" in row:
        raise DatasetError(f"dataset {uri}: line {n} is a second header; a Wordle games file has one, on line 1")
    missing, extra = sorted(set(_GAME_FIELDS) - set(row)), sorted(set(row) - set(_GAME_FIELDS))
    if missing or extra:
        raise DatasetError(f"{where}s: missing {missing}, unknown {extra}; a game has {list(_GAME_FIELDS)}")
    secret, guesses, feedbacks, rewards, player = (row[f] for f in _GAME_FIELDS)
    if not is_word(secret):
        raise DatasetError(f"{where} secret: {str(secret)[:40]!r} is not five lower-case letters a-z")
    if not isinstance(player, str) or not 0 < len(player) <= _MAX_NAME:
        raise DatasetError(f"{where} player: {str(player)[:40]!r} is not a name of 1 to {_MAX_NAME} characters")
    for name, col in (("guesses", guesses), ("feedbacks", feedbacks), ("rewards", rewards)):
        if not isinstance(col, list):
            raise DatasetError(f"{where} {name}: a {type(col).__name__}, not a list")
    if not 1 <= len(guesses) <= max_guesses:
        raise DatasetError(f"{where} guesses: {len(guesses)} guesses, not 1 to max_guesses = {max_guesses} (the "
                           f"header's description)")
    for name, col in (("feedbacks", feedbacks), ("rewards", rewards)):
        if len(col) != len(guesses):
            raise DatasetError(f"{where} {name}: {len(col)} entries for {len(guesses)} guesses")
    for k, (g, f, r) in enumerate(zip(guesses, feedbacks, rewards, strict=True)):
        if not is_word(g):
            raise DatasetError(f"{where} guesses[{k}]: {str(g)[:40]!r} is not five lower-case letters a-z")
        if k > 0 and feedbacks[k - 1] == SOLVED:
            raise DatasetError(f"{where} guesses[{k}]: the game continues after it was solved at guesses[{k - 1}]")
        want = feedback(g, secret)
        if f != want:
            raise DatasetError(f"{where} feedbacks[{k}]: {str(f)[:40]!r} is not the feedback {want!r} of guess "
                               f"{g!r} for secret {secret!r} (the file was altered)")
        reward = 0.0 if want == SOLVED else -1.0
        if not _number(r) or r != reward:
            raise DatasetError(f"{where} rewards[{k}]: {str(r)[:40]!r} is not the reward {reward} of that guess "
                               f"(the file was altered)")
    if feedbacks[-1] != SOLVED and len(guesses) != max_guesses:
        raise DatasetError(f"{where} guesses: the game ends unsolved after {len(guesses)} of max_guesses = "
                           f"{max_guesses} guesses (a truncated game)")
    return GameRecord(secret, tuple(guesses), tuple(feedbacks), tuple(float(r) for r in rewards), player)


def read_games(path: Path, uri: str) -> tuple[dict[str, Any], list[GameRecord]]:
    """(description, games) of a local games file; a DatasetError naming the uri, line and field."""
    lim = _limits.current()
    description: dict[str, Any] | None = None
    games: list[GameRecord] = []
    with open_regular(path, f"dataset {uri}", DatasetError) as f:  # a FIFO or folder is refused, never waited on
        _limits.check("json_bytes", os.fstat(f.fileno()).st_size, f"dataset {uri}: file size", DatasetError)
        total = 0
        for n, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise DatasetError(f"dataset {uri}: line {n} is longer than {MAX_LINE_BYTES:,} bytes (a game or "
                                   f"header line is far shorter; agilerl_core.language.games.MAX_LINE_BYTES)")
            total += len(line)
            if total > lim.json_bytes:
                raise DatasetError(f"dataset {uri}: line {n}: the file grew past limits.json_bytes = "
                                   f"{lim.json_bytes:,} bytes while it was read")
            if n > lim.dataset_records:
                raise DatasetError(f"dataset {uri}: line {n:,}: more than limits.dataset_records = "
                                   f"{lim.dataset_records:,} records (lines); if the set is meant, raise "
                                   f"limits.dataset_records in your own config (or split the file)")
            if not line.strip():
                continue
            try:
                row = read_record(line, f"dataset {uri}: line {n}", error=DatasetError)
            except DatasetError as err:
                raise DatasetError(f"dataset {uri}: line {n} is not JSON ({err}); a Wordle games file is JSON "
                                   f"Lines: one object per line") from None
            if not isinstance(row, dict):
                raise DatasetError(f"dataset {uri}: line {n} is a {type(row).__name__}, not an object")
            if description is None:
                if set(row) != {"wordle_games", "description"} or row["wordle_games"] != FORMAT \
                        or not _whole(row["wordle_games"]):
                    raise DatasetError(f"dataset {uri}: line {n}: no header; a Wordle games file starts with "
                                       f'{{"wordle_games": {FORMAT}, "description": {{...}}}} (this line has fields '
                                       f"{sorted(row)[:10]})")
                description = _check_description(row["description"], uri, n)
                continue
            if len(games) >= MAX_GAMES:
                raise DatasetError(f"dataset {uri}: line {n}: more than {MAX_GAMES:,} games, the limit "
                                   f"agilerl_core.language.games.MAX_GAMES; split the file")
            games.append(_check_game(row, uri, n, description["max_guesses"]))
    if description is None:
        raise DatasetError(f"dataset {uri}: empty; a Wordle games file has a header line and one game per line")
    if not games:
        raise DatasetError(f"dataset {uri}: no games after the header")
    if description["games"] != len(games):
        raise DatasetError(f"dataset {uri}: line 1: field description.games says {description['games']} games, the "
                           f"file holds {len(games)} (truncated or altered)")
    return description, games


def load_games(uri: str, s3: S3Options | None = None, cache_dir: str | None = None,
               limits: Limits | dict[str, Any] | None = None) -> GameSet:
    """Resolve `uri` (downloading s3:// once into the cache) and read its games, checking every one."""
    local = resolve_dataset(uri, s3, cache_dir)
    if not local.path.is_file():
        raise DatasetError(f"dataset {uri}: {local.path} is not a file; a Wordle games dataset is one JSONL file")
    with _limits.applied(limits):
        description, games = read_games(local.path, uri)
    return GameSet(uri, local.sha256, description, games)


def games_digest(records: Sequence[GameRecord]) -> str:
    """The content hash of games played here (what a ``sha256`` pin names when no file is read)."""
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps([r.secret, list(r.guesses), list(r.feedbacks), list(r.rewards), r.player]).encode())
        h.update(b"\n")
    return h.hexdigest()


def games_for(ds: Any, words: WordList, vocabulary: int | None, held_out: float, max_guesses: int,
              s3: S3Options | None = None, limits: Any = None, game_fields: dict[str, str] | None = None,
              data_field: str = "dataset.") -> tuple[list[GameRecord], str, dict[str, Any]]:
    """The games a config's games section `ds` (uri, or players/games/seed) names, their content hash and their
    description, for the game of `words` (`vocabulary`, `held_out`, `max_guesses`): read from the file (checked
    line by line; played with this game's settings, on its words, never on a held-out secret) or played here by
    the seeded players on the training secrets. Errors name the config's fields: `game_field` prefixes the game's
    settings, `data_field` the games section's."""
    if ds.uri is None:
        try:
            mix = parse_mix(ds.players, words)
        except ValueError as err:
            raise ConfigError(f"{data_field}players: {err}") from None
        records = play_games(mix, words.train, words, ds.games, ds.seed, max_guesses)
        return records, games_digest(records), describe_games(words, vocabulary, held_out, max_guesses, ds.seed,
                                                              ds.players, records)
    got = load_games(ds.uri, s3, ds.cache_dir, limits)
    d = got.description
    for field, want in (("vocabulary", vocabulary), ("held_out", held_out), ("max_guesses", max_guesses)):
        where = (game_fields or {}).get(field, f"env.{field}")
        if d.get(field) != want:
            raise DatasetError(f"dataset {ds.uri}: its games were played with {field} {d.get(field)!r}, this "
                               f"config's {where} is {want!r}; set {where}: {d.get(field)!r} or collect games for "
                               f"this game")
    held = set(words.held_out)
    leaked = next((g.secret for g in got.games if g.secret in held), None)
    if leaked is not None:
        raise DatasetError(f"dataset {ds.uri}: a game's secret {leaked!r} is a held-out secret (evaluation would "
                           f"score memorised games); collect games on the train secrets only")
    unknown = next((w for g in got.games for w in (g.secret, *g.guesses) if w not in words.valid), None)
    if unknown is not None:
        raise DatasetError(f"dataset {ds.uri}: the word {unknown!r} is not in this game's word list")
    return got.games, got.sha256, d
