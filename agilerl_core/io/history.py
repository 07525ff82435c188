"""The run's history as population.json records it (``extra.global_steps`` and ``extra.history``: one
:class:`~agilerl_core.results.GenerationStats` per generation run), every field checked for type and range before
anything reads it, so a tampered record is refused naming the file and field before a resume trains."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from agilerl_core import limits as _limits
from agilerl_core.errors import CheckpointError
from agilerl_core.io.files import quote
from agilerl_core.io.records import check_type, field, sized
from agilerl_core.results import GenerationStats

_STATS = {f.name: f for f in dataclasses.fields(GenerationStats)}
_ABSENT = object()


def generation_history(meta: dict[str, Any], file: str, slots: int) -> tuple[int, list[GenerationStats]]:
    """population.json's ``extra.global_steps`` and ``extra.history`` (one :class:`GenerationStats` per generation
    run), every field checked before anything reads it: counters whole and within limits.member_id; per-slot lists
    one entry per slot (`slots`); fitnesses, returns and metrics numbers (NaN allowed: an evaluation may return it);
    wall time finite and non-negative; mutations strings; hyperparameters and metrics objects; groups slot numbers,
    each slot at most once; metric points ``[env steps, {name: number}]``. A CheckpointError names the file and the
    field (``extra.history.0.best_fitness``) otherwise, so a resume refuses before any training."""
    steps = sized(meta, "extra.global_steps", "member_id", file)
    history = field(meta, "extra.history", list, file)
    return steps, [_generation_stats(meta, file, f"extra.history.{i}", slots) for i in range(len(history))]


def _number(value: Any, path: str, file: str) -> int | float:
    """`value` unchanged when it is a number (int or float, never bool; NaN and inf allowed), else a CheckpointError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"{file}: field {path} is {quote(value)}, not a number")
    return value


def _generation_stats(meta: dict[str, Any], file: str, at: str, slots: int) -> GenerationStats:
    record = field(meta, at, dict, file)
    unknown = sorted(set(record) - set(_STATS))
    if unknown:
        raise CheckpointError(f"{file}: field {at} has unknown keys {', '.join(quote(k, 40) for k in unknown[:5])} "
                              f"(a generation's stats are {', '.join(_STATS)})")
    out: dict[str, Any] = {}
    for name, spec in _STATS.items():
        value = record.get(name, _ABSENT)
        if value is _ABSENT:
            if spec.default_factory is dataclasses.MISSING:  # a field every record holds (the others came later)
                raise CheckpointError(f"{file}: field {at}.{name} is missing; the file is damaged or not one of ours")
            continue
        out[name] = _STAT_CHECKS[name](value, f"{at}.{name}", file, slots)
    return GenerationStats(**out)


def _counter(value: Any, path: str, file: str, slots: int = 0) -> int:
    """A whole number within limits.member_id (a generation, a step count)."""
    return _limits.check("member_id", check_type(value, int, path, file), f"{file}: field {path}", CheckpointError)


def _wall(value: Any, path: str, file: str, slots: int) -> float:
    if not math.isfinite(_number(value, path, file)) or value < 0:
        raise CheckpointError(f"{file}: field {path} is {quote(value)}, not a finite number of seconds >= 0")
    return value


def _per_slot(item: Callable[[Any, str, str], Any], optional: bool = False) -> Callable[[Any, str, str, int], list]:
    """A check of a list with one entry per slot, each checked by `item` (`optional`: an empty list, as records
    written before the field existed hold)."""
    def checked(value: Any, path: str, file: str, slots: int) -> list:
        check_type(value, list, path, file)
        if len(value) != slots and not (optional and not value):
            raise CheckpointError(f"{file}: field {path} has {len(value):,} entries, but the population has {slots} "
                                  f"slots (one entry per slot)")
        return [item(v, f"{path}.{j}", file) for j, v in enumerate(value)]
    return checked


def _metrics(value: Any, path: str, file: str) -> dict[str, Any]:
    check_type(value, dict, path, file)
    for k, v in value.items():
        _number(v, f"{path}.{k}", file)
    return value


def _points(value: Any, path: str, file: str) -> list:
    """One slot's metric points: ``[[env steps, {name: number}], ...]``."""
    check_type(value, list, path, file)
    for j, point in enumerate(value):
        if not (isinstance(point, list) and len(point) == 2):
            raise CheckpointError(f"{file}: field {path}.{j} is {quote(point)}, not [env steps, {{name: number}}]")
        _counter(point[0], f"{path}.{j}.0", file)
        _metrics(point[1], f"{path}.{j}.1", file)
    return value


def _groups(value: Any, path: str, file: str, slots: int) -> list:
    check_type(value, list, path, file)
    seen: set[int] = set()
    for j, group in enumerate(value):
        check_type(group, list, f"{path}.{j}", file)
        for k, slot in enumerate(group):
            if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < slots or slot in seen:
                raise CheckpointError(f"{file}: field {path}.{j}.{k} is {quote(slot)}, not a slot of the population "
                                      f"(0 to {slots - 1}, each in one group)")
            seen.add(slot)
    return value


_STAT_CHECKS: dict[str, Callable[[Any, str, str, int], Any]] = {
    "generation": _counter, "global_steps": _counter,
    "fitnesses": _per_slot(_number),
    "best_fitness": lambda v, path, file, slots: _number(v, path, file),
    "mean_fitness": lambda v, path, file, slots: _number(v, path, file),
    "train_returns": _per_slot(_number),
    "mutations": _per_slot(lambda v, path, file: check_type(v, str, path, file)),
    "hyperparameters": _per_slot(lambda v, path, file: check_type(v, dict, path, file)),
    "wall_s": _wall,
    "train_metrics": _per_slot(_metrics, optional=True),
    "groups": _groups,
    "train_metric_points": _per_slot(_points, optional=True),
}
