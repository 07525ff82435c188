"""Training diagnostics per member, kept on the device while a phase runs and read back once with its other
numbers (the fitness, the returns): what SB3 logs to TensorBoard and CleanRL to W&B (losses, entropy, KL,
Q-values, gradient norms...), for every member of a group at once.

:class:`MetricSums`: named [K] values added at every learn step (each a mean over the step's rows), summed with
a [K] weight (which members took the step); :meth:`MetricSums.means` reads them all in one copy to the host.
:class:`EpisodeTally`: the episodes that ended while a group collected (their returns and lengths) from the
[K, N] rewards and done flags of each vector step, on the device.
They sit at the bottom of the house: the algorithms fill the first, the arenas the second, and both end in a
:class:`~agilerl_core.results.TrainResult`'s ``metrics``."""

from __future__ import annotations

import torch


class MetricSums:
    """Each member's running sums of named diagnostics [K] and how much weight each has had; one host read.

    Values added together (one :meth:`add` call) are stacked and summed in one op, so a step's diagnostics cost a
    few small ops whatever their number, and nothing is read back until :meth:`means`. A group whose steps are
    many and cheap measures one step in `every` (:meth:`due`: the first, then every `every`-th, counted on the
    host), so that measuring stays within the noise of its speed."""

    def __init__(self, k: int, device: torch.device | str, every: int = 1) -> None:
        self.k, self.device, self.every = k, torch.device(device), every
        self._sums: dict[tuple[str, ...], list[torch.Tensor]] = {}  # names -> [values sum [M, K], weight sum [M, K]]
        self._last: dict[str, torch.Tensor] = {}
        self._calls: dict[str, int] = {}
        self._marks: list[tuple[list[int], dict[tuple[str, ...], list[torch.Tensor]]]] = []  # (env steps, sums then)

    def due(self, kind: str = "step") -> bool:
        """Whether this step of `kind` (a learn step; an actor's delayed step counts apart) is one to measure (one
        in :attr:`every`); counts the step."""
        n = self._calls.get(kind, 0)
        self._calls[kind] = n + 1
        return n % self.every == 0

    @torch.no_grad()
    def add(self, weight: torch.Tensor | None = None, **values: torch.Tensor) -> None:
        """Add each named value [K] (a member's mean over one step), weighted by `weight` [K] (bool or float:
        which members took the step; None: all of them). A value that is not a number (an explained variance of
        returns that did not vary) counts as not measured, for that member and name only."""
        names = tuple(values)
        stacked = torch.stack([v.detach().reshape(self.k) for v in values.values()]).to(torch.float32)
        finite = torch.isfinite(stacked)
        w = finite.to(torch.float32) if weight is None else finite * weight.to(torch.float32)
        slot = self._sums.get(names)
        if slot is None:
            self._sums[names] = [stacked.nan_to_num(0.0, 0.0, 0.0) * w, w]
        else:
            slot[0].add_(stacked.nan_to_num(0.0, 0.0, 0.0) * w)
            slot[1].add_(w)

    @torch.no_grad()
    def last(self, **values: torch.Tensor) -> None:
        """Record each named value [K] as it is now (a schedule's value at the end of the phase: epsilon)."""
        for name, v in values.items():
            self._last[name] = v.detach().reshape(self.k)

    @torch.no_grad()
    def mark(self, steps: list[int]) -> None:
        """A point within a long phase: each member's env steps so far (`steps`, host ints) and a copy of the sums
        (on the device), so :meth:`points` can give the means of each stretch between marks."""
        self._marks.append((list(steps), {keys: [sums.clone(), w.clone()] for keys, (sums, w) in self._sums.items()}))

    def points(self) -> list[list[list]]:
        """Per member, at each :meth:`mark`: [its env steps then, the means of what was measured since the mark
        before]; empty without marks. One copy to the host."""
        out: list[list[list]] = [[] for _ in range(self.k)]  # lists, not tuples: they travel as JSON
        if not self._marks:
            return out
        parts, layout = [], []
        previous: dict[tuple[str, ...], list[torch.Tensor]] = {}
        for at, snapshot in self._marks:
            for keys, (sums, w) in snapshot.items():
                before = previous.get(keys)
                d_sums, d_w = (sums, w) if before is None else (sums - before[0], w - before[1])
                parts.append(torch.where(d_w > 0, d_sums / d_w.clamp(min=1e-12), torch.nan))
                layout += [(at, name) for name in keys]
            previous = snapshot
        for (at, name), row in zip(layout, torch.cat(parts).cpu().tolist(), strict=True):
            for i, value in enumerate(row):
                if value == value:  # not nan: the member measured it in this stretch
                    if not out[i] or out[i][-1][0] != at[i]:
                        out[i].append([at[i], {}])
                    out[i][-1][1][name] = value
        return out

    def means(self) -> list[dict[str, float]]:
        """Per member: each diagnostic's weighted mean over the phase (absent where the member never took a step
        that measured it), and the :meth:`last` values. One copy to the host."""
        out: list[dict[str, float]] = [{} for _ in range(self.k)]
        if not self._sums and not self._last:
            return out
        parts, names = [], []
        for keys, (sums, w) in self._sums.items():
            parts.append(torch.where(w > 0, sums / w.clamp(min=1e-12), torch.nan))
            names += list(keys)
        for name, v in self._last.items():
            parts.append(v.to(torch.float32).unsqueeze(0))
            names.append(name)
        table = torch.cat(parts).cpu().tolist()  # [M, K]
        for name, row in zip(names, table, strict=True):
            for i, value in enumerate(row):
                if value == value:  # not nan: the member measured it
                    out[i][name] = value
        return out


