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
        return EvolvableRNN.rebuilt_from(dict(self.named_parameters()), spec, generator)

    @classmethod
    def rebuilt_from(cls, old: dict[str, torch.Tensor], spec: RNNSpec, generator: torch.Generator | None
                     ) -> EvolvableRNN:
        """:meth:`rebuilt` from the old core's parameters by name (no old module)."""
        new = cls(spec, generator)
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


def run_sequence(cell: str, params: list[tuple[torch.Tensor, ...]], x: torch.Tensor, state: torch.Tensor | None,
                 starts: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """K members' sequences x [K, B, L, in] through their stacked layers (`params`: per layer (w_ih, w_hh,
    b_ih, b_hh), each [K, ...]) from `state` [K, B, layers, S, H] (None: zeros), zeroing the state before
    every step where `starts` [K, B, L] is set: (top layer's outputs [K, B, L, H], final state).

    One loop over the L steps serves all K members' B sequences. Each layer's input projection is one matmul
    for all steps; a step is then one matmul and a few elementwise ops. When a gradient is needed the
    backward is written by hand (:class:`_Recurrence`): measured 1.8x faster than autograd through the step
    loop (LSTM and GRU, 4 members x 16 sequences x 16 steps, one CPU thread)."""
    k, b = x.shape[0], x.shape[1]
    if state is None:
        state = x.new_zeros(k, b, len(params), STATE_PARTS[cell], params[0][0].shape[2])
    keep = None if starts is None else (~starts.bool()).to(x.dtype)
    flat = [t for layer in params for t in layer]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, state, *flat)):
        return _Recurrence.apply(cell, keep, x, state, *flat)
    return _run(cell, params, x, state, keep, None)


