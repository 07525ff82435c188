"""A recurrent core (LSTM or GRU) between an evolvable network's features and its MLP head.

The cell maths is written once over a leading member axis K: a network alone runs it at K = 1, a group of
stacked members (:class:`~agilerl_core.networks.stacked.StackedNetwork`) at K. Each layer's parameters are
gate-major, ``w_ih`` [G, H, in], ``w_hh`` [G, H, H], ``b_ih`` / ``b_hh`` [G, H] (G = 4 for an LSTM: input,
forget, cell, output; G = 3 for a GRU: reset, update, new), so a member with a narrower hidden size stacks
zero-padded in the leading corner of every gate: a padded unit has zero weights in and out, its state stays
0 (LSTM: c' = 0.5 c + 0.5 tanh(0); GRU: h' = 0.5 h + 0.5 tanh(0)) and every gradient reaching it is 0.

A recurrent state is one tensor [..., layers, S, H] (S = 2 for an LSTM's (h, c), 1 for a GRU's h), so a
rollout stores it like any other field. ``starts`` [..., L] marks the steps that begin an episode: the
state is zeroed before such a step, in acting and in the truncated backpropagation through time alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

CELLS = ("lstm", "gru")
GATES = {"lstm": 4, "gru": 3}
STATE_PARTS = {"lstm": 2, "gru": 1}


@dataclass(frozen=True)
class RNNSpec:
    """A recurrent core: cell kind, input width, hidden size, layers."""

    cell: str
    in_dim: int
    hidden: int
    layers: int = 1

    def to_dict(self) -> dict:
        return {"cell": self.cell, "in_dim": self.in_dim, "hidden": self.hidden, "layers": self.layers}

    @classmethod
    def from_dict(cls, d: dict) -> RNNSpec:
        cell = str(d["cell"])
        if cell not in CELLS:
            raise ValueError(f"rnn cell {cell!r} is not one of {CELLS}")
        return cls(cell, int(d["in_dim"]), int(d["hidden"]), int(d["layers"]))

    def state_shape(self) -> tuple[int, int, int]:
        """A state's trailing shape (layers, S, H)."""
        return self.layers, STATE_PARTS[self.cell], self.hidden


class EvolvableRNN(nn.Module):
    """The recurrent core's parameters (``layers.i.w_ih`` ...), initialised as PyTorch's LSTM/GRU are:
    uniform in +-1/sqrt(H), drawn from an explicit generator."""

    def __init__(self, spec: RNNSpec, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.spec = spec
        g, h = GATES[spec.cell], spec.hidden
        bound = 1.0 / math.sqrt(h)
        self.layers = nn.ModuleList()
        for i in range(spec.layers):
            layer = nn.Module()
            layer.w_ih = nn.Parameter(torch.empty(g, h, spec.in_dim if i == 0 else h))
            layer.w_hh = nn.Parameter(torch.empty(g, h, h))
            layer.b_ih = nn.Parameter(torch.empty(g, h))
            layer.b_hh = nn.Parameter(torch.empty(g, h))
            with torch.no_grad():
                for p in (layer.w_ih, layer.w_hh, layer.b_ih, layer.b_hh):
                    p.uniform_(-bound, bound, generator=generator)
            self.layers.append(layer)

    def stacked_params(self) -> list[tuple[torch.Tensor, ...]]:
        """Each layer's (w_ih, w_hh, b_ih, b_hh) with a member axis of one."""
        return [(lay.w_ih[None], lay.w_hh[None], lay.b_ih[None], lay.b_hh[None]) for lay in self.layers]

    def forward(self, x: torch.Tensor, state: torch.Tensor | None, starts: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequences x [B, L, in] from `state` [B, layers, S, H] (None: zeros) with episode `starts` [B, L]:
        (outputs [B, L, H], the state after the last step)."""
        out, new = run_sequence(self.spec.cell, self.stacked_params(), x[None],
                                None if state is None else state[None], None if starts is None else starts[None])
        return out[0], new[0]

    def rebuilt(self, spec: RNNSpec, generator: torch.Generator | None = None) -> EvolvableRNN:
        """A new core with `spec` keeping every weight that still exists. Units a mutation adds get fresh
        weights in and zero weights out (into the other units and the next layer), so adding units leaves
        the function unchanged; a new layer starts fresh."""
        new = EvolvableRNN(spec, generator)
        old = dict(self.named_parameters())
        with torch.no_grad():
            for name, p in new.named_parameters():
                if name not in old:
                    continue
                o = old[name]
                h_old = min(o.shape[1], p.shape[1])
                if p.ndim == 3:  # existing units read nothing from the new ones
                    p[:, :h_old].zero_()
                region = tuple(slice(0, min(a, b)) for a, b in zip(p.shape, o.shape, strict=True))
                p[region] = o[region]
        return new


def zero_state(spec: RNNSpec, batch: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.zeros((*batch, *spec.state_shape()), device=device)


def cell_step(cell: str, x: torch.Tensor, s: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
              b_ih: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    """One step of one layer for K members: x [K, B, in], state s [K, B, S, H], weights [K, G, H, ...];
    returns the new state [K, B, S, H] (its h is s[:, :, 0])."""
    k, b = x.shape[0], x.shape[1]
    g, h = w_ih.shape[1], w_ih.shape[2]
    gi = torch.baddbmm(b_ih.reshape(k, 1, g * h), x, w_ih.reshape(k, g * h, -1).transpose(1, 2)).view(k, b, g, h)
    gh = torch.baddbmm(b_hh.reshape(k, 1, g * h), s[:, :, 0], w_hh.reshape(k, g * h, h).transpose(1, 2)).view(k, b, g, h)
    if cell == "lstm":
        z = gi + gh
        i, f, o = torch.sigmoid(z[:, :, 0]), torch.sigmoid(z[:, :, 1]), torch.sigmoid(z[:, :, 3])
        c = f * s[:, :, 1] + i * torch.tanh(z[:, :, 2])
        return torch.stack([o * torch.tanh(c), c], dim=2)
    r = torch.sigmoid(gi[:, :, 0] + gh[:, :, 0])
    u = torch.sigmoid(gi[:, :, 1] + gh[:, :, 1])
    n = torch.tanh(gi[:, :, 2] + r * gh[:, :, 2])
    return ((1 - u) * n + u * s[:, :, 0]).unsqueeze(2)


def run_sequence(cell: str, params: list[tuple[torch.Tensor, ...]], x: torch.Tensor, state: torch.Tensor | None,
                 starts: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """K members' sequences x [K, B, L, in] through their stacked layers (`params`: per layer (w_ih, w_hh,
    b_ih, b_hh), each [K, ...]) from `state` [K, B, layers, S, H] (None: zeros), zeroing the state before
    every step where `starts` [K, B, L] is set: (top layer's outputs [K, B, L, H], final state)."""
    k, b, steps = x.shape[0], x.shape[1], x.shape[2]
    h = params[0][0].shape[2]
    if state is None:
        state = x.new_zeros(k, b, len(params), STATE_PARTS[cell], h)
    layers = list(state.unbind(2))
    keep = None if starts is None else (~starts.bool()).to(x.dtype)
    outs = []
    for t in range(steps):
        inp = x[:, :, t]
        if keep is not None:
            m = keep[:, :, t, None, None]
            layers = [s * m for s in layers]
        for i, p in enumerate(params):
            layers[i] = cell_step(cell, inp, layers[i], *p)
            inp = layers[i][:, :, 0]
        outs.append(inp)
    return torch.stack(outs, dim=2), torch.stack(layers, dim=2)
