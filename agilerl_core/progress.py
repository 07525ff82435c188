"""Progress within a generation: training loops report the budget units they spend (env steps; offline:
gradient steps) as they go, to whatever the running loop listens with (its progress bar). Nothing listens by
default, and then a report costs one call.

    with progress.reporting(bar.update):
        evo.run_generation()        # the arenas' loops call progress.advance(n) as they step
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_sink: Callable[[int], object] | None = None


def advance(units: int) -> None:
    """`units` more of the budget spent (every member's env steps of a group step, a gradient step...)."""
    sink = _sink
    if sink is not None:
        with _lock:  # members may train in threads
            sink(units)


@contextmanager
def reporting(sink: Callable[[int], object]) -> Iterator[None]:
    """Send :func:`advance` reports to `sink` while the block runs (this process, every thread)."""
    global _sink
    previous, _sink = _sink, sink
    try:
        yield
    finally:
        _sink = previous


def show_generation(bar, global_steps: int, generation: int, run_best: float, last_best: float,
                    last_mean: float) -> None:
    """A tqdm bar after a generation: exact at its step count, showing the generation just evaluated (numbered as
    the history and the per-generation lines number it), its best and mean, and the run's best so far."""
    bar.n = min(global_steps, bar.total)
    bar.set_postfix(gen=generation, last=f"{last_best:.2f}", mean=f"{last_mean:.2f}", best=f"{run_best:.2f}")
