"""Adam over one contiguous parameter buffer.

A network's parameters (and their gradients) are re-pointed to views of one flat tensor, so the
optimiser step, gradient zeroing and soft target updates are a handful of whole-buffer ops instead of
a loop over tensors. Bias correction is tracked per element, so a tensor whose state is reset after a
mutation behaves exactly like a fresh Adam while every other tensor keeps its moments.
"""

from __future__ import annotations

import math
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


Params = tuple[tuple[str, tuple[int, ...]], ...]  # one module's parameters (name, shape) in its buffer's order


def _params(module: nn.Module) -> Params:
    return tuple((name, tuple(p.shape)) for name, p in module.named_parameters())


class FlatAdam:
    """A member's Adam (Kingma & Ba, 2015) state for parameters that live in one flat buffer: those of one
    module, or of M identically shaped modules stacked (``stack=True``, see :func:`stack_parameters`; module m's
    parameters the m-th equal segment). It holds the weights, moments, step powers and scalars that checkpoints
    save and mutations keep; the steps themselves are taken by
    :class:`~agilerl_core.algorithms.group_state.StackedAdam` for a group of members (a member alone: a group of
    one). :meth:`view` gives each stacked module its own handle (its state and scalars) for checkpoints and
    mutations. It reads its state by the modules' parameter names and shapes, not through the modules: a
    :meth:`shell` has none built (`modules` lists the modules built over its buffer, for re-pointing)."""

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
        self.params: Params = _params(self.modules[0])
        self.count = len(self.modules)
        self.m = torch.zeros_like(self.flat)
        self.v = torch.zeros_like(self.flat)
        self.beta1_pow = torch.ones_like(self.flat)  # beta1^t per element
        self.beta2_pow = torch.ones_like(self.flat)

    def shell(self) -> FlatAdam:
        """A copy of the scalars and layout with no module and no buffers of its own yet (a clone's: every buffer
        is set next, see :meth:`~agilerl_core.algorithms.base.RLAlgorithm.set_flat_buffer`)."""
        out = FlatAdam.__new__(FlatAdam)
        out.lr, out.betas, out.eps = self.lr, self.betas, self.eps
        out.params, out.count, out.modules, out.grad = self.params, self.count, [], None
        for name in ("flat", "m", "v", "beta1_pow", "beta2_pow"):
            setattr(out, name, None)
        return out

    def segment(self, buffer: torch.Tensor, index: int = 0) -> torch.Tensor:
        """Module `index`'s part of `buffer` (one of this Adam's buffers)."""
        size = buffer.numel() // self.count
        return buffer[index * size: (index + 1) * size]

    def _views(self, key: str, index: int) -> dict[str, torch.Tensor]:
        seg, out, i = self.segment(getattr(self, key), index), {}, 0
        for name, shape in self.params:
            n = math.prod(shape)
            out[name] = seg[i: i + n].view(shape)
            i += n
        return out

    def state_tensors(self, index: int | None = None) -> dict[str, torch.Tensor]:
        """Per-parameter state of module `index` (default: the only one): `m/<name>`, `v/<name>`,
        `beta1_pow/<name>`, `beta2_pow/<name>`."""
        views = {key: self._views(key, self._only(index)) for key in ("m", "v", "beta1_pow", "beta2_pow")}
        return {f"{key}/{name}": views[key][name].clone() for name, _ in self.params for key in views}

    def load_state_tensors(self, state: dict[str, torch.Tensor], strict: bool = True,
                           index: int | None = None) -> list[str]:
        """Load per-parameter state of module `index` (default: the only one). With strict=False a parameter
        whose width changed (a mutation) keeps the state of the entries it shares with the old one, as its
        weights do (start-aligned; conv kernels centred), and its new entries start fresh (zero moments, their
        own bias correction); a new parameter starts fresh. Returns the names whose state was kept, wholly or
        over the overlap."""
        index = self._only(index)
        views = {key: self._views(key, index) for key in ("m", "v", "beta1_pow", "beta2_pow")}
        kept = []
        for name, shape in self.params:
            src = {k: state.get(f"{k}/{name}") for k in views}
            if all(t is not None and tuple(t.shape) == shape for t in src.values()):
                for k, t in src.items():
                    views[k][name].copy_(t)
                kept.append(name)
            elif not strict and all(t is not None and t.ndim == len(shape) for t in src.values()):
                centered = (2, 3) if len(shape) == 4 else ()
                for k, t in src.items():
                    s_new, s_old = overlap_slices(shape, t.shape, centered)
                    views[k][name][s_new] = t[s_old].to(self.flat.device)
                kept.append(name)
            elif strict:
                raise ValueError(f"optimiser state for {name!r} is missing or has the wrong shape")
        return kept

    def _only(self, index: int | None) -> int:
        if index is None and self.count != 1:
            raise ValueError("this optimiser steps several modules: name one (or use view(index))")
        return 0 if index is None else index

    def scalars(self) -> dict:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps}

    def view(self, index: int) -> AdamView:
        return AdamView(self, index)


class AdamView:
    """One module's handle on a :class:`FlatAdam` that steps several: its state and the shared scalars."""

    def __init__(self, adam: FlatAdam, index: int) -> None:
        self.adam, self.index = adam, index

    lr = property(lambda self: self.adam.lr, lambda self, v: setattr(self.adam, "lr", float(v)))
    betas = property(lambda self: self.adam.betas, lambda self, v: setattr(self.adam, "betas", tuple(v)))
    eps = property(lambda self: self.adam.eps, lambda self, v: setattr(self.adam, "eps", float(v)))

    @property
    def flat(self) -> torch.Tensor:
        """Its module's weights in the shared buffer."""
        return self.adam.segment(self.adam.flat, self.index)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.adam.state_tensors(self.index)

    def load_state_tensors(self, state: dict[str, torch.Tensor], strict: bool = True) -> list[str]:
        return self.adam.load_state_tensors(state, strict, self.index)

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
