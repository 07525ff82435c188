"""Callbacks of an evolution run: :class:`Callback` (what a user overrides), and :class:`CallbackHooks`, which
calls a run's callbacks with its members as :class:`~agilerl_core.api.policy.Policy` views."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agilerl_core.api.policy import Policy
from agilerl_core.errors import ConfigError
from agilerl_core.hpo.population import Member
from agilerl_core.results import GenerationStats, TrainResult


class Callback:
    """Hooks into an evolution run; override what you need. Exceptions propagate (they stop the run).

    - :meth:`on_member_trained` after each member's training phase, before evaluation;
    - :meth:`on_generation` after each generation is evaluated (and, in a flow, committed): return True to
      stop the run there (the elite, the population and, in a flow, the champion are still saved).

    A plain function passed as a callback is called as :meth:`on_generation`."""

    def on_member_trained(self, slot: int, member: Policy, result: TrainResult) -> None:
        """Member `slot` finished training this generation (`result`: env steps, mean return, loss...)."""

    def on_generation(self, stats: GenerationStats, population: list[Policy]) -> bool | None:
        """Generation `stats.generation` is evaluated (`population`: the members by slot, fitness set).
        Return True to stop the run after it."""
        return None


class _FunctionCallback(Callback):
    def __init__(self, fn: Callable[[GenerationStats, list[Policy]], bool | None]) -> None:
        self.fn = fn

    def on_generation(self, stats: GenerationStats, population: list[Policy]) -> bool | None:
        return self.fn(stats, population)


def as_callbacks(callbacks: Sequence[Callback | Callable] | Callback | None) -> list[Callback]:
    """Callback objects from what a caller passed (a Callback, a function, a list of them)."""
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback) or not isinstance(callbacks, Sequence):
        callbacks = [callbacks]
    out = []
    for i, cb in enumerate(callbacks):
        if isinstance(cb, Callback):
            out.append(cb)
        elif callable(cb):
            out.append(_FunctionCallback(cb))
        else:
            raise ConfigError(f"callbacks[{i}]: a {type(cb).__name__} is neither a Callback nor a function of "
                              f"(stats, population)")
    return out


class CallbackHooks:
    """The callbacks of one run, called with the run's members as :class:`Policy` views."""

    def __init__(self, callbacks: Sequence[Callback | Callable] | Callback | None, env: dict[str, Any]) -> None:
        self.callbacks = as_callbacks(callbacks)
        self.env = env
        self.stopped_by: str | None = None

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def member_trained(self, members: list[Member], result: TrainResult) -> None:
        for cb in self.callbacks:
            cb.on_member_trained(result.slot, Policy(members[result.slot], self.env), result)

    def generation(self, stats: GenerationStats, members: list[Member]) -> bool:
        """Call every on_generation; True when one asked to stop (all are called first)."""
        population = [Policy(m, self.env) for m in members]
        stop = [cb for cb in self.callbacks if cb.on_generation(stats, population) is True]
        if stop:
            self.stopped_by = type(stop[0]).__name__ if not isinstance(stop[0], _FunctionCallback) \
                else getattr(stop[0].fn, "__name__", "function")
        return bool(stop)