class EpisodeTally:
    """The episodes K members' N envs each end while they collect (the envs start fresh with the phase): each
    env's running return and the step its last episode ended at, and each member's summed returns and count of
    ended episodes (all on the device). The ended episodes of an env tile its steps up to its last end, so their
    lengths sum to that step: no length is counted per step."""

    def __init__(self, k: int, n: int, device: torch.device | str) -> None:
        self.running = torch.zeros(k, n, device=device)
        self.ended_at = torch.zeros(k, n, device=device)  # vector steps up to each env's last episode end
        self.return_sum = torch.zeros(k, device=device)
        self.count = torch.zeros(k, device=device)
        self.steps = 0

    @torch.no_grad()
    def step(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """One vector step's rewards and done flags ([K, N], or [K * N]: member-major)."""
        done = done.view_as(self.running)
        self.steps += 1
        self.running += reward.view_as(self.running)
        self.return_sum += (self.running * done).sum(1)
        self.count += done.sum(1)
        self.running.masked_fill_(done, 0.0)
        self.ended_at.masked_fill_(done, float(self.steps))

    def read(self) -> tuple[list[int], list[float], list[float]]:
        """(episodes ended, their mean return, their mean length) per member, nan where none ended; one read."""
        count, ret, length = torch.stack([self.count, self.return_sum, self.ended_at.sum(1)]).cpu().tolist()
        return ([int(c) for c in count], [r / c if c else float("nan") for r, c in zip(ret, count, strict=True)],
                [n / c if c else float("nan") for n, c in zip(length, count, strict=True)])


def marks(vector_steps: int, env_steps: int, points: int = 4, long: int = 4000) -> set[int]:
    """The vector steps (1-based) after which a phase of `vector_steps` (`env_steps` per member) marks its
    diagnostics (:meth:`MetricSums.mark`): `points` evenly spaced ones, the last at its end, when the phase is long
    (at least `long` env steps per member); none otherwise (the phase's means are its one point)."""
    if env_steps < long or vector_steps < points:
        return set()
    return {round(vector_steps * (i + 1) / points) for i in range(points)}


def phase_metrics(diagnostics: dict[str, float], env_steps: int, wall_s: float, episode_length: float,
                  loss: float = float("nan")) -> dict[str, float]:
    """A member's :attr:`~agilerl_core.results.TrainResult.metrics` for one phase: its learn steps' diagnostics,
    its mean `loss` over every learn step (where the diagnostics have none of their own), its env steps per second
    of the phase's wall time and the mean length of the episodes it ended (when any)."""
    out = dict(diagnostics)
    if loss == loss and "loss" not in out:
        out["loss"] = loss
    if wall_s > 0:
        out["env_steps_per_s"] = env_steps / wall_s
    if episode_length == episode_length:
        out["episode_length"] = episode_length
    return out


def per_unit_points(points: dict[str, list[list[list]]]) -> list[list[list]]:
    """:func:`per_unit` for :meth:`MetricSums.points`: each member's points of every unit, merged by env steps."""
    k = len(next(iter(points.values()), []))
    out = []
    for i in range(k):
        merged: dict[int, dict[str, float]] = {}
        for u, rows in points.items():
            for at, values in rows[i]:
                merged.setdefault(at, {}).update({f"{name}.{u}": v for name, v in values.items()})
        out.append([[at, merged[at]] for at in sorted(merged)])
    return out


def per_unit(means: dict[str, list[dict[str, float]]]) -> list[dict[str, float]]:
    """Each member's diagnostics of several policy units (a multi-agent team's, unit -> :meth:`MetricSums.means`)
    as one dict per member, each name suffixed with its unit (``loss.speaker_0``)."""
    k = len(next(iter(means.values()), []))
    return [{f"{name}.{u}": v for u, rows in means.items() for name, v in rows[i].items()} for i in range(k)]


_HEADLINE = (("loss", "critic_loss"), ("entropy", "q", "accuracy", "reward", "kl"))


def headline(fitnesses: list[float], train_metrics: list[dict[str, float]]) -> str:
    """The generation's best member's training in two numbers for a one-line report (its loss, then its entropy,
    mean Q or accuracy, whichever it has: ``"loss 0.123, q 3.87"``); empty when it has none."""
    scored = [(f, i) for i, f in enumerate(fitnesses) if f == f and i < len(train_metrics)]
    if not scored:
        return ""
    metrics = train_metrics[max(scored)[1]]
    parts = []
    for choices in _HEADLINE:
        name = next((c for c in choices if c in metrics), None)
        if name is not None:
            parts.append(f"{name.replace('_', ' ')} {metrics[name]:.3g}")
    return ", ".join(parts)