def _run(cell: str, params: list[tuple[torch.Tensor, ...]], x: torch.Tensor, state: torch.Tensor,
         keep: torch.Tensor | None, saved: list | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`run_sequence`'s forward, layer by layer over time-major sequences; with `saved` (a list) each
    layer's input and per-step activations are appended to it (what :meth:`_Recurrence.backward` reads)."""
    k, b, steps = x.shape[0], x.shape[1], x.shape[2]
    inp = x.transpose(1, 2).reshape(k, steps * b, x.shape[3])  # time-major rows: step t is rows t*B..t*B+B-1
    keep_t = None if keep is None else keep.transpose(1, 2).unsqueeze(3)  # [K, L, B, 1]
    layer_fn = _lstm_layer if cell == "lstm" else _gru_layer
    finals = []
    for i, p in enumerate(params):
        record = None if saved is None else []
        outs, final = layer_fn(inp, state[:, :, i], *p, keep_t, steps, record)
        if saved is not None:
            saved.append((inp, record))
        finals.append(final)
        inp = outs.view(k, steps * b, -1)
    return outs.transpose(1, 2), torch.stack(finals, dim=2)


def _lstm_layer(inp: torch.Tensor, state: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
                b_hh: torch.Tensor, keep: torch.Tensor | None, steps: int, record: list | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM layer over time-major rows `inp` [K, L * B, in] from `state` [K, B, 2, H]: (outputs
    [K, L, B, H], final state [K, B, 2, H]). `record` receives, stacked over the steps, each step's (h, c)
    before it (zeroed where an episode starts), its gates' sigmoids, cell candidate and tanh of the new cell."""
    k, hid = inp.shape[0], w_hh.shape[2]
    b = inp.shape[1] // steps
    gi = torch.baddbmm((b_ih + b_hh).reshape(k, 1, 4 * hid), inp, w_ih.reshape(k, 4 * hid, -1).transpose(1, 2)
                       ).view(k, steps, b, 4 * hid).unbind(1)
    keeps = None if keep is None else keep.unbind(1)
    w_hh_t = w_hh.reshape(k, 4 * hid, hid).transpose(1, 2)
    h, c = state.unbind(2)
    outs, kept = [], []
    for t in range(steps):
        if keeps is not None:
            h, c = h * keeps[t], c * keeps[t]
        z = torch.baddbmm(gi[t], h, w_hh_t).view(k, b, 4, hid)
        gates = torch.sigmoid(z)  # input, forget, (unused), output
        i, f, _, o = gates.unbind(2)
        g = torch.tanh(z.select(2, 2))
        c_new = torch.addcmul(f * c, i, g)
        tc = torch.tanh(c_new)
        if record is not None:
            kept.append((h, c, gates, g, tc))
        h, c = o * tc, c_new
        outs.append(h)
    if record is not None:
        record.extend(torch.stack(parts, dim=1) for parts in zip(*kept, strict=True))
    return torch.stack(outs, dim=1), torch.stack((h, c), dim=2)


def _gru_layer(inp: torch.Tensor, state: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
               b_hh: torch.Tensor, keep: torch.Tensor | None, steps: int, record: list | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """One GRU layer over time-major rows `inp` [K, L * B, in] from `state` [K, B, 1, H]: (outputs
    [K, L, B, H], final state [K, B, 1, H]). `record` receives, stacked over the steps, each step's h before
    it (zeroed where an episode starts), reset and update gates, new gate and the new gate's hidden part
    (W_hn h + b_hn)."""
    k, hid = inp.shape[0], w_hh.shape[2]
    b = inp.shape[1] // steps
    gi = torch.baddbmm(b_ih.reshape(k, 1, 3 * hid), inp, w_ih.reshape(k, 3 * hid, -1).transpose(1, 2)
                       ).view(k, steps, b, 3, hid)
    gi_ru, gi_n = gi[:, :, :, :2].unbind(1), gi.select(3, 2).unbind(1)
    keeps = None if keep is None else keep.unbind(1)
    w_hh_t, b_hh = w_hh.reshape(k, 3 * hid, hid).transpose(1, 2), b_hh.reshape(k, 1, 3 * hid)
    h = state.select(2, 0)
    outs, kept = [], []
    for t in range(steps):
        if keeps is not None:
            h = h * keeps[t]
        gh = torch.baddbmm(b_hh, h, w_hh_t).view(k, b, 3, hid)
        r, u = torch.sigmoid(gi_ru[t] + gh[:, :, :2]).unbind(2)
        gh_n = gh.select(2, 2)
        n = torch.tanh(torch.addcmul(gi_n[t], r, gh_n))
        if record is not None:
            kept.append((h, r, u, n, gh_n))
        h = torch.lerp(n, h, u)  # (1 - u) n + u h
        outs.append(h)
    if record is not None:
        record.extend(torch.stack(parts, dim=1) for parts in zip(*kept, strict=True))
    return torch.stack(outs, dim=1), h.unsqueeze(2)


def _lstm_backward(inp: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, keep: torch.Tensor | None,
                   record: list[torch.Tensor], d_out: torch.Tensor | None, d_final: torch.Tensor | None,
                   need_inp: bool) -> tuple[torch.Tensor | None, ...]:
    """Gradients of one LSTM layer (see :func:`_lstm_layer`) given its outputs' `d_out` [K, L, B, H] and its
    final state's `d_final` [K, B, 2, H] (None: zero): (d inp [K, L * B, in] (None unless `need_inp`),
    d state [K, B, 2, H], d w_ih, d w_hh, d bias (of b_ih and of b_hh alike))."""
    h_prev, c_prev, gates, g, tc = record
    k, steps, b, hid = h_prev.shape
    i, f, _, o = gates.unbind(3)
    to_c = (o * (1 - tc * tc)).unbind(1)  # d c_t / d h_t
    # d z / d (c_t, c_t, c_t, h_t) for the input, forget, cell and output gates' pre-activations
    coef = torch.stack((g * i * (1 - i), c_prev * f * (1 - f), i * (1 - g * g), tc * o * (1 - o)), dim=3)
    coef_c, coef_h = coef[:, :, :, :3].unbind(1), coef.select(3, 3).unbind(1)
    carry = (f if keep is None else f * keep).unbind(1)  # d c_{t-1} / d c_t (0 across an episode start)
    keeps = None if keep is None else keep.unbind(1)
    d_outs = None if d_out is None else d_out.unbind(1)
    dz = torch.empty_like(gates)
    dz_c, dz_h, dz_rows = dz[:, :, :, :3].unbind(1), dz.select(3, 3).unbind(1), dz.view(k, steps, b, -1).unbind(1)
    w = w_hh.reshape(k, 4 * hid, hid)
    dh, dc = (None, None) if d_final is None else d_final.unbind(2)
    for t in range(steps - 1, -1, -1):
        dht = _plus(None if d_outs is None else d_outs[t], dh, h_prev)
        dct = dht * to_c[t] if dc is None else torch.addcmul(dc, dht, to_c[t])
        torch.mul(dct.unsqueeze(2), coef_c[t], out=dz_c[t])
        torch.mul(dht, coef_h[t], out=dz_h[t])
        dh = torch.bmm(dz_rows[t], w)
        if keeps is not None:
            dh = dh * keeps[t]
        dc = dct * carry[t]
    dz = dz.view(k, steps * b, 4 * hid)
    return (_input_grad(dz, w_ih, need_inp), torch.stack((dh, dc), dim=2), _weight_grad(inp, dz, w_ih),
            _weight_grad(h_prev.view(k, steps * b, hid), dz, w_hh), dz.sum(1).view(k, 4, hid))


def _gru_backward(inp: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, keep: torch.Tensor | None,
                  record: list[torch.Tensor], d_out: torch.Tensor | None, d_final: torch.Tensor | None,
                  need_inp: bool) -> tuple[torch.Tensor | None, ...]:
    """Gradients of one GRU layer (see :func:`_gru_layer`), as :func:`_lstm_backward`: (d inp, d state
    [K, B, 1, H], d w_ih, d w_hh, d b_ih, d b_hh)."""
    h_prev, r, u, n, gh_n = record
    k, steps, b, hid = h_prev.shape
    to_n = ((1 - u) * (1 - n * n)).unbind(1)  # d (new gate's pre-activation) / d h_t
    to_u = ((h_prev - n) * u * (1 - u)).unbind(1)  # d (update gate's pre-activation) / d h_t
    to_r = (gh_n * r * (1 - r)).unbind(1)  # d (reset gate's pre-activation) / d (new gate's)
    rs, us = r.unbind(1), u.unbind(1)
    keeps = None if keep is None else keep.unbind(1)
    d_outs = None if d_out is None else d_out.unbind(1)
    dgh = torch.empty(k, steps, b, 3, hid, dtype=h_prev.dtype, device=h_prev.device)  # d (W_hh h + b_hh)
    dn = torch.empty_like(h_prev)  # d (new gate's pre-activation)
    dgh_r, dgh_u, dgh_n = (dgh.select(3, j).unbind(1) for j in range(3))
    dgh_rows, dns = dgh.view(k, steps, b, -1).unbind(1), dn.unbind(1)
    w = w_hh.reshape(k, 3 * hid, hid)
    dh = None if d_final is None else d_final.select(2, 0)
    for t in range(steps - 1, -1, -1):
        dht = _plus(None if d_outs is None else d_outs[t], dh, h_prev)
        dnt = torch.mul(dht, to_n[t], out=dns[t])
        torch.mul(dnt, to_r[t], out=dgh_r[t])
        torch.mul(dht, to_u[t], out=dgh_u[t])
        torch.mul(dnt, rs[t], out=dgh_n[t])
        dh = torch.baddbmm(dht * us[t], dgh_rows[t], w)
        if keeps is not None:
            dh = dh * keeps[t]
    dgi = torch.cat((dgh[:, :, :, :2], dn.unsqueeze(3)), dim=3).view(k, steps * b, 3 * hid)
    dgh = dgh.view(k, steps * b, 3 * hid)
    return (_input_grad(dgi, w_ih, need_inp), dh.unsqueeze(2), _weight_grad(inp, dgi, w_ih),
            _weight_grad(h_prev.view(k, steps * b, hid), dgh, w_hh), dgi.sum(1).view(k, 3, hid),
            dgh.sum(1).view(k, 3, hid))


def _weight_grad(x: torch.Tensor, dz: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A gate-major weight's gradient [K, G, H, in] over all steps from its input rows `x` [K, R, in] and the
    gates' pre-activation gradients `dz` [K, R, G * H]: (x^T dz)^T, the product whose operands need no copy
    (measured several times faster than dz^T x for narrow inputs)."""
    return torch.bmm(x.transpose(1, 2), dz).transpose(1, 2).reshape(w.shape)


def _input_grad(dz: torch.Tensor, w_ih: torch.Tensor, needed: bool) -> torch.Tensor | None:
    """The layer input's gradient [K, R, in] from the gates' `dz` [K, R, G * H] (None when not `needed`)."""
    return torch.bmm(dz, w_ih.reshape(w_ih.shape[0], -1, w_ih.shape[3])) if needed else None


def _plus(a: torch.Tensor | None, b: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """a + b where either may be None (zero; both None: zeros shaped as one step of `like` [K, L, B, H])."""
    if a is None:
        return like.new_zeros(like.shape[0], *like.shape[2:]) if b is None else b
    return a if b is None else a + b


class _Recurrence(torch.autograd.Function):
    """:func:`run_sequence` with a hand-written backward (truncated backpropagation through time): the forward
    keeps every step's activations, the backward walks the steps in reverse (one matmul and a few elementwise
    ops per step for all members' sequences) and each weight's gradient over all steps is one matmul."""

    @staticmethod
    def forward(ctx, cell: str, keep: torch.Tensor | None, x: torch.Tensor, state: torch.Tensor,
                *flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        params = [flat[i: i + 4] for i in range(0, len(flat), 4)]
        saved: list = []
        out, final = _run(cell, params, x, state, keep, saved)
        ctx.cell, ctx.keep, ctx.layers, ctx.x_shape = cell, keep, saved, x.shape
        ctx.save_for_backward(*flat)
        ctx.set_materialize_grads(False)
        return out, final

    @staticmethod
    def backward(ctx, d_out: torch.Tensor | None, d_final: torch.Tensor | None) -> tuple:
        flat = ctx.saved_tensors
        k, b, steps = ctx.x_shape[0], ctx.x_shape[1], ctx.x_shape[2]
        keep = None if ctx.keep is None else ctx.keep.transpose(1, 2).unsqueeze(3)
        backward = _lstm_backward if ctx.cell == "lstm" else _gru_backward
        d_flat: list[torch.Tensor] = []
        d_states = []
        d = None if d_out is None else d_out.transpose(1, 2)  # time-major [K, L, B, H]
        for i in range(len(ctx.layers) - 1, -1, -1):
            inp, record = ctx.layers[i]
            w_ih, w_hh = flat[4 * i], flat[4 * i + 1]
            d_inp, d_state, dw_ih, dw_hh, *d_bias = backward(inp, w_ih, w_hh, keep, record, d,
                                                            None if d_final is None else d_final[:, :, i],
                                                            i > 0 or ctx.needs_input_grad[2])
            # an LSTM's two biases enter as their sum: each gets the gradient (a tensor of its own)
            d_flat[:0] = [dw_ih, dw_hh, d_bias[0], d_bias[-1] if len(d_bias) > 1 else d_bias[0].clone()]
            d_states.insert(0, d_state)
            d = None if d_inp is None else d_inp.view(k, steps, b, -1)
        dx = None if d is None else d.transpose(1, 2)
        d_state = torch.stack(d_states, dim=2) if ctx.needs_input_grad[3] else None
        return None, None, dx, d_state, *d_flat
