"""Non-finite values (NaN, inf) stop a member's training with a :class:`~agilerl_core.errors.NonFiniteError`
naming the env or dataset, the member, the step and the value, before anything of the generation is committed.

Checked cheaply, with no host wait added to the loop on CUDA:

* rewards and observations from host envs are looked at on the host (`_bad`; a group's envs name the member
  only once something is wrong), every step, before they reach a buffer (an integer array, e.g. an image, is
  finite by construction);
* losses of a batched learn step stay on the device: :class:`FirstBad` keeps them and finds, per member, the
  first step whose loss was not finite (a few kernels per 256 steps), read once at the end of the training phase;
* weights are checked once per member after its training phase (:func:`nonfinite_weight`: one reduction,
  one host read) and again before a member is saved as elite or registered.

The arenas raise with the slot and step; :class:`~agilerl_core.evolution.Evolution` adds the member id,
the generation and the source (:func:`source_of`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from agilerl_core.errors import NonFiniteError


def source_of(cfg: Any) -> str:
    """Where a run's values come from, as an error names it: ``dataset URI`` (offline, LLM prompt sets) or
    ``env ENV_ID``."""
    if cfg is None:
        return "training"
    dataset = getattr(cfg, "dataset", None)
    uri = getattr(dataset, "uri", None) or getattr(dataset, "task", None)
    if uri is not None:
        return f"dataset {uri}"
    env_id = getattr(cfg, "env_id", None)
    return f"env {env_id}" if env_id is not None else f"run {getattr(cfg, 'name', '?')}"


def _bad(x: Any) -> bool:
    """Whether host data (an array, a number, or a dict / tuple of them) holds a non-finite float."""
    if type(x) is np.ndarray:  # the common case first: a few microseconds a step
        return x.dtype.kind in "fc" and not np.isfinite(x).all()
    if isinstance(x, dict):
        return any(_bad(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return any(_bad(v) for v in x)
    if isinstance(x, torch.Tensor):  # on-device data: a reduction and a host read (callers keep it off hot paths)
        return x.is_floating_point() and not bool(torch.isfinite(x).all())
    a = np.asarray(x)
    return a.dtype.kind in "fc" and not np.isfinite(a).all()


class FirstBad:
    """Per member of a group, the first step at which a per-member value (a loss) was not finite, found on the
    values' device: :meth:`see` only keeps the tensor (no kernel, no host wait); every `chunk` steps the kept
    ones are reduced to each member's first bad row, and :meth:`check` reads the reductions once."""

    def __init__(self, k: int, device: Any, chunk: int = 256) -> None:
        self.k, self.device, self.chunk = k, device, chunk
        self.pending: list[torch.Tensor] = []
        self.steps: list[int] = []
        self.folded: list[tuple[torch.Tensor, torch.Tensor, list[int]]] = []  # (any bad [K], first bad row [K], steps)

    def see(self, values: torch.Tensor, step: int) -> None:
        self.pending.append(values.detach())
        self.steps.append(step)
        if len(self.pending) >= self.chunk:
            self._fold()

    def _fold(self) -> None:
        if not self.pending:
            return
        bad = ~torch.isfinite(torch.stack([v.expand(self.k) for v in self.pending]))  # [C, K]
        self.folded.append((bad.any(0), bad.to(torch.int32).argmax(0), self.steps))
        self.pending, self.steps = [], []

    def check(self, slots: list[int], what: str, step_kind: str = "learn step") -> None:
        """Raise a NonFiniteError for the first member (in `slots` order) that met a non-finite value, naming
        the step it first did."""
        self._fold()
        if not self.folded:
            return
        folded, self.folded = self.folded, []
        anys = torch.stack([a for a, _, _ in folded]).cpu().tolist()  # one host read for the whole phase
        rows = torch.stack([r for _, r, _ in folded]).cpu().tolist()
        for i, slot in enumerate(slots):
            for (_, _, steps), bad, row in zip(folded, anys, rows, strict=True):
                if bad[i]:
                    raise NonFiniteError(None, slot, what, steps[row[i]], step_kind)


def _weights(agent: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A member's live floating-point tensors by name: its networks' parameters and buffers (an RL agent, or
    each learner of a team), else the tensors of its state (adapters, heads, optimiser moments)."""
    buffers, layouts = getattr(agent, "weight_buffers", None), getattr(agent, "layouts", None)
    if callable(buffers) and isinstance(layouts, dict):  # an RL agent: its networks' weights in its flat buffers
        for name, flat in buffers().items():
            for k, p in layouts[name].views(flat).items():
                yield f"{name}.{k}", p
        return
    nets = getattr(agent, "networks", None)
    if isinstance(nets, dict) and nets and all(isinstance(n, torch.nn.Module) for n in nets.values()):
        for name, net in nets.items():
            for k, p in net.state_dict(keep_vars=True).items():
                if p.is_floating_point():
                    yield f"{name}.{k}", p
        return
    learners = getattr(agent, "learners", None)  # a team of learners (IPPO, MAPPO): each one's networks
    if isinstance(learners, dict) and learners and all(hasattr(v, "networks") for v in learners.values()):
        for unit, learner in learners.items():
            for k, p in _weights(learner):
                yield f"{unit}.{k}", p
        return
    tensors, _ = agent.state()
    for k, v in tensors.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            yield k, v


def nonfinite_weight(agent: Any) -> str | None:
    """The name of the first of a member's weights holding NaN or inf (None: all finite). One reduction per
    device and one host read."""
    named = list(_weights(agent))
    if not named:
        return None
    flags = [torch.isfinite(t.detach()).all() for _, t in named]
    by_device: dict[torch.device, list[int]] = {}
    for i, f in enumerate(flags):
        by_device.setdefault(f.device, []).append(i)
    if all(bool(torch.stack([flags[i] for i in idx]).all()) for idx in by_device.values()):
        return None
    return next(name for (name, _), f in zip(named, flags, strict=True) if not bool(f))


def check_weights(agent: Any, slot: int, when: str = "after its training phase") -> None:
    """Raise a NonFiniteError naming the first non-finite weight of the member in `slot`."""
    name = nonfinite_weight(agent)
    if name is not None:
        raise NonFiniteError(None, slot, f"weight {name} ({when})", None)
