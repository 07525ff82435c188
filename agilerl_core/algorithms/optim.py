"""Adam over one contiguous parameter buffer.

A network's parameters (and their gradients) are re-pointed to views of one flat tensor, so the
optimiser step, gradient zeroing and soft target updates are a handful of whole-buffer ops instead of
a loop over tensors. Bias correction is tracked per element, so a tensor whose state is reset after a
mutation behaves exactly like a fresh Adam while every other tensor keeps its moments.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from agilerl_core.networks.transfer import overlap_slices


def flatten_parameters(module: nn.Module, with_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Move `module`'s parameters into one flat buffer (and grads into another); return both."""
    flat, grad = _into_flat(list(module.parameters()), with_grad)
    return flat, grad


def stack_parameters(modules: Sequence[nn.Module], with_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Move the parameters of `modules` (the same names and shapes in each) into one flat buffer, module after
    module: module m's parameters are the m-th equal segment, laid out as :func:`flatten_parameters` lays out one
    module (so the buffer viewed [M, P] is one row per module, as a group stacks members). Returns the flat buffer
    and the flat gradient (or None)."""
    per_module = [list(m.parameters()) for m in modules]
    shapes = [[tuple(p.shape) for p in ps] for ps in per_module]
    if any(s != shapes[0] for s in shapes):
        raise ValueError("stacked modules must have the same parameter shapes")
    flat, grad = _into_flat([p for ps in per_module for p in ps], with_grad)
    return flat, grad


def _into_flat(params: list[torch.Tensor], with_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Lay `params` out one after another in a flat buffer, re-pointing each to its view (and its gradient to
    the same view of a flat gradient). Returns (flat, grad or None)."""
    total = sum(p.numel() for p in params)
    dev = params[0].device if params else torch.device("cpu")
    flat = torch.empty(total, dtype=torch.float32, device=dev)
    grad = torch.zeros(total, dtype=torch.float32, device=dev) if with_grad else None
    i = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            view = flat[i: i + n].view(p.shape)
            view.copy_(p)
            p.data = view
            if with_grad:
                p.grad = grad[i: i + n].view(p.shape)
            else:
                p.requires_grad_(False)
            i += n
    return flat, grad


def _state_view(buffer: torch.Tensor, flat: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The part of `buffer` (laid out as `flat`) that belongs to parameter `p` (a view of `flat`)."""
    return buffer.as_strided(p.shape, p.stride(), buffer.storage_offset() + p.storage_offset() - flat.storage_offset())


class FlatAdam:
    """A member's Adam (Kingma & Ba, 2015) state for parameters that live in one flat buffer: those of one
    module, or of several identically shaped modules stacked (``stack=True``, see :func:`stack_parameters`).
    It holds the weights, moments, step powers and scalars that checkpoints save and mutations keep; the steps
    themselves are taken by :class:`~agilerl_core.algorithms.group_state.StackedAdam` for a group of members (a
    member alone: a group of one). :meth:`view` gives each stacked module its own handle (its state and
    scalars) for checkpoints and mutations."""

    def __init__(self, module: nn.Module | Sequence[nn.Module], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, stack: bool = False) -> None:
        self.lr = float(lr)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        if stack:
            self.modules = list(module)
            self.flat, self.grad = stack_parameters(self.modules, with_grad=True)
        else:
            self.modules = [module]
            self.flat, self.grad = flatten_parameters(module, with_grad=True)
        self.m = torch.zeros_like(self.flat)
        self.v = torch.zeros_like(self.flat)
        self.beta1_pow = torch.ones_like(self.flat)  # beta1^t per element
        self.beta2_pow = torch.ones_like(self.flat)

    def state_tensors(self, module: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """Per-parameter state of `module` (default: the only one): `m/<name>`, `v/<name>`,
        `beta1_pow/<name>`, `beta2_pow/<name>`."""
        out = {}
        for name, p in (module or self._only()).named_parameters():
            for key in ("m", "v", "beta1_pow", "beta2_pow"):
                out[f"{key}/{name}"] = _state_view(getattr(self, key), self.flat, p).clone()
        return out

    def load_state_tensors(self, state: dict[str, torch.Tensor], strict: bool = True,
                           module: nn.Module | None = None) -> list[str]:
        """Load per-parameter state of `module` (default: the only one). With strict=False a parameter whose
        width changed (a mutation) keeps the state of the entries it shares with the old one, as its weights
        do (start-aligned; conv kernels centred), and its new entries start fresh (zero moments, their own
        bias correction); a new parameter starts fresh. Returns the names whose state was kept, wholly or
        over the overlap."""
        kept = []
        for name, p in (module or self._only()).named_parameters():
            src = {k: state.get(f"{k}/{name}") for k in ("m", "v", "beta1_pow", "beta2_pow")}
            if all(t is not None and tuple(t.shape) == tuple(p.shape) for t in src.values()):
                for k, t in src.items():
                    _state_view(getattr(self, k), self.flat, p).copy_(t)
                kept.append(name)
            elif not strict and all(t is not None and t.ndim == p.ndim for t in src.values()):
                centered = (2, 3) if p.ndim == 4 else ()
                for k, t in src.items():
                    s_new, s_old = overlap_slices(p.shape, t.shape, centered)
                    _state_view(getattr(self, k), self.flat, p)[s_new] = t[s_old].to(p.device)
                kept.append(name)
            elif strict:
                raise ValueError(f"optimiser state for {name!r} is missing or has the wrong shape")
        return kept

    def _only(self) -> nn.Module:
        if len(self.modules) != 1:
            raise ValueError("this optimiser steps several modules: name one (or use view(module))")
        return self.modules[0]

    def scalars(self) -> dict:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps}

    def view(self, module: nn.Module) -> AdamView:
        return AdamView(self, module)


class AdamView:
    """One module's handle on a :class:`FlatAdam` that steps several: its state and the shared scalars."""

    def __init__(self, adam: FlatAdam, module: nn.Module) -> None:
        self.adam, self.module = adam, module

    lr = property(lambda self: self.adam.lr, lambda self, v: setattr(self.adam, "lr", float(v)))
    betas = property(lambda self: self.adam.betas, lambda self, v: setattr(self.adam, "betas", tuple(v)))
    eps = property(lambda self: self.adam.eps, lambda self, v: setattr(self.adam, "eps", float(v)))

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.adam.state_tensors(self.module)

    def load_state_tensors(self, state: dict[str, torch.Tensor], strict: bool = True) -> list[str]:
        return self.adam.load_state_tensors(state, strict, self.module)

    def scalars(self) -> dict:
        return self.adam.scalars()


def adam_update_stacked_(param: torch.Tensor, grad: torch.Tensor, state: torch.Tensor, lr: torch.Tensor,
                         active: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """One Adam step, in place, of a small tensor kept outside the networks (SAC's temperature, PPO's log std)
    for K members at once: `param` and `grad` [K, n], `state` [K, 2n + 1] (each row m (n), v (n), step; zeros at
    the start), `lr` [K]; only the `active` [K] members step (the others keep parameter and state
    exactly). No host round trip."""
    n = param.shape[1]
    b1, b2 = betas
    on = active.to(param.dtype).unsqueeze(1)
    m, v, t = state[:, :n], state[:, n: 2 * n], state[:, 2 * n:]
    g = grad.reshape(param.shape)
    t.add_(on)
    m.lerp_(g, on * (1.0 - b1))
    v.mul_(1.0 - on * (1.0 - b2)).addcmul_(g * on, g, value=1.0 - b2)
    tt = t.clamp(min=1.0)
    step = (m / (1 - b1 ** tt)) / ((v / (1 - b2 ** tt)).sqrt() + eps)
    param.sub_(torch.where(on > 0, lr.unsqueeze(1) * step, 0.0))
