"""Delivery of a run's generations to the tracking server, off the training path.

:class:`TrackingQueue` hands each generation to :meth:`tasks.tracker.Tracker.log_generation` from one background
thread, in order and exactly once, so that training never waits on the server: while it is down the queue grows
(and what it holds is spilled somewhere durable), and once it is back the queue drains.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.tracker import Tracker


class TrackingQueue:
    """Generations waiting to be logged, delivered in order by one background thread, so that training never
    waits on the tracking server: while it is down the queue grows, a failed delivery is tried again (the same
    generation, the same timestamps: exactly once) after a backoff of 1 s doubling to `max_backoff`, and once it
    is back the queue drains in order."""

    def __init__(self, tracker: Tracker, logger, max_backoff: float = 30.0, spill=None, unspill=None) -> None:
        """`spill(stats, members)`: keep an undelivered generation's rows somewhere durable (called once per
        generation, when a delivery first fails: what a later process delivers if this one cannot);
        `unspill(generation)`: forget them once delivered."""
        self.tracker, self.logger, self.max_backoff = tracker, logger, max_backoff
        self.spill, self.unspill = spill, unspill
        self._spilled: set[int] = set()
        self._items: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._abandon = False
        self._down_since: float | None = None
        self._thread = threading.Thread(target=self._deliver, name="agilerl-tracking", daemon=True)
        self._thread.start()

    def put(self, stats: dict[str, Any], members: list[dict[str, Any]]) -> None:
        with self._cv:
            self._items.append((stats, members))
            self._cv.notify_all()

    def pending(self) -> list[int]:
        with self._cv:
            return [int(stats["generation"]) for stats, _ in self._items]

    def _deliver(self) -> None:
        delay = 1.0
        while True:
            with self._cv:
                while not self._items and not self._closing:
                    self._cv.wait()
                if not self._items or self._abandon:
                    return
                stats, members = self._items[0]
            try:
                self.tracker.log_generation(stats, members)
            except Exception as err:  # the server is down (MLflow's own client retries are spent): keep it queued
                self._spill_queued()
                with self._cv:
                    if self._down_since is None:
                        self._down_since = time.monotonic()
                        self.logger.warning(
                            "run %s: the tracking server %s is not answering (%s); training goes on, generation %s "
                            "and later ones are queued and will be logged in order when it is back",
                            self.tracker.run_id, self.tracker.uri, _short(err), stats["generation"])
                    if self._abandon:
                        return
                    self._cv.wait(delay)
                delay = min(2 * delay, self.max_backoff)
                continue
            delay = 1.0
            if int(stats["generation"]) in self._spilled and self.unspill is not None:
                with contextlib.suppress(Exception):
                    self.unspill(int(stats["generation"]))
            with self._cv:
                self._items.popleft()
                if self._down_since is not None:
                    self.logger.info("run %s: the tracking server is back after %.0f s; logged generation %s "
                                     "(%d still queued)", self.tracker.run_id, time.monotonic() - self._down_since,
                                     stats["generation"], len(self._items))
                    self._down_since = None
                self._cv.notify_all()

    def _spill_queued(self) -> None:
        if self.spill is None:
            return
        with self._cv:
            items = [(st, m) for st, m in self._items if int(st["generation"]) not in self._spilled]
        for stats, members in items:
            try:
                self.spill(stats, members)
                self._spilled.add(int(stats["generation"]))
            except Exception as err:  # storage down too: resume rebuilds the rows from the committed generation
                self.logger.warning("run %s: could not keep generation %s's tracking rows in storage: %s",
                                    self.tracker.run_id, stats["generation"], _short(err))
                return

    def close(self, timeout: float) -> list[int]:
        """Wait up to `timeout` seconds for the queue to drain; returns the generations still undelivered (the
        thread then stops after its current attempt; a later process delivers them exactly once)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            while self._items and time.monotonic() < deadline:
                self._cv.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            self._abandon = True
            self._cv.notify_all()
            left = [int(stats["generation"]) for stats, _ in self._items]
        if left:
            self._spill_queued()
        return left


def _short(err: Exception) -> str:
    text = str(getattr(err, "message", None) or err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]
