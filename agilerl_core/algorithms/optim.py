"""Adam over one contiguous parameter buffer.

A network's parameters (and their gradients) are re-pointed to views of one flat tensor, so the
optimiser step, gradient zeroing and soft target updates are a handful of whole-buffer ops instead of
a loop over tensors. Bias correction is tracked per element, so a tensor whose state is reset after a
mutation behaves exactly like a fresh Adam while every other tensor keeps its moments.
"""

from __future__ import annotations

import torch
from torch import nn


def flatten_parameters(module: nn.Module, with_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Move `module`'s parameters into one flat buffer (and grads into another); return both."""
    params = list(module.parameters())
    total = sum(p.numel() for p in params)
    dev = params[0].device if params else torch.device("cpu")
    flat = torch.empty(total, dtype=torch.float32, device=dev)
    grad = torch.zeros(total, dtype=torch.float32, device=dev) if with_grad else None
    i = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[i: i + n].copy_(p.reshape(-1))
            p.data = flat[i: i + n].view_as(p)
            if with_grad:
                p.grad = grad[i: i + n].view_as(p)
            else:
                p.requires_grad_(False)
            i += n
    return flat, grad


class FlatAdam:
    """Adam (Kingma & Ba, 2015) on a module whose parameters live in one flat buffer."""

    def __init__(self, module: nn.Module, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.lr = float(lr)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in module.named_parameters()]
        self.flat, self.grad = flatten_parameters(module, with_grad=True)
        self.m = torch.zeros_like(self.flat)
        self.v = torch.zeros_like(self.flat)
        self.beta1_pow = torch.ones_like(self.flat)  # beta1^t per element
        self.beta2_pow = torch.ones_like(self.flat)

    def zero_grad(self) -> None:
        self.grad.zero_()

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Scale the gradient to a global norm of at most `max_norm` (as torch.nn.utils.clip_grad_norm_)."""
        norm = torch.linalg.vector_norm(self.grad)
        self.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        self.beta1_pow.mul_(b1)
        self.beta2_pow.mul_(b2)
        self.m.lerp_(self.grad, 1.0 - b1)
        self.v.mul_(b2).addcmul_(self.grad, self.grad, value=1.0 - b2)
        denom = self.v.div(1.0 - self.beta2_pow).sqrt_().add_(self.eps)
        self.flat.addcdiv_(self.m.div(1.0 - self.beta1_pow), denom, value=-self.lr)

    def _slices(self) -> dict[str, tuple[slice, tuple[int, ...]]]:
        out, i = {}, 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            n = 1
            for d in shape:
                n *= d
            out[name] = (slice(i, i + n), shape)
            i += n
        return out

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Per-parameter state: `m/<name>`, `v/<name>`, `beta1_pow/<name>`, `beta2_pow/<name>`."""
        out = {}
        for name, (sl, shape) in self._slices().items():
            for key in ("m", "v", "beta1_pow", "beta2_pow"):
                out[f"{key}/{name}"] = getattr(self, key)[sl].view(shape).clone()
        return out

    def load_state_tensors(self, state: dict[str, torch.Tensor], strict: bool = True) -> list[str]:
        """Load per-parameter state; with strict=False, parameters whose shape changed (or that are new)
        keep a fresh state. Returns the names whose state was kept."""
        kept = []
        for name, (sl, shape) in self._slices().items():
            src = {k: state.get(f"{k}/{name}") for k in ("m", "v", "beta1_pow", "beta2_pow")}
            if all(t is not None and tuple(t.shape) == shape for t in src.values()):
                for k, t in src.items():
                    getattr(self, k)[sl].copy_(t.reshape(-1))
                kept.append(name)
            elif strict:
                raise ValueError(f"optimiser state for {name!r} is missing or has the wrong shape")
        return kept

    def scalars(self) -> dict:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps}


@torch.no_grad()
def adam_update_(param: torch.Tensor, grad: torch.Tensor, state: torch.Tensor, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """One Adam step, in place, on a small tensor kept outside the networks (SAC's temperature, PPO's
    log std). `state` holds [m (n), v (n), step], flattened, zeros at the start; it is updated in place."""
    n = param.numel()
    b1, b2 = betas
    m, v, t = state[:n], state[n: 2 * n], state[2 * n]
    g = grad.reshape(-1)
    t += 1
    m.mul_(b1).add_(g, alpha=1.0 - b1)
    v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
    step = (m / (1 - b1 ** float(t))) / ((v / (1 - b2 ** float(t))).sqrt() + eps)
    param.sub_(lr * step.view_as(param))
