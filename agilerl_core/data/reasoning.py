"""reasoning-gym (procedural reasoning tasks, each with its own answer scorer) as a prompt source:
``dataset: {source: reasoning_gym, task: chain_sum, size: 1000, seed: 0, options: {...}}``.

The records are generated when the experiment is built, from the task name, size, seed and the task's options
(its ``create_dataset`` keyword arguments), so the same config gives the same prompts. Their content hash
(every question, answer and metadata entry, in order) stands in for a file's: the pipeline pins it in the run's
config and a resumed run regenerates the records and refuses them if the hash differs (another reasoning-gym
version, say), so a resumed run trains on exactly what the run started with.

The ``reasoning_gym`` reward kind (:class:`agilerl_core.llm.rewards.TaskScorer`) scores a completion with the
task's own ``score_answer`` against the record's entry.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any

from agilerl_core.errors import ConfigError, DatasetError

SOURCE = "reasoning_gym"


def reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError("dataset.source: reasoning_gym is not installed; pip install -c constraints.txt -e "
                          "\".[reasoning]\"") from None
    return reasoning_gym


def tasks() -> list[str]:
    """Every task name reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS

    reasoning_gym()
    return sorted(DATASETS)


def check_task(task: str) -> None:
    """A ConfigError naming dataset.task (and close names) when reasoning-gym has no such task."""
    known = tasks()
    if task not in known:
        close = difflib.get_close_matches(task, known, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else f"; e.g. {', '.join(known[:6])}"
        raise ConfigError(f"dataset.task: {task!r} is not a reasoning-gym task ({len(known)} are){hint}")


def entry_digest(entries: list[dict[str, Any]]) -> str:
    """The SHA-256 of the entries in order (questions, answers, metadata), as a file's content hash."""
    h = hashlib.sha256()
    for e in entries:
        h.update(json.dumps(e, sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def generate(task: str, size: int, seed: int, options: dict[str, Any] | None = None):
    """`size` records of reasoning-gym task `task` drawn with `seed` (its `options` passed to the task's config):
    a :class:`~agilerl_core.data.prompts.TextRecords` whose prompts are the questions, answers the answers and
    entries the whole entries (for the task's scorer)."""
    from agilerl_core.data.prompts import TextRecords

    check_task(task)
    try:
        ds = reasoning_gym().create_dataset(task, size=int(size), seed=int(seed), **dict(options or {}))
        entries = [ds[i] for i in range(len(ds))]
    except (TypeError, ValueError, AssertionError, KeyError) as err:
        raise ConfigError(f"dataset.options: reasoning_gym.create_dataset({task!r}, size={size}, seed={seed}, "
                          f"**{dict(options or {})}) failed: {err}") from None
    if not entries:
        raise DatasetError(f"dataset: reasoning-gym task {task!r} generated no records")
    return TextRecords(f"{SOURCE}:{task}", entry_digest(entries), [str(e["question"]) for e in entries],
                       [None if e.get("answer") is None else str(e["answer"]) for e in entries], entries=entries)
